"""cuDNN's fused attention (lmkit.layers.kernels.cudnn), checked on a CPU.

cuDNN runs only on a GPU under XLA, so these CPU tests check what can be checked without one: the
program the custom calls make (targets, shapes, which tensor goes where, the backend config), that the
dimension numbers of that config compute attention and its gradients (a NumPy dot_general reads them),
the custom gradient's wiring with a reference in cuDNN's place, which calls the kernel takes, and the
probe. benchmarks/gpu_session.sh cudnn measures and checks it on a GPU.
"""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import kernels as attention_kernels
from lmkit.layers.kernels import cudnn as cudnn_attention
from lmkit.layers.kernels.cudnn import BACKWARD_TARGET, FORWARD_TARGET, KERNEL, backend_config, check_against_matmul
from tests.layers.test_kernels import SHAPE, _matmul_attention, _qkv


def _custom_calls(hlo: str):
    """{target: (instruction name, result text, [operand names], backend config dict)} of an HLO module."""
    calls = {}
    for line in hlo.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)) custom-call\((.*?)\), custom_call_target=\"([^\"]+)\"",
                         line)
        if not match:
            continue
        name, results, operands, target = match.groups()
        config_text = line.split("backend_config=", 1)[1]
        if config_text.startswith('"'):  # printed as an escaped string by some versions
            config_text = json.loads(config_text[:config_text.rindex('"') + 1])
        calls[target] = (name, results, re.findall(r"%([\w.\-]+)", operands),
                         json.JSONDecoder().raw_decode(config_text)[0])
    return calls


def _tuple_elements(hlo: str):
    """{instruction name: (tuple it reads, index)} of the get-tuple-element instructions."""
    found = {}
    for match in re.finditer(r"%([\w.\-]+) = [^\n]*? get-tuple-element\([^\n]*?%([\w.\-]+)\), index=(\d+)", hlo):
        found[match.group(1)] = (match.group(2), int(match.group(3)))
    return found


def _producer(hlo: str, name: str) -> str:
    """Follows reshapes and copies back from instruction ``name`` to where its value comes from."""
    while True:
        match = re.search(rf"%{re.escape(name)} = \S+ (?:reshape|copy|bitcast)\(\S+ %([\w.\-]+)\)", hlo)
        if not match:
            return name
        name = match.group(1)


def test_the_forward_and_backward_calls_in_the_compiled_program():
    batch, heads, time, head_dim = SHAPE

    @tf.function(jit_compile=True)
    def step(q, k, v, w):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = KERNEL(q, k, v)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * w)
        return tape.gradient(loss, [q, k, v])

    q, k, v = _qkv(dtype=tf.bfloat16)
    hlo = step.experimental_get_compiler_ir(q, k, v, tf.ones(SHAPE))(stage="hlo")
    calls = _custom_calls(hlo)
    assert set(calls) == {FORWARD_TARGET, BACKWARD_TARGET}
    shape = f"bf16[{batch},{heads},{time},{head_dim}]"
    fwd_name, fwd_results, fwd_operands, fwd_config = calls[FORWARD_TARGET]
    assert re.sub(r"\{[\d,]*\}", "", fwd_results) == f"({shape}, f32[{batch},{heads},{time}], u8[0])"
    bwd_name, bwd_results, bwd_operands, bwd_config = calls[BACKWARD_TARGET]
    assert re.sub(r"\{[\d,]*\}", "", bwd_results) == f"({shape}, {shape}, {shape}, u8[0])"

    # Which value goes where: the backward call reads the forward's Q, K, V, its statistics (result 1),
    # the incoming gradient, and its output (result 0): the order XLA's cuDNN compiler reads.
    sources = [_producer(hlo, name) for name in fwd_operands]
    assert [s.startswith("arg") for s in sources] == [True, True, True]
    assert [_producer(hlo, name) for name in bwd_operands[:3]] == sources
    elements = _tuple_elements(hlo)
    assert elements[bwd_operands[3]] == (fwd_name, 1)  # the softmax statistics
    assert elements[bwd_operands[5]] == (fwd_name, 0)  # the forward output
    assert bwd_operands[4] not in elements  # dO: the loss's gradient, not a result of either call
    assert len(bwd_operands) == 6

    for config, backward in ((fwd_config, False), (bwd_config, True)):
        assert config == json.loads(backend_config(batch, heads, time, tf.bfloat16, backward))
        fmha = config["cudnn_fmha_backend_config"]
        assert fmha["mask_type"] == "CAUSAL" and fmha["is_flash_attention"] is True
        assert fmha["fmha_scale"] == 1.0 and fmha["dropout_rate"] == 0.0  # the queries come scaled
        assert fmha["intermediate_tensor_shape"]["dimensions"] == [str(d) for d in (batch, heads, time, time)]
        assert fmha["intermediate_tensor_shape"]["element_type"] == "BF16"


