#!/usr/bin/env python
"""Training words/sec of lmkit against tf.keras and PyTorch, measured in one run.

For each config (``config_small``, ``config_medium``, ``config_transformer``)
the same language model is trained four ways in this one process:

* ``lmkit``: the real :class:`lmkit.train.Trainer` step (``Trainer.train_step``
  after ``fit(max_steps=2)`` built it), driven by the same loop as
  ``Trainer.fit``: one ``tf.constant`` per input, the state carried across
  windows, losses read back once per run;
* ``lmkit_xla``: the same with ``jit_compile=True``;
* ``keras``: what a user would otherwise write with ``tf.keras`` layers
  (``Embedding``, ``LSTM`` with the state passed across windows, ``Dense``;
  or ``MultiHeadAttention``/``LayerNormalization`` blocks) and a
  ``tf.function`` training step with a Keras optimizer (``global_clipnorm``);
* ``torch``: the same model in PyTorch (``nn.LSTM``,
  ``nn.TransformerEncoderLayer``), eager, ``clip_grad_norm_``; skipped (and
  said so) when torch is not installed (``pip install torch==2.13.0``).

Variants of the lmkit step, not in the default set (name them in
``--frameworks``; their ratios are to ``lmkit``): ``lmkit_bf16`` and
``lmkit_fp16`` (``precision = mixed_bfloat16`` / ``mixed_float16``),
``lmkit_k2`` and ``lmkit_k4`` (``grad_accum_steps = 2`` / ``4``, the same
global batch in 2 or 4 micro-batches), and ``lmkit_bf16_f32probs``: the
``mixed_bfloat16`` step with attention's softmax as it was before
:func:`lmkit.layers.attend.masked_softmax` (float32 probabilities kept
for the backward pass; swapped in its own worker), the baseline of
``lmkit_bf16`` measured in the same run; ``lmkit_blocks4`` and
``lmkit_bf16_blocks4``: attention in 4 query blocks that skip the masked keys
(``model_params = {"attention_blocks": 4}``), against ``lmkit`` and
``lmkit_bf16``; ``lmkit_blocks1`` and ``lmkit_bf16_blocks1``: attention in one
block, the baselines of ``lmkit`` and ``lmkit_bf16`` now that ``"auto"``
blocks are the default; ``lmkit_bf16_nocmdbuf`` and ``lmkit_bf16_cmdbuf``:
the ``mixed_bfloat16`` step with XLA's command buffers (CUDA graphs) off, and
on for fusions and cuBLAS calls (``XLA_FLAGS`` of their worker, ``LMKIT_ENV``),
``lmkit_bf16_devin``: the compiled step on windows and flags placed on the
device beforehand (no copy from host memory per step), and
``lmkit_bf16_prefetch``: the trainer's ``device_prefetch = 2`` (windows copied
two steps ahead on a thread of their own), and ``lmkit_bf16_cudnn``: causal
attention through cuDNN's fused kernel (``attention_kernel = "cudnn"``, a GPU
with cuDNN 9 only) and ``lmkit_bf16_cudnn_prefetch`` (that and
``device_prefetch = 2``), against ``lmkit_bf16``; ``lmkit_bf16_loop``,
``lmkit_bf16_loop_prefetch`` and ``lmkit_bf16_cudnn_loop_prefetch``: the same
through ``Trainer.fit``'s own epoch loop (its flags, bookkeeping and feed),
not the bare step::

    .venv/bin/python benchmarks/train_throughput.py --configs config_small,config_transformer \
        --frameworks lmkit,lmkit_bf16,lmkit_fp16,lmkit_k2,lmkit_k4 \
        --output benchmarks/results/train_precision_accum.json

Same sizes, vocabulary 10000, batch, window, optimizer (SGD lr 1.0 for the
LSTMs, Adam for the transformer), global-norm clipping, dropout placement
and loss (cross entropy summed over the window, averaged over the batch).
The data are synthetic random ids: speed does not depend on them.

Every framework runs in a process of its own (a worker started by this
script and driven over a pipe), so no framework shares a process with
another's thread pools, allocator or OpenMP runtime: measured here, putting
all four in one process slowed every column by up to 20%, unevenly. The
workers are built one after the other; then the timed runs ALTERNATE
(lmkit, lmkit_xla, keras, torch, lmkit, ...), one worker running at a time
while the others wait idle on their pipe, each run a fixed number of steps,
so that load from other jobs on this shared machine hits every framework
alike. Reported: the median words/sec per framework and the ratio lmkit /
baseline, both of the medians and as the median of the per-round ratios.
Every framework gets the same threads (``--threads``, default all cores:
TF intra-op and inter-op pools, ``torch.set_num_threads`` and
``set_num_interop_threads``).

Usage::

    .venv/bin/python benchmarks/train_throughput.py            # ~10 minutes
    .venv/bin/python benchmarks/train_throughput.py --quick    # ~4 minutes
    .venv/bin/python benchmarks/train_throughput.py --configs config_small --repeats 9

Writes ``benchmarks/results/train_throughput.json`` and ``.png``.

On a GPU (``--device gpu``; every framework on the GPU, the CPU ones hidden
from it otherwise) the PyTorch columns run on CUDA: ``torch`` (float32
eager), ``torch_bf16`` (eager under ``torch.autocast`` bfloat16) and
``torch_compile`` / ``torch_compile_bf16`` (``torch.compile``); lmkit's
``lmkit`` is the default step (``jit_compile="auto"``: XLA on a GPU),
``lmkit_plain`` the uncompiled one, ``lmkit_bf16`` / ``lmkit_xla_bf16`` in
``mixed_bfloat16``. ``--peak_probe`` first measures the GPU's bfloat16
matmul rate (8192^3 products) and each column's model FLOPs utilisation is
stated against it, with the model FLOPs per token that lmkit's trainer logs
(:mod:`lmkit.train.flops`: 6 x the weights that multiply + 12 x layers x
context x width, the same count for every framework)::

    python benchmarks/train_throughput.py --device gpu --threads 16 --peak_probe \
        --configs config_small,config_medium,config_transformer,config_gpt2_124m_shape \
        --frameworks lmkit,lmkit_plain,lmkit_bf16,torch,torch_bf16,torch_compile_bf16

writes ``benchmarks/results/train_throughput_gpu.json`` (with the GPU's name).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    package_version,
    parse_overrides,
    ratio_spread,
    save_figure,
    summarize,
    write_json,
)
from benchmarks.attention import float32_probs_softmax  # noqa: E402

DEFAULT_FRAMEWORKS = ("lmkit", "lmkit_xla", "keras", "torch")
# lmkit variants: name -> config overrides (compared with plain "lmkit")
LMKIT_VARIANTS: Dict[str, Dict[str, Any]] = {
    "lmkit": {},
    "lmkit_plain": {"jit_compile": False},
    "lmkit_xla": {"jit_compile": True},
    "lmkit_bf16": {"precision": "mixed_bfloat16"},
    "lmkit_xla_bf16": {"jit_compile": True, "precision": "mixed_bfloat16"},
    "lmkit_fp16": {"precision": "mixed_float16"},
    "lmkit_k2": {"grad_accum_steps": 2},
    "lmkit_k4": {"grad_accum_steps": 4},
    "lmkit_bf16_f32probs": {"precision": "mixed_bfloat16"},
    # attention in 4 query blocks that skip the masked keys (transformers; the other models ignore it)
    "lmkit_blocks4": {"model_params": {"attention_blocks": 4}},
    "lmkit_bf16_blocks4": {"precision": "mixed_bfloat16", "model_params": {"attention_blocks": 4}},
    # one block, as before "auto" (4 blocks from windows of 1024 positions) became the default
    "lmkit_blocks1": {"model_params": {"attention_blocks": 1}},
    "lmkit_bf16_blocks1": {"precision": "mixed_bfloat16", "model_params": {"attention_blocks": 1}},
    # XLA's command buffers (CUDA graphs: a sequence of kernels launched at once) off, and on for the
    # kinds of kernels an lmkit step has (the flags in LMKIT_ENV)
    "lmkit_bf16_nocmdbuf": {"precision": "mixed_bfloat16"},
    "lmkit_bf16_cmdbuf": {"precision": "mixed_bfloat16"},
    # the compiled step fed with inputs already on the device (DEVICE_INPUTS)
    "lmkit_bf16_devin": {"precision": "mixed_bfloat16"},
    # the trainer's own feed: windows copied two steps ahead on a thread, flags kept on the device
    "lmkit_bf16_prefetch": {"precision": "mixed_bfloat16", "device_prefetch": 2},
    # cuDNN's fused (flash) attention instead of the scores through matmuls (lmkit.layers.kernels);
    # the default ("auto") takes it where it runs, so the matmuls are a variant of their own
    "lmkit_bf16_cudnn": {"precision": "mixed_bfloat16", "attention_kernel": "cudnn"},
    "lmkit_bf16_matmul": {"precision": "mixed_bfloat16", "attention_kernel": "matmul"},
    "lmkit_bf16_cudnn_prefetch": {"precision": "mixed_bfloat16", "attention_kernel": "cudnn", "device_prefetch": 2},
    # Trainer.fit's own epoch loop (LOOP_VARIANTS) instead of the bare step: its per-step bookkeeping and
    # flags, its feed; one loss read per run, as a long epoch reads them once per progress line
    "lmkit_bf16_loop": {"precision": "mixed_bfloat16", "log_every_steps": 1000000},
    "lmkit_bf16_loop_prefetch": {"precision": "mixed_bfloat16", "device_prefetch": 2, "log_every_steps": 1000000},
    "lmkit_bf16_cudnn_loop_prefetch": {"precision": "mixed_bfloat16", "attention_kernel": "cudnn",
                                       "device_prefetch": 2, "log_every_steps": 1000000},
}
# Variants timed through the trainer's epoch loop (TrainingLoop.run_epoch, what fit() runs) over the run's windows.
LOOP_VARIANTS = ("lmkit_bf16_loop", "lmkit_bf16_loop_prefetch", "lmkit_bf16_cudnn_loop_prefetch")
# Variants whose worker places every window and the step's stop/save flags on the device before
# timing and calls the compiled step with them: no copy from host memory at any step (a copy to a GPU
# waits for the work queued before it, so the host could not start a step before the last one ended).
DEVICE_INPUTS = ("lmkit_bf16_devin",)
# Environment of a variant's worker: variable -> words added to it (XLA_FLAGS is read when TF starts).
LMKIT_ENV: Dict[str, Dict[str, str]] = {
    "lmkit_bf16_nocmdbuf": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "lmkit_bf16_cmdbuf": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL "
                                       "--xla_gpu_graph_min_graph_size=1"},
}
# Same-run A/B pairs reported beside the ratios to lmkit: (variant, its baseline other than lmkit).
PAIRED_RATIOS = (("lmkit_bf16", "lmkit_bf16_f32probs"), ("lmkit_bf16_blocks4", "lmkit_bf16"),
                 ("lmkit_bf16", "lmkit_bf16_blocks1"), ("lmkit", "lmkit_blocks1"),
                 ("lmkit_bf16_nocmdbuf", "lmkit_bf16"), ("lmkit_bf16_cmdbuf", "lmkit_bf16"),
                 ("lmkit_bf16_devin", "lmkit_bf16"), ("lmkit_bf16_prefetch", "lmkit_bf16"),
                 ("lmkit_bf16_cudnn", "lmkit_bf16"), ("lmkit_bf16_cudnn_prefetch", "lmkit_bf16"),
                 ("lmkit_bf16", "lmkit_bf16_matmul"), ("lmkit_bf16_cudnn", "lmkit_bf16_matmul"),
                 ("lmkit_bf16_loop", "lmkit_bf16_matmul"),
                 ("lmkit_bf16_loop", "lmkit_bf16"), ("lmkit_bf16_loop_prefetch", "lmkit_bf16_loop"),
                 ("lmkit_bf16_cudnn_loop_prefetch", "lmkit_bf16_loop"))


# lmkit variants that swap a function of lmkit in their own worker process (an older program as a
# baseline measured in the same run): name -> (module, attribute, replacement)
LMKIT_PATCHES: Dict[str, Tuple[str, str, Callable[..., Any]]] = {
    "lmkit_bf16_f32probs": ("lmkit.layers.attend", "masked_softmax", float32_probs_softmax),
}
# PyTorch columns: name -> (bfloat16 autocast, torch.compile)
TORCH_VARIANTS: Dict[str, Tuple[bool, bool]] = {
    "torch": (False, False),
    "torch_bf16": (True, False),
    "torch_compile": (False, True),
    "torch_compile_bf16": (True, True),
}
BASELINES = ("keras",) + tuple(TORCH_VARIANTS)
FRAMEWORKS = tuple(LMKIT_VARIANTS) + BASELINES
DEVICES = ("cpu", "gpu")
DEFAULT_CONFIGS = ("config_small", "config_medium", "config_transformer")
# Timed steps per run: a run lasts a few seconds on 2 cores.
STEPS = {"config_small": 40, "config_medium": 4, "config_transformer": 3, "config_tiny_transformer": 40,
         "config_gpt2_124m_shape": 1}
QUICK_STEPS = {"config_small": 20, "config_medium": 2, "config_transformer": 2, "config_tiny_transformer": 20,
               "config_gpt2_124m_shape": 1}
# On a GPU a step takes milliseconds: runs of this many steps last seconds there.
GPU_STEPS = {"config_small": 200, "config_medium": 100, "config_transformer": 100,
             "config_tiny_transformer": 200, "config_gpt2_124m_shape": 20}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help="comma-separated config names (default: %(default)s)")
    parser.add_argument("--frameworks", default=",".join(DEFAULT_FRAMEWORKS),
                        help=f"comma-separated subset of {', '.join(FRAMEWORKS)} (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per framework (default 5)")
    parser.add_argument("--steps", type=int, default=0,
                        help="training steps per timed run (default: per config, see STEPS)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before the first run")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="intra-op and inter-op threads of every framework (default: all cores)")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="seconds of idle between runs, so that spinning worker threads of the "
                             "previous framework go to sleep")
    parser.add_argument("--quick", action="store_true", help="3 repeats, fewer steps (a smoke run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every config and framework (a Python literal), "
                             "e.g. --set num_steps=512")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where every framework trains (default cpu: GPUs are hidden)")
    parser.add_argument("--peak_probe", action="store_true",
                        help="measure the device's bfloat16 matmul rate first and state each "
                             "transformer column's model FLOPs utilisation against it")
    parser.add_argument("--output", default="",
                        help="results file (default benchmarks/results/train_throughput[_gpu].json); "
                             "the plot goes next to it as .png")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a worker may take to build or to finish one run")
    parser.add_argument("--parallel_build", action="store_true",
                        help="build every framework's worker at once (many cores, e.g. a GPU machine); "
                             "the timed runs still run one at a time")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: FRAMEWORK:CONFIG
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.frameworks = [f for f in args.frameworks.split(",") if f]
    unknown = sorted(set(args.frameworks) - set(FRAMEWORKS))
    if unknown:
        parser.error(f"--frameworks {unknown[0]!r} is not one of {', '.join(FRAMEWORKS)}")
    if not args.output:
        suffix = "_gpu" if args.device == "gpu" else ""
        args.output = os.path.join(RESULTS_DIR, f"train_throughput{suffix}.json")
    if args.quick:
        args.repeats = min(args.repeats, 3)
    if args.repeats < 1 or args.threads < 1 or args.warmup < 1:
        parser.error("--repeats, --threads and --warmup must be >= 1")
    from lmkit.config import ConfigError, load_config
    try:
        args.overrides = parse_overrides(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    for name in args.configs:
        try:
            load_config(name, args.overrides)
        except ConfigError as exc:
            parser.error(f"--configs {name} with --set: {exc}" if args.set else f"--configs: {exc}")
    return args


# ----------------------------------------------------------------------------- data
def synthetic_batches(cfg: Any, num_batches: int, seed: int = 0):
    """Random ids and their BPTT windows: (ids, inputs, targets), windows [n, batch, num_steps] int32."""
    import numpy as np

    from lmkit.data.batching import bptt_arrays
    ids = np.random.RandomState(seed).randint(
        0, cfg.model["vocab_size"],
        size=cfg.data.batch_size * cfg.data.num_steps * num_batches + cfg.data.batch_size + 1)
    ids = ids.astype(np.int32)
    return (ids,) + tuple(bptt_arrays(ids, cfg.data.batch_size, cfg.data.num_steps))


class Runner:
    """Trains one model; :meth:`run` times ``steps`` steps including the final sync."""

    name = "?"

    def __init__(self) -> None:
        self.position = 0
        self.losses: List[float] = []
        self.setup_seconds = 0.0

    def run(self, steps: int) -> float:
        raise NotImplementedError


# ----------------------------------------------------------------------------- lmkit
class LmkitRunner(Runner):
    """The Trainer's own compiled step, driven like ``Trainer.fit`` drives it."""

    def __init__(self, cfg: Any, ids, inputs, targets, variant: str = "lmkit") -> None:
        super().__init__()
        import tensorflow as tf

        from lmkit.models import build_model
        from lmkit.train import Trainer
        self.name = variant
        self.tf = tf
        if variant in LMKIT_PATCHES:  # this worker only
            module, attribute, replacement = LMKIT_PATCHES[variant]
            setattr(importlib.import_module(module), attribute, replacement)
        cfg = cfg.replace(**LMKIT_VARIANTS[variant])
        tf.random.set_seed(cfg.run.seed)
        self.trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
        start = time.perf_counter()
        # fit() builds (and traces) the step that the timed runs then call.
        self.trainer.fit(ids, max_steps=2, num_epochs=1)
        self.setup_seconds = time.perf_counter() - start
        self.step = self.trainer.train_step
        self.parameters = sum(int(v.shape.num_elements()) for v in self.trainer.model.trainable_variables)
        self.flops_per_token = self.trainer.flops_per_token  # lmkit.train.flops, what the trainer logs
        self.inputs, self.targets = inputs, targets
        self.state = self.trainer.initial_state()
        self.device_inputs = variant in DEVICE_INPUTS
        if self.device_inputs:
            from lmkit.train.feed import feed_device, flag_tensors
            device = feed_device()
            with tf.device(device):
                self.inputs = [tf.identity(tf.constant(x)) for x in inputs]
                self.targets = [tf.identity(tf.constant(y)) for y in targets]
            self.flags = flag_tensors(device)(0.0, 0.0)  # (stop, save, end)
            self.step = self.trainer.step.function  # what Trainer.train_step calls, minus the flags' copies

    def run(self, steps: int) -> float:
        if self.name in LOOP_VARIANTS:
            return self._run_loop(steps)
        tf = self.tf
        pending = []
        start = time.perf_counter()
        feed = None
        # the windows of this run through the trainer's feed, as in fit()
        if self.trainer.config.compute.device_prefetch:
            from lmkit.train.feed import window_feed
            feed = window_feed(self._windows(steps), self.trainer.config.compute.device_prefetch)
        for k in range(steps):
            i = self.position % len(self.inputs)
            self.position += 1
            if self.device_inputs:
                out = self.step(self.inputs[i], self.targets[i], self.state, *self.flags)
            elif feed is not None:
                out = self.step(*feed.get(k), self.state)
            else:
                out = self.step(tf.constant(self.inputs[i]), tf.constant(self.targets[i]), self.state)
            self.state = out.state
            pending.append(out.loss)
        if feed is not None:
            feed.close()
        values = [float(v) for v in pending]  # the host sync Trainer.fit does every few steps
        elapsed = time.perf_counter() - start
        self.losses.extend(values)
        return elapsed

    def _windows(self, steps: int) -> List[Tuple[Any, Any]]:
        """The next ``steps`` ``(inputs, targets)`` from the current position, cycling (the position stays)."""
        n = len(self.inputs)
        return [(self.inputs[(self.position + k) % n], self.targets[(self.position + k) % n]) for k in range(steps)]

    def _run_loop(self, steps: int) -> float:
        """``steps`` steps of ``Trainer.fit``'s epoch loop on this run's windows (an "epoch" of them)."""
        from lmkit.train.records import TrainResult
        windows = self._windows(steps)
        self.position += steps
        start = time.perf_counter()
        run = self.trainer.loop.run_epoch(0, 1, windows, None, TrainResult())
        elapsed = time.perf_counter() - start
        self.losses.append(run.loss_sum / max(run.steps, 1))  # the run's mean (per-step losses would sync)
        return elapsed


