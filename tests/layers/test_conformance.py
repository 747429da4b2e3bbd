"""Every module (and the language models) through the shared conformance harness."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit import models
from lmkit.layers import (
    Attention,
    AttentionRNNDecoder,
    CrossAttentionLayer,
    GatedFeedForward,
    GRUCell,
    LayerNorm,
    Linear,
    LoRAAdapter,
    LSTMCell,
    OutputProjection,
    PositionEmbedder,
    RMSNorm,
    RNNDecoder,
    RNNEncoder,
    RotaryEmbedding,
    SinusoidsPositionEmbedder,
    StackedRNN,
    TransformerCrossDecoder,
    TransformerDecoder,
    TransformerEncoder,
    TransformerEncoderLayer,
    TransformerLayer,
    WordEmbedder,
)
from lmkit.models.llama.blocks import LlamaDecoder, LlamaLayer
from lmkit.train import losses

from .harness import ModuleCase, check_checkpoint, check_config, check_gradient_step, check_outputs, check_variables

B, T, VOCAB = 2, 5, 11


def _floats(*shape, seed=0):
    return tf.constant(np.random.RandomState(seed).normal(size=shape).astype(np.float32))


def _ids(*shape, seed=0):
    return tf.constant(np.random.RandomState(seed).randint(0, VOCAB, size=shape).astype(np.int32))


def _names(prefix, *suffixes):
    return [f"{prefix}/{s}:0" for s in suffixes]


def _adapter():
    """An adapter whose B is not zero yet (as after training): A gets a gradient too."""
    adapter = LoRAAdapter(input_size=3, output_size=4, rank=2, alpha=4.0, dropout=0.1, name="lora")
    adapter.b.assign(_floats(2, 4, seed=3))
    return adapter


def _source_mask():
    return tf.constant([[True, True, True, True], [True, True, False, False]])


def _encoder_layers(prefix):
    return _names(prefix, "attention/query/kernel", "attention/query/bias", "attention/key_value/kernel",
                  "attention/key_value/bias", "attention/output/kernel", "attention/output/bias",
                  "attention_norm/scale", "attention_norm/offset", "ffn_inner/kernel", "ffn_inner/bias",
                  "ffn_outer/kernel", "ffn_outer/bias", "ffn_norm/scale", "ffn_norm/offset")


def _cross_layers(prefix):
    return (_names(prefix, "attention/qkv/kernel", "attention/qkv/bias", "attention/output/kernel",
                   "attention/output/bias", "cross_norm/scale", "cross_norm/offset")
            + [name.replace(f"{prefix}/attention/", f"{prefix}/cross_attention/")
               for name in _encoder_layers(prefix) if "/attention/" in name]
            + [name for name in _encoder_layers(prefix) if "/attention/" not in name])


def _lm_loss(outputs):
    logits, _ = outputs
    return losses.sequence_softmax_cross_entropy(_ids(B, T, seed=1), logits)


def _lstm_layers(prefix, n):
    return [f"{prefix}/layer_{i}/{v}:0" for i in range(n) for v in ("input_kernel", "recurrent_kernel", "bias")]


def _transformer_layers(prefix, n):
    parts = ("attention/qkv/kernel", "attention/qkv/bias", "attention/output/kernel", "attention/output/bias",
             "attention_norm/scale", "attention_norm/offset", "ffn_inner/kernel", "ffn_inner/bias",
             "ffn_outer/kernel", "ffn_outer/bias", "ffn_norm/scale", "ffn_norm/offset")
    return [f"{prefix}/layer_{i}/{p}:0" for i in range(n) for p in parts]


def _llama_layers(prefix, n):
    parts = ("attention_norm/scale", "attention/query/kernel", "attention/key/kernel", "attention/value/kernel",
             "attention/output/kernel", "ffn_norm/scale", "ffn/gate/kernel", "ffn/up/kernel", "ffn/down/kernel")
    return [f"{prefix}/layer_{i}/{p}:0" for i in range(n) for p in parts]


def _cell_forward(module, inputs, training):
    x, = inputs
    # A non-zero state, so the recurrent kernel gets a gradient too.
    state = tf.nest.map_structure(lambda zeros: zeros + _floats(B, 4, seed=2), module.initial_state(B))
    return module(x, state)


def _stack():
    return StackedRNN(cells=[LSTMCell(input_size=3, hidden_size=4, name="lstm_a"),
                             LSTMCell(input_size=4, hidden_size=4, name="lstm_b")], dropout=0.3, name="stack")


CASES = [
    ModuleCase(
        id="Linear", build=lambda: Linear(input_size=3, output_size=4, name="linear"),
        inputs=lambda: (_floats(B, T, 3),), forward=lambda m, i, t: m(*i),
        variables=_names("linear", "kernel", "bias"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="LoRAAdapter", build=lambda: _adapter(), inputs=lambda: (_floats(B, T, 3),),
        forward=lambda m, i, t: m(i[0], training=t), variables=_names("lora", "a", "b"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="Attention-memory",
        build=lambda: Attention(dim=6, num_heads=3, causal=False, fused="kv", dropout=0.1, name="attention"),
        inputs=lambda: (_floats(B, T, 6), _floats(B, 4, 6, seed=1), _source_mask()),
        forward=lambda m, i, t: m(i[0], t, memory=m.memory(i[1]), mask=i[2])[0],
        variables=_names("attention", "query/kernel", "query/bias", "key_value/kernel", "key_value/bias",
                         "output/kernel", "output/bias"), shapes=[(B, T, 6)]),
    ModuleCase(
        id="TransformerEncoderLayer",
        build=lambda: TransformerEncoderLayer(dim=6, num_heads=2, ffn_dim=8, dropout=0.1, name="layer_0"),
        inputs=lambda: (_floats(B, 4, 6), _source_mask()), forward=lambda m, i, t: m(i[0], i[1], training=t),
        variables=_encoder_layers("layer_0"), shapes=[(B, 4, 6)]),
    ModuleCase(
        id="TransformerEncoder",
        build=lambda: TransformerEncoder(num_layers=2, dim=6, num_heads=2, ffn_dim=8, name="encoder"),
        inputs=lambda: (_floats(B, 4, 6), _source_mask()), forward=lambda m, i, t: m(i[0], i[1], training=t),
        variables=(_encoder_layers("encoder/layer_0") + _encoder_layers("encoder/layer_1")
                   + _names("encoder", "final_norm/scale", "final_norm/offset")), shapes=[(B, 4, 6)]),
    ModuleCase(
        id="CrossAttentionLayer",
        build=lambda: CrossAttentionLayer(dim=6, num_heads=2, ffn_dim=8, dropout=0.1, name="layer_0"),
        inputs=lambda: (_floats(B, T, 6), _floats(B, 4, 6, seed=1), _source_mask()),
        forward=lambda m, i, t: m(i[0], t, memory=m.cross_attention.memory(i[1]), memory_mask=i[2])[0],
        variables=_cross_layers("layer_0"), shapes=[(B, T, 6)]),
    ModuleCase(
        id="TransformerCrossDecoder",
        build=lambda: TransformerCrossDecoder(num_layers=2, dim=6, num_heads=2, ffn_dim=8, max_positions=8,
                                              pre_layer_norm=False, name="decoder"),
        inputs=lambda: (_floats(B, T, 6), _floats(B, 4, 6, seed=1), _source_mask()),
        forward=lambda m, i, t: m(i[0], m.memory(i[1], i[2]), training=t)[0],
        variables=_cross_layers("decoder/layer_0") + _cross_layers("decoder/layer_1"), shapes=[(B, T, 6)]),
    ModuleCase(
        id="RNNEncoder-bidirectional",
        build=lambda: RNNEncoder(input_size=3, hidden_size=4, cell="gru", bidirectional=True, name="encoder"),
        inputs=lambda: (_floats(B, 4, 3), _source_mask()), forward=lambda m, i, t: m(i[0], i[1], training=t),
        variables=(_lstm_layers("encoder/forward", 1) + _lstm_layers("encoder/backward", 1)), shapes=[(B, 4, 8)]),
    ModuleCase(
        id="AttentionRNNDecoder-bahdanau",
        build=lambda: AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, attention="bahdanau",
                                          dropout=0.1, name="decoder"),
        inputs=lambda: (_floats(B, T, 3), _floats(B, 4, 6, seed=1), _source_mask()),
        forward=lambda m, i, t: m(i[0], m.memory(i[1], i[2]), training=t)[0],
        variables=(_lstm_layers("decoder/rnn", 1)
                   + _names("decoder", "memory_key/kernel", "query/kernel", "score", "attentional/kernel")),
        shapes=[(B, T, 4)]),
    ModuleCase(
        id="WordEmbedder", build=lambda: WordEmbedder(vocab_size=VOCAB, dim=4, dropout=0.2, name="words"),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t),
        variables=_names("words", "embeddings"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="PositionEmbedder", build=lambda: PositionEmbedder(max_positions=8, dim=4, name="positions"),
        inputs=lambda: (tf.constant([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]),), forward=lambda m, i, t: m(i[0]),
        variables=_names("positions", "embeddings"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="SinusoidsPositionEmbedder", build=lambda: SinusoidsPositionEmbedder(dim=6, name="sinusoids"),
        inputs=lambda: (tf.constant([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]),), forward=lambda m, i, t: m(i[0]),
        variables=[], shapes=[(B, T, 6)]),
    ModuleCase(
        id="OutputProjection", build=lambda: OutputProjection(dim=4, vocab_size=VOCAB, name="softmax"),
        inputs=lambda: (_floats(B, T, 4),), forward=lambda m, i, t: m(i[0]),
        variables=_names("softmax", "kernel", "bias"), shapes=[(B, T, VOCAB)]),
    ModuleCase(
        id="LSTMCell", build=lambda: LSTMCell(input_size=3, hidden_size=4, forget_bias=1.0, name="lstm"),
        inputs=lambda: (_floats(B, 3),), forward=_cell_forward,
        variables=_names("lstm", "input_kernel", "recurrent_kernel", "bias"),
        shapes=[(B, 4), (B, 4), (B, 4)]),
    ModuleCase(
        id="GRUCell", build=lambda: GRUCell(input_size=3, hidden_size=4, name="gru"),
        inputs=lambda: (_floats(B, 3),), forward=_cell_forward,
        variables=_names("gru", "input_kernel", "recurrent_kernel", "bias"), shapes=[(B, 4), (B, 4)]),
    ModuleCase(
        id="StackedRNN", build=_stack, inputs=lambda: (_floats(B, T, 3),),
        forward=lambda m, i, t: m.unroll(i[0], training=t),
        variables=(_names("lstm_a", "input_kernel", "recurrent_kernel", "bias")
                   + _names("lstm_b", "input_kernel", "recurrent_kernel", "bias")),
        shapes=[(B, T, 4)] + [(B, 4)] * 4, no_rebuild=True),
    ModuleCase(
        id="RNNDecoder-lstm",
        build=lambda: RNNDecoder(input_size=3, hidden_size=4, num_layers=2, dropout=0.3, forget_bias=1.0,
                                 name="decoder"),
        inputs=lambda: (_floats(B, T, 3),), forward=lambda m, i, t: m(i[0], training=t),
        variables=_lstm_layers("decoder", 2), shapes=[(B, T, 4)] + [(B, 4)] * 4),
    ModuleCase(
        id="RNNDecoder-gru",
        build=lambda: RNNDecoder(input_size=3, hidden_size=4, num_layers=2, cell="gru", name="decoder"),
        inputs=lambda: (_floats(B, T, 3),), forward=lambda m, i, t: m(i[0], training=t),
        variables=_lstm_layers("decoder", 2), shapes=[(B, T, 4)] + [(B, 4)] * 2),
    ModuleCase(
        id="LayerNorm", build=lambda: LayerNorm(dim=4, name="norm"), inputs=lambda: (_floats(B, T, 4),),
        forward=lambda m, i, t: m(i[0]), variables=_names("norm", "scale", "offset"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="Attention-qkv",
        build=lambda: Attention(dim=6, num_heads=3, fused="qkv", dropout=0.1, name="attention"),
        inputs=lambda: (_floats(B, T, 6),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=_names("attention", "qkv/kernel", "qkv/bias", "output/kernel", "output/bias"),
        shapes=[(B, T, 6)]),
    ModuleCase(
        id="TransformerLayer-post-ln",
        build=lambda: TransformerLayer(dim=6, num_heads=2, ffn_dim=8, dropout=0.1, pre_layer_norm=False,
                                       activation="relu", name="layer_0"),
        inputs=lambda: (_floats(B, T, 6),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=[v.replace("x/", "", 1) for v in _transformer_layers("x", 1)], shapes=[(B, T, 6)]),
    ModuleCase(
        id="TransformerDecoder",
        build=lambda: TransformerDecoder(num_layers=2, dim=6, num_heads=2, ffn_dim=8, dropout=0.1,
                                         max_positions=8, name="decoder"),
        inputs=lambda: (_floats(B, T, 6),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=_transformer_layers("decoder", 2) + _names("decoder", "final_norm/scale", "final_norm/offset"),
        shapes=[(B, T, 6)]),
    ModuleCase(
        id="RMSNorm", build=lambda: RMSNorm(dim=4, name="norm"), inputs=lambda: (_floats(B, T, 4),),
        forward=lambda m, i, t: m(i[0]), variables=_names("norm", "scale"), shapes=[(B, T, 4)]),
    ModuleCase(
        id="RotaryEmbedding",
        build=lambda: RotaryEmbedding(head_dim=4, theta=100.0, scaling={"rope_type": "linear", "factor": 2.0},
                                      name="rotary"),
        inputs=lambda: (_floats(B, T, 4),),
        forward=lambda m, i, t: m.rotate(i[0], *m.cos_sin(tf.range(T)[tf.newaxis])), variables=[],
        shapes=[(B, T, 4)]),
    ModuleCase(
        id="GatedFeedForward", build=lambda: GatedFeedForward(dim=6, ffn_dim=8, name="ffn"),
        inputs=lambda: (_floats(B, T, 6),), forward=lambda m, i, t: m(i[0]),
        variables=_names("ffn", "gate/kernel", "up/kernel", "down/kernel"), shapes=[(B, T, 6)]),
    ModuleCase(
        id="Attention-grouped-rotary",
        build=lambda: Attention(dim=8, num_heads=4, num_kv_heads=2, rotary={"theta": 10000.0}, sliding_window=3,
                                qkv_bias=True, output_bias=False, dropout=0.1, init_scale=0.02, name="attention"),
        inputs=lambda: (_floats(B, T, 8),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=_names("attention", "query/kernel", "query/bias", "key/kernel", "key/bias", "value/kernel",
                         "value/bias", "output/kernel"), shapes=[(B, T, 8)]),
    ModuleCase(
        id="LlamaLayer",
        build=lambda: LlamaLayer(dim=8, num_heads=4, num_kv_heads=2, ffn_dim=8, dropout=0.1, name="layer_0"),
        inputs=lambda: (_floats(B, T, 8),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=[v.replace("x/", "", 1) for v in _llama_layers("x", 1)], shapes=[(B, T, 8)]),
    ModuleCase(
        id="LlamaDecoder",
        build=lambda: LlamaDecoder(num_layers=2, dim=8, num_heads=4, num_kv_heads=1, ffn_dim=8,
                                   sliding_windows=[None, 2], max_positions=8, name="decoder"),
        inputs=lambda: (_floats(B, T, 8),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=_llama_layers("decoder", 2) + _names("decoder", "final_norm/scale"), shapes=[(B, T, 8)]),
    ModuleCase(
        id="LlamaLanguageModel-tied",
        build=lambda: models.LlamaLanguageModel(vocab_size=VOCAB, hidden_size=8, num_layers=2, num_heads=4,
                                                num_kv_heads=2, ffn_dim=8, max_positions=8, dropout=0.1,
                                                tie_weights=True),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=(_llama_layers("llama_language_model/decoder", 2)
                   + _names("llama_language_model", "decoder/final_norm/scale", "embedder/embeddings")),
        shapes=[(B, T, VOCAB)], loss=lambda logits: _lm_loss((logits, None)), rebuild=models.build_model),
    ModuleCase(
        id="RNNLanguageModel-lstm-tied",
        build=lambda: models.RNNLanguageModel(vocab_size=VOCAB, hidden_size=4, num_layers=2, dropout=0.3,
                                              tie_weights=True),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t),
        variables=(_lstm_layers("rnn_language_model/decoder", 2)
                   + _names("rnn_language_model", "embedder/embeddings", "projection/bias")),
        shapes=[(B, T, VOCAB)] + [(B, 4)] * 4, loss=_lm_loss, rebuild=models.build_model),
    ModuleCase(
        id="RNNLanguageModel-gru",
        build=lambda: models.RNNLanguageModel(vocab_size=VOCAB, hidden_size=4, num_layers=1, cell="gru",
                                              embedding_dim=3, name="gru_lm"),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t),
        variables=(_lstm_layers("gru_lm/decoder", 1)
                   + _names("gru_lm", "embedder/embeddings", "projection/kernel", "projection/bias")),
        shapes=[(B, T, VOCAB), (B, 4)], loss=_lm_loss,
        # build_model names every model by its class.
        rebuild=lambda cfg: models.RNNLanguageModel(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                                                    num_layers=cfg["num_layers"], cell=cfg["model"],
                                                    embedding_dim=cfg["embedding_dim"], name="gru_lm")),
    ModuleCase(
        id="TransformerLanguageModel-tied",
        build=lambda: models.TransformerLanguageModel(vocab_size=VOCAB, hidden_size=6, num_layers=2, num_heads=2,
                                                      ffn_dim=8, max_positions=8, dropout=0.1, tie_weights=True),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=(_transformer_layers("transformer_language_model/decoder", 2)
                   + _names("transformer_language_model", "decoder/final_norm/scale", "decoder/final_norm/offset",
                            "embedder/embeddings", "position_embedder/embeddings", "projection/bias")),
        shapes=[(B, T, VOCAB)], loss=lambda logits: _lm_loss((logits, None)), rebuild=models.build_model),
    ModuleCase(
        id="TransformerLanguageModel-sinusoid-post-ln",
        build=lambda: models.TransformerLanguageModel(vocab_size=VOCAB, hidden_size=6, num_layers=1, num_heads=3,
                                                      ffn_dim=8, max_positions=8, pre_layer_norm=False,
                                                      position_embedding="sinusoid"),
        inputs=lambda: (_ids(B, T),), forward=lambda m, i, t: m(i[0], training=t)[0],
        variables=(_transformer_layers("transformer_language_model/decoder", 1)
                   + _names("transformer_language_model", "embedder/embeddings", "projection/kernel",
                            "projection/bias")),
        shapes=[(B, T, VOCAB)], loss=lambda logits: _lm_loss((logits, None)), rebuild=models.build_model),
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


def test_variables(case):
    check_variables(case)


def test_outputs(case):
    check_outputs(case)


def test_config(case):
    check_config(case)


def test_checkpoint_round_trip(case, tmp_path):
    check_checkpoint(case, str(tmp_path))


def test_gradient_step(case):
    check_gradient_step(case)


def test_every_module_class_is_covered():
    import lmkit.layers as mod

    module_classes = {getattr(mod, n) for n in mod.__all__
                      if isinstance(getattr(mod, n), type) and issubclass(getattr(mod, n), tf.Module)}
    abstract = {mod.Module, mod.RecurrentCell}
    covered = {type(c.build()) for c in CASES}
    assert module_classes - abstract <= covered
    assert {models.RNNLanguageModel, models.TransformerLanguageModel, models.LlamaLanguageModel} <= covered
