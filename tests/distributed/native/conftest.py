"""Runs shared by the native-backend tests."""
import pytest

from tests.distributed.native.runs import FIRST_LEG, REFERENCE_STEPS, Run, probe_cmd, run_all


@pytest.fixture(scope="session")
def base_runs(tmp_path_factory):
    """The one-process reference (local backend) and the native run on 2 logical CPUs.

    Returns:
      ``(reference, native, native_model_dir)``.
    """
    tmp = tmp_path_factory.mktemp("native_base")
    ref, nat, model_dir = str(tmp / "ref"), str(tmp / "nat"), str(tmp / "nat_model")
    run_all([probe_cmd(ref, "local", "--steps", str(REFERENCE_STEPS)),
             probe_cmd(nat, "native", "--steps", str(FIRST_LEG), "--model_dir", model_dir, replicas=2)])
    return Run(ref, 1), Run(nat, 1), model_dir
