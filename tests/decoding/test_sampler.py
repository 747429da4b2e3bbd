"""The XLA-compiled decode loop (the default with the cache) against the plain tf.function loop.

Same tokens for greedy and beam search, the same samples for a fixed seed,
on the LSTM and the transformer; prompts of different lengths in one batch
decode as each prompt alone; a second call with other prompts of the same
batch size and length reuses the compiled loop (no new trace).
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import decoding
from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.decoding.loop import trace_count
from lmkit.models import build_model

VOCAB = 60


@pytest.fixture(scope="module")
def models():
    dist.init(backend="local")
    tf.random.set_seed(3)
    common = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, init_scale=0.5, dropout=0.0)
    return {"lstm": build_model({"model": "lstm", **common}),
            "transformer": build_model({"model": "transformer", "num_heads": 4, "max_positions": 40, **common})}


PROMPTS = [[5], [7, 8, 9], [11, 12, 13, 14, 15, 16]]
SAMPLERS = [("greedy", {}), ("sample", {"temperature": 1.0}), ("top_k", {"k": 5}), ("top_p", {"p": 0.8})]


@pytest.mark.parametrize("model_name", ["lstm", "transformer"])
@pytest.mark.parametrize("name, kwargs", SAMPLERS)
@pytest.mark.parametrize("seed", [11, 2 ** 40 + 3, 2 ** 62 + 5])  # large seeds: the windows after the first
def test_xla_gives_the_tokens_of_the_plain_loop(models, model_name, name, kwargs, seed):
    model = models[model_name]
    sampler = decoding.get_sampler(name, **kwargs)
    runs = [decoding.decode(model, 24, sampler, prompts=PROMPTS * 2, eos_id=3, seed=seed, jit_compile=jit)
            for jit in (False, True)]
    np.testing.assert_array_equal(runs[1].ids, runs[0].ids)
    np.testing.assert_array_equal(runs[1].lengths, runs[0].lengths)
    np.testing.assert_allclose(runs[1].log_probs, runs[0].log_probs, rtol=1e-4, atol=1e-4)
    assert (runs[0].ids[:, 8:] != 0).any()  # it generated something


@pytest.mark.parametrize("model_name, scoring, early_stopping", [("lstm", "gnmt", None),
                                                                 ("transformer", "gnmt", None),
                                                                 ("transformer", "transformers", False)])
def test_xla_beam_search_equals_the_plain_loop(models, model_name, scoring, early_stopping):
    model = models[model_name]
    sampler = decoding.BeamSampler(3, 0.6, scoring=scoring, early_stopping=early_stopping)
    runs = [decoding.decode(model, 20, sampler, prompts=PROMPTS, eos_id=3, jit_compile=jit) for jit in (False, True)]
    np.testing.assert_array_equal(runs[1].beam_ids, runs[0].beam_ids)
    np.testing.assert_allclose(runs[1].beam_scores, runs[0].beam_scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_name", ["lstm", "transformer"])
def test_mixed_prompt_lengths_decode_as_each_prompt_alone(models, model_name):
    model = models[model_name]
    together = decoding.decode(model, 24, prompts=PROMPTS).sequences(include_prompt=True)
    alone = [decoding.decode(model, 24, prompts=[p]).sequences(include_prompt=True)[0] for p in PROMPTS]
    assert together == alone


def test_a_second_call_with_other_prompts_is_not_compiled_again(models):
    model = models["transformer"]
    sampler = decoding.get_sampler("top_k", k=5)
    decoding.decode(model, 16, sampler, prompts=[[1, 2], [3]], seed=1)
    before = trace_count()
    again = decoding.decode(model, 16, sampler, prompts=[[4, 5, 6], [7, 8]], seed=2)
    # A new sampler object with the same settings (the first is still alive: no reused id).
    fresh = decoding.get_sampler("top_k", k=5)
    assert fresh is not sampler
    fresh_sampler = decoding.decode(model, 16, fresh, prompts=[[9], [10]], seed=3)
    greedy = [decoding.decode(model, 16, prompts=[[p], [p + 1]]) for p in (1, 5)]  # a new GreedySampler each
    assert trace_count() == before + 1  # the greedy loop, once
    assert again.ids.shape == fresh_sampler.ids.shape == greedy[1].ids.shape == (2, 16)
    # Another batch size is another shape: compiled once more.
    decoding.decode(model, 16, sampler, prompts=[[1]], seed=1)
    assert trace_count() == before + 2


def test_xla_needs_the_cache():
    with pytest.raises(UsageError, match="jit_compile=True needs compiled=True and use_cache=True"):
        decoding.decode(build_model({"model": "lstm", "vocab_size": 10, "hidden_size": 4, "num_layers": 1,
                                     "init_scale": 0.1, "dropout": 0.0}), 5, batch_size=1, start_id=1,
                        use_cache=False, jit_compile=True)
