"""The model FLOPs a training step does, and their share of a GPU's peak (MFU), for the logs.

Training FLOPs per token follow the usual estimate (Kaplan et al., 2020;
PaLM's appendix B; nanoGPT)::

    6 x (weights that multiply) + 12 x layers x window x attention width

Each weight that multiplies costs 2 FLOPs per token forward and 4 backward
(the gradients of the input and of the weight); a frozen weight (LoRA's
base) costs 4, having no gradient of its own. Embedding tables that are only
looked up do no multiplication and are not counted, unless the softmax layer
shares them (``tie_weights``). (A run that trains nothing below its first
layer, as LoRA's, skips that layer's input gradient, which this counts: a
fraction of a per cent.) Attention adds, per layer and token, the
scores and their weighted sum over the window's positions (the whole window,
as PaLM counts it, although a causal mask needs half). Models without
attention (LSTMs, GRUs) have no second term; encoder-decoders are not
estimated (their tokens are target tokens; the encoder's work is per source).

MFU is the model FLOPs per second of the run over the peak of its devices:
``peak_tflops`` in the config, or the GPU's dense tensor peak from
:data:`PEAK_TFLOPS` (NVIDIA's data sheets) in the run's precision. Profilers
count the FLOPs executed; MFU counts the model's, so recomputation or padding
does not raise it.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

__all__ = ["PEAK_TFLOPS", "attention_flops_per_token", "device_peak_tflops", "flops_per_token",
           "gpu_name", "matmul_parameters", "peak_tflops"]

#: GPU name (a regular expression searched in the name TensorFlow reports, the first match wins) ->
#: (dense bfloat16/float16 tensor TFLOP/s, dense TF32 TFLOP/s) per GPU, from NVIDIA's data sheets.
#: float32 training uses TF32 on these GPUs (TensorFlow's default).
PEAK_TFLOPS: Tuple[Tuple[str, Tuple[float, float]], ...] = (
    (r"H200 NVL", (835.5, 417.5)),
    (r"H200", (989.4, 494.7)),
    (r"H100 NVL", (835.5, 417.5)),
    (r"H100 PCIe", (756.5, 378.0)),
    (r"H100", (989.4, 494.7)),
    (r"A100", (312.0, 156.0)),
    (r"L40S", (362.1, 183.0)),
    (r"\bL4\b", (121.0, 60.0)),
)


def matmul_parameters(model: Any) -> Tuple[int, int]:
    """``(trainable, frozen)``: the parameters of ``model`` that multiply (see the module's docstring)."""
    from lmkit.layers.embeddings import PositionEmbedder, WordEmbedder
    from lmkit.layers.projection import OutputProjection

    looked_up = {id(v) for m in model.submodules if isinstance(m, (WordEmbedder, PositionEmbedder))
                 for v in m.variables}
    tied = {id(m.tied_embedder.embeddings) for m in model.submodules
            if isinstance(m, OutputProjection) and m.tied_embedder is not None}
    counts = {True: 0, False: 0}
    seen = set()
    for v in model.variables:
        if id(v) in seen or (id(v) in looked_up and id(v) not in tied) or not v.dtype.is_floating:
            continue
        seen.add(id(v))
        counts[bool(v.trainable)] += int(v.shape.num_elements())
    return counts[True], counts[False]


def attention_flops_per_token(model: Any, window: int) -> float:
    """``12 x layers x window x width`` for a decoder-only transformer (lmkit's or the Llama family's), else 0."""
    decoder = getattr(model, "decoder", None)
    layers = getattr(decoder, "layers", None)
    if not layers or getattr(model, "conditional", False):
        return 0.0
    attention = getattr(layers[0], "attention", None)
    heads, head_dim = getattr(attention, "num_heads", None), getattr(attention, "head_dim", None)
    if not heads or not head_dim:
        return 0.0
    return 12.0 * len(layers) * window * heads * head_dim


def flops_per_token(model: Any, window: int) -> Optional[float]:
    """Training FLOPs per token of ``model`` on windows of ``window`` tokens; None for encoder-decoders."""
    if getattr(model, "conditional", False):
        return None
    trainable, frozen = matmul_parameters(model)
    return 6.0 * trainable + 4.0 * frozen + attention_flops_per_token(model, window)


def peak_tflops(device_name: Optional[str], precision: str) -> Optional[float]:
    """The dense tensor peak of one GPU named ``device_name`` in ``precision``, or None when unknown."""
    if not device_name:
        return None
    for pattern, (low_precision, tf32) in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return tf32 if precision == "float32" else low_precision
    return None


def gpu_name() -> Optional[str]:
    """The name of this process's first visible GPU (as TensorFlow reports it), or None."""
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    try:
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name")
    except (RuntimeError, ValueError, AttributeError):
        return None


def device_peak_tflops(configured: float, precision: str) -> Tuple[Optional[float], str]:
    """``(TFLOP/s per device, where it came from)``: ``peak_tflops`` when > 0, else the GPU's known peak."""
    if configured > 0:
        return configured, "peak_tflops"
    name = gpu_name()
    peak = peak_tflops(name, precision)
    return peak, (f"the {name}'s data sheet" if peak else "")
