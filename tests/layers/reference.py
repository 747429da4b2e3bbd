"""NumPy references of the transformer blocks, written out per head (shared by the layers' tests)."""

import math

import numpy as np


def np_layer_norm(norm, x):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * norm.scale.numpy() + norm.offset.numpy()


def np_linear(linear, x):
    return x @ linear.kernel.numpy() + linear.bias.numpy()


def np_attention(attention, x):
    """Causal multi-head self-attention, written out per head."""
    batch, length, dim = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    q, k, v = np.split(np_linear(attention.qkv, x), 3, axis=-1)
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(head_dim)  # [time, time]
            scores = np.where(np.tril(np.ones((length, length))) > 0, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[b, :, cols] = probs @ v[b, :, cols]
    return np_linear(attention.output, out)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
