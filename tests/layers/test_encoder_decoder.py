"""The encoder-decoder transformer blocks against PyTorch's nn.TransformerEncoderLayer / DecoderLayer,
padding, the cached decoder against its full pass, XLA and bfloat16."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import (
    Attention,
    CrossAttentionLayer,
    TransformerCrossDecoder,
    TransformerEncoder,
    TransformerEncoderLayer,
    precision,
)

DIM, HEADS, FFN = 8, 2, 16
SOURCE_LENGTHS = [5, 3]  # the second row padded


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _mask(lengths, time):
    return np.arange(time)[None, :] < np.array(lengths)[:, None]  # True = token


def _set_memory_attention(ours, torch_attention):
    w, b = torch_attention.in_proj_weight.detach().numpy(), torch_attention.in_proj_bias.detach().numpy()
    ours.query.kernel.assign(w[:DIM].T)
    ours.query.bias.assign(b[:DIM])
    ours.key_value.kernel.assign(np.concatenate([w[DIM:2 * DIM].T, w[2 * DIM:].T], axis=1))
    ours.key_value.bias.assign(b[DIM:])
    ours.output.kernel.assign(torch_attention.out_proj.weight.detach().numpy().T)
    ours.output.bias.assign(torch_attention.out_proj.bias.detach().numpy())


def _set_norm(ours, torch_norm):
    ours.scale.assign(torch_norm.weight.detach().numpy())
    ours.offset.assign(torch_norm.bias.detach().numpy())


def _set_ffn(ours, torch_layer):
    ours.ffn_inner.kernel.assign(torch_layer.linear1.weight.detach().numpy().T)
    ours.ffn_inner.bias.assign(torch_layer.linear1.bias.detach().numpy())
    ours.ffn_outer.kernel.assign(torch_layer.linear2.weight.detach().numpy().T)
    ours.ffn_outer.bias.assign(torch_layer.linear2.bias.detach().numpy())


def _torch_layer(kind, pre_layer_norm):
    import torch  # the main environment has it (make setup); the tests that call this are marked transformers
    from torch import nn
    torch.manual_seed(0)
    cls = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    layer = cls(DIM, HEADS, FFN, dropout=0.0, activation=functools.partial(nn.functional.gelu, approximate="tanh"),
                batch_first=True, norm_first=pre_layer_norm)
    for p in layer.parameters():  # biases and norms away from 0 and 1 too
        nn.init.uniform_(p, -0.5, 0.5)
    return torch, layer.eval()


@pytest.mark.transformers
@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-ln", "post-ln"])
def test_encoder_layer_equals_pytorch_on_a_padded_batch(pre_layer_norm):
    torch, reference = _torch_layer("encoder", pre_layer_norm)
    ours = TransformerEncoderLayer(dim=DIM, num_heads=HEADS, ffn_dim=FFN, pre_layer_norm=pre_layer_norm)
    _set_memory_attention(ours.attention, reference.self_attn)
    _set_norm(ours.attention_norm, reference.norm1)
    _set_norm(ours.ffn_norm, reference.norm2)
    _set_ffn(ours, reference)
    x, mask = _random(2, 5, DIM), _mask(SOURCE_LENGTHS, 5)
    with torch.no_grad():
        expected = reference(torch.tensor(x), src_key_padding_mask=torch.tensor(~mask)).numpy()
    got = ours(tf.constant(x), tf.constant(mask)).numpy()
    np.testing.assert_allclose(got[mask], expected[mask], rtol=1e-4, atol=1e-5)  # the tokens' outputs


@pytest.mark.transformers
@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-ln", "post-ln"])
def test_cross_attention_layer_equals_pytorch_decoder_layer(pre_layer_norm):
    torch, reference = _torch_layer("decoder", pre_layer_norm)
    from torch import nn
    ours = CrossAttentionLayer(dim=DIM, num_heads=HEADS, ffn_dim=FFN, pre_layer_norm=pre_layer_norm)
    ours.attention.qkv.kernel.assign(reference.self_attn.in_proj_weight.detach().numpy().T)
    ours.attention.qkv.bias.assign(reference.self_attn.in_proj_bias.detach().numpy())
    ours.attention.output.kernel.assign(reference.self_attn.out_proj.weight.detach().numpy().T)
    ours.attention.output.bias.assign(reference.self_attn.out_proj.bias.detach().numpy())
    _set_memory_attention(ours.cross_attention, reference.multihead_attn)
    for mine, theirs in ((ours.attention_norm, reference.norm1), (ours.cross_norm, reference.norm2),
                         (ours.ffn_norm, reference.norm3)):
        _set_norm(mine, theirs)
    _set_ffn(ours, reference)
    target, source, mask = _random(2, 4, DIM, seed=1), _random(2, 5, DIM, seed=2), _mask(SOURCE_LENGTHS, 5)
    with torch.no_grad():
        expected = reference(torch.tensor(target), torch.tensor(source),
                             tgt_mask=nn.Transformer.generate_square_subsequent_mask(4), tgt_is_causal=True,
                             memory_key_padding_mask=torch.tensor(~mask)).numpy()
    memory = ours.cross_attention.memory(tf.constant(source))
    got, cache = ours(tf.constant(target), memory=memory, memory_mask=tf.constant(mask))
    assert cache is None
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_padding_is_never_attended():
    encoder = TransformerEncoder(num_layers=2, dim=DIM, num_heads=HEADS)
    x, mask = _random(2, 5, DIM), _mask(SOURCE_LENGTHS, 5)
    base = encoder(tf.constant(x), tf.constant(mask)).numpy()
    noisy = x.copy()
    noisy[~mask] = 100.0  # other padding vectors
    longer = np.concatenate([noisy, _random(2, 3, DIM, seed=9)], axis=1)  # and more of them
    again = encoder(tf.constant(longer), tf.constant(_mask(SOURCE_LENGTHS, 8))).numpy()
    np.testing.assert_allclose(again[:, :5][mask], base[mask], rtol=1e-5, atol=1e-6)
    # Without a mask the padding is attended: the outputs move.
    assert not np.allclose(encoder(tf.constant(x)).numpy()[1, :3], base[1, :3], atol=1e-4)


def _stack(pre_layer_norm=True):
    tf.random.set_seed(3)
    encoder = TransformerEncoder(num_layers=2, dim=DIM, num_heads=HEADS, pre_layer_norm=pre_layer_norm)
    decoder = TransformerCrossDecoder(num_layers=2, dim=DIM, num_heads=HEADS, max_positions=8,
                                      pre_layer_norm=pre_layer_norm)
    source, mask = tf.constant(_random(2, 5, DIM)), tf.constant(_mask(SOURCE_LENGTHS, 5))
    return encoder, decoder, decoder.memory(encoder(source, mask), mask), tf.constant(_random(2, 6, DIM, seed=4))


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-ln", "post-ln"])
def test_cached_decoding_equals_the_full_pass(pre_layer_norm):
    _, decoder, memory, target = _stack(pre_layer_norm)
    full, state = decoder(target, memory)
    assert state is None and full.shape == (2, 6, DIM)
    state = decoder.initial_state(2, 6)
    prefill, state = decoder(target[:, :2], memory, state)  # a 2-token prefill, then one at a time
    steps = [prefill]
    for t in range(2, 6):
        out, state = decoder(target[:, t:t + 1], memory, state)
        steps.append(out)
    np.testing.assert_array_equal(state.positions.numpy(), [6, 6])
    np.testing.assert_allclose(tf.concat(steps, axis=1).numpy(), full.numpy(), rtol=1e-5, atol=1e-5)


def test_compiled_and_bfloat16_passes():
    encoder, decoder, memory, target = _stack()
    eager, _ = decoder(target, memory)

    @tf.function(jit_compile=True)
    def step(x, memory, state):
        return decoder(x, memory, state)

    state = decoder.initial_state(2, 6)
    outs = []
    for t in range(6):
        out, state = step(target[:, t:t + 1], memory, state)
        outs.append(out)
    np.testing.assert_allclose(tf.concat(outs, 1).numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    with precision.scope("mixed_bfloat16"):
        half = tf.cast(decoder(tf.cast(target, tf.bfloat16), memory)[0], tf.float32)
    np.testing.assert_allclose(half.numpy(), eager.numpy(), atol=0.15)


def test_bad_sizes_and_memories_are_named():
    with pytest.raises(UsageError, match="dim 10 is not divisible by num_heads 3"):
        Attention(dim=10, num_heads=3, causal=False, fused="kv")
    with pytest.raises(UsageError, match="activation 'swish' is not one of gelu, gelu_exact, relu"):
        TransformerEncoderLayer(dim=8, num_heads=2, ffn_dim=4, activation="swish")
    _, decoder, memory, target = _stack()
    other = TransformerCrossDecoder(num_layers=1, dim=DIM, num_heads=HEADS)
    with pytest.raises(UsageError, match="memory has 2 layers but the decoder has 1"):
        other(target, memory)
    with pytest.raises(UsageError, match="max_length 9 exceeds max_positions 8"):
        decoder.initial_state(2, 9)