# ----------------------------------------------------------------------------- keras
def _keras_lstm_model(cfg: Any):
    import tensorflow as tf
    keras = tf.keras

    class KerasLSTMLM(keras.Model):
        """Embedding -> LSTM x L (state passed across windows) -> Dense, Zaremba dropout."""

        def __init__(self) -> None:
            super().__init__()
            init = keras.initializers.RandomUniform(-cfg.model["init_scale"], cfg.model["init_scale"],
                                                    seed=cfg.run.seed)
            self.embedding = keras.layers.Embedding(cfg.model["vocab_size"], cfg.model["hidden_size"],
                                                    embeddings_initializer=init)
            self.lstms = [keras.layers.LSTM(cfg.model["hidden_size"], return_sequences=True, return_state=True,
                                            kernel_initializer=init, recurrent_initializer=init,
                                            bias_initializer=init, unit_forget_bias=False)
                          for _ in range(cfg.model["num_layers"])]
            self.drop = keras.layers.Dropout(cfg.model["dropout"])
            self.softmax = keras.layers.Dense(cfg.model["vocab_size"], kernel_initializer=init, bias_initializer=init)

        def call(self, ids, states, training=False):
            x = self.drop(self.embedding(ids), training=training)  # [batch, time, hidden]
            new_states = []
            for lstm, (h, c) in zip(self.lstms, states):
                x, h, c = lstm(x, initial_state=[h, c], training=training)
                x = self.drop(x, training=training)
                new_states.append((h, c))
            return self.softmax(x), new_states  # [batch, time, vocab]

    return KerasLSTMLM()


