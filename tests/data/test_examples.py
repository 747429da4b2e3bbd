"""lmkit.data.examples: examples as flat arrays, cut and subset without copying, from memory or a memory map."""
import numpy as np

from lmkit.data.chat import Example
from lmkit.data.examples import ExampleSet


def _examples():
    return [Example(np.array([5, 6, 7], np.int32), np.array([0, 1, 1], np.uint8)),
            Example(np.array([8], np.int32), np.array([1], np.uint8)),
            Example(np.array([9, 10, 11, 12], np.int32), np.array([1, 0, 0, 1], np.uint8))]


def test_a_set_holds_each_example_as_it_was_given():
    examples = _examples()
    flat = ExampleSet.of(examples)
    assert len(flat) == 3 and flat.tokens == 8 and ExampleSet.of(flat) is flat
    for got, want in zip(flat, examples):
        assert isinstance(got, Example) and got.ids.dtype == np.int32 and got.weights.dtype == np.uint8
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.weights, want.weights)
    # the first id is never a target: its weight does not count
    np.testing.assert_array_equal(flat.targets(), [2, 0, 1])
    empty = ExampleSet.of([])
    assert len(empty) == 0 and empty.targets().shape == (0,)


def test_cut_and_subset_share_the_arrays_of_a_memory_map(tmp_path):
    flat = ExampleSet.of(_examples())
    ids_path, weights_path = tmp_path / "ids.bin", tmp_path / "weights.bin"
    flat.ids.astype(np.uint16).tofile(ids_path)
    flat.weights.tofile(weights_path)
    mapped = ExampleSet(np.memmap(ids_path, np.uint16, "r"), np.memmap(weights_path, np.uint8, "r"), flat.starts,
                        flat.lengths)
    cut = mapped.cut(2)
    np.testing.assert_array_equal(cut.lengths, [2, 1, 2])
    np.testing.assert_array_equal(cut.targets(), [1, 0, 0])
    np.testing.assert_array_equal(cut[2].ids, [9, 10])
    assert cut.ids is mapped.ids  # nothing copied
    picked = cut.subset([0, 2])
    assert [list(e.ids) for e in picked] == [[5, 6], [9, 10]]
    held = picked.in_memory()
    assert not isinstance(held.ids, np.memmap) and [list(e.weights) for e in held] == [[0, 1], [1, 0]]


def test_target_weights_are_summed_in_chunks_of_examples(monkeypatch):
    from lmkit.data import examples as module
    monkeypatch.setattr(module, "_CHUNK", 2)  # every chunk boundary and a last, partial chunk
    rng = np.random.default_rng(0)
    many = [Example(rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 2, n).astype(np.uint8))
            for n in rng.integers(1, 7, 11)]
    np.testing.assert_array_equal(ExampleSet.of(many).targets(), [float(e.weights[1:].sum()) for e in many])
