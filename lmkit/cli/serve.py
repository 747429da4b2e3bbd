"""``lmkit serve``: a model folder behind an OpenAI-compatible HTTP API, with a playground at ``/``.

    lmkit serve --model_dir runs/plays --port 8000
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"prompt": "ROMEO:", "max_tokens": 40, "temperature": 0}'

--model_dir is an lmkit run or a Hugging Face folder of a language model
(any family). Requests share decode steps: up to --max_batch sequences in one
preallocated cache (continuous batching), up to --max_queue more waiting
(then 429). With --api_key (or LMKIT_API_KEY) every API request must send
``Authorization: Bearer KEY``. On SIGTERM or SIGINT the server answers new
requests with 503, finishes the running ones within --grace seconds, and
exits 0. docs/serving.md has the API, the metrics and the security notes.

Exit status: 0 stopped by a signal, 2 bad input (one ``error:`` line), 1 a crash.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from lmkit.cli.common import model_dir_parser, user_modules_importable
from lmkit.core.errors import UsageError

__all__ = ["build_parser", "main"]

_LOCAL = ("127.0.0.1", "localhost", "::1")


def build_parser(prog: str = "lmkit serve"):
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (another than the loopback: give a key)")
    p.add_argument("--port", type=int, default=8000, help="the port to bind (0: a free one)")
    p.add_argument("--api_key", default=None, help="the Bearer token requests must send (default: LMKIT_API_KEY)")
    p.add_argument("--max_batch", type=int, default=16, help="sequences decoded side by side (cache slots)")
    p.add_argument("--max_queue", type=int, default=64, help="sequences that may wait for a slot; more get 429")
    p.add_argument("--request_timeout", type=float, default=600.0,
                   help="seconds a request may take, its wait included (0: no limit)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds the running requests get to finish after SIGTERM")
    p.add_argument("--prefill_chunk", type=int, default=64,
                   help="tokens of a prompt fed at a time between decode steps; prompts joining together share a "
                        "call of twice this (smaller: a join stalls the others less)")
    p.add_argument("--context", type=int, default=None,
                   help="positions per sequence, prompt included (default: a run's trained window, else the "
                        "model's max_positions)")
    p.add_argument("--chat_template", default=None, metavar="FILE",
                   help="a Jinja chat template for /v1/chat/completions (default: the folder's)")
    p.add_argument("--model_name", default=None, help="the model name requests give (default: the folder's name)")
    p.add_argument("--no_xla", dest="jit_compile", action="store_false",
                   help="run the decode step without XLA (slower; for models XLA cannot compile)")
    p.add_argument("--verbose", action="store_true", help="keep TensorFlow's start-up log lines")
    return p


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit serve") -> int:
    """Serves until a signal; returns the exit status (errors are raised, see ``run_main``)."""
    args = build_parser(prog).parse_args(argv)
    if not os.path.exists(args.model_dir):
        raise UsageError(f"--model_dir {args.model_dir} does not exist; pass an lmkit run or a Hugging Face folder")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} must be in [0, 65535]")
    if args.grace < 0:
        raise UsageError(f"--grace {args.grace} must be >= 0")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError("lmkit serve needs Starlette and uvicorn: pip install 'lmkit[serve]'") from None
    key = args.api_key or os.environ.get("LMKIT_API_KEY") or None
    if args.host not in _LOCAL and not key:
        sys.stderr.write(f"warning: binding {args.host} without an API key: anyone who reaches this port can use "
                         "the model; give --api_key or LMKIT_API_KEY, or bind 127.0.0.1\n")
    user_modules_importable()
    from lmkit import distributed as dist
    from lmkit.core.preemption import set_doing
    from lmkit.serve.app import create_app, serve_forever
    from lmkit.serve.server import ServeOptions

    dist.init(backend="local")
    set_doing(f"loading the model of {args.model_dir}")
    options = ServeOptions(api_key=key, max_batch=args.max_batch, max_queue=args.max_queue,
                           request_timeout=args.request_timeout, prefill_chunk=args.prefill_chunk,
                           context=args.context, chat_template=args.chat_template, model_name=args.model_name,
                           jit_compile=args.jit_compile)
    app = create_app(args.model_dir, options)
    server = app.state.server
    print(f"lmkit serve: {server.model_name} on http://{args.host}:{args.port} (context {server.context}, "
          f"{options.max_batch} slots); the playground at /, the API at /v1", flush=True)
    set_doing("serving")
    serve_forever(app, args.host, args.port, args.grace, log=lambda line: print(line, flush=True))
    return 0
