"""The engine without HTTP: sequences join and leave the running batch, each gets the tokens it gets alone,
and a cancelled or late request frees its slot at the next step."""
import threading
import time

import pytest

from lmkit.serve.engine import Engine, QueueFull, Sampling, Sequence
from lmkit.serve.slots import SlotModel
from lmkit.serve.text import Prompts


@pytest.fixture(scope="module")
def parts(run_dir):
    """The run's prompts and 2 slots of its model, compiled once for the module (without XLA: quicker to
    trace, and the engine's logic is the same)."""
    from lmkit.decoding.source import load_generator
    generator = load_generator(run_dir)
    return SlotModel(generator.model, 2, 64, 4, jit_compile=False), Prompts(generator.tokenizer)


def make_engine(parts, max_queue=8):
    engine = Engine(parts[0], parts[1], max_queue=max_queue)
    engine.start()
    return engine


class Listener:
    def __init__(self, count):
        self.tokens, self.reasons, self.done = {}, {}, threading.Event()
        self.count = count

    def __call__(self, sequence, text, tokens, entries, reason):
        self.tokens.setdefault(sequence.index, []).extend(tokens)
        if reason is not None:
            self.reasons[sequence.index] = reason
            if len(self.reasons) == self.count:
                self.done.set()


def request(parts, engine, texts, max_tokens=20, sampling=Sampling(), timeout=None):
    prompts = parts[1]
    sequences = []
    for i, text in enumerate(texts):
        ids = prompts.text(text)
        sequences.append(Sequence(ids, ids[1:], max_tokens, sampling, index=i))
    listener = Listener(len(sequences))
    handle = engine.submit(sequences, listener, timeout)
    return listener, handle


def test_a_sequence_gets_the_same_tokens_alone_and_in_a_batch_joining_and_leaving(parts):
    engine = make_engine(parts)
    try:
        alone, _ = request(parts, engine, ["the cat sat"], 30)
        assert alone.done.wait(120)
        seeded, _ = request(parts, engine, ["a dog"], 30, Sampling(0.9, 0.8, None, 5, 0))
        assert seeded.done.wait(120)
        # 6 sequences for 2 slots: the short ones leave, the waiting ones join the running batch.
        crowd, _ = request(parts, engine, ["blue", "the cat sat", "a", "sky and", "of in", "a dog"], 30)
        short, _ = request(parts, engine, ["to"], 2)
        again, _ = request(parts, engine, ["a dog"], 30, Sampling(0.9, 0.8, None, 5, 0))
        for listener in (crowd, short, again):
            assert listener.done.wait(120)
        assert crowd.tokens[1] == alone.tokens[0] and again.tokens[0] == seeded.tokens[0]
        assert len(short.tokens[0]) == 2 and set(crowd.reasons.values()) == {"length"}
        assert engine.counts() == (0, 0)
    finally:
        engine.stop()


def test_a_cancelled_or_late_request_frees_its_slot_at_the_next_step(parts):
    engine = make_engine(parts, max_queue=0)
    engine.step_delay = 0.02
    try:
        left, handle = request(parts, engine, ["the cat"], 60)
        late, _ = request(parts, engine, ["a dog"], 60, timeout=0.3)
        with pytest.raises(QueueFull):  # both slots taken, no queue
            request(parts, engine, ["blue"], 5)
        deadline = time.monotonic() + 60
        while not left.tokens and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.cancel(handle)
        assert left.done.wait(60) and late.done.wait(60)
        assert left.reasons == {0: "cancelled"} and late.reasons == {0: "timeout"}
        assert len(left.tokens[0]) < 60 and engine.counts() == (0, 0)
        after, _ = request(parts, engine, ["blue"], 5)  # the slots serve again
        assert after.done.wait(60) and after.reasons == {0: "length"}
    finally:
        engine.stop()


def test_stop_waits_for_the_running_requests_within_the_grace(parts):
    engine = make_engine(parts)
    engine.step_delay = 0.01
    listener, _ = request(parts, engine, ["the cat", "a dog"], 20)
    assert engine.stop(grace=60) is True
    assert listener.reasons == {0: "length", 1: "length"}
    with pytest.raises(QueueFull):
        request(parts, engine, ["blue"], 5)