def _keras_transformer_model(cfg: Any):
    import tensorflow as tf
    keras = tf.keras
    ffn_dim = cfg.model["ffn_dim"] or 4 * cfg.model["hidden_size"]

    class Block(keras.layers.Layer):
        def __init__(self, init) -> None:
            super().__init__()
            self.norm1 = keras.layers.LayerNormalization(epsilon=1e-5)
            self.attention = keras.layers.MultiHeadAttention(
                cfg.model["num_heads"], cfg.model["hidden_size"] // cfg.model["num_heads"],
                dropout=cfg.model["dropout"], kernel_initializer=init)
            self.norm2 = keras.layers.LayerNormalization(epsilon=1e-5)
            self.inner = keras.layers.Dense(ffn_dim, kernel_initializer=init,
                                            activation=lambda x: keras.activations.gelu(x, approximate=True))
            self.outer = keras.layers.Dense(cfg.model["hidden_size"], kernel_initializer=init)
            self.drop = keras.layers.Dropout(cfg.model["dropout"])

        def call(self, x, training=False):
            h = self.norm1(x)
            x = x + self.drop(self.attention(h, h, use_causal_mask=True, training=training), training=training)
            return x + self.drop(self.outer(self.inner(self.norm2(x))), training=training)

    class KerasTransformerLM(keras.Model):
        """Token + position embeddings -> pre-LN blocks -> final norm -> tied softmax."""

        def __init__(self) -> None:
            super().__init__()
            init = keras.initializers.RandomUniform(-cfg.model["init_scale"], cfg.model["init_scale"],
                                                    seed=cfg.run.seed)
            self.embedding = keras.layers.Embedding(cfg.model["vocab_size"], cfg.model["hidden_size"],
                                                    embeddings_initializer=init)
            self.positions = keras.layers.Embedding(cfg.model["max_positions"], cfg.model["hidden_size"],
                                                    embeddings_initializer=init)
            self.blocks = [Block(init) for _ in range(cfg.model["num_layers"])]
            self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5)
            self.drop = keras.layers.Dropout(cfg.model["dropout"])
            self.bias = self.add_weight(shape=(cfg.model["vocab_size"],), initializer="zeros", name="softmax_bias")

        def call(self, ids, states=None, training=False):
            length = tf.shape(ids)[1]
            x = self.embedding(ids) + self.positions(tf.range(length))[tf.newaxis]  # [batch, time, dim]
            x = self.drop(x, training=training)
            for block in self.blocks:
                x = block(x, training=training)
            x = self.final_norm(x)
            logits = tf.einsum("btd,vd->btv", x, self.embedding.embeddings) + self.bias
            return logits, None

    return KerasTransformerLM()


