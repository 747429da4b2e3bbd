"""LoRA fine-tuning of a Llama folder from the command line: 2 workers = 1 process (resumed) = 2 native
replicas, adapters saved alone, an export with the adapters merged that transformers loads (through
load_model, as lmkit generate and evaluate read the run) and a PEFT export that peft loads."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import torch
from safetensors.numpy import load_file
from transformers import LlamaForCausalLM

from lmkit.layers.lora import lora_of
from lmkit.train.checkpoint import load_model
from tests.helpers import assert_relatively_close, mpirun_cmd
from tests.models.llama.test_convert import IDS, _lmkit, make_llama_folder

pytestmark = pytest.mark.transformers

TARGETS = "query,value,down"


def _checkpoint_values(model_dir):
    """name -> size of every value the run's latest checkpoint holds."""
    from lmkit.core.layout import CHECKPOINT_DIR
    root = os.path.join(model_dir, CHECKPOINT_DIR)
    latest = sorted((d for d in os.listdir(root) if d.startswith("ckpt-")), key=lambda d: int(d.split("-")[1]))[-1]
    path = os.path.join(root, latest, "ckpt")
    return {name: int(np.prod(shape)) for name, shape in tf.train.list_variables(path)}


@pytest.mark.horovod
@pytest.mark.mpi
def test_lora_fine_tune_on_two_workers_and_native_replicas_resumes_and_exports(tmp_path):
    folder = str(tmp_path / "llama")
    corpus = make_llama_folder(folder, seed=1)
    flags = ["train", "--init_from", folder, "--train_file", corpus, "--lora_rank", "4", "--lora_alpha", "8",
             "--lora_targets", TARGETS, "--set", "num_steps=16", "--set", "batch_size=4",
             "--set", "optimizer='momentum'", "--set", "learning_rate=0.5", "--set", "warmup_epochs=0.0",
             "--set", "optimizer_params={}"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    # One process: a step, then a second run resumes from the adapters-only checkpoint for another.
    res = _lmkit(*flags, "--model_dir", one, "--max_steps", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "LoRA: rank 4, alpha 8 on query, value, down (6 layers)" in res.stdout, res.stdout[-2000:]
    res = _lmkit(*flags, "--model_dir", one, "--max_steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stdout, res.stdout[-2000:]
    # Two workers: both steps at once.
    res = _lmkit(*flags, "--model_dir", two, "--max_steps", "2", launcher=mpirun_cmd(2, [])[:-1])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    with open(os.path.join(two, "results.json")) as f:
        assert json.load(f)["world_size"] == 2

    # The checkpoint holds the adapters and their momentum, nothing of the base.
    values = _checkpoint_values(two)
    model_values = {k: n for k, n in values.items() if k.startswith("model/")}
    lora_model, _, config = load_model(two, merge_adapters=False)
    lora = lora_of(lora_model)
    assert config.adapters.lora_rank == 4 and len(lora.adapters) == 6
    assert model_values and all("/adapters/" in k for k in model_values), sorted(model_values)
    assert sum(model_values.values()) == lora.num_parameters()
    optimizer_values = sum(n for k, n in values.items() if k.startswith("optimizer/") and n > 1)
    assert optimizer_values == lora.num_parameters()  # one momentum slot per adapter value
    base_size = sum(v.shape.num_elements() for v in lora_model.variables) - lora.num_parameters()
    assert lora.num_parameters() < base_size / 4

    # 2 workers applied the updates of 1 process (resumed half-way), and so did the native backend's
    # 2 replicas (its variables made under the strategy's scope, the base's not trainable there too).
    native = str(tmp_path / "native")
    res = _lmkit(*flags, "--model_dir", native, "--max_steps", "2", "--backend", "native", "--num_gpus", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    for run in (one, native):
        other = lora_of(load_model(run, merge_adapters=False)[0])
        for path, adapter in lora.adapters.items():
            for a, b in zip(adapter.variables, other.adapters[path].variables):
                assert_relatively_close(a.numpy(), b.numpy(), 1e-5, f"{run}: {path}/{a.name}")
    assert all(np.any(a.b.numpy()) for a in lora.adapters.values())  # B moved off zero

    # The export merges the adapters: transformers computes lmkit's adapted logits; only targets changed.
    exported = str(tmp_path / "exported")
    res = _lmkit("export", "--model_dir", two, "--format", "hf", "--output", exported)
    assert res.returncode == 0, res.stderr[-3000:]
    with torch.no_grad():
        theirs = LlamaForCausalLM.from_pretrained(exported).eval()(torch.tensor(IDS)).logits.numpy()
        base = LlamaForCausalLM.from_pretrained(folder).eval()(torch.tensor(IDS)).logits.numpy()
    ours = lora_model(tf.constant(IDS))[0].numpy()  # adapters not merged: the sum computed apart
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    assert np.abs(theirs - base).max() > 1e-3
    # The adapters alone, as a PEFT folder: peft puts them on the base with the same result.
    adapters = str(tmp_path / "adapters")
    res = _lmkit("export", "--model_dir", two, "--format", "peft", "--output", adapters)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(os.listdir(adapters)) == ["adapter_config.json", "adapter_model.safetensors"]
    from peft import PeftModel
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(folder), adapters).eval()
        np.testing.assert_allclose(peft_model(torch.tensor(IDS)).logits.numpy(), ours, atol=1e-4, rtol=1e-4)
    before, after = load_file(os.path.join(folder, "model.safetensors")), load_file(
        os.path.join(exported, "model.safetensors"))
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed == sorted(f"model.layers.{i}.{name}.weight" for i in range(2)
                             for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")), changed
