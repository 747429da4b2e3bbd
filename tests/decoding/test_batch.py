"""lmkit.decoding.batch: token-id prompts checked against the model and padded into one batch; DecodeResult."""

from __future__ import annotations

import numpy as np
import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.batch import DecodeResult, PromptBatch, check_seed, end_ids, prepare_prompts


class Model:
    vocab_size = 8


def test_prompts_are_padded_after_the_start_id_and_the_pad_id_defaults_to_the_first_end():
    ids, lengths, pad = prepare_prompts(Model(), 5, batch_size=None, prompts=[[3], [4, 5, 6]], eos_id=[2, 7],
                                        start_id=1, pad_id=None)
    np.testing.assert_array_equal(ids, [[1, 3, 2, 2, 2], [1, 4, 5, 6, 2]])
    assert lengths.tolist() == [2, 4] and pad == 2 and ids.dtype == np.int32
    ids, lengths, pad = prepare_prompts(Model(), 3, batch_size=2, prompts=None, eos_id=None, start_id=4, pad_id=None)
    np.testing.assert_array_equal(ids, [[4, 0, 0], [4, 0, 0]])  # no end id: padding 0
    assert lengths.tolist() == [1, 1] and pad == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[[1], [8]]), r"prompt 1 token = 8 is not a token id of the model \(vocab_size 8\)"),
    (dict(prompts=[[1] * 6]), "prompt 0 has 6 tokens .* more than max_length = 5; raise max_length"),
    (dict(prompts=[[1]], pad_id=9), "pad_id = 9 is not a token id"),
    (dict(prompts=None, batch_size=None), "give batch_size or prompts"),
    (dict(prompts=None, batch_size=1), "without prompts every sequence needs a first token"),
    (dict(prompts=[1, 2]), r"wrap a single prompt: prompts=\[\[...\]\]"),
    (dict(prompts=[[1]], batch_size=3), "batch_size = 3 but 1 prompts were given"),
    (dict(prompts=[[1], []]), "prompt 1 is empty; give it a first token or pass start_id"),
])
def test_bad_prompts_and_ids_are_named(kwargs, message):
    options = {**dict(batch_size=None, eos_id=None, start_id=None, pad_id=None), **kwargs}
    with pytest.raises(UsageError, match=message):
        prepare_prompts(Model(), 5, **options)


def test_end_ids_seeds_and_results():
    assert end_ids(None) == () and end_ids(3) == (3,) and end_ids([4, 3, 4]) == (4, 3)
    assert end_ids(np.array([2, 5])) == (2, 5)
    with pytest.raises(UsageError, match=r"eos_id = \[\] must be a token id or a non-empty list"):
        end_ids([])
    assert check_seed(5) == 5 and 0 <= check_seed(None) < 2 ** 31
    with pytest.raises(UsageError, match=r"seed = 1.5 must be an integer in \[0, 2\*\*63\)"):
        check_seed(1.5)
    result = DecodeResult(ids=np.array([[1, 2, 3, 0], [1, 4, 0, 0]]), lengths=np.array([3, 2]),
                          prompt_lengths=np.array([1, 1]), log_probs=np.zeros(2), seed=None)
    assert result.sequences() == [[1, 2, 3], [1, 4]] and result.sequences(include_prompt=False) == [[2, 3], [4]]
    batch = PromptBatch(np.zeros((2, 6), np.int32), np.array([1, 2]), 0, (3,), np.array([0, 2]))
    assert batch.max_length == 6 and batch.holds_ends
    assert not PromptBatch(np.zeros((1, 6), np.int32), np.array([1]), 0, (), np.array([2])).holds_ends  # no end
