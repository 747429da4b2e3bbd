"""``tests/scripts/faulty_ptb.py`` with a strict watchdog over the final wait of every rank but 0.

Used by ``test_clean_end.py``. Training runs under the watchdog the user's
settings give (``LMKIT_COLLECTIVE_TIMEOUT``, 300 s by default), so no step
that a loaded machine slows down can trip it. Only where the other ranks
wait for rank 0's last evaluation (``Trainer._leave_together``) does this
script swap in a watchdog of :data:`STRICT_LIMIT` seconds, armed: the
trainer must pause it there, or it ends the rank a few seconds into a wait
that rank 0's slowed evaluation makes much longer (the failure the test
guards against). Nothing here is part of lmkit.

    python -m lmkit.launch --hosts 127.0.0.1 --num_workers 2 -- \\
        python tests/distributed/reliability/watched_end.py --fault kind=slow_test_eval,step=14 -- ...
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FAULTY = os.path.join(ROOT, "tests", "scripts", "faulty_ptb.py")
STRICT_LIMIT = 2.0  # seconds; a rank waiting inside TensorFlow gets 5 s more (the watchdog's head start)


def _watch_the_final_wait() -> None:
    sys.path.insert(0, ROOT)
    from lmkit.train.trainer import Trainer
    from lmkit.train.watchdog import Watchdog

    leave_together = Trainer._leave_together  # an AttributeError here fails the test loudly

    def strictly_watched(self) -> None:
        if not self.chief:
            self.watchdog.stop()
            self.watchdog = Watchdog(self.rank, STRICT_LIMIT)
            self.watchdog.beat("training ended")
            print(f"rank {self.rank}: a {STRICT_LIMIT:g} s watchdog watches the wait for rank 0", flush=True)
        leave_together(self)

    Trainer._leave_together = strictly_watched


if __name__ == "__main__":
    _watch_the_final_wait()
    sys.argv[0] = FAULTY
    runpy.run_path(FAULTY, run_name="__main__")
