"""A quiet console: TensorFlow's start-up chatter is filtered out unless --verbose."""
import re
import shutil
import sys

import pytest

from lmkit.core.console import is_chatter
from tests.cli.test_cli_text import SMALL, write_corpus
from tests.helpers import run, subprocess_env

CHATTER = [
    "I0000 00:00:1795470082.533027    4233 service.cc:148] XLA service 0x7fab880f2b30 initialized",
    "I0000 00:00:1795470082.612789    4233 device_compiler.h:188] Compiled cluster using XLA!  This line",
    "W0000 00:00:1795470082.612789    4233 gpu_device.cc:2344] Cannot dlopen some GPU libraries.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "2026-11-23 19:36:13.928140: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with",
    "  StreamExecutor device (0): Host, Default Version",
]
KEPT = [
    "error: train_file 'x.txt' does not exist; check the path",
    "E0000 00:00:1795470082.612789    4233 cuda_dnn.cc:535] Could not create cudnn handle",
    "[2026-11-23 19:36:13.928140: W /tmp/horovod/common/stall_inspector.cc:107] One or more tensors "
    "were submitted to be reduced by only a subset of ranks",
    "F0000 00:00:1795470082.612789    4233 check.cc:1] Check failed: x",
    "compiled the training step in 13.0 s",
]
ABSL = re.compile(r"^(?:rank \d+: )?[IW]\d{4} ")


def test_chatter_is_recognised_and_real_messages_are_not():
    assert all(is_chatter(line) for line in CHATTER)
    assert not any(is_chatter(line) for line in KEPT)


def test_the_filter_passes_errors_and_prefixes_other_ranks(tmp_path):
    payload = ("\n".join(CHATTER + KEPT) + "\n").encode()
    code = ("import os, sys\n"
            "from lmkit.core.console import quiet_console\n"
            "quiet_console(rank=int(sys.argv[1]))\n"
            "print('python line', file=sys.stderr, flush=True)\n"
            f"os.write(2, {payload!r})\n")
    for rank, prefix in ((0, ""), (1, "rank 1: ")):
        res = run([sys.executable, "-c", code, str(rank)], timeout=60)
        assert res.returncode == 0, res.stderr
        lines = res.stderr.splitlines()
        assert lines[0] == "python line"  # Python's own stderr is not filtered or prefixed
        assert lines[1:] == [prefix + line for line in KEPT], lines
    verbose = run([sys.executable, "-c", code, "0"], timeout=60, env=subprocess_env({"LMKIT_VERBOSE": "1"}))
    assert all(line in verbose.stderr for line in CHATTER)


@pytest.mark.horovod
@pytest.mark.mpi
def test_lmkit_train_under_mpirun_is_quiet_unless_verbose(tmp_path):
    files = write_corpus(str(tmp_path / "corpus"), lines=60)
    env = subprocess_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # as a user's shell: nothing set

    def train(model_dir, *flags):
        # mpirun_cmd's, without forwarding TF_CPP_MIN_LOG_LEVEL
        mpirun = [shutil.which("mpirun"), "-np", "2", "--oversubscribe", "--bind-to", "none",
                  "-x", "PYTHONPATH", "-x", "LMKIT_INTRA_OP_THREADS"]
        cmd = [*mpirun, sys.executable, "-m", "lmkit", "train", "--config", "config_transformer",
               "--train_file", files["train"], "--tokenizer", "byte", "--model_dir", str(tmp_path / model_dir),
               "--max_steps", "2", *SMALL, *flags]
        res = run(cmd, timeout=400, env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        return (res.stdout + res.stderr).splitlines()

    quiet = train("quiet")
    assert not [line for line in quiet if ABSL.match(line) or "cpu_feature_guard" in line], quiet
    assert sum(line.startswith("compiled the training step in") for line in quiet) == 1  # once, rank 0
    verbose = train("verbose", "--verbose")
    assert [line for line in verbose if ABSL.match(line)], verbose
