"""Reusable building blocks: ``tf.Module`` s holding plain ``tf.Variable`` s.

Every module creates its variables in ``__init__``, works eagerly and under
``tf.function``, and describes itself with ``get_config()``. One concept per
file: ``base`` (Module, Linear, dropout, initializers), ``embeddings``,
``norms``, ``rotary``, ``feedforward``, ``attention`` (the one attention
module), ``attend`` (the functions it computes with), ``transformer`` (residual layers and the
decoder-only stack), ``encoder_decoder``, ``cells`` and ``rnn`` (recurrent
cores and unrolling), ``attention_rnn``, ``lora``, ``projection``,
``precision``, ``layouts`` (the decode loop's weight layouts on a CPU),
``kernels/`` (fused attention).

The names below load their module on first use: ``lmkit.layers.precision``
and ``lmkit.layers.kernels`` (which the config's checks read) import no
TensorFlow, and neither does this package.
"""

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "Attention": "lmkit.layers.attention",
    "AttentionCache": "lmkit.layers.attention",
    "AttentionRNNDecoder": "lmkit.layers.attention_rnn",
    "AttentionRNNState": "lmkit.layers.attention_rnn",
    "CrossAttentionLayer": "lmkit.layers.encoder_decoder",
    "GRUCell": "lmkit.layers.rnn",
    "GatedFeedForward": "lmkit.layers.feedforward",
    "LSTMCell": "lmkit.layers.rnn",
    "LSTMState": "lmkit.layers.rnn",
    "LayerNorm": "lmkit.layers.norms",
    "Linear": "lmkit.layers.base",
    "LoRAAdapter": "lmkit.layers.lora",
    "Memory": "lmkit.layers.encoder_decoder",
    "Module": "lmkit.layers.base",
    "OutputProjection": "lmkit.layers.projection",
    "PositionEmbedder": "lmkit.layers.embeddings",
    "RMSNorm": "lmkit.layers.norms",
    "RNNDecoder": "lmkit.layers.rnn",
    "RNNEncoder": "lmkit.layers.attention_rnn",
    "RNNMemory": "lmkit.layers.attention_rnn",
    "RecurrentCell": "lmkit.layers.rnn",
    "RotaryEmbedding": "lmkit.layers.rotary",
    "SinusoidsPositionEmbedder": "lmkit.layers.embeddings",
    "StackedRNN": "lmkit.layers.rnn",
    "TransformerCrossDecoder": "lmkit.layers.encoder_decoder",
    "TransformerDecoder": "lmkit.layers.transformer",
    "TransformerEncoder": "lmkit.layers.encoder_decoder",
    "TransformerEncoderLayer": "lmkit.layers.encoder_decoder",
    "TransformerLayer": "lmkit.layers.transformer",
    "TransformerState": "lmkit.layers.transformer",
    "WordEmbedder": "lmkit.layers.embeddings",
    "add_lora": "lmkit.layers.lora",
    "dropout": "lmkit.layers.base",
    "frozen": "lmkit.layers.lora",
    "initialize_like_gpt2": "lmkit.layers.transformer",
    "merge_lora": "lmkit.layers.lora",
    "ones_initializer": "lmkit.layers.base",
    "uniform_initializer": "lmkit.layers.base",
    "unroll": "lmkit.layers.rnn",
    "zeros_initializer": "lmkit.layers.base",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lmkit.layers' has no attribute {name!r}")


def __dir__() -> list:
    return __all__
