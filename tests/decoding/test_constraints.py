"""lmkit.decoding.constraints: the rules on the next token, against a NumPy reading of each rule."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.decoding.constraints import Constraints, is_end

NEG_INF = -np.inf


def apply(rules, ids, length, prompt_lengths, max_length=8, ends=(2,), min_new=None):
    log_probs = np.zeros((len(ids), 1, 6), np.float32)  # [batch, width 1, vocab 6]
    out = rules.apply(tf.constant(log_probs), tf.constant(np.array(ids, np.int32)[:, np.newaxis]), tf.constant(length),
                      tf.constant(np.array(prompt_lengths, np.int32)), max_length, ends,
                      None if min_new is None else tf.constant(np.array(min_new, np.int32)))
    return out.numpy()[:, 0]  # [batch, vocab]


def test_no_repeated_ngram_forbids_the_tokens_that_would_complete_one_already_written():
    ids = [[1, 3, 4, 1, 3, 0, 0, 0]]  # 5 written: after "1 3" came 4, and the last two tokens are "1 3"
    allowed = apply(Constraints(no_repeat_ngram_size=3), ids, 5, [1])
    assert np.isinf(allowed[0]).nonzero()[0].tolist() == [4]
    allowed = apply(Constraints(no_repeat_ngram_size=1), ids, 5, [1])  # no token twice: 1, 3 and 4 are written
    assert np.isinf(allowed[0]).nonzero()[0].tolist() == [1, 3, 4]


def test_forced_tokens_and_the_end_held_back():
    ids = [[5, 0, 0, 0, 0, 0, 0, 0], [5, 5, 0, 0, 0, 0, 0, 0]]
    first = apply(Constraints(forced_first_id=4), ids, 1, [1, 2])
    assert np.isfinite(first[0]).nonzero()[0].tolist() == [4] and np.isfinite(first[1]).all()  # row 1: in prompt
    last = apply(Constraints(forced_last_id=2), ids, 7, [1, 2])
    assert all(np.isfinite(row).nonzero()[0].tolist() == [2] for row in last)  # the last position of 8
    held = apply(Constraints(), ids, 2, [1, 2], ends=(2, 3), min_new=[3, 0])
    assert np.isinf(held[0, [2, 3]]).all() and np.isfinite(held[1]).all()
    limited = apply(Constraints(vocab_limit=4), ids, 2, [1, 1])
    assert np.isinf(limited[:, 4:]).all() and np.isfinite(limited[:, :4]).all()


def test_settings_are_checked_and_reported():
    assert not Constraints().active and Constraints(vocab_limit=3).active
    assert Constraints(no_repeat_ngram_size=2, vocab_limit=3).get_config() == \
        {"no_repeat_ngram_size": 2, "forced_first_id": None, "forced_last_id": None}
    for rules, message in [(dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size = -1 must be an integer >= 0"),
                           (dict(forced_first_id="a"), "forced_first_id = 'a' must be a token id"),
                           (dict(vocab_limit=0), "vocab_limit = 0 must be the number of ids")]:
        with pytest.raises(UsageError, match=message):
            Constraints(**rules)
    assert is_end(tf.constant([1, 2, 3]), (2, 3)).numpy().tolist() == [False, True, True]
    assert not is_end(tf.constant([1, 2]), ()).numpy().any()
