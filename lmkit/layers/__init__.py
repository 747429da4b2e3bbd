"""Reusable building blocks: ``tf.Module`` s holding plain ``tf.Variable`` s.

Every module creates its variables in ``__init__``, works eagerly and under
``tf.function``, and describes itself with ``get_config()``.
"""

from lmkit.layers.attention_rnn import AttentionRNNDecoder, AttentionRNNState, RNNEncoder, RNNMemory
from lmkit.layers.base import (Linear, Module, dropout, ones_initializer, uniform_initializer,
                                zeros_initializer)
from lmkit.layers.encoder_decoder import (CrossAttentionLayer, Memory, MemoryAttention, TransformerCrossDecoder,
                                           TransformerEncoder, TransformerEncoderLayer)
from lmkit.layers.embeddings import PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder
from lmkit.layers.llama import (GatedFeedForward, GroupedQueryAttention, LlamaDecoder, LlamaLayer, RMSNorm,
                                 RotaryEmbedding)
from lmkit.layers.lora import LoRAAdapter, add_lora, frozen, merge_lora
from lmkit.layers.projection import OutputProjection
from lmkit.layers.rnn import (GRUCell, LSTMCell, LSTMState, RecurrentCell, RNNDecoder, StackedRNN,
                               unroll)
from lmkit.layers.transformer import (AttentionCache, LayerNorm, MultiHeadAttention,
                                       TransformerDecoder, TransformerLayer, TransformerState)

__all__ = [
    "AttentionCache",
    "AttentionRNNDecoder",
    "AttentionRNNState",
    "CrossAttentionLayer",
    "GRUCell",
    "GatedFeedForward",
    "GroupedQueryAttention",
    "LSTMCell",
    "LSTMState",
    "LayerNorm",
    "Memory",
    "MemoryAttention",
    "Linear",
    "LlamaDecoder",
    "LlamaLayer",
    "LoRAAdapter",
    "Module",
    "MultiHeadAttention",
    "OutputProjection",
    "PositionEmbedder",
    "RMSNorm",
    "RNNDecoder",
    "RNNEncoder",
    "RNNMemory",
    "RecurrentCell",
    "RotaryEmbedding",
    "SinusoidsPositionEmbedder",
    "StackedRNN",
    "TransformerCrossDecoder",
    "TransformerDecoder",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "TransformerLayer",
    "TransformerState",
    "WordEmbedder",
    "add_lora",
    "dropout",
    "frozen",
    "merge_lora",
    "ones_initializer",
    "uniform_initializer",
    "unroll",
    "zeros_initializer",
]
