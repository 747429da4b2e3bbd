"""cuDNN's fused (flash) causal attention inside an XLA-compiled step: ``attention_kernel = "cudnn"``.

Without it, a window's attention writes its ``[batch, heads, time, time]``
scores and probabilities to GPU memory and reads them back several times
(forward and backward); on an H100 the GPT-2 124M-shaped bf16 step spent
about a quarter of its time there (``docs/performance.md``). cuDNN's fused
attention keeps those tiles on chip. TensorFlow has no op for it, but XLA's
GPU compiler turns a custom call named ``__cudnn$fmhaSoftmax`` (and its
``...Backward``) into cuDNN's flash-attention graphs, compiled when the step
is: the protocol JAX's ``dot_product_attention(implementation="cudnn")``
speaks. This module emits those calls with ``XlaCustomCallV2`` and ties them
together with ``tf.custom_gradient``:

* forward: ``(Q, K, V) -> (O, stats, workspace)``; ``stats`` [batch, heads,
  time] float32 are the softmax's row statistics the backward call uses;
* backward: ``(Q, K, V, stats, dO, O) -> (dQ, dK, dV, workspace)``;
* grouped-query attention (fewer key/value heads, Llama's) repeats each
  key/value head for its queries before the calls (``tf.repeat``, Hugging
  Face's ``repeat_kv`` order), whose gradient sums the copies back: the
  calls always see as many key/value heads as query heads;
* every array in the ``[batch, heads, time, head_dim]`` order ("BNTH") and
  the default layout (what ``XlaCustomCallV2`` emits), the queries already
  scaled (``fmha_scale`` 1), the mask causal, no dropout: the form XLA's own
  GPU tests compile (``xla/service/gpu/tests/gpu_fused_mha_test.cc``).

It only runs under XLA on a GPU with cuDNN 9 (TensorFlow loads
``libcudnn.so.9``), so :meth:`CudnnAttention.probe` compiles a small case on
the GPU and checks it against the matmuls before a run relies on it. CPU
tests check the program the calls make (tests/layers/test_kernels.py);
``benchmarks/gpu_session.sh cudnn`` measures it on a GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

__all__ = ["BACKWARD_TARGET", "FORWARD_TARGET", "KERNEL", "CudnnAttention", "backend_config",
           "check_against_matmul", "cudnn_library", "compile_check"]

FORWARD_TARGET = "__cudnn$fmhaSoftmax"
BACKWARD_TARGET = "__cudnn$fmhaSoftmaxBackward"
MAX_HEAD_DIM = 128  # cuDNN's flash attention: head_dim a multiple of 8, at most 128
LIBRARY = "libcudnn.so.9"  # what TensorFlow 2.21's CUDA 12 build loads
_DTYPE_NAMES = {tf.bfloat16: "BF16", tf.float16: "F16"}

# (lhs contracting, rhs contracting, lhs batch, rhs batch) of each matmul of attention over
# BNTH arrays: Q K^T -> P [B, N, T, S]; P V -> O; and the four of the backward pass.
_FORWARD_DOTS = {
    "bmm1_dot_dimension_numbers": (3, 3),  # Q [B,N,T,H] . K [B,N,S,H] over H -> P [B,N,T,S]
    "bmm2_dot_dimension_numbers": (3, 2),  # P [B,N,T,S] . V [B,N,S,H] over S -> O [B,N,T,H]
}
_BACKWARD_DOTS = {
    "bmm1_grad_gemm1_dot_dimension_numbers": (2, 2),  # dP [B,N,T,S] . Q over T -> dK [B,N,S,H]
    "bmm1_grad_gemm2_dot_dimension_numbers": (3, 2),  # dP . K [B,N,S,H] over S -> dQ [B,N,T,H]
    "bmm2_grad_gemm1_dot_dimension_numbers": (2, 2),  # P [B,N,T,S] . dO over T -> dV [B,N,S,H]
    "bmm2_grad_gemm2_dot_dimension_numbers": (3, 3),  # dO [B,N,T,H] . V over H -> dP [B,N,T,S]
}


def backend_config(batch: int, heads: int, time: int, dtype: tf.DType, backward: bool) -> str:
    """The ``GpuBackendConfig`` (JSON) of one call: XLA reads its ``cudnn_fmha_backend_config``."""
    dots = _BACKWARD_DOTS if backward else _FORWARD_DOTS
    config: Dict[str, Any] = {
        "algorithm": {"algo_id": "0", "math_type": "TENSOR_OP_MATH", "tuning_knobs": {"17": "1", "24": "0"},
                      "is_cudnn_frontend": True, "workspace_size": "0"},
        "fmha_scale": 1.0,  # the queries come scaled by 1/sqrt(head_dim)
        "dropout_rate": 0.0,
        "seed": 42,  # unused without dropout
        "intermediate_tensor_shape": {  # P: [batch, heads, time, time], row-major
            "element_type": _DTYPE_NAMES[dtype],
            "dimensions": [str(d) for d in (batch, heads, time, time)],
            "tuple_shapes": [],
            "layout": {"minor_to_major": ["3", "2", "1", "0"]},
            "is_dynamic_dimension": [False] * 4,
        },
        "is_flash_attention": True,
        "mask_type": "CAUSAL",
        "sliding_window_length": 0,
    }
    for key, (lhs, rhs) in dots.items():
        config[key] = {"lhs_contracting_dimensions": [str(lhs)], "rhs_contracting_dimensions": [str(rhs)],
                       "lhs_batch_dimensions": ["0", "1"], "rhs_batch_dimensions": ["0", "1"]}
    return json.dumps({"operation_queue_id": "0", "wait_on_operation_queues": [],
                       "cudnn_fmha_backend_config": config})


def _custom_call(operands: Sequence[tf.Tensor], target: str, config: str, dtypes: List[tf.DType],
                 shapes: List[List[int]]) -> List[tf.Tensor]:
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # XLA's own ops (compiled functions only)

    return gen_xla_ops.xla_custom_call_v2(operands=list(operands), call_target_name=target, backend_config=config,
                                          has_side_effect=False, result_dtypes=dtypes, result_shapes=shapes)


def _forward(queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(O, stats)`` of the forward call (the workspace output dropped)."""
    batch, heads, time, head_dim = queries.shape.as_list()
    out, stats, _ = _custom_call(
        [queries, keys, values], FORWARD_TARGET, backend_config(batch, heads, time, queries.dtype, backward=False),
        [queries.dtype, tf.float32, tf.uint8], [[batch, heads, time, head_dim], [batch, heads, time], [0]])
    return out, stats


