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