def _dot_general(lhs, rhs, dims):
    """XLA's DotGeneral from a backend config's dimension numbers: batch dims, then lhs's free, then rhs's."""
    (lc,) = [int(d) for d in dims["lhs_contracting_dimensions"]]
    (rc,) = [int(d) for d in dims["rhs_contracting_dimensions"]]
    lb, rb = [int(d) for d in dims["lhs_batch_dimensions"]], [int(d) for d in dims["rhs_batch_dimensions"]]
    letters = iter("abcdefghij")
    lhs_ix, rhs_ix = [None] * lhs.ndim, [None] * rhs.ndim
    for i, j in zip(lb, rb):
        lhs_ix[i] = rhs_ix[j] = next(letters)
    lhs_ix[lc] = rhs_ix[rc] = "z"
    for ix in (lhs_ix, rhs_ix):
        for i, letter in enumerate(ix):
            if letter is None:
                ix[i] = next(letters)
    out = [lhs_ix[i] for i in lb] + [x for i, x in enumerate(lhs_ix) if i not in lb and i != lc] + \
          [x for i, x in enumerate(rhs_ix) if i not in rb and i != rc]
    return np.einsum(f"{''.join(lhs_ix)},{''.join(rhs_ix)}->{''.join(out)}", lhs, rhs)


