"""Attention kernels (lmkit.layers.kernels): the setting's check, the choice of kernel (resolve), causal_attend
inside a kernel's scope, and the trainer's and evaluator's traces inside it. cuDNN's own kernel is tested in
tests/layers/kernels/test_cudnn.py."""


import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import ConfigError, TrainConfig
from lmkit.core.errors import UsageError
from lmkit.layers import kernels as attention_kernels
from lmkit.layers.attention import causal_attend
from lmkit.layers.kernels.cudnn import KERNEL

SHAPE = (2, 3, 16, 8)  # batch, heads, time, head_dim


def _qkv(shape=SHAPE, dtype=tf.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal(shape).astype(np.float32), dtype=dtype) for _ in range(3)]


def _matmul_attention(q, k, v):
    """Causal attention of scaled queries through lmkit's matmuls (one block), as float32."""
    return causal_attend(q, k, v, 1, 0.0, False)


# --- the program the calls make -----------------------------------------------------------------


# as many key/value heads as query heads; grouped (2 queries a head: the order matters); multi-query


# --- which calls the kernel takes -------------------------------------------------------------------


class _Recorder:
    """A kernel that computes lmkit's matmul attention and counts the calls it took (float32 too)."""

    name = "recorder"

    def __init__(self):
        self.calls = 0

    def applies(self, queries, keys, values, rate, training, window):
        return window is None

    def __call__(self, queries, keys, values):
        self.calls += 1
        with attention_kernels.scope("matmul"):  # not itself again
            return _matmul_attention(queries, keys, values)

    def probe(self):
        return None


RECORDER = _Recorder()


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setitem(attention_kernels.KERNELS, "recorder", f"{__name__}:RECORDER")
    RECORDER.calls = 0
    return RECORDER


def test_causal_attend_goes_to_the_scopes_kernel_where_it_applies(recorder):
    q, k, v = _qkv()
    want = causal_attend(q, k, v, 4, 0.0, False)
    assert recorder.calls == 0  # no scope: the matmuls
    with attention_kernels.scope("recorder"):
        got = causal_attend(q, k, v, 4, 0.0, False)
        assert recorder.calls == 1
        causal_attend(q, k, v, 4, 0.0, False, window=4)  # not for this kernel: the matmuls
        assert recorder.calls == 1
        with attention_kernels.scope("matmul"):  # scopes nest
            causal_attend(q, k, v, 4, 0.0, False)
            assert recorder.calls == 1
    assert attention_kernels.active() is None
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)


def _config(**changes):
    values = dict(model="transformer", vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, max_positions=8,
                  batch_size=4, num_steps=8, num_epochs=1, learning_rate=0.01, optimizer="adam", dropout=0.0,
                  max_grad_norm=1.0, init_scale=0.1, seed=5)
    return TrainConfig.from_dict({**values, **changes})


def test_the_trainer_traces_its_steps_inside_the_kernels_scope(recorder, monkeypatch):
    """The training and evaluation steps call the resolved kernel in every layer; training is unchanged."""
    from lmkit.models import build_model
    from lmkit.train import Trainer

    resolved = []

    def resolve(setting, **kwargs):
        resolved.append((setting, kwargs))
        return "recorder" if setting == "cudnn" else "matmul"

    monkeypatch.setattr(attention_kernels, "resolve", resolve)
    ids = np.random.default_rng(0).integers(0, 40, 400).astype(np.int32)
    losses = {}
    for setting in ("matmul", "cudnn"):
        cfg = _config(attention_kernel=setting)
        tf.random.set_seed(7)
        trainer = Trainer(build_model(cfg.model_config()), cfg, record_step_losses=True, log=lambda s: None)
        result = trainer.fit(ids, valid_ids=ids[:200], max_steps=3)
        losses[setting] = result.step_losses
        assert trainer.attention_kernel == resolve(setting)
    assert [s for s, _ in resolved[::2]] == ["matmul", "cudnn"]
    assert resolved[0][1] == {"device_type": "CPU", "xla": False, "precision": "float32", "log": resolved[0][1]["log"]}
    assert recorder.calls == 2 * 2  # 2 layers in the training step's trace and in the evaluation step's
    np.testing.assert_allclose(losses["cudnn"], losses["matmul"], rtol=1e-6)


# --- choosing the kernel --------------------------------------------------------------------------

GPU_RUN = dict(device_type="GPU", xla=True, precision="mixed_bfloat16")


