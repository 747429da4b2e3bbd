"""python -m lmkit.launch --mpirun/--horovodrun (lmkit.distributed.wrapped): a scheduler's signal to the wrapper
becomes what the Horovod launcher passes on to its ranks."""
import os

import pytest

from lmkit.distributed import launch, wrapped


def _fake_proc(root, pid, name, ppid):
    folder = root / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
    (folder / "comm").write_text(name + "\n")


def test_the_wrapper_finds_open_mpis_launcher_below_horovodrun(tmp_path):
    # horovodrun (exec'd into sh -c) -> mpirun -> ranks; a name with spaces and parentheses.
    for pid, name, ppid in [(10, "sh", 1), (11, "mpirun", 10), (12, "python", 11), (13, "orted", 11),
                            (20, "odd (name) x", 10), (21, "prterun", 20), (30, "mpirun", 1)]:
        _fake_proc(tmp_path, pid, name, ppid)
    (tmp_path / "self").mkdir()  # not a pid
    assert wrapped.mpi_launchers_below(10, proc_root=str(tmp_path)) == [11, 21]
    assert wrapped.mpi_launchers_below(11, proc_root=str(tmp_path)) == [11]  # mpirun itself
    assert wrapped.mpi_launchers_below(12, proc_root=str(tmp_path)) == []  # gloo: none below


_FAKE_LAUNCHER = """#!{python}
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
open(sys.argv[1] + ".started", "w").close()
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.02)
open(sys.argv[1], "w").write(",".join(got))
sys.exit(75 if got == ["USR1"] else 9)
"""


@pytest.mark.parametrize("name, through_sh, signum, expected", [
    ("mpirun", False, "SIGTERM", "USR1"),   # mpirun itself: SIGUSR1, which Open MPI forwards at once
    ("mpirun", True, "SIGINT", "USR1"),     # horovodrun's `sh -c mpirun`: the mpirun below it
    ("horovodrun", False, "SIGUSR1", "TERM"),  # no Open MPI below (--gloo): SIGTERM to the launcher
])
def test_the_wrapper_turns_a_signal_into_what_the_launcher_passes_on(tmp_path, name, through_sh, signum,
                                                                     expected):
    import signal
    import sys
    import threading
    import time
    fake = tmp_path / name
    fake.write_text(_FAKE_LAUNCHER.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record"
    command = ["sh", "-c", f"{fake} {record}; exit $?"] if through_sh else [str(fake), str(record)]

    def signal_when_started():
        deadline = time.time() + 20
        while not (tmp_path / "record.started").exists() and time.time() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), getattr(signal, signum))  # as a scheduler would signal the wrapper

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    threading.Thread(target=signal_when_started, daemon=True).start()
    code = wrapped.run_wrapped(command)
    assert record.read_text() == expected
    assert code == (75 if expected == "USR1" else 9)
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are put back


def test_the_wrapper_holds_a_signal_that_comes_while_the_launcher_starts(tmp_path, monkeypatch):
    # A scheduler's signal between the wrapper's start and the launcher's: it is passed on
    # once the launcher exists, and never reaches the handler that was there before.
    import signal
    import subprocess
    import sys
    fake = tmp_path / "horovodrun"
    fake.write_text(_FAKE_LAUNCHER.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record"
    earlier = []
    real_popen = subprocess.Popen

    def popen_after_a_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler before the next line
        return real_popen(*args, **kwargs)

    previous = signal.signal(signal.SIGUSR1, lambda s, f: earlier.append(s))
    try:
        monkeypatch.setattr(wrapped.subprocess, "Popen", popen_after_a_signal)
        code = wrapped.run_wrapped([str(fake), str(record)])
        assert signal.getsignal(signal.SIGUSR1) is not previous  # the test's own, put back
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert earlier == []
    # SIGTERM reached the launcher: through its handler, or before it had one (128 + 15)
    assert (record.exists() and record.read_text() == "TERM" and code == 9) or (not record.exists()
                                                                               and code == 143)


def test_the_wrapper_says_what_is_missing(capsys, monkeypatch):
    assert launch.main(["--mpirun"]) == 2
    assert "give the launcher's arguments" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launch.main(["--horovodrun", "-np", "2", "python", "x.py"]) == 2
    assert "'horovodrun' was not found; install it or put it on PATH" in capsys.readouterr().err