def test_the_configs_dimension_numbers_compute_attention_and_its_gradients():
    """Read as XLA reads them, the six dot products of the configs give attention and its exact gradients."""
    batch, heads, time, head_dim = SHAPE
    forward = json.loads(backend_config(batch, heads, time, tf.bfloat16, False))["cudnn_fmha_backend_config"]
    backward = json.loads(backend_config(batch, heads, time, tf.bfloat16, True))["cudnn_fmha_backend_config"]
    q, k, v, w = (t.numpy().astype(np.float64) for t in _qkv() + [_qkv(seed=1)[0]])

    scores = _dot_general(q, k, forward["bmm1_dot_dimension_numbers"])  # [B, N, T, S]
    scores = np.where(np.tril(np.ones((time, time), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = _dot_general(probs, v, forward["bmm2_dot_dimension_numbers"])
    d_out = w  # the gradient of sum(out * w)
    d_v = _dot_general(probs, d_out, backward["bmm2_grad_gemm1_dot_dimension_numbers"])
    d_probs = _dot_general(d_out, v, backward["bmm2_grad_gemm2_dot_dimension_numbers"])
    d_scores = probs * (d_probs - (d_out * out).sum(-1, keepdims=True))
    d_k = _dot_general(d_scores, q, backward["bmm1_grad_gemm1_dot_dimension_numbers"])
    d_q = _dot_general(d_scores, k, backward["bmm1_grad_gemm2_dot_dimension_numbers"])

    qt, kt, vt = (tf.constant(x) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([qt, kt, vt])
        want = _matmul_attention(qt, kt, vt)
        loss = tf.reduce_sum(want * w)
    want_grads = tape.gradient(loss, [qt, kt, vt])
    # lmkit's softmax computes in float32 (values of order 1: rounding ~1e-7); a wrong dimension is off by O(1)
    np.testing.assert_allclose(out, want.numpy(), atol=1e-5)
    for got, expected in zip((d_q, d_k, d_v), want_grads):
        assert got.shape == tuple(SHAPE)
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)


def _reference_forward(q, k, v):
    """What the forward call returns, computed with TensorFlow: (O, log-sum-exp of each row's scores)."""
    time = q.shape[2]
    scores = tf.where(tf.range(time)[:, None] >= tf.range(time)[None, :], tf.matmul(q, k, transpose_b=True), -1e9)
    stats = tf.reduce_logsumexp(scores, axis=-1)
    return tf.matmul(tf.exp(scores - stats[..., None]), v), stats


def _reference_backward(q, k, v, stats, d_out, out):
    """What the backward call returns, from the flash-attention identities (P rebuilt from the statistics)."""
    time = q.shape[2]
    visible = tf.range(time)[:, None] >= tf.range(time)[None, :]
    probs = tf.where(visible, tf.exp(tf.matmul(q, k, transpose_b=True) - stats[..., None]), 0.0)
    d_probs = tf.matmul(d_out, v, transpose_b=True)
    d_scores = probs * (d_probs - tf.reduce_sum(d_out * out, axis=-1, keepdims=True))
    return tf.matmul(d_scores, k), tf.matmul(d_scores, q, transpose_a=True), tf.matmul(probs, d_out, transpose_a=True)


@pytest.mark.parametrize("heads, kv_heads", [(3, 3), (4, 2), (3, 1)])
def test_the_custom_gradient_wires_the_calls_as_attention(monkeypatch, heads, kv_heads):
    """With references in the calls' places, the kernel's output and gradients are attention's, grouped-query
    attention's too (its key/value gradients summed over the queries that share a head)."""
    monkeypatch.setattr(cudnn_attention, "_forward", _reference_forward)
    monkeypatch.setattr(cudnn_attention, "_backward", _reference_backward)
    shape = (2, heads, 16, 8)
    q, k, v = _qkv(shape)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    w = _qkv(shape, seed=1)[0]
    results = []
    for attend in (KERNEL, _matmul_attention):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attend(q, k, v)
            loss = tf.reduce_sum(out * w)
        results.append([out] + tape.gradient(loss, [q, k, v]))
    for got, want in zip(*results):
        # float32 on values of order 1 (exp(s - logsumexp) against lmkit's softmax: ~1e-6 apart); a wrong
        # tensor in a wrong place is off by O(1)
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-5)


def test_check_against_matmul_accepts_attention_and_names_what_differs():
    def bf16_matmul_attention(q, k, v):
        return _matmul_attention(q, k, v)

    def not_causal(q, k, v):
        return tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1), v)

    def wrong_value_gradient(q, k, v):  # the same output, half the values' gradient
        return _matmul_attention(q, k, 0.5 * v + tf.stop_gradient(0.5 * v))

    def no_key_gradient(q, k, v):
        return _matmul_attention(q, tf.stop_gradient(k), v)

    shape = (1, 2, 16, 8)
    assert check_against_matmul(bf16_matmul_attention, shape) is None
    assert "output differs" in check_against_matmul(not_causal, shape)
    assert "dV differs" in check_against_matmul(wrong_value_gradient, shape)
    assert "no dK" in check_against_matmul(no_key_gradient, shape)


def test_the_probe_without_a_gpu_says_so():
    assert "no GPU" in KERNEL.probe()


@pytest.mark.parametrize("case, applies", [
    ("bf16", True), ("f16", True), ("float32", False), ("grouped", True), ("grouped_uneven", False),
    ("keys_longer", False), ("head_dim_12", False),
    ("head_dim_256", False), ("window", False), ("dropout_training", False), ("dropout_not_training", True),
    ("dynamic_time", False)])
def test_which_calls_the_cudnn_kernel_takes(case, applies):
    dtype = {"f16": tf.float16, "float32": tf.float32}.get(case, tf.bfloat16)
    head_dim = {"head_dim_12": 12, "head_dim_256": 256}.get(case, 8)
    q, k, v = (tf.zeros([2, 4, 16, head_dim], dtype) for _ in range(3))
    if case == "grouped":
        k = v = tf.zeros([2, 2, 16, head_dim], dtype)
    if case == "grouped_uneven":  # 3 key/value heads cannot serve 4 query heads
        k = v = tf.zeros([2, 3, 16, head_dim], dtype)
    if case == "keys_longer":  # a cache longer than the queries: not this causal self-attention
        k = v = tf.zeros([2, 4, 32, head_dim], dtype)
    rate = 0.1 if case.startswith("dropout") else 0.0
    training = case != "dropout_not_training"
    window = 4 if case == "window" else None
    if case == "dynamic_time":
        spec = tf.TensorSpec([2, 4, None, 8], tf.bfloat16)
        seen = []
        tf.function(lambda q, k, v: seen.append(KERNEL.applies(q, k, v, 0.0, True, None)) or q,
                    input_signature=[spec] * 3).get_concrete_function()
        assert seen == [applies]
        return
    assert KERNEL.applies(q, k, v, rate, training, window) is applies


