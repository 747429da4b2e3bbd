"""SIGKILL during a real checkpoint save keeps the previous checkpoint, and the run resumes from it."""
import os
import re
import signal
import sys

from tests.distributed.reliability.support import FAULTY, SINGLE, run_streamed, tree_digest


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