class KerasRunner(Runner):
    name = "keras"

    def __init__(self, cfg: Any, inputs, targets) -> None:
        super().__init__()
        import tensorflow as tf
        keras = tf.keras
        self.tf = tf
        start = time.perf_counter()
        tf.random.set_seed(cfg.run.seed)
        if cfg.model.name == "transformer":
            model = _keras_transformer_model(cfg)
            optimizer = keras.optimizers.Adam(learning_rate=cfg.optimization.learning_rate, beta_1=0.9, beta_2=0.98,
                                              epsilon=1e-9, global_clipnorm=cfg.optimization.max_grad_norm)
            self.state = None
        else:
            model = _keras_lstm_model(cfg)
            optimizer = keras.optimizers.SGD(learning_rate=cfg.optimization.learning_rate,
                                             global_clipnorm=cfg.optimization.max_grad_norm)
            zeros = tf.zeros([cfg.data.batch_size, cfg.model["hidden_size"]])
            self.state = [(zeros, zeros) for _ in range(cfg.model["num_layers"])]

        def train_step(x, y, state):
            with tf.GradientTape() as tape:
                logits, new_state = model(x, state, training=True)
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)  # [batch, time]
                loss = tf.reduce_mean(tf.reduce_sum(losses, axis=1))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss, new_state

        model(tf.constant(inputs[0]), self.state)  # builds the variables
        self.step = tf.function(train_step)
        self.inputs, self.targets = inputs, targets
        self.run(2)
        self.losses.clear()
        self.setup_seconds = time.perf_counter() - start

    def run(self, steps: int) -> float:
        tf = self.tf
        pending = []
        start = time.perf_counter()
        for _ in range(steps):
            i = self.position % len(self.inputs)
            self.position += 1
            loss, self.state = self.step(tf.constant(self.inputs[i]), tf.constant(self.targets[i]), self.state)
            pending.append(loss)
        values = [float(v) for v in pending]
        elapsed = time.perf_counter() - start
        self.losses.extend(values)
        return elapsed


