"""NumPy (float64) reference implementations of the lmkit.optim update rules.

Written from the papers / OpenSeq2Seq formulas, independently of the
TensorFlow code, one function per optimizer: ``step(w, g, state, lr, t)``
returns the new weight and updates ``state`` (a dict) in place; ``t`` is the
1-based update number.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

State = Dict[str, np.ndarray]


def sgd(w, g, state: State, lr, t, *, momentum=0.0, nesterov=False, wd=0.0):
    del t
    g = g + wd * w
    if momentum == 0.0:
        return w - lr * g
    m = momentum * state.get("m", np.zeros_like(w)) + g
    state["m"] = m
    return w - lr * (g + momentum * m if nesterov else m)


def adam(w, g, state: State, lr, t, *, beta1, beta2, eps, wd=0.0, decoupled=False):
    if not decoupled:
        g = g + wd * w
    m = beta1 * state.get("m", np.zeros_like(w)) + (1 - beta1) * g
    v = beta2 * state.get("v", np.zeros_like(w)) + (1 - beta2) * g * g
    state["m"], state["v"] = m, v
    update = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    if decoupled:
        update = update + wd * w
    return w - lr * update


def novograd(w, g, state: State, lr, t, *, beta1, beta2, eps, wd=0.0, grad_averaging=False):
    del t
    n = float(np.sum(g * g))
    v = n if "v" not in state else beta2 * state["v"] + (1 - beta2) * n
    d = g / np.sqrt(v + eps) + wd * w
    if grad_averaging:
        d = (1 - beta1) * d
    m = beta1 * state.get("m", np.zeros_like(w)) + d
    state["v"], state["m"] = v, m
    return w - lr * m


def lamb(w, g, state: State, lr, t, *, beta1, beta2, eps, wd=0.0, bias_correction=True):
    m = beta1 * state.get("m", np.zeros_like(w)) + (1 - beta1) * g
    v = beta2 * state.get("v", np.zeros_like(w)) + (1 - beta2) * g * g
    state["m"], state["v"] = m, v
    if bias_correction:
        m, v = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    u = m / (np.sqrt(v) + eps) + wd * w
    w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
    ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    return w - lr * ratio * u


def larc_factor(w, g, lr, *, eta, mode, min_update, eps) -> float:
    """OpenSeq2Seq ``post_process_gradients``: the LARC multiplier of ``g``."""
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if mode == "clip":
        return min(max(eta * w_norm / (lr * (g_norm + eps)), min_update), 1.0)
    return max(eta * w_norm / (g_norm + eps), min_update)


def clip_global(grads, max_norm):
    """Dense gradients (None allowed) -> (clipped, norm)."""
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads if g is not None))
    scale = max_norm / max(norm, max_norm)
    return [None if g is None else g * scale for g in grads], norm


def clip_per_layer(grads, max_norm):
    out = []
    for g in grads:
        if g is None:
            out.append(None)
            continue
        norm = np.linalg.norm(g)
        out.append(g * (max_norm / max(norm, max_norm)))
    return out


def densify(values: np.ndarray, indices: np.ndarray, shape) -> np.ndarray:
    """Dense tensor of an IndexedSlices (duplicate indices summed)."""
    out = np.zeros(shape, dtype=np.float64)
    np.add.at(out, indices, values)
    return out


def lr_zaremba(epoch: int, lr: float = 1.0, decay: float = 0.5, max_epoch: int = 4) -> float:
    """Zaremba et al.'s PTB schedule (``ptb_word_lm.py``): ``lr * decay ** max(i + 1 - max_epoch, 0)``."""
    return lr * decay ** max(epoch + 1 - max_epoch, 0.0)

