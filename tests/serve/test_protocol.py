"""Request checks: each bad field is one 400 naming it, with OpenAI's error shape."""
import pytest

from lmkit.serve.protocol import ApiError, chunk, error_body, parse_body, parse_chat, parse_completion


@pytest.mark.parametrize("raw, words", [(b"\xff", "UTF-8"), (b"{", "not valid JSON"), (b"[]", "not an object"),
                                        (b'{"a": NaN}', "not valid JSON"),
                                        (b"[" * 100000, "not valid JSON")])
def test_a_body_that_is_not_a_json_object_is_a_400(raw, words):
    with pytest.raises(ApiError, match=words) as caught:
        parse_body(raw)
    assert caught.value.status == 400


@pytest.mark.parametrize("body, param", [
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"), ({"prompt": "a", "max_tokens": "3"}, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, "temperature"), ({"prompt": "a", "top_p": 1.5}, "top_p"),
    ({"prompt": "a", "n": 0}, "n"), ({"prompt": "a", "stop": [""]}, "stop"), ({"prompt": "a", "extra": 1}, "extra"),
    ({"prompt": [1, True]}, "prompt"), ({"prompt": []}, "prompt"), ({}, "prompt"),
    ({"prompt": "a", "seed": -1}, "seed"), ({"prompt": "a", "logprobs": 50}, "logprobs"),
    ({"prompt": "a", "stream": True, "echo": True}, "echo")])
def test_a_bad_completion_field_is_a_400_naming_it(body, param):
    with pytest.raises(ApiError) as caught:
        parse_completion(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_good_requests_read_back_with_openais_defaults():
    params = parse_completion({"prompt": ["a", [1, 2]], "stop": "x", "top_k": -1, "seed": 3})
    assert params.prompts == ["a", [1, 2]] and params.stop == ["x"] and params.top_k is None
    assert (params.temperature, params.top_p, params.n, params.max_tokens) == (1.0, 1.0, 1, None)
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5,
                       "stream": True, "stream_options": {"include_usage": True}})
    assert chat.chat and chat.max_tokens == 5 and chat.logprobs is None and chat.include_usage
    for bad in ({"messages": [{"role": "user", "content": 5}]},
                {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}):
        with pytest.raises(ApiError):
            parse_chat(bad)
    assert error_body(404, "no")["error"] == {"message": "no", "type": "not_found_error", "param": None, "code": None}
    assert chunk(chat, "m", "id", []).startswith('data: {"id": "id", "object": "chat.completion.chunk"')