def test_resolve_keeps_the_matmuls_or_says_why_a_kernel_cannot_run(monkeypatch):
    assert attention_kernels.resolve("matmul", **GPU_RUN) == "matmul"
    with pytest.raises(UsageError, match=r"attention_kernel = 'cudnn' cannot run here: it needs a GPU \(this "
                                         r"run computes on CPU\); use attention_kernel = 'matmul'"):
        attention_kernels.resolve("cudnn", device_type="CPU", xla=False, precision="mixed_bfloat16")
    with pytest.raises(UsageError, match="needs the XLA-compiled step"):
        attention_kernels.resolve("cudnn", **{**GPU_RUN, "xla": False})
    with pytest.raises(UsageError, match="needs precision 'mixed_bfloat16' or 'mixed_float16' .this run: 'float32'"):
        attention_kernels.resolve("cudnn", **{**GPU_RUN, "precision": "float32"})
    probes = []
    monkeypatch.setattr(KERNEL, "probe", lambda: probes.append(1) or "cuDNN is not loaded")
    with pytest.raises(UsageError, match="cannot run here: cuDNN is not loaded"):
        attention_kernels.resolve("cudnn", **GPU_RUN)
    logged = []
    assert attention_kernels.resolve("auto", **GPU_RUN, log=logged.append) == "matmul"
    assert logged == ["attention_kernel = 'auto': the matmuls (cudnn: cuDNN is not loaded)"]
    assert attention_kernels.resolve("auto", device_type="CPU", xla=False, precision="float32",
                                     log=logged.append) == "matmul"
    assert len(logged) == 1  # no GPU: nothing to say
    monkeypatch.setattr(KERNEL, "probe", lambda: None)
    assert attention_kernels.resolve("cudnn", **GPU_RUN) == "cudnn"
    assert attention_kernels.resolve("auto", **{**GPU_RUN, "precision": "mixed_float16"}) == "cudnn"
    assert len(probes) == 2  # the probe runs only once the run could use the kernel


@pytest.mark.parametrize("value", ["flash", "", None, 1])
def test_a_bad_attention_kernel_is_named_with_the_choices(value):
    with pytest.raises(ConfigError,
                       match=r"attention_kernel = .* (is not one of matmul, cudnn, auto|must be a string)"):
        _config(attention_kernel=value)
    with pytest.raises(UsageError, match="is not one of matmul, cudnn, auto"):
        attention_kernels.check_setting(value)


def test_the_default_kernel_is_auto_and_a_cpu_run_keeps_the_matmuls_without_probing(monkeypatch):
    """"auto" by default (measured on a GPU); on a CPU it resolves to the matmuls before any probe."""
    from lmkit.config.sections import ComputeConfig  # the config's compute section holds the kernel
    from lmkit.models import build_model
    from lmkit.train import Trainer
    assert ComputeConfig.__dataclass_fields__["attention_kernel"].default == "auto"
    assert _config().compute.attention_kernel == "auto"
    assert _config(attention_kernel="matmul").compute.attention_kernel == "matmul"

    def no_probe():
        raise AssertionError("a CPU run must not probe cuDNN")

    monkeypatch.setattr(KERNEL, "probe", no_probe)
    lines = []
    trainer = Trainer(build_model(_config().model_config()), _config(), log=lines.append)
    trainer.fit(np.arange(200, dtype=np.int32) % 40, max_steps=1)
    assert trainer.attention_kernel == "matmul"
    assert not any("attention_kernel" in line for line in lines)  # nothing to say without a GPU
    monkeypatch.setattr(KERNEL, "probe", lambda: None)  # a GPU run where cuDNN checks out takes it
    assert attention_kernels.resolve(_config().compute.attention_kernel, **GPU_RUN) == "cudnn"


# --- which lengths cuDNN takes on a GPU ---------------------------------------------------------------


def test_the_trainer_says_once_compiled_which_calls_the_kernel_left_to_the_matmuls(recorder, monkeypatch):
    from lmkit.models import build_model
    from lmkit.train import Trainer

    monkeypatch.setattr(attention_kernels, "resolve", lambda setting, **kwargs: "recorder")
    monkeypatch.setattr(recorder, "declined", {"windows of 8 positions": "a reason"}, raising=False)
    lines = []
    trainer = Trainer(build_model(_config().model_config()), _config(), log=lines.append)
    trainer.fit(np.arange(200, dtype=np.int32) % 40, max_steps=2)
    said = [line for line in lines if "the matmuls for" in line]
    assert said == ["attention_kernel 'recorder': the matmuls for windows of 8 positions (a reason)"]
    compiled = next(i for i, line in enumerate(lines) if line.startswith("compiled the training step"))
    assert lines.index(said[0]) == compiled + 1


