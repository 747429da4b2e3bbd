"""The trainer's watchdog: off in one process, configurable, fires only when armed and idle."""
import re
import sys

import pytest

from lmkit.core.errors import UsageError
from lmkit.train.watchdog import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT, Watchdog
from tests.distributed.reliability.support import run_streamed

SCRIPT = r"""
import time
from lmkit.train.watchdog import Watchdog
dog = Watchdog(rank=3, limit=1.0)
time.sleep(2.5)                      # not armed before the first beat (compilation)
dog.beat(7); dog.pause()
time.sleep(2.5)                      # paused (waiting for rank 0's evaluation)
print("still alive", flush=True)
dog.beat(8)
time.sleep(30)                       # stuck: the watchdog ends the process
print("not reached", flush=True)
"""


def test_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert Watchdog.from_env(0, processes=2).limit == DEFAULT_COLLECTIVE_TIMEOUT
    assert Watchdog.from_env(0, processes=1).limit == 0  # no peer to wait for: off
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "45")
    dog = Watchdog.from_env(1, processes=2)
    dog.stop()
    assert dog.limit == 45
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "0")
    assert Watchdog.from_env(0, processes=2).limit == 0
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "5min")
    with pytest.raises(UsageError, match=r"LMKIT_COLLECTIVE_TIMEOUT='5min' is not a number of seconds; "
                                         r"set it to e\.g\. 600, or 0"):
        Watchdog.from_env(0, processes=2)


def test_fires_only_when_armed_and_names_the_place(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(SCRIPT)
    out = run_streamed([sys.executable, str(script)], timeout=120)
    assert out.returncode == 1, out.output
    assert "still alive" in out.output and "not reached" not in out.output
    assert re.search(r"rank 3 failed: no progress for [12] s since training step 8 finished; it is at "
                     r"\S+/stuck\.py:10 in <module> \(time\.sleep\(30\)[^)]*\), the other ranks wait for this one "
                     r"in the next collective operation\. Ending this rank .*LMKIT_COLLECTIVE_TIMEOUT=1 s",
                     out.output), \
        out.output
