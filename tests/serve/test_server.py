"""A folder loaded for serving: options checked, a prompt too long for the context refused with both numbers,
``n`` replies as rows of one seeded run."""
import pytest

from lmkit.core.errors import UsageError
from lmkit.serve.protocol import ApiError, parse_completion
from lmkit.serve.server import ServeOptions, Server


def test_options_out_of_range_name_the_flag():
    with pytest.raises(UsageError, match="--max_batch 0"):
        ServeOptions(max_batch=0).check()
    with pytest.raises(UsageError, match="--context 1"):
        ServeOptions(context=1).check()


def test_sequences_of_a_request(run_dir):
    server = Server(run_dir, ServeOptions(max_batch=2))
    assert server.context == 64 and server.model_name == "run"
    with pytest.raises(ApiError, match=r"70 tokens and the context holds 64") as caught:
        server.sequences(parse_completion({"prompt": "a" * 69}))
    assert caught.value.status == 400
    sequences = server.sequences(parse_completion({"prompt": ["ab", "c"], "n": 2, "seed": 9, "max_tokens": 99}))
    assert [(s.index, s.sampling.row, s.sampling.seed) for s in sequences] == [(0, 0, 9), (1, 1, 9), (2, 2, 9),
                                                                              (3, 3, 9)]
    assert sequences[0].max_tokens == 64 - 3 and len(sequences[2].ids) == 2
    with pytest.raises(ApiError, match="--chat_template"):
        server.sequences(parse_completion({"prompt": "a"}).__class__(None, messages=[{"role": "user",
                                                                                        "content": "hi"}]))


def test_a_steps_events_reach_the_event_loop_in_order_with_one_wake_up():
    import asyncio
    import threading

    from lmkit.serve.app import _Carrier

    async def main():
        loop = asyncio.get_running_loop()
        carrier = _Carrier(loop)
        wake_ups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wake_ups.append(a), real(*a))[1]
        queues = [asyncio.Queue(), asyncio.Queue()]
        # The engine's thread hands out a step's events while the loop is busy: one wake-up takes them all.
        thread = threading.Thread(target=lambda: [carrier.put(queues[i % 2], i) for i in range(6)])
        thread.start()
        thread.join()
        got = [[await asyncio.wait_for(q.get(), 10) for _ in range(3)] for q in queues]
        carrier.put(queues[0], 6)  # the next step's: a wake-up of its own
        got[0].append(await asyncio.wait_for(queues[0].get(), 10))
        return got, len(wake_ups)

    got, wake_ups = asyncio.run(main())
    assert got == [[0, 2, 4, 6], [1, 3, 5]] and wake_ups == 2
