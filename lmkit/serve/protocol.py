"""The OpenAI API's request and response shapes: requests checked field by field, responses built.

A request body is read into :class:`Params` by :func:`parse_completion` or
:func:`parse_chat`; anything wrong is an :class:`ApiError` that the app sends
as OpenAI sends its errors, ``{"error": {"message", "type", "param", "code"}}``
with its HTTP status: 400 for bad JSON, a wrong type, an unknown field, a
value out of range; 404 for another model's name; 413 for a body over
:data:`MAX_BODY`; 401 for a missing or wrong key; 429 when the queue is full;
503 while the server shuts down.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["ApiError", "MAX_BODY", "Params", "chunk", "completion_response", "error_body", "parse_body",
           "parse_chat", "parse_completion"]

#: The largest request body taken, in bytes.
MAX_BODY = 1 << 20
#: Replies per prompt (``n``) at most; stop strings at most; top log-probabilities at most.
MAX_N, MAX_STOP, MAX_LOGPROBS = 16, 16, 20

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error",
                504: "timeout_error"}


class ApiError(Exception):
    """An error answered as OpenAI answers it.

    Args:
      status: the HTTP status; message: what is wrong and how to fix it; param: the field at fault;
      code: a short machine-readable code.
    """

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> Dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


@dataclasses.dataclass
class Params:
    """A checked completion or chat request.

    Attributes:
      prompts: a completion's prompts (each a text or token ids); messages: a chat's messages.
      max_tokens: None: the completion default (16) or, for a chat, the rest of the context.
      temperature: 0 greedy; top_p, top_k (None: no limit), seed (None: drawn), stop, n, stream,
      echo, logprobs (top log-probabilities per token; None: none), include_usage (a stream's last chunk).
    """

    model: Optional[str]
    prompts: List[Union[str, List[int]]] = dataclasses.field(default_factory=list)
    messages: Optional[List[Dict[str, str]]] = None
    max_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stop: List[str] = dataclasses.field(default_factory=list)
    n: int = 1
    stream: bool = False
    echo: bool = False
    logprobs: Optional[int] = None
    include_usage: bool = False

    @property
    def chat(self) -> bool:
        return self.messages is not None


def parse_body(raw: bytes) -> Dict[str, Any]:
    """The JSON object of a request body.

    Raises:
      ApiError: 400 for a body that is not UTF-8, not JSON or not an object.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8 (byte {exc.start}); send JSON in UTF-8") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
        raise ApiError(400, f"the request body is not valid JSON ({str(exc)[:100]}); send a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body is a JSON {type(body).__name__}, not an object; send {{...}}")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# field -> (the JSON types it takes, what to say)
_COMMON = {
    "model": ((str,), "a string"), "max_tokens": ((int,), "an integer >= 1"),
    "temperature": ((int, float), "a number >= 0"), "top_p": ((int, float), "a number in (0, 1]"),
    "top_k": ((int,), "an integer >= 1 (0 or -1: no limit)"), "seed": ((int,), "an integer in [0, 2**63)"),
    "stop": ((str, list), "a string or a list of strings"), "n": ((int,), f"an integer in [1, {MAX_N}]"),
    "stream": ((bool,), "true or false"), "stream_options": ((dict,), "an object"),
    "user": ((str,), "a string"), "presence_penalty": ((int, float), "0"), "frequency_penalty": ((int, float), "0"),
}
_COMPLETION = {**_COMMON, "prompt": ((str, list), "a string, a list of strings, token ids or lists of token ids"),
               "echo": ((bool,), "true or false"), "logprobs": ((int,), f"an integer in [0, {MAX_LOGPROBS}]")}
_CHAT = {**_COMMON, "messages": ((list,), "a list of {\"role\", \"content\"} objects"),
         "max_completion_tokens": ((int,), "an integer >= 1"), "logprobs": ((bool,), "true or false"),
         "top_logprobs": ((int,), f"an integer in [0, {MAX_LOGPROBS}]")}


def _check_types(body: Mapping[str, Any], fields: Mapping[str, Tuple[tuple, str]]) -> None:
    for key, value in body.items():
        if key not in fields:
            raise ApiError(400, f"unknown field {key!r}; this server takes {', '.join(sorted(fields))}", key,
                           "unknown_field")
        types, need = fields[key]
        if value is None:
            continue
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise ApiError(400, f"{key} = {json.dumps(value)[:60]} must be {need}", key, "invalid_type")


def _check(ok: bool, key: str, value: Any, need: str) -> None:
    if not ok:
        raise ApiError(400, f"{key} = {json.dumps(value)[:60]} must be {need}", key, "invalid_value")


def _common(body: Mapping[str, Any], params: Params) -> Params:
    """The fields completions and chats share, checked into ``params``."""
    get = body.get
    params.temperature = 1.0 if get("temperature") is None else float(get("temperature"))
    _check(params.temperature >= 0, "temperature", params.temperature, "a number >= 0 (0: greedy)")
    params.top_p = 1.0 if get("top_p") is None else float(get("top_p"))
    _check(0 < params.top_p <= 1, "top_p", params.top_p, "a number in (0, 1]")
    top_k = get("top_k")
    _check(top_k is None or top_k >= -1, "top_k", top_k, "an integer >= 1 (0 or -1: no limit)")
    params.top_k = top_k if top_k is not None and top_k >= 1 else None
    params.seed = get("seed")
    _check(params.seed is None or 0 <= params.seed < 2 ** 63, "seed", params.seed, "an integer in [0, 2**63)")
    params.n = 1 if get("n") is None else get("n")
    _check(1 <= params.n <= MAX_N, "n", params.n, f"an integer in [1, {MAX_N}]")
    params.stream = bool(get("stream"))
    params.include_usage = bool((get("stream_options") or {}).get("include_usage"))
    stop = get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    _check(len(stop) <= MAX_STOP and all(isinstance(s, str) and s for s in stop), "stop", get("stop"),
           f"a non-empty string or a list of at most {MAX_STOP} of them")
    params.stop = list(stop)
    for key in ("presence_penalty", "frequency_penalty"):
        _check(not get(key), key, get(key), "0 (this server has no such penalty)")
    return params


def _max_tokens(value: Any, key: str) -> Optional[int]:
    _check(value is None or value >= 1, key, value, "an integer >= 1")
    return value


def parse_completion(body: Mapping[str, Any]) -> Params:
    """A ``/v1/completions`` request.

    Raises:
      ApiError: 400 naming the field.
    """
    _check_types(body, _COMPLETION)
    if "prompt" not in body:
        raise ApiError(400, "prompt is missing: give a text, a list of texts or token ids", "prompt", "missing")
    params = _common(body, Params(body.get("model")))
    params.prompts = _prompts(body["prompt"])
    params.max_tokens = _max_tokens(body.get("max_tokens"), "max_tokens")
    params.echo = bool(body.get("echo"))
    params.logprobs = body.get("logprobs")
    _check(params.logprobs is None or 0 <= params.logprobs <= MAX_LOGPROBS, "logprobs", params.logprobs,
           f"an integer in [0, {MAX_LOGPROBS}]")
    if params.echo and params.stream:
        raise ApiError(400, "echo is not offered with stream; send one of them", "echo", "unsupported")
    return params


def _prompts(prompt: Any) -> List[Union[str, List[int]]]:
    """A completion's ``prompt`` as a list of texts and token-id lists."""
    def ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    if isinstance(prompt, str):
        return [prompt]
    if ids(prompt):
        return [list(prompt)]
    if prompt and all(isinstance(p, str) or ids(p) for p in prompt):
        return list(prompt)
    raise ApiError(400, f"prompt = {json.dumps(prompt)[:60]} must be a string, a list of strings, token ids "
                        "(integers >= 0) or lists of them, none empty", "prompt", "invalid_value")


def parse_chat(body: Mapping[str, Any]) -> Params:
    """A ``/v1/chat/completions`` request.

    Raises:
      ApiError: 400 naming the field.
    """
    _check_types(body, _CHAT)
    messages = body.get("messages")
    ok = bool(messages) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                and isinstance(m.get("content"), str) and set(m) <= {"role", "content", "name"}
                                for m in messages)
    _check(ok, "messages", messages, 'a non-empty list of {"role": "...", "content": "..."} objects')
    params = _common(body, Params(body.get("model"), messages=[{"role": m["role"], "content": m["content"]}
                                                               for m in messages]))
    given = body.get("max_completion_tokens", body.get("max_tokens"))
    params.max_tokens = _max_tokens(given, "max_completion_tokens" if "max_completion_tokens" in body
                                    else "max_tokens")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise ApiError(400, "a chat's logprobs are not offered here; use /v1/completions with logprobs",
                       "logprobs", "unsupported")
    return params


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def completion_response(params: Params, model: str, rid: str, choices: List[Dict[str, Any]],
                        usage: Dict[str, int]) -> Dict[str, Any]:
    """A whole (not streamed) response."""
    return {"id": rid, "object": "chat.completion" if params.chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage}


def chunk(params: Params, model: str, rid: str, choices: List[Dict[str, Any]],
          usage: Optional[Dict[str, int]] = None) -> str:
    """One server-sent event of a stream: ``data: {...}`` and a blank line."""
    body = {"id": rid, "object": "chat.completion.chunk" if params.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def logprobs_object(tokens: Sequence[str], token_logprobs: Sequence[Optional[float]],
                    top: Sequence[Optional[Dict[str, float]]], start: int = 0) -> Dict[str, Any]:
    """The completions API's ``logprobs``: tokens, their log-probabilities, the top ones, text offsets."""
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": list(tokens), "token_logprobs": list(token_logprobs), "top_logprobs": list(top),
            "text_offset": offsets}
