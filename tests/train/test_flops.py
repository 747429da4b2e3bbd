"""Model FLOPs per token and MFU (lmkit.train.flops) against the matmuls of the training graph itself."""
import json

import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import ConfigError, load_config
from lmkit.layers.lora import add_lora, frozen
from lmkit.models import build_model
from lmkit.train import flops

SMALL = {"hidden_size": 32, "vocab_size": 50, "num_steps": 8, "num_layers": 2, "max_positions": 16,
         "num_heads": 2, "ffn_dim": 0}


def _matmul_flops(a_shape, b_shape, adj_a, adj_b):
    m, k = (a_shape[-1], a_shape[-2]) if adj_a else (a_shape[-2], a_shape[-1])
    n = b_shape[-2] if adj_b else b_shape[-1]
    return 2 * int(np.prod(a_shape[:-2] or [1])) * m * n * k


def graph_matmul_flops_per_token(model, batch, window):
    """The FLOPs of every MatMul / BatchMatMul of one training step's graph (forward and backward), per token."""
    ids = tf.constant(np.random.RandomState(0).randint(0, model.vocab_size, (batch, window)).astype(np.int32))

    @tf.function(autograph=False)
    def step(ids):
        with tf.GradientTape() as tape:
            logits, _ = model(ids, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ids, logits))
        return tape.gradient(loss, model.trainable_variables)

    total = 0
    for op in step.get_concrete_function(ids).graph.get_operations():
        if op.type == "MatMul":
            total += _matmul_flops(op.inputs[0].shape.as_list(), op.inputs[1].shape.as_list(),
                                   op.get_attr("transpose_a"), op.get_attr("transpose_b"))
        elif op.type == "BatchMatMulV2":
            total += _matmul_flops(op.inputs[0].shape.as_list(), op.inputs[1].shape.as_list(),
                                   op.get_attr("adj_x"), op.get_attr("adj_y"))
    return total / (batch * window)


def _vector_parameters(model):
    """Biases and norm scales: 6 FLOPs each in the estimate, no matmul in the graph."""
    return sum(int(v.shape.num_elements()) for v in model.trainable_variables if v.shape.rank < 2)


def _llama():
    from lmkit.models import LlamaLanguageModel
    return LlamaLanguageModel(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                              ffn_dim=48, max_positions=16)


@pytest.mark.parametrize("build", [
    pytest.param(lambda: build_model(load_config("config_tiny_transformer").model_config()), id="tied-transformer"),
    pytest.param(lambda: build_model(load_config("config_transformer", SMALL).model_config()), id="transformer"),
    pytest.param(lambda: build_model(load_config("config_small", SMALL).model_config()), id="lstm"),
    pytest.param(_llama, id="llama-gqa"),
])
def test_the_estimate_is_the_graphs_matmuls(build):
    # 6 x weights + 12 x layers x window x width is, exactly, the training graph's matmul FLOPs plus
    # 6 for each bias and norm parameter (elementwise work that the estimate counts as weights).
    model = build()
    graph = graph_matmul_flops_per_token(model, batch=3, window=8)
    assert flops.flops_per_token(model, 8) == graph + 6 * _vector_parameters(model)
    assert (flops.attention_flops_per_token(model, 8) > 0) == (not model.stateful)  # the transformers'


def test_frozen_weights_cost_four_flops_per_token():
    # LoRA: the frozen base has no weight gradient; its forward and input gradient remain.
    with frozen():
        model = build_model(load_config("config_transformer", SMALL).model_config())
    add_lora(model, rank=2, alpha=4.0, targets=("qkv",))
    trainable, frozen_count = flops.matmul_parameters(model)
    assert trainable == sum(int(v.shape.num_elements()) for v in model.trainable_variables) > 0
    assert frozen_count > trainable
    graph = graph_matmul_flops_per_token(model, batch=2, window=8)
    frozen_vectors = sum(int(v.shape.num_elements()) for v in model.variables
                         if not v.trainable and v.shape.rank < 2)
    # Nothing below the first layer trains, so the graph skips the input gradient of its first
    # matmuls (the qkv kernel [32, 96] and the adapter's [32, 2]), 2 FLOPs per weight, which the
    # estimate counts: about 0.4 % of GPT-2 small's FLOPs.
    below = 2 * 32 * (96 + 2)
    assert flops.flops_per_token(model, 8) == graph + 4 * frozen_vectors + below