# ----------------------------------------------------------------------------- torch
class TorchRunner(Runner):
    """The same model in PyTorch: eager or ``torch.compile``d, float32 or bfloat16 autocast."""

    name = "torch"

    def __init__(self, cfg: Any, inputs, targets, variant: str = "torch", device: str = "cpu") -> None:
        super().__init__()
        import contextlib
        import functools

        import torch
        from torch import nn
        from torch.nn import functional as F
        self.torch = torch
        self.name = variant
        bf16, compiled = TORCH_VARIANTS[variant]
        self.device = torch.device("cuda" if device == "gpu" else "cpu")
        self.autocast = ((lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if bf16
                         else contextlib.nullcontext)
        start = time.perf_counter()
        torch.manual_seed(cfg.run.seed)
        vocab, dim = cfg.model["vocab_size"], cfg.model["hidden_size"]

        class TorchLSTMLM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embedding = nn.Embedding(vocab, dim)
                self.lstm = nn.LSTM(dim, dim, num_layers=cfg.model["num_layers"], batch_first=True,
                                    dropout=cfg.model["dropout"])
                self.drop = nn.Dropout(cfg.model["dropout"])
                self.softmax = nn.Linear(dim, vocab)
                for p in self.parameters():
                    nn.init.uniform_(p, -cfg.model["init_scale"], cfg.model["init_scale"])

            def forward(self, ids, state):
                out, state = self.lstm(self.drop(self.embedding(ids)), state)  # [batch, time, dim]
                return self.softmax(self.drop(out)), state

        class TorchTransformerLM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embedding = nn.Embedding(vocab, dim)
                self.positions = nn.Embedding(cfg.model["max_positions"], dim)
                layer = nn.TransformerEncoderLayer(
                    dim, cfg.model["num_heads"], cfg.model["ffn_dim"] or 4 * dim, dropout=cfg.model["dropout"],
                    activation=functools.partial(F.gelu, approximate="tanh"), batch_first=True,
                    norm_first=True)
                self.blocks = nn.TransformerEncoder(layer, cfg.model["num_layers"], enable_nested_tensor=False)
                self.final_norm = nn.LayerNorm(dim)
                self.drop = nn.Dropout(cfg.model["dropout"])
                self.bias = nn.Parameter(torch.zeros(vocab))
                nn.init.uniform_(self.embedding.weight, -cfg.model["init_scale"], cfg.model["init_scale"])
                nn.init.uniform_(self.positions.weight, -cfg.model["init_scale"], cfg.model["init_scale"])

            def forward(self, ids, state):
                length = ids.shape[1]
                x = self.drop(self.embedding(ids) + self.positions(torch.arange(length, device=ids.device)))
                mask = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
                x = self.final_norm(self.blocks(x, mask=mask, is_causal=True))
                return F.linear(x, self.embedding.weight, self.bias), None

        self.model = (TorchTransformerLM() if cfg.model.name == "transformer" else TorchLSTMLM()).to(self.device)
        if cfg.model.name == "transformer":
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optimization.learning_rate,
                                              betas=(0.9, 0.98), eps=1e-9)
        else:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.optimization.learning_rate)
        self.model.train()
        self.forward = torch.compile(self.model) if compiled else self.model
        self.params = list(self.model.parameters())
        self.parameters = sum(p.numel() for p in self.params)
        self.cfg = cfg
        self.state = None
        self.inputs = torch.from_numpy(inputs.astype("int64")).to(self.device)
        self.targets = torch.from_numpy(targets.astype("int64")).to(self.device)
        self.run(2)
        self.losses.clear()
        self.setup_seconds = time.perf_counter() - start

    def run(self, steps: int) -> float:
        torch, cfg = self.torch, self.cfg
        from torch.nn import functional as F
        pending = []
        start = time.perf_counter()
        for _ in range(steps):
            i = self.position % len(self.inputs)
            self.position += 1
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast():
                logits, state = self.forward(self.inputs[i], self.state)
                loss = F.cross_entropy(logits.reshape(-1, cfg.model["vocab_size"]).float(),
                                       self.targets[i].reshape(-1), reduction="sum") / cfg.data.batch_size
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, cfg.optimization.max_grad_norm)
            self.optimizer.step()
            self.state = None if state is None else tuple(s.detach() for s in state)
            pending.append(loss.detach())
        values = [float(v) for v in pending]  # waits for the GPU too
        elapsed = time.perf_counter() - start
        self.losses.extend(values)
        return elapsed


