"""Reusable building blocks: ``tf.Module`` s holding plain ``tf.Variable`` s.

Every module creates its variables in ``__init__``, works eagerly and under
``tf.function``, and describes itself with ``get_config()``.
"""

from lmkit.modules.attention_rnn import AttentionRNNDecoder, AttentionRNNState, RNNEncoder, RNNMemory
from lmkit.modules.base import (Linear, Module, dropout, ones_initializer, uniform_initializer,
                                zeros_initializer)
from lmkit.modules.encoder_decoder import (CrossAttentionLayer, Memory, MemoryAttention, TransformerCrossDecoder,
                                           TransformerEncoder, TransformerEncoderLayer)
from lmkit.modules.embedders import PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder
from lmkit.modules.llama import (GatedFeedForward, GroupedQueryAttention, LlamaDecoder, LlamaLayer, RMSNorm,
                                 RotaryEmbedding)
from lmkit.modules.lora import LoRAAdapter, add_lora, frozen, merge_lora
from lmkit.modules.projection import OutputProjection
from lmkit.modules.rnn import (GRUCell, LSTMCell, LSTMState, RecurrentCell, RNNDecoder, StackedRNN,
                               unroll)
from lmkit.modules.transformer import (AttentionCache, LayerNorm, MultiHeadAttention,
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