def test_encoder_decoders_are_not_estimated():
    model = build_model(load_config("config_seq2seq", {"source_vocab_size": 20, "vocab_size": 20}).model_config())
    assert flops.flops_per_token(model, 8) is None


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "mixed_bfloat16", 989.4),
    ("NVIDIA H100 80GB HBM3", "float32", 494.7),
    ("NVIDIA H100 PCIe", "mixed_float16", 756.5),
    ("NVIDIA H100 NVL", "mixed_bfloat16", 835.5),
    ("NVIDIA H200", "mixed_bfloat16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "float32", 156.0),
    ("NVIDIA L4", "mixed_bfloat16", 121.0),
    ("NVIDIA L40S", "mixed_bfloat16", 362.1),
    ("Tesla V100-SXM2-16GB", "mixed_float16", None),
    (None, "float32", None),
])
def test_peaks_of_known_gpus(name, precision, peak):
    assert flops.peak_tflops(name, precision) == peak


def test_the_configured_peak_wins_and_a_known_gpu_needs_no_config(monkeypatch):
    monkeypatch.setattr(flops, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    assert flops.device_peak_tflops(0.0, "mixed_bfloat16") == (989.4, "the NVIDIA H100 80GB HBM3's data sheet")
    assert flops.device_peak_tflops(250.0, "mixed_bfloat16") == (250.0, "peak_tflops")
    monkeypatch.setattr(flops, "gpu_name", lambda: None)
    assert flops.device_peak_tflops(0.0, "float32") == (None, "")
    with pytest.raises(ConfigError, match="peak_tflops"):
        load_config("config_small", {"peak_tflops": -1.0})


@pytest.mark.parametrize("peak", [0.0, 0.25])
def test_training_reports_model_tflops_and_mfu(tmp_path, peak):
    from lmkit.train import Trainer
    # A plan of one epoch (its line), in place of the config's 2000 steps and their 100 warmup steps.
    cfg = load_config("config_tiny_transformer", {"peak_tflops": peak, "num_epochs": 1, "max_steps": 0,
                                                  "warmup_steps": 0})
    lines = []
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=str(tmp_path), log=lines.append)
    ids = np.random.RandomState(0).randint(0, cfg.model["vocab_size"],
                                           size=cfg.data.batch_size * cfg.data.num_steps * 4 + 1)
    stats = trainer.fit(ids.astype(np.int32)).epochs[-1]
    per_token = flops.flops_per_token(trainer.model, cfg.data.num_steps)
    assert stats.model_tflops == pytest.approx(stats.tokens_per_sec * per_token / 1e12, rel=1e-12)
    epoch_line = next(line for line in lines if line.startswith("Epoch 1/1"))
    assert f"| model {stats.model_tflops:.3g} TFLOP/s" in epoch_line
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["flops_per_token"] == per_token
    assert results["epochs"][-1]["model_tflops"] == pytest.approx(stats.model_tflops)
    if peak:  # on a CPU only a configured peak gives an MFU
        assert stats.mfu == pytest.approx(stats.model_tflops / peak, rel=1e-12)
        assert epoch_line.endswith(f", MFU {100 * stats.mfu:.1f}%")
        assert (results["peak_tflops"], results["peak_source"]) == (peak, "peak_tflops")
    else:
        assert stats.mfu is None and "MFU" not in epoch_line
        assert results["peak_tflops"] is None
