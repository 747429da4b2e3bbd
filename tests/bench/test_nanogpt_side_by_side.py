"""benchmarks/nanogpt_side_by_side.py: nanoGPT's ids, the shared validation windows, the loop's timing."""

import pickle

import numpy as np
import pytest

from benchmarks import nanogpt_side_by_side as bench


def test_the_ids_are_nanogpts_character_scheme(tmp_path):
    """data/shakespeare_char/prepare.py: the sorted characters, the first 90% to train on, uint16 files."""
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 3
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    sizes = bench.write_ids(str(tmp_path / "input.txt"), str(tmp_path / "data"))
    chars = sorted(set(text))
    split = int(len(text) * 0.9)
    assert sizes == {"characters": len(text), "vocab_size": len(chars), "train_ids": split,
                     "val_ids": len(text) - split}
    train = np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "data" / "val.bin", dtype=np.uint16)
    assert "".join(chars[i] for i in train) == text[:split] and "".join(chars[i] for i in val) == text[split:]
    with open(tmp_path / "data" / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    assert meta["vocab_size"] == len(chars) and meta["stoi"] == {c: i for i, c in enumerate(chars)}
    assert bench.read_ids(str(tmp_path / "data"), "val.bin").dtype == np.int32


def test_both_sides_are_evaluated_on_every_non_overlapping_window():
    """The windows of lmkit's Evaluator with one row: window k is ids[64k : 64k + 65]."""
    val = np.arange(64 * 5 + 3, dtype=np.int32)
    windows = bench.eval_windows(val)
    assert windows.shape == (5, 65)
    np.testing.assert_array_equal(windows[:, 0], np.arange(5) * 64)
    np.testing.assert_array_equal(windows[2], val[128:193])
    from lmkit.data.batching import BpttBatches  # what the Evaluator reads with batch_size 1
    inputs = np.stack([x[0] for x, _ in BpttBatches(val, 1, 64)])
    np.testing.assert_array_equal(inputs, windows[:, :-1])


def test_the_loop_is_timed_from_the_first_steps_end_to_the_last():
    """Steps 2..N over the time from step 1's end (start-up and compilation left out), and the median of
    the intervals, which a burst of load moves less."""
    marks = [(11, 1.0), (21, 2.0), (31, 7.0), (41, 8.0)]  # one slow interval
    speed = bench._loop_speed(marks, start=0.0, steps=41, interval=10)
    assert speed["steps_per_sec"] == pytest.approx(40 / 8.0)
    assert speed["interval_steps_per_sec"] == pytest.approx(10.0)  # intervals: 10, 10, 2, 10 steps/s


def test_nanogpts_and_lmkits_lines_are_read():
    match = bench.ITER_LINE.match("iter 1999: loss 1.6717, time 45.49ms, mfu 0.01%")
    assert match and (match.group(1), match.group(2), match.group(3)) == ("1999", "1.6717", "45.49")
    match = bench.STEP_LINE.match("step 2000/2000 | loss 1.7001 | lr 0.0001 | 14,402 tokens/s | MFU - | eta 0s")
    assert match and (match.group(1), match.group(3)) == ("2000", "1.7001")


def test_a_folder_that_is_not_a_nanogpt_checkout_is_named(tmp_path):
    (tmp_path / "input.txt").write_text("abc", encoding="utf-8")
    args = bench.parse_args(["--nanogpt", str(tmp_path), "--text", str(tmp_path / "input.txt")])
    with pytest.raises(SystemExit, match="is not a nanoGPT checkout"):
        bench._check(args)
    args = bench.parse_args(["--frameworks", "lmkit", "--text", str(tmp_path / "input.txt"), "--steps", "50"])
    with pytest.raises(SystemExit, match="more than the recipe's 100 warmup steps"):
        bench._check(args)
