"""Serving a model over HTTP, as the OpenAI API: ``lmkit serve`` and :func:`create_app`.

    from lmkit.serve import create_app
    app = create_app("runs/plays", max_batch=16, api_key="...")   # an ASGI app (Starlette)

The parts, each in its module: :mod:`~lmkit.serve.protocol` (request and
response shapes, errors), :mod:`~lmkit.serve.engine` (continuous batching,
free of HTTP), :mod:`~lmkit.serve.slots` (the model's cache of slots, the
compiled step and prefill), :mod:`~lmkit.serve.text` (prompts, replies and
stop strings), :mod:`~lmkit.serve.server` (a folder loaded for serving),
:mod:`~lmkit.serve.metrics` (Prometheus text), :mod:`~lmkit.serve.app` (the
routes) and :mod:`~lmkit.serve.saved_model` (a SavedModel with the decode loop
inside). Needs the ``serve`` extra (``pip install 'lmkit[serve]'``: Starlette and uvicorn).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(model_dir: str, options: Any = None, **settings: Any) -> Any:
    """The ASGI app serving ``model_dir``: :func:`lmkit.serve.app.create_app`."""
    from lmkit.serve.app import create_app as build
    return build(model_dir, options, **settings)