# ----------------------------------------------------------------------------- main
def set_threads(threads: int, want_torch: bool) -> Dict[str, Any]:
    """Gives TensorFlow and PyTorch the same thread pools; returns what was set."""
    if not want_torch:  # a PyTorch worker never starts TensorFlow (two CUDA runtimes in one process crash)
        from lmkit import distributed as dist
        dist.init(backend="local", intra_op_threads=threads, inter_op_threads=threads)
        return {"tf_intra_op": dist.threads().intra_op, "tf_inter_op": dist.threads().inter_op}
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
    return {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads()}


def build_runner(framework: str, cfg: Any, ids, inputs, targets, device: str = "cpu") -> Runner:
    if framework in LMKIT_VARIANTS:
        return LmkitRunner(cfg, ids, inputs, targets, variant=framework)
    if framework == "keras":
        return KerasRunner(cfg, inputs, targets)
    return TorchRunner(cfg, inputs, targets, variant=framework, device=device)


def check_device(framework: str, device: str) -> str:
    """The device's name as the framework sees it; RuntimeError when ``--device gpu`` finds none."""
    if framework in TORCH_VARIANTS:
        import torch
        if device == "gpu":
            if not torch.cuda.is_available():
                raise RuntimeError("--device gpu: PyTorch sees no CUDA device")
            return torch.cuda.get_device_name(0)
        return "cpu"
    import tensorflow as tf
    if device == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            raise RuntimeError("--device gpu: TensorFlow sees no GPU (a CPU-only TensorFlow? see "
                               "the README's GPU section)")
        from lmkit.train.flops import gpu_name  # the name the trainer's MFU looks up
        return gpu_name() or "GPU"
    return "cpu"


def steps_per_run(name: str, args: argparse.Namespace) -> int:
    """Timed steps per run: --steps, else the config's entry for this device and mode."""
    if args.steps:
        return args.steps
    table = GPU_STEPS if args.device == "gpu" else (QUICK_STEPS if args.quick else STEPS)
    return table.get(name, 10)


def matmul_tflops(size: int, chain: int = 8, repeats: int = 5, dtype: str = "bfloat16") -> float:
    """The best rate (TFLOP/s) of ``chain`` dependent [size, size] matmuls in ``dtype`` (TensorFlow)."""
    import tensorflow as tf
    a = tf.cast(tf.random.normal([size, size], stddev=size ** -0.5), dtype)
    b = tf.cast(tf.random.normal([size, size], stddev=size ** -0.5), dtype)

    @tf.function
    def products(x, b):
        for _ in range(chain):  # each depends on the last: nothing merges or overlaps them
            x = tf.matmul(x, b)
        return tf.reduce_sum(tf.cast(x[:1], tf.float32))

    float(products(a, b))  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        float(products(a, b))
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 * chain / best / 1e12


# ----------------------------------------------------------------------------- worker processes
_PROTOCOL = "@@lmkit-bench "  # prefix of the lines a worker sends back (other output passes through)


def _reply(payload: Dict[str, Any]) -> None:
    sys.stdout.write(_PROTOCOL + json.dumps(payload) + "\n")
    sys.stdout.flush()


def worker_main(args: argparse.Namespace) -> int:
    """One framework on one config: build, warm up, then ``run N`` / ``quit`` commands from stdin."""
    framework, _, name = args.worker.partition(":")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before TensorFlow or PyTorch start
    try:
        if framework == "probe":
            import tensorflow as tf
            size = int(name)
            _reply({"ready": True, "device": check_device("lmkit", args.device),
                    "bf16_matmul_tflops": round(matmul_tflops(size), 2),
                    "float32_matmul_tflops": round(matmul_tflops(size, dtype="float32"), 2),
                    "tf32": tf.config.experimental.tensor_float_32_execution_enabled(), "size": size})
            return 0
        threads = set_threads(args.threads, framework in TORCH_VARIANTS)
        device_name = check_device(framework, args.device)
        from lmkit.config import load_config
        cfg = load_config(name, args.overrides)
        steps = steps_per_run(name, args)
        ids, inputs, targets = synthetic_batches(cfg, num_batches=max(8, steps + args.warmup))
        runner = build_runner(framework, cfg, ids, inputs, targets, args.device)
        runner.run(args.warmup)
        runner.losses.clear()
        _reply({"ready": True, "setup_seconds": runner.setup_seconds, "threads": threads,
                "device": device_name, "parameters": getattr(runner, "parameters", None),
                "flops_per_token": getattr(runner, "flops_per_token", None)})
    except Exception as exc:  # reported by the parent, which stops
        _reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        losses_before = len(runner.losses)
        elapsed = runner.run(int(command[1]))
        _reply({"elapsed": elapsed, "losses": runner.losses[losses_before:]})
    return 0


