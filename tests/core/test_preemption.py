"""Preemption's pieces in one process (lmkit.core.preemption): what a stop names, a signal turned into an
error or a flag, signals held while helpers start. Whole commands stopped by signals are in
tests/cli/test_signals.py and tests/distributed/reliability/test_preemption.py."""
import os
import signal
import threading

import pytest

from lmkit.core import preemption
from lmkit.core.errors import PreemptedError


@pytest.fixture
def command(monkeypatch):
    """The process-wide state of the command, put back after the test."""
    for name in ("doing", "kept", "signal_name", "message"):
        monkeypatch.setattr(preemption._COMMAND, name, getattr(preemption._COMMAND, name))
    return preemption._COMMAND


def test_doing_names_the_work_for_the_block_only(command):
    preemption.set_doing("starting up")
    with preemption.doing("encoding train_file", kept="the tokenizer is kept"):
        assert (command.doing, command.kept) == ("encoding train_file", "the tokenizer is kept")
    assert command.doing == "starting up" and command.kept.startswith("nothing is lost")


def test_a_signal_during_shared_work_becomes_an_error_every_rank_can_receive():
    def signalled():
        raise preemption.PreemptionSignal("stopped by SIGTERM while training the word tokenizer")

    with pytest.raises(PreemptedError, match="^stopped by SIGTERM while training the word tokenizer$"):
        preemption.as_error(signalled)()
    assert preemption.as_error(lambda: 7)() == 7
    assert issubclass(preemption.PreemptionSignal, BaseException)
    assert not issubclass(preemption.PreemptionSignal, Exception)  # `except Exception` lets it pass


def test_the_watcher_turns_a_signal_into_a_flag_and_puts_the_handlers_back(command):
    before = {sig: signal.getsignal(sig) for sig in preemption.PREEMPTION_SIGNALS}
    with preemption.PreemptionWatcher(rank=0, grace_seconds=0) as watcher:
        assert not watcher.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):  # the handler runs at the next bytecode of the main thread
            if watcher.requested:
                break
        assert watcher.requested and watcher.signal_name == "SIGUSR1"
        assert preemption.received() == "SIGUSR1"
        assert preemption.stop_message().startswith("stopped by SIGUSR1 during training")
    assert {sig: signal.getsignal(sig) for sig in preemption.PREEMPTION_SIGNALS} == before


def test_signals_are_held_inside_the_block_and_arrive_after_it():
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    try:
        with preemption.signals_held():
            assert threading.current_thread() is threading.main_thread()
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # to this thread, which holds it
            assert got == []  # blocked: pending
        assert got == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