def test_on_a_gpu_each_kind_of_call_is_checked_once_eagerly_and_a_declined_one_keeps_the_matmuls(monkeypatch):
    asked = []

    def shape_check(time, head_dim, dtype):
        asked.append((time, head_dim, dtype, tf.executing_eagerly()))
        return "no engine for this length" if time == 24 else None

    kernel = cudnn_attention.CudnnAttention(shape_check=shape_check)
    monkeypatch.setattr(cudnn_attention, "_gpu_visible", lambda: True)
    monkeypatch.setattr(cudnn_attention, "KERNEL", kernel)  # what the registry hands out
    seen = []

    def trace(time, head_dim=8):
        spec = tf.TensorSpec([2, 4, time, head_dim], tf.bfloat16)
        tf.function(lambda q, k, v: seen.append(kernel.applies(q, k, v, 0.0, True, None)) or q,
                    input_signature=[spec] * 3).get_concrete_function()

    for time in (16, 24, 16, 24):
        trace(time)
    assert seen == [True, False, True, False]
    # asked once per kind, outside the trace (eagerly), with the call's length, head size and dtype
    assert asked == [(16, 8, tf.bfloat16, True), (24, 8, tf.bfloat16, True)]
    assert kernel.applies(*(tf.zeros([2, 4, 16, 16], tf.float16),) * 3, 0.0, True, None) is True
    assert asked[-1][:3] == (16, 16, tf.float16)
    assert attention_kernels.declined("cudnn") == [
        "attention_kernel 'cudnn': the matmuls for windows of 24 positions, head size 8, bfloat16 "
        "(no engine for this length)"]
    assert attention_kernels.declined("matmul") == []
    # without a GPU nothing is compiled: the program is only traced, and every such call fits
    monkeypatch.setattr(cudnn_attention, "_gpu_visible", lambda: False)
    assert kernel.fits(40, 8, tf.bfloat16) and len(asked) == 3


def test_the_probe_looks_for_cudnn_before_compiling_anything(monkeypatch, tmp_path):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(cudnn_attention.ctypes, "CDLL", no_library)
    why = cudnn_attention.cudnn_library(paths=[str(tmp_path)])
    assert why == ("cuDNN 9 (libcudnn.so.9) is not installed: pip install 'tensorflow[and-cuda]' brings it, "
                   "or put its folder on LD_LIBRARY_PATH")
    wheel = tmp_path / "nvidia" / "cudnn" / "lib"  # where the nvidia-cudnn-cu12 wheel puts it
    wheel.mkdir(parents=True)
    (wheel / "libcudnn.so.9").write_bytes(b"")
    assert cudnn_attention.cudnn_library(paths=["", str(tmp_path)]) is None
    # on a GPU without cuDNN the probe says so and compiles nothing
    monkeypatch.setattr(cudnn_attention, "_gpu_visible", lambda: True)
    monkeypatch.setattr(cudnn_attention, "cudnn_library", lambda: why)
    monkeypatch.setattr(cudnn_attention, "check_against_matmul",
                        lambda kernel: pytest.fail("compiled without cuDNN"))
    assert cudnn_attention.CudnnAttention().probe() == why


def test_a_length_cudnn_cannot_compile_is_a_reason_not_an_error():
    """On this CPU nothing compiles the cuDNN calls: compile_check returns why, as a GPU whose cuDNN lacks
    an engine for the length would, instead of raising."""
    why = cudnn_attention.compile_check(16, 8, tf.bfloat16)
    assert why.startswith("cuDNN did not compile 16 positions x head size 8 (")
    assert "fmhaSoftmax" in why


def test_training_windows_with_attention_dropout_keep_the_matmuls_and_say_how_to_change_that():
    kernel = cudnn_attention.CudnnAttention(shape_check=lambda *shape: None)
    q = tf.zeros([2, 4, 16, 8], tf.bfloat16)
    assert kernel.applies(q, q, q, 0.1, True, None) is False
    assert kernel.applies(q, q, q, 0.1, False, None) is True  # evaluation: no dropout, cuDNN takes it
    assert kernel.applies(q, q, q, 0.0, True, None) is True
    (what, why), = kernel.declined.items()
    assert what == "training windows with attention dropout 0.1"
    assert "dropout = 0.0" in why and "attention_dropout=0.0 in the model section" in why
