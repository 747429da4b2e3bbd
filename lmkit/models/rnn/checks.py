"""The checks a training config of the recurrent models (``lstm``, ``gru``, ``rnn_seq2seq``) must pass.

Declared in the family's ``__init__.py`` as ``CONFIG_CHECK``; lmkit's config
calls it through the registry (:func:`lmkit.models.registry.check_config`)
when a config is built. No TensorFlow import here.
"""

from __future__ import annotations

from typing import Any

from lmkit.config import ConfigError

__all__ = ["check_config"]


def check_config(cfg: Any, source: str) -> None:
    """A stated ``embedding_dim`` fits ``tie_weights`` (the softmax kernel is then the embedding table).

    Args:
      cfg: a :class:`lmkit.config.TrainConfig` of a recurrent model.
      source: where the config comes from, for messages.

    Raises:
      ConfigError: ``<source>: embedding_dim = <value> must equal hidden_size = <h> when tie_weights = True``.
    """
    model = cfg.model
    hidden = model["hidden_size"]
    if model.arguments.get("embedding_dim", 0) not in (0, hidden) and model["tie_weights"]:
        raise ConfigError(f"{source}: embedding_dim = {model['embedding_dim']!r} must equal hidden_size = {hidden} "
                          "when tie_weights = True")
