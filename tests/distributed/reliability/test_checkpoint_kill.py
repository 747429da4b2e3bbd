"""A checkpoint save that is killed or fails, or a checkpoint that no longer reads back, loses nothing.

* SIGKILL during a real save keeps the previous checkpoint, and the run resumes from it;
* a full disk during a save on 2 ranks ends every rank with one message, the previous checkpoint kept;
* a corrupt newest checkpoint: 2 ranks resume together from the one before.
"""
import os
import re
import signal
import sys

import pytest

from tests.distributed.reliability.support import FAULTY, SINGLE, TRAIN, mpirun, run_streamed, tree_digest


def test_kill_during_a_save_then_resume(corpus, model_copy):
    ckpts = os.path.join(model_copy, "checkpoints")
    assert os.listdir(ckpts) == ["ckpt-000000064"]  # one epoch of 64 steps
    previous = tree_digest(os.path.join(ckpts, "ckpt-000000064"))
    started = []  # the Python process itself (no launcher in between)

    def kill_in_the_save(line):
        if "in the middle of saving step 128" in line:
            os.kill(started[0].pid, signal.SIGKILL)

    # The real example, resuming for a second epoch; its checkpoint writer is
    # slowed down (tests/scripts/faulty_ptb.py) and killed half-way.
    flags = ["--config", corpus.config, "--data_path", corpus.data, "--model_dir", model_copy,
             "--num_epochs", "2"]
    out = run_streamed([sys.executable, FAULTY, "--fault", "kind=slow_save", "--", *flags], timeout=300,
                       on_line=kill_in_the_save, on_start=started.append)
    assert out.returncode == -signal.SIGKILL, out.output[-4000:]
    assert "epoch 2/2 step 64/64" in out.output  # killed after the epoch's last step, in the save
    leftovers = sorted(os.listdir(ckpts))
    assert leftovers[0] == "ckpt-000000064" and len(leftovers) == 2, leftovers
    assert re.fullmatch(r"ckpt-000000128\.tmp-\d+", leftovers[1]), leftovers  # never renamed into place
    assert tree_digest(os.path.join(ckpts, "ckpt-000000064")) == previous

    # The unmodified example resumes from the last complete checkpoint.
    out = run_streamed([sys.executable, SINGLE, *flags], timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    assert re.search(r"resumed from \S+/ckpt-000000064 \(epoch 1, step 64\) on 1 worker\(s\)", out.output)
    assert re.search(r"Epoch 2/2: lr \S+ \| train ppl", out.output)
    assert sorted(os.listdir(ckpts)) == ["ckpt-000000064", "ckpt-000000128"]  # the leftover is gone


# The distributed example, with every checkpoint write of step 128 failing as TensorFlow's does on a full disk.
FULL_DISK_AT_128 = """
import runpy, sys
import tensorflow as tf
real_write = tf.train.Checkpoint.write
def write(self, prefix, options=None):
    if "ckpt-000000128" in prefix:
        raise tf.errors.ResourceExhaustedError(None, None, prefix + "_temp/part-00000-of-00001.data-00000-of-00001"
                                               ".tempstate1; No space left on device [Op:SaveV2]")
    return real_write(self, prefix, options)
tf.train.Checkpoint.write = write
sys.argv = ["lmkit", "train"] + sys.argv[1:]
runpy.run_module("lmkit", run_name="__main__")
"""


@pytest.mark.horovod
@pytest.mark.mpi
def test_two_ranks_after_a_full_disk_and_a_corrupt_checkpoint(corpus, model_copy):
    """A full disk in the save of step 128 stops both ranks with rank 0's one message (exit 2); the rerun
    writes step 128; that checkpoint's data file is then truncated, and both ranks resume from step 64."""
    ckpts = os.path.join(model_copy, "checkpoints")
    c = re.escape(ckpts)
    flags = ["--config", corpus.config, "--data_path", corpus.data, "--model_dir", model_copy]
    previous = tree_digest(os.path.join(ckpts, "ckpt-000000064"))

    out = run_streamed(mpirun(["-c", FULL_DISK_AT_128, *flags, "--num_epochs", "2"]), timeout=400)
    assert out.returncode == 2, out.output[-4000:]
    assert "Traceback" not in out.output and " failed:" not in out.output, out.output[-4000:]
    errors = [line for line in out.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.output[-4000:]
    assert re.fullmatch(rf"error: cannot write checkpoint {c}/ckpt-000000128: no space left on the disk of "
                        rf"{c} \(.* free; a checkpoint needs about \d+ KB, as the previous one\); the partial "
                        rf"checkpoint was removed and the previous checkpoint {c}/ckpt-000000064 is kept\. "
                        r"Free space on that disk and rerun the same command \(it continues from there\), or pass a "
                        r"--model_dir on a disk with room", errors[0]), errors[0]
    assert os.listdir(ckpts) == ["ckpt-000000064"]
    assert tree_digest(os.path.join(ckpts, "ckpt-000000064")) == previous

    out = run_streamed([sys.executable, SINGLE, *flags, "--num_epochs", "2"], timeout=300)  # room again
    assert out.returncode == 0, out.output[-4000:]
    assert sorted(os.listdir(ckpts)) == ["ckpt-000000064", "ckpt-000000128"]
    data = os.path.join(ckpts, "ckpt-000000128", "ckpt.data-00000-of-00001")
    os.truncate(data, os.path.getsize(data) // 2)

    out = run_streamed(mpirun([*TRAIN, *flags, "--num_epochs", "2"]), timeout=400)
    assert out.returncode == 0, out.output[-4000:]
    assert out.count("is corrupt") == 1, out.output[-4000:]  # rank 0 alone says so
    assert re.search(rf"warning: checkpoint {c}/ckpt-000000128 is corrupt \(IndexError: Read less bytes than "
                     r"requested\); skipping it", out.output), out.output[-4000:]
    assert re.search(rf"warning: continuing from the previous complete checkpoint {c}/ckpt-000000064 "
                     r"\(step 64\)", out.output), out.output[-4000:]
    assert re.search(r"resumed from \S+/ckpt-000000064 \(epoch 1, step 64\) on 2 worker\(s\)", out.output)
    assert re.search(r"Epoch 2/2: lr \S+ \| train ppl", out.output), out.output[-4000:]
    assert sorted(os.listdir(ckpts)) == ["ckpt-000000064", "ckpt-000000128"]  # 128 written anew, whole
