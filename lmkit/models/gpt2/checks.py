"""The checks a training config of the transformer language models (``transformer``, ``gpt2``) must pass.

Declared in the family's ``__init__.py`` as ``CONFIG_CHECK``; lmkit's config
calls it through the registry (:func:`lmkit.models.registry.check_config`)
when a config is built, before anything is trained. No TensorFlow import
here: the class is imported only when the config leaves a key it reads to
the constructor's default.
"""

from __future__ import annotations

from typing import Any

from lmkit.config import ConfigError
from lmkit.core.checks import check_heads
from lmkit.core.errors import UsageError

__all__ = ["check_config"]


def check_config(cfg: Any, source: str) -> None:
    """The heads divide the model, the training window fits the positions, the embeddings are the model's width.

    Args:
      cfg: a :class:`lmkit.config.TrainConfig` of a ``transformer`` or ``gpt2`` model.
      source: where the config comes from, for messages.

    Raises:
      ConfigError: ``<source>: <key> = <value> <why and the fix>``.
    """
    model = cfg.model
    hidden = model["hidden_size"]
    try:
        check_heads("hidden_size", hidden, model["num_heads"])
    except UsageError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if cfg.data.num_steps > model["max_positions"]:
        raise ConfigError(f"{source}: num_steps = {cfg.data.num_steps!r} exceeds max_positions = "
                          f"{model['max_positions']}; raise max_positions")
    if model.arguments.get("embedding_dim", 0) not in (0, hidden):
        raise ConfigError(f"{source}: embedding_dim = {model['embedding_dim']!r} must be 0 or hidden_size = "
                          f"{hidden}: a transformer's embeddings are as wide as the model")
