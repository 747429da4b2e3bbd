"""The synthetic transduction tasks: exact targets, held-out sources, the same files for the same seed."""
import pytest

from lmkit.core.errors import UsageError
from lmkit.data.synthetic import make_pairs, write_task


def _numbers(text):
    return [int(word[1:]) for word in text.split()]


@pytest.mark.parametrize("task, rule", [("copy", list), ("reverse", lambda s: s[::-1]), ("sort", sorted)])
def test_each_task_maps_its_sources_exactly(task, rule):
    pairs = make_pairs(task, 200, symbols=7, min_length=2, max_length=9, seed=4)
    assert len({source for source, _ in pairs}) == 200
    for source, target in pairs:
        numbers = _numbers(source)
        assert 2 <= len(numbers) <= 9 and all(0 <= n < 7 for n in numbers)
        assert _numbers(target) == rule(numbers)


def test_held_out_splits_never_repeat_a_training_source(tmp_path):
    paths = write_task(str(tmp_path / "a"), "reverse", train=300, valid=40, test=40, symbols=5, max_length=5)
    sources = {split: open(paths[f"{split}_src"]).read().splitlines() for split in ("train", "valid", "test")}
    assert [len(sources[s]) for s in ("train", "valid", "test")] == [300, 40, 40]
    assert not set(sources["train"]) & (set(sources["valid"]) | set(sources["test"]))
    assert not set(sources["valid"]) & set(sources["test"])
    again = write_task(str(tmp_path / "b"), "reverse", train=300, valid=40, test=40, symbols=5, max_length=5)
    assert all(open(paths[k]).read() == open(again[k]).read() for k in paths)  # the seed decides


def test_bad_task_settings_are_named():
    with pytest.raises(UsageError, match="unknown task 'revers'; did you mean 'reverse'"):
        make_pairs("revers", 10)
    with pytest.raises(UsageError, match="too many to draw"):
        make_pairs("copy", 100, symbols=2, min_length=1, max_length=3)
    with pytest.raises(UsageError, match="max_length 2 is below min_length 3"):
        make_pairs("copy", 10, max_length=2)
