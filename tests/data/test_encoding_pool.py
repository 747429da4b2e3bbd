"""The encoding processes of the data cache: ids in order whatever the workers, and a dead worker is one
DataError wherever the pool reports it (submit, result)."""
import concurrent.futures.process
import os
import signal
import time

import numpy as np
import pytest

from lmkit.data import encoding_pool
from lmkit.data.errors import DataError
from lmkit.data.tokenizers import ByteTokenizer

DIED = "an encoding process died while encoding train_file .*LMKIT_ENCODING_WORKERS=1"


@pytest.fixture
def tokenizer_dir(tmp_path) -> str:
    folder = str(tmp_path / "tok")
    ByteTokenizer().save(folder)
    return folder


def _blocks(n: int):
    return [(f"line {k}\n", False, True) for k in range(n)]


def _kill_a_worker(pool) -> None:
    """SIGKILL one worker, as the OOM killer would, and wait until the pool has seen it die."""
    deadline = time.monotonic() + 120
    while not pool._processes and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(next(iter(pool._processes)), signal.SIGKILL)
    while not pool._broken and time.monotonic() < deadline:  # the pool's own thread notes the death
        time.sleep(0.01)
    assert pool._broken, "the pool never saw its worker die"


def test_blocks_come_back_in_order_with_the_same_ids_in_one_process_or_two(tokenizer_dir):
    got = {}
    for workers in (1, 2):
        taken = []
        with encoding_pool.encoders(workers, tokenizer_dir, True, "train_file") as pool:
            assert (pool is None) == (workers == 1)
            encoding_pool.map_blocks(_blocks(9), encoding_pool.encode_block, pool, workers, taken.append)
        got[workers] = taken
    assert [lines for _, lines, _ in got[1]] == [1] * 9
    for one, two in zip(got[1], got[2]):
        np.testing.assert_array_equal(one[0], two[0])
    assert ByteTokenizer().decode(np.concatenate([ids for ids, _, _ in got[1]])) == \
        "".join(text for text, _, _ in _blocks(9))


def test_a_worker_dead_before_submit_is_one_data_error(tokenizer_dir, monkeypatch):
    # The pool already saw the death: submit raises BrokenProcessPool (no future to ask), which used to
    # escape as a raw traceback and exit 1 (issue 55).
    raised = []
    with pytest.raises(DataError, match=DIED):
        with encoding_pool.encoders(2, tokenizer_dir, True, "train_file") as pool:
            _kill_a_worker(pool)
            real_submit = pool.submit

            def submit(*args, **kwargs):
                try:
                    return real_submit(*args, **kwargs)
                except concurrent.futures.process.BrokenProcessPool as exc:
                    raised.append(exc)
                    raise

            monkeypatch.setattr(pool, "submit", submit)
            encoding_pool.map_blocks(_blocks(3), encoding_pool.encode_block, pool, 2, lambda result: None)
    assert len(raised) == 1  # it was submit that raised


def test_a_worker_dead_while_its_block_is_in_flight_is_the_same_error(tokenizer_dir):
    def take_then_kill(pool):
        def take(result) -> None:
            if not pool._broken:
                _kill_a_worker(pool)
        return take

    with pytest.raises(DataError, match=DIED):
        with encoding_pool.encoders(2, tokenizer_dir, True, "train_file") as pool:
            encoding_pool.map_blocks(_blocks(40), encoding_pool.encode_block, pool, 2, take_then_kill(pool))


def test_workers_setting_and_id_types(monkeypatch):
    monkeypatch.setenv(encoding_pool.WORKERS_ENV, "3")
    assert encoding_pool.encoding_workers() == 3
    monkeypatch.setenv(encoding_pool.WORKERS_ENV, "zero")
    with pytest.raises(DataError, match="LMKIT_ENCODING_WORKERS = 'zero' must be a positive integer"):
        encoding_pool.encoding_workers()
    assert encoding_pool.id_dtype(1 << 16) == np.uint16 and encoding_pool.id_dtype((1 << 16) + 1) == np.uint32
