"""The HTTP face of the server: an ASGI app (Starlette) speaking the OpenAI API.

    from lmkit.serve import create_app
    app = create_app("runs/plays", max_batch=16)       # then: uvicorn.run(app, port=8000)

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(``stream: true``: server-sent events ending ``data: [DONE]``), ``GET /health``,
``GET /metrics`` (Prometheus text) and ``GET /``, the playground. Every
error is OpenAI's JSON (:mod:`lmkit.serve.protocol`); nothing a client sends
ends the server: an exception in a handler is a 500 for that request alone,
and a request whose client leaves is cancelled, freeing its slot at the
engine's next step. :func:`drain` is the graceful stop ``lmkit serve`` runs on
SIGTERM: new requests get 503 while the running ones finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import threading
import time
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Tuple

from lmkit.serve import protocol
from lmkit.serve.engine import QueueFull
from lmkit.serve.protocol import ApiError
from lmkit.serve.server import Collector, ServeOptions, Server

__all__ = ["create_app", "drain"]

_STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "playground.html")
#: Seconds a client is told to wait after a 429.
RETRY_AFTER = 1


def create_app(model_dir: str, options: Optional[ServeOptions] = None, **settings: Any) -> Any:
    """The ASGI app serving ``model_dir`` (an lmkit run or a Hugging Face folder of a language model).

    Args:
      model_dir: the model folder.
      options: a :class:`~lmkit.serve.server.ServeOptions`; ``**settings`` are its fields as keywords
        (``max_batch=8, api_key="..."``) and win over it.

    Returns:
      A Starlette app; its ``state.server`` is the :class:`~lmkit.serve.server.Server`. The engine
      starts with the app's lifespan (uvicorn, or Starlette's ``TestClient`` as a context manager).
    """
    import dataclasses

    from starlette.applications import Starlette
    from starlette.routing import Route
    server = Server(model_dir, dataclasses.replace(options or ServeOptions(), **settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await asyncio.to_thread(server.warm_up)
        server.engine.start()
        yield
        await asyncio.to_thread(server.engine.stop, 0.0)

    routes = [Route("/", _playground, methods=["GET"]), Route("/health", _health, methods=["GET"]),
              Route("/metrics", _metrics, methods=["GET"]), Route("/v1/models", _guarded(_models), methods=["GET"]),
              Route("/v1/completions", _guarded(_completions), methods=["POST"]),
              Route("/v1/chat/completions", _guarded(_chat), methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server, app.state.draining = server, False
    return app


def drain(app: Any, grace: float) -> bool:
    """Stops taking requests (503) and waits up to ``grace`` seconds for the running ones to finish, then ends
    the rest; returns True when all finished in time."""
    app.state.draining = True
    return app.state.server.engine.stop(grace)


def _error(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> Any:
    from starlette.responses import JSONResponse
    headers = {"Retry-After": str(RETRY_AFTER)} if status in (429, 503) else None
    return JSONResponse(protocol.error_body(status, message, param, code), status_code=status, headers=headers)


def _guarded(handler: Callable[[Any, Server], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """``handler`` behind the key, the drain and the error shape; each answer counted by status."""
    async def endpoint(request: Any) -> Any:
        server: Server = request.app.state.server
        try:
            _check_key(request, server.options.api_key)
            if request.app.state.draining or server.engine.error is not None:
                raise ApiError(503, "the server is shutting down; retry on another replica or later",
                               code="shutting_down")
            response = await handler(request, server)
        except ApiError as exc:
            response = _error(exc.status, exc.message, exc.param, exc.code)
        except Exception as exc:  # noqa: BLE001 - one request fails, the server stays up
            response = _error(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
        server.metrics.request(response.status_code)
        return response
    return endpoint


def _check_key(request: Any, key: Optional[str]) -> None:
    if not key:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not token or not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key "
                            "lmkit serve was started with (--api_key or LMKIT_API_KEY)", code="invalid_api_key")


async def _body(request: Any) -> Dict[str, Any]:
    """The request's JSON object, refused past :data:`~lmkit.serve.protocol.MAX_BODY` bytes (413)."""
    too_big = ApiError(413, f"the request body is over {protocol.MAX_BODY} bytes; send a shorter prompt",
                       code="body_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > protocol.MAX_BODY:
        raise too_big
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > protocol.MAX_BODY:
            raise too_big
        chunks.append(part)
    return protocol.parse_body(b"".join(chunks))


def _check_model(params: protocol.Params, server: Server) -> None:
    if params.model is not None and params.model != server.model_name:
        raise ApiError(404, f"model {params.model!r} is not served here; this server serves {server.model_name!r} "
                            "(GET /v1/models)", "model", "model_not_found")


async def _models(request: Any, server: Server) -> Any:
    from starlette.responses import JSONResponse
    return JSONResponse({"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                                     "owned_by": "lmkit", "max_model_len": server.context}]})


async def _completions(request: Any, server: Server) -> Any:
    return await _generate(request, server, protocol.parse_completion(await _body(request)))


async def _chat(request: Any, server: Server) -> Any:
    return await _generate(request, server, protocol.parse_chat(await _body(request)))


class _Carrier:
    """Carries events from the engine's thread onto one event loop: one wake-up of the loop takes all the
    events that came since the last (a decode step's, for every running request), not one each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.lock = loop, threading.Lock()
        self.pending: List[Tuple["asyncio.Queue[Any]", Any]] = []

    def put(self, queue: "asyncio.Queue[Any]", item: Any) -> None:
        with self.lock:
            self.pending.append((queue, item))
            if len(self.pending) > 1:  # a wake-up is on its way
                return
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for queue, item in pending:
            queue.put_nowait(item)


_carriers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Carrier]" = weakref.WeakKeyDictionary()


class _Events:
    """The engine's events of one request, carried onto the event loop."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.carrier = _carriers.get(loop) or _carriers.setdefault(loop, _Carrier(loop))
        self.queue: "asyncio.Queue[Any]" = asyncio.Queue()

    def __call__(self, sequence: Any, text: str, tokens: Any, entries: Any, reason: Optional[str]) -> None:
        self.carrier.put(self.queue, (sequence.index, text, entries, reason))


async def _generate(request: Any, server: Server, params: protocol.Params) -> Any:
    _check_model(params, server)
    sequences = await asyncio.to_thread(server.sequences, params)
    events = _Events()
    try:
        handle = server.engine.submit(sequences, events, server.options.request_timeout)
    except QueueFull as exc:
        raise ApiError(429, f"the server is busy ({exc}); retry after {RETRY_AFTER} s", code="queue_full") from None
    collector = Collector(server, params, sequences)
    rid = protocol.new_id(params.chat)
    if params.stream:
        from starlette.responses import StreamingResponse
        return StreamingResponse(_stream(server, params, collector, events, handle, rid),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        while not collector.done:
            try:
                collector.add(*await asyncio.wait_for(events.queue.get(), 0.5))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise ApiError(499, "the client closed the connection", code="client_closed") from None
    finally:
        if not collector.done:  # the client left, or the handler failed: free the slots
            server.engine.cancel(handle)
    _raise_failure(collector.failure())
    choices = await asyncio.to_thread(collector.choices)
    from starlette.responses import JSONResponse
    return JSONResponse(protocol.completion_response(params, server.model_name, rid, choices, collector.usage()))


def _raise_failure(failure: Optional[str]) -> None:
    if failure == "timeout":
        raise ApiError(504, "the request took longer than the server's --request_timeout; ask for fewer tokens",
                       code="timeout")
    if failure == "error":
        raise ApiError(500, "the engine failed; see the server's log", code="engine_error")
    if failure == "cancelled":
        raise ApiError(503, "the server stopped before the request finished", code="shutting_down")


async def _stream(server: Server, params: protocol.Params, collector: Collector, events: _Events, handle: Any,
                  rid: str) -> AsyncIterator[str]:
    """Server-sent events: one chunk per event of the engine, then ``data: [DONE]``; a client that leaves
    cancels the request (its slots free at the engine's next step)."""
    name = server.model_name
    try:
        if params.chat:  # the role comes first, as OpenAI streams it
            yield protocol.chunk(params, name, rid, [{"index": s.index, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}
                                                     for s in collector.sequences])
        while not collector.done:
            index, text, entries, reason = await events.queue.get()
            collector.add(index, text, entries, reason)
            if reason in ("timeout", "error", "cancelled"):
                status = {"timeout": 504, "error": 500, "cancelled": 503}[reason]
                yield f"data: {_json(protocol.error_body(status, f'the request ended: {reason}', code=reason))}\n\n"
                break
            if text or reason:
                piece = {"delta": {"content": text} if text else {}} if params.chat else {"text": text}
                yield protocol.chunk(params, name, rid, [{"index": index, **piece, "logprobs": None,
                                                          "finish_reason": reason}])
        if params.include_usage and collector.failure() is None:
            yield protocol.chunk(params, name, rid, [], collector.usage())
        yield "data: [DONE]\n\n"
    finally:
        if not collector.done:
            server.engine.cancel(handle)


def _json(value: Any) -> str:
    import json
    return json.dumps(value, ensure_ascii=False)


async def _health(request: Any) -> Any:
    from starlette.responses import JSONResponse
    server: Server = request.app.state.server
    if request.app.state.draining or server.engine.error is not None:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(request: Any) -> Any:
    from starlette.responses import PlainTextResponse
    return PlainTextResponse(request.app.state.server.metrics.render(),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


async def _playground(request: Any) -> Any:
    from starlette.responses import HTMLResponse
    with open(_STATIC, encoding="utf-8") as f:
        return HTMLResponse(f.read())


def serve_forever(app: Any, host: str, port: int, grace: float, log: Callable[[str], None] = print) -> bool:
    """Runs ``app`` under uvicorn until SIGTERM or SIGINT: then :func:`drain` (``grace`` seconds), and returns
    whether every running request finished. A second signal stops at once."""
    import uvicorn

    class _Server(uvicorn.Server):
        finished = True
        draining: Optional[threading.Thread] = None

        def handle_exit(self, sig: int, frame: Any) -> None:  # noqa: ARG002 - signal handler
            if self.draining is not None:  # a second signal: now
                self.should_exit = self.force_exit = True
                return
            log(f"lmkit serve: stopping: finishing the running requests (up to --grace {grace:g} s); new ones get 503")

            def run() -> None:
                started = time.monotonic()
                self.finished = drain(app, grace)
                log(f"lmkit serve: {'all requests finished' if self.finished else 'grace ran out'} after "
                    f"{time.monotonic() - started:.1f} s; exiting")
                self.should_exit = True
            self.draining = threading.Thread(target=run, daemon=True)
            self.draining.start()

    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5))
    server.run()
    return server.finished