def _backward(queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, stats: tf.Tensor, d_out: tf.Tensor,
              out: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(dQ, dK, dV)`` of the backward call (the operand order XLA's cuDNN compiler reads)."""
    batch, heads, time, head_dim = queries.shape.as_list()
    shape = [batch, heads, time, head_dim]
    dq, dk, dv, _ = _custom_call(
        [queries, keys, values, stats, d_out, out], BACKWARD_TARGET,
        backend_config(batch, heads, time, queries.dtype, backward=True),
        [queries.dtype] * 3 + [tf.uint8], [shape, shape, shape, [0]])
    return dq, dk, dv


class CudnnAttention:
    """The ``"cudnn"`` attention kernel (:mod:`lmkit.layers.kernels`).

    Args:
      shape_check: ``(time, head_dim, dtype) -> None or why not``, asked once
        per kind of call while tracing, on a machine with a GPU only:
        :func:`compile_check` by default (cuDNN compiles that length and head
        size here). A call it declines keeps the matmuls, and
        :attr:`declined` says why (the trainer prints it once).
    """

    name = "cudnn"

    def __init__(self, shape_check: Optional[Callable[[int, int, tf.DType], Optional[str]]] = None) -> None:
        self._shape_check = shape_check or compile_check
        self._lock = threading.Lock()  # the native backend traces each replica in its own thread
        self._shapes: Dict[Tuple[int, int, str], Optional[str]] = {}
        self.declined: Dict[str, str] = {}  # the kind of call -> why it keeps the matmuls, as asked so far

    def fits(self, time: int, head_dim: int, dtype: tf.DType) -> bool:
        """Whether cuDNN takes attention over ``time`` positions of ``head_dim`` in ``dtype`` here.

        Without a GPU nothing runs, so every such call fits (the program is
        only traced). With one, :attr:`_shape_check` decides, once per kind.
        """
        if not _gpu_visible():
            return True
        key = (int(time), int(head_dim), tf.as_dtype(dtype).name)
        with self._lock:
            if key not in self._shapes:
                with tf.init_scope():  # eagerly, also while a step is being traced
                    self._shapes[key] = why = self._shape_check(int(time), int(head_dim), tf.as_dtype(dtype))
                if why is not None:
                    self.declined[f"windows of {key[0]} positions, head size {key[1]}, {key[2]}"] = why
            return self._shapes[key] is None

    def applies(self, queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, rate: float, training: Any,
                window: Optional[int]) -> bool:
        """Whether this call can go to cuDNN; decided from static facts while tracing.

        It needs bf16 or f16 arrays of static shape, key/value heads that
        divide the query heads (grouped-query attention), a head size that is
        a multiple of 8 up to 128, no sliding window, no dropout on the
        probabilities while training, and (on a GPU) a length and head size
        that cuDNN compiles here (:meth:`fits`).
        """
        shapes = [t.shape for t in (queries, keys, values)]
        if any(s.rank != 4 or not s.is_fully_defined() for s in shapes):
            return False
        if queries.dtype not in _DTYPE_NAMES or keys.dtype != queries.dtype or values.dtype != queries.dtype:
            return False
        (batch, heads, time, head_dim), kv_heads = shapes[0], shapes[1][1]
        if shapes[1] != shapes[2] or shapes[1] != (batch, kv_heads, time, head_dim) or heads % kv_heads:
            return False
        if head_dim % 8 or head_dim > MAX_HEAD_DIM or window:
            return False
        if rate > 0 and _maybe_training(training):
            with self._lock:
                self.declined[f"training windows with attention dropout {rate:g}"] = (
                    "cuDNN's fused attention runs here without dropout; a dropout of 0 on the attention "
                    "probabilities lets it take them: dropout = 0.0, or attention_dropout=0.0 in the model "
                    "section (for a model that takes it), which keeps the rest of the dropout")
            return False
        return self.fits(time, head_dim, queries.dtype)

    def __call__(self, queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """Causal attention ``[batch, heads, time, head_dim]`` of already scaled queries (keys and values
        ``[batch, kv_heads, time, head_dim]``, ``kv_heads`` dividing ``heads``)."""
        group = queries.shape[1] // keys.shape[1]
        if group > 1:  # query head h reads key/value head h // group
            keys, values = tf.repeat(keys, group, axis=1), tf.repeat(values, group, axis=1)

        @tf.custom_gradient
        def attention(q, k, v):
            out, stats = _forward(q, k, v)

            def grad(d_out):
                return _backward(q, k, v, stats, tf.cast(d_out, q.dtype), out)

            return out, grad

        return attention(queries, keys, values)

    def probe(self) -> Optional[str]:
        """None when the kernel compiles and agrees with the matmuls on this machine's GPU, else why not.

        The answer is kept: a process probes once (``lmkit train`` asks before
        it writes anything, the trainer again when it builds its steps).
        """
        if not hasattr(self, "_probed"):
            self._probed = self._probe()
        return self._probed

    def _probe(self) -> Optional[str]:
        if not _gpu_visible():
            return "no GPU is visible to TensorFlow"
        missing = cudnn_library()
        if missing is not None:  # nothing to compile against (and nothing to fail inside XLA)
            return missing
        try:
            with tf.device("/GPU:0"):
                return check_against_matmul(self)
        except Exception as exc:  # a missing cuDNN, an XLA that rejects the call: all mean "not here"
            return f"compiling it failed ({_first_line(exc, 300)})"


def _gpu_visible() -> bool:
    return bool(tf.config.list_logical_devices("GPU"))


def cudnn_library(paths: Optional[Sequence[str]] = None) -> Optional[str]:
    """None when cuDNN 9 can be loaded in this process, else why not (what to install).

    Looks where TensorFlow does: the library path and the linker's cache
    (``dlopen``), and the ``nvidia/cudnn/lib`` folder of the ``nvidia-cudnn-cu12``
    wheel that ``tensorflow[and-cuda]`` brings, in ``paths`` (default:
    ``sys.path``).
    """
    try:
        ctypes.CDLL(LIBRARY)
        return None
    except OSError:
        pass
    for folder in sys.path if paths is None else paths:
        if folder and os.path.isfile(os.path.join(folder, "nvidia", "cudnn", "lib", LIBRARY)):
            return None
    return (f"cuDNN 9 ({LIBRARY}) is not installed: pip install 'tensorflow[and-cuda]' brings it, or put its "
            "folder on LD_LIBRARY_PATH")


def compile_check(time: int, head_dim: int, dtype: tf.DType) -> Optional[str]:
    """None when cuDNN compiles and runs causal attention over ``time`` positions of ``head_dim`` here.

    Runs the forward and backward calls once on zeros of ``[1, 1, time,
    head_dim]`` on the first GPU (the values were checked by the probe): a
    length or head size this cuDNN has no engine for fails here rather than
    in the training step's compilation.
    """
    zeros = tf.zeros([1, 1, time, head_dim], dtype)
    both = tf.function(lambda q, k, v: _with_gradients(KERNEL, q, k, v), jit_compile=True)
    try:
        with tf.device("/GPU:0"):
            [t.numpy() for t in both(zeros, zeros, zeros)]
    except Exception as exc:  # an engine cuDNN does not have for this length or head size
        return f"cuDNN did not compile {time} positions x head size {head_dim} ({_first_line(exc, 200)})"
    return None


def _with_gradients(attention: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor], q: tf.Tensor, k: tf.Tensor,
                    v: tf.Tensor, weights: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
    """``[out, dQ, dK, dV]`` of ``attention(q, k, v)``, the gradients of the float32 sum of ``out``
    (times ``weights`` where given)."""
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = attention(q, k, v)
        total = tf.cast(out, tf.float32) if weights is None else tf.cast(out, tf.float32) * weights
        loss = tf.reduce_sum(total)
    return [out] + tape.gradient(loss, [q, k, v])


def _first_line(exc: Exception, limit: int) -> str:
    """``Type: the message's first line`` (at most ``limit`` characters of it) of an error."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {(text.splitlines()[0] if text else type(exc).__name__)[:limit]}"


def _maybe_training(training: Any) -> bool:
    """Whether ``training`` may be true (a tensor counts as maybe)."""
    return training if isinstance(training, bool) else True


def check_against_matmul(kernel: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor],
                         shape: Tuple[int, int, int, int] = (2, 2, 128, 64),
                         dtype: tf.DType = tf.bfloat16, tolerance: float = 0.05) -> Optional[str]:
    """Compiles ``kernel``'s attention, forward and backward, and compares it with float32 matmuls.

    Returns None when the output and the three gradients each stay within
    ``tolerance`` of the largest reference value (bf16 rounds at about
    0.008), else what differed. Runs on the current device.
    """
    rng = np.random.default_rng(0)
    q, k, v, w = (tf.constant(rng.standard_normal(shape).astype(np.float32)) for _ in range(4))
    scale = 1.0 / np.sqrt(shape[3])

    @tf.function(jit_compile=True)
    def fused(q, k, v):
        return _with_gradients(lambda q, k, v: kernel(q * tf.cast(scale, dtype), k, v),
                               *(tf.cast(t, dtype) for t in (q, k, v)), weights=w)

    @tf.function(jit_compile=True)
    def reference(q, k, v):  # lmkit's matmuls, one block, in float32
        from lmkit.layers.attention import causal_attend

        return _with_gradients(lambda q, k, v: causal_attend(q * scale, k, v, 1, 0.0, False), q, k, v, weights=w)

    rounded = [tf.cast(tf.cast(t, dtype), tf.float32) for t in (q, k, v)]  # the inputs the kernel sees
    got = [None if t is None else tf.cast(t, tf.float32).numpy() for t in fused(q, k, v)]
    want = [t.numpy() for t in reference(*rounded)]
    for name, a, b in zip(("output", "dQ", "dK", "dV"), got, want):
        if a is None:
            return f"it gives no {name}"
        if a.shape != b.shape:
            return f"its {name} has shape {a.shape}, not {b.shape}"
        error = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-6)
        if not np.isfinite(error) or error > tolerance:
            return f"its {name} differs from the matmuls' by {error:.3g} of the largest value (bound {tolerance})"
    return None


KERNEL = CudnnAttention()
