"""Ranks that load different data or config stop at start-up with a message naming the difference."""
import re

import pytest

from tests.distributed.reliability.support import FAULTY, mpirun, run_streamed, tree_digest

pytestmark = [pytest.mark.horovod, pytest.mark.mpi]


@pytest.mark.parametrize("fault, difference", [
    ("rank=1,kind=truncate", r"train_ids \(rank 0: (\d+), rank 1: (\d+)\); steps_per_epoch \(rank 0: 64, "
                             r"rank 1: \d+\)"),
    ("rank=1,kind=config", r"config key optimization\.learning_rate \(rank 0: 1\.0, rank 1: 2\.0\)"),
], ids=["rank 1 has fewer ids", "rank 1 has another learning rate"])
def test_ranks_that_disagree_stop_at_start_up(corpus, tmp_path, fault, difference):
    before = tree_digest(corpus.data)
    out = run_streamed(mpirun([FAULTY, "--fault", fault, "--", "--config", corpus.config, "--data_path",
                               corpus.data, "--model_dir", str(tmp_path / "model"), "--max_steps", "5"]),
                       timeout=300)
    assert out.returncode == 2, out.output[-4000:]
    messages = re.findall(r"error: ranks disagree at start-up: rank 1 differs from rank 0 in (.*)", out.output)
    assert len(messages) == 1, out.output[-4000:]  # printed once, by rank 0
    assert re.match(difference, messages[0]), messages[0]
    assert messages[0].endswith("make every rank read the same config and data files")
    assert "Traceback" not in out.output
    assert "training" not in out.output  # stopped before the first step
    assert tree_digest(corpus.data) == before
    assert not (tmp_path / "model").exists()  # checked before anything is written