def worker_env(framework: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """The environment of ``framework``'s worker: ``environ`` plus the variant's words (LMKIT_ENV)."""
    env = dict(environ)
    for name, words in LMKIT_ENV.get(framework, {}).items():
        env[name] = f"{env[name]} {words}" if env.get(name) else words
    return env


class Worker:
    """The parent's handle on one framework's worker process."""

    def __init__(self, framework: str, config: str, args: argparse.Namespace, script: str = "",
                 wait: bool = True) -> None:
        """Starts ``script`` (default this file) as ``--worker FRAMEWORK:CONFIG`` and, unless ``wait`` is
        False (then call :meth:`ready`), waits for it to be ready."""
        self.framework = framework
        self.timeout = args.timeout
        cmd = [sys.executable, script or os.path.abspath(__file__), "--worker", f"{framework}:{config}",
               "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps),
               "--device", args.device]
        if args.quick:
            cmd.append("--quick")
        for item in args.set:
            cmd += ["--set", item]
        env = worker_env(framework, os.environ)
        if framework in TORCH_VARIANTS and "LMKIT_BENCH_TORCH_LD_LIBRARY_PATH" in env:
            # A machine whose TensorFlow brings its own CUDA libraries (../shared/gpu) on the library
            # path: PyTorch gets the path it had before them.
            env["LD_LIBRARY_PATH"] = env["LMKIT_BENCH_TORCH_LD_LIBRARY_PATH"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env=env)
        self.info: Dict[str, Any] = {}
        if wait:
            self.ready()

    def ready(self) -> Dict[str, Any]:
        """Waits for the worker's ready line (built, traced, warmed up); its payload."""
        if not self.info:
            self.info = self._read()
        return self.info

    def _read(self) -> Dict[str, Any]:
        import select
        deadline = time.monotonic() + self.timeout
        assert self.proc.stdout is not None
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            if not ready:
                self.close()
                raise RuntimeError(f"the {self.framework} worker gave no answer in {self.timeout:.0f} s "
                                   "(raise --timeout on a slow machine)")
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                raise RuntimeError(f"the {self.framework} worker exited with status {code} "
                                   "(its error is printed above)")
            if line.startswith(_PROTOCOL):
                payload = json.loads(line[len(_PROTOCOL):])
                if "error" in payload:
                    self.close()
                    raise RuntimeError(f"the {self.framework} worker failed: {payload['error']}")
                return payload
            sys.stdout.write(line)  # the framework's own output

    def run(self, steps: int) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {steps}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def bench_config(name: str, frameworks: Sequence[str], args: argparse.Namespace,
                 log: Callable[[str], None], peak_tflops: Optional[float] = None) -> Dict[str, Any]:
    from lmkit.config import load_config, stored_setting
    cfg = load_config(name, args.overrides)
    steps = steps_per_run(name, args)
    words_per_step = cfg.data.batch_size * cfg.data.num_steps
    workers: Dict[str, Worker] = {}
    build_errors: Dict[str, str] = {}
    started: Dict[str, Worker] = {}

    def build_failed(fw: str, exc: Exception) -> None:
        print(f"train_throughput: [{name}] {fw}: {exc}", file=sys.stderr)
        build_errors[fw] = str(exc)

    try:
        # One at a time by default: tracing is not timed but uses the cores. --parallel_build starts
        # them together (a GPU machine's many cores compile several XLA steps at once); the timed
        # runs below still run one framework at a time.
        for fw in frameworks:
            log(f"[{name}] building {fw} in its own process ...")
            try:
                started[fw] = Worker(fw, name, args, wait=False)
                if not args.parallel_build:
                    started[fw].ready()
            except RuntimeError as exc:  # the other columns are still measured; the error is kept
                build_failed(fw, exc)
                started.pop(fw, None)
        for fw, worker in started.items():
            try:
                worker.ready()
            except RuntimeError as exc:
                build_failed(fw, exc)
                continue
            workers[fw] = worker
            log(f"[{name}] {fw} ready ({worker.info['setup_seconds']:.1f} s to build and trace)")
        if not workers:
            raise RuntimeError(f"no framework could be built: {build_errors}")
        frameworks = [fw for fw in frameworks if fw in workers]
        wps: Dict[str, List[float]] = {fw: [] for fw in frameworks}
        losses: Dict[str, List[float]] = {fw: [] for fw in frameworks}
        for r in range(args.repeats):
            for fw in frameworks:
                time.sleep(args.pause)
                result = workers[fw].run(steps)
                wps[fw].append(words_per_step * steps / result["elapsed"])
                losses[fw].extend(result["losses"])
            log(f"[{name}] round {r + 1}/{args.repeats}: "
                + ", ".join(f"{fw} {wps[fw][-1]:.0f}" for fw in frameworks)
                + f" words/sec (load {load_average()[:1]})")
    finally:
        for worker in started.values():
            worker.close()
    out: Dict[str, Any] = {
        "config": {k: stored_setting(cfg.to_sections(), k)
                   for k in ("model", "vocab_size", "hidden_size", "num_layers", "batch_size", "num_steps", "dropout",
                             "optimizer", "learning_rate", "max_grad_norm")},
        "steps_per_run": steps,
        "words_per_step": words_per_step,
        "lmkit_overrides": {fw: LMKIT_VARIANTS[fw] for fw in frameworks if fw in LMKIT_VARIANTS},
        "lmkit_env": {fw: LMKIT_ENV[fw] for fw in frameworks if fw in LMKIT_ENV},
        "config_overrides": args.overrides,  # --set, for every framework
        "frameworks": {},
        "ratios": {},
        "worker_info": {fw: w.info for fw, w in workers.items()},
        "build_errors": build_errors,
    }
    # One count for every framework (the same computation): an lmkit worker's (lmkit.train.flops).
    flops = next((workers[fw].info["flops_per_token"] for fw in frameworks
                  if workers[fw].info.get("flops_per_token")), None)
    for fw in frameworks:
        out["frameworks"][fw] = {
            "words_per_sec": [round(v, 1) for v in wps[fw]],
            "summary": {k: round(v, 1) for k, v in summarize(wps[fw]).items()},
            "setup_seconds": round(workers[fw].info["setup_seconds"], 2),
            # Sanity: every framework computes the same loss (about num_steps * ln(vocab) on random ids).
            "mean_loss": round(sum(losses[fw]) / max(1, len(losses[fw])), 3),
            "parameters": workers[fw].info.get("parameters"),
        }
        if flops and peak_tflops:
            out["frameworks"][fw]["mfu"] = round(
                summarize(wps[fw])["median"] * flops / (peak_tflops * 1e12), 4)
    out["train_flops_per_token"] = flops
    for lm in LMKIT_VARIANTS:
        for base in BASELINES:
            if lm in wps and base in wps:
                out["ratios"][f"{lm}/{base}"] = ratio_spread(wps[lm], wps[base])
    for variant in LMKIT_VARIANTS:
        if variant != "lmkit" and "lmkit" in wps and variant in wps:
            out["ratios"][f"{variant}/lmkit"] = ratio_spread(wps[variant], wps["lmkit"])
    for variant, baseline in PAIRED_RATIOS:
        if variant in wps and baseline in wps:
            out["ratios"][f"{variant}/{baseline}"] = ratio_spread(wps[variant], wps[baseline])
    return out


def plot(results: Dict[str, Any], path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no plot", flush=True)
        return None
    configs = list(results["configs"])
    fig, axes = plt.subplots(1, len(configs), figsize=(4.2 * len(configs), 4.2), squeeze=False)
    colors = {"lmkit": "#1f77b4", "lmkit_xla": "#6baed6", "keras": "#ff7f0e", "torch": "#d62728"}
    for ax, name in zip(axes[0], configs):
        fws = results["configs"][name]["frameworks"]
        names = list(fws)
        med = [fws[f]["summary"]["median"] for f in names]
        low = [m - fws[f]["summary"]["min"] for m, f in zip(med, names)]
        high = [fws[f]["summary"]["max"] - m for m, f in zip(med, names)]
        bars = ax.bar(names, med, yerr=[low, high], capsize=4, color=[colors.get(f, "gray") for f in names])
        base = fws.get("lmkit", {}).get("summary", {}).get("median")
        for bar, m in zip(bars, med):
            label = f"{m:.0f}" + (f"\n({base / m:.2f}x)" if base and m else "")
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), label, ha="center", va="bottom",
                    fontsize=8)
        ax.set_title(name)
        ax.set_ylabel("training words/sec (median, min-max)")
        ax.set_ylim(0, max(m + h for m, h in zip(med, high)) * 1.25)
        ax.tick_params(axis="x", labelrotation=20)
    threads = results["threads"]
    where = (", ".join(results["machine"].get("gpus", [])) or "GPU") if results.get("device") == "gpu" \
        else f"{results['machine']['cpu_model']}, {results['machine']['nproc']} cores"
    fig.suptitle(f"lmkit vs tf.keras vs PyTorch, one process, {threads.get('tf_intra_op')} threads each "
                 f"({where}); (x) = lmkit / column", fontsize=9)
    return save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.worker:
        return worker_main(args)
    import importlib.util
    log = lambda s: print(s, flush=True)  # noqa: E731
    frameworks = list(args.frameworks)
    notes = []
    torch_columns = [f for f in frameworks if f in TORCH_VARIANTS]
    if torch_columns and importlib.util.find_spec("torch") is None:
        notes.append("torch is not installed: the PyTorch columns are skipped "
                     "(install the optional baseline with: make bench-deps, or "
                     ".venv/bin/python -m pip install torch==2.13.0)")
        log(notes[-1])
        frameworks = [f for f in frameworks if f not in TORCH_VARIANTS]
    has_torch = any(f in TORCH_VARIANTS for f in frameworks)

    results: Dict[str, Any] = {
        "benchmark": "train_throughput",
        "command": command_line(),
        "machine": machine_info(tensorflow=package_version("tensorflow-cpu") or package_version("tensorflow"),
                                keras=package_version("keras"),
                                torch=package_version("torch") if has_torch else None),
        "threads": {"tf_intra_op": args.threads, "tf_inter_op": args.threads,
                    **({"torch_intra_op": args.threads, "torch_inter_op": args.threads}
                       if has_torch else {})},
        "settings": {"repeats": args.repeats, "warmup_steps": args.warmup, "pause_seconds": args.pause,
                     "order": frameworks, "data": "synthetic uniform random ids",
                     "isolation": "one worker process per framework, one running at a time"},
        "device": args.device,
        "notes": notes,
        "configs": {},
    }
    log(f"{args.threads} threads per framework; load {load_average()}")
    started = time.perf_counter()
    peak = None
    if args.peak_probe:
        size = 8192 if args.device == "gpu" else 1024
        try:
            probe = Worker("probe", str(size), args).info
        except RuntimeError as exc:
            print(f"train_throughput: peak probe: {exc}", file=sys.stderr)
            return 1
        peak = probe["bf16_matmul_tflops"]
        results["peak_probe"] = {k: v for k, v in probe.items() if k != "ready"}
        log(f"measured matmul rate on {probe['device']}: bfloat16 {peak} TFLOP/s, "
            f"float32 {probe['float32_matmul_tflops']} TFLOP/s ({size}^3)")
    failed = []
    for name in args.configs:
        try:
            results["configs"][name] = bench_config(name, frameworks, args, log, peak)
        except RuntimeError as exc:
            # The other configs still run: a lease on a GPU machine is short, and one config's
            # failure (a compile error, out of memory) must not cost the others' figures.
            print(f"train_throughput: {name}: {exc}", file=sys.stderr)
            results.setdefault("errors", {})[name] = str(exc)
            failed.append(name)
            write_json(args.output, results)
            continue
        # Written after every config, so that a run cut short keeps what it measured.
        write_json(args.output, results)
        for key, ratio in results["configs"][name]["ratios"].items():
            log(f"[{name}] {key}: {ratio['of_medians']:.2f} (ratio of medians), "
                f"{ratio['median_of_rounds']:.2f} (median of per-round ratios, "
                f"{ratio['min_of_rounds']:.2f}-{ratio['max_of_rounds']:.2f})")
        for fw, entry in results["configs"][name]["frameworks"].items():
            if "mfu" in entry:
                log(f"[{name}] {fw}: {100 * entry['mfu']:.1f}% MFU")
    results["load_average_at_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    path = write_json(args.output, results)
    png = plot(results, os.path.splitext(args.output)[0] + ".png") if results["configs"] else None
    log(f"wrote {path}" + (f" and {png}" if png else "") + f" in {results['wall_seconds']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
