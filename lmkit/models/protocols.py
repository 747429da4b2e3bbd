"""The language-model protocol that the trainer, generation and checkpoints rely on.

A language model is a ``tf.Module`` with ``vocab_size``, ``stateful``,
``initial_state(batch_size, max_length=None)``,
``__call__(ids, state=None, training=False) -> (logits, state)``,
``step(ids, state) -> (logits, state)``, ``reorder_state(state, indices)``
and ``get_config()``: ``{"model": <its registered name>, <constructor
argument>: value}``, which ``lmkit.models.build_model`` turns back into the
model. Subclass :class:`LanguageModel` to plug a model into lmkit
(``docs/design.md``).

Every state tensor has the batch as its first dimension, so
``reorder_state`` gathers rows of every tensor of the state.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_non_negative_int
from lmkit.layers.base import Module, Training

__all__ = ["LanguageModel", "State", "check_window", "embedding_dim_of"]

State = Any  # a nest of tensors, each [batch, ...]


def embedding_dim_of(embedding_dim: int, hidden_size: int) -> int:
    """``embedding_dim``, where 0 means ``hidden_size``."""
    return check_non_negative_int("embedding_dim", embedding_dim,
                                  f"0 means hidden_size = {hidden_size}") or hidden_size


def check_window(ids: Any, state: Any, max_positions: int) -> tf.Tensor:
    """``ids`` as a tensor; a training window (no state) longer than ``max_positions`` is refused.

    Raises:
      UsageError: the static window length exceeds ``max_positions``.
    """
    from lmkit.core.errors import UsageError
    ids = tf.convert_to_tensor(ids)
    static_length = ids.shape[1] if ids.shape.rank == 2 else None
    if static_length is not None and state is None and static_length > max_positions:
        raise UsageError(f"ids have {static_length} time steps but max_positions is {max_positions}; "
                         f"use shorter windows or build with max_positions >= {static_length}")
    return ids


class LanguageModel(Module):
    """The language-model protocol; subclass it to plug a model into lmkit.

    Attributes:
      vocab_size: size of the output distribution.
      stateful: True when the state carries across BPTT windows.
      lora_targets: the names of the Linear layers ``lora_rank`` adapts when
        ``lora_targets`` is not set (:func:`lmkit.layers.lora.add_lora`).
    """

    vocab_size: int
    stateful: bool
    lora_targets: Tuple[str, ...] = ()

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> State:
        """The state before the first token: a nest of [batch, ...] tensors."""
        raise NotImplementedError

    def __call__(self, ids: tf.Tensor, state: Optional[State] = None,
                 training: Training = False) -> Tuple[tf.Tensor, State]:
        """Teacher-forced pass: ids [batch, time] -> (logits [batch, time, vocab], state)."""
        raise NotImplementedError

    def step(self, ids: tf.Tensor, state: State) -> Tuple[tf.Tensor, State]:
        """One decoding step: ids [batch] -> (logits [batch, vocab], state)."""
        raise NotImplementedError

    def reorder_state(self, state: State, indices: tf.Tensor) -> State:
        """Gathers state rows (beam search).

        Args:
          state: a state of this model.
          indices: [batch'] int32 rows to keep, in order (repeats allowed).

        Returns:
          The state with every tensor's batch axis gathered by ``indices``.
        """
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, indices, axis=0), state)
