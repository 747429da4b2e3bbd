"""A folder's tensors (lmkit.hub.safetensors): one file, shards through their index, or pytorch_model.bin; shapes
from the headers alone, values as float32, buffers left out, and each way a folder can lack its weights named."""
import json
import os
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lmkit.core.errors import UsageError
from lmkit.hub.safetensors import Checkpoint, save_tensors, weight_files

TENSORS = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b.bias": np.ones(4, np.float16),
           "layers.0.rotary_emb.inv_freq": np.ones(2, np.float32)}


def test_one_file_shards_and_buffers(tmp_path):
    single, sharded = str(tmp_path / "single"), str(tmp_path / "sharded")
    os.makedirs(single)
    os.makedirs(sharded)
    save_file(TENSORS, os.path.join(single, "model.safetensors"))
    save_file({"a.weight": TENSORS["a.weight"]}, os.path.join(sharded, "model-1.safetensors"))
    save_file({"b.bias": TENSORS["b.bias"]}, os.path.join(sharded, "model-2.safetensors"))
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a.weight": "model-1.safetensors", "b.bias": "model-2.safetensors"}}, f)
    assert weight_files(single) == [os.path.join(single, "model.safetensors")]
    assert [os.path.basename(p) for p in weight_files(sharded)] == ["model-1.safetensors", "model-2.safetensors"]
    for folder in (single, sharded):
        checkpoint = Checkpoint(folder)
        shapes = checkpoint.shapes()
        assert {n: s for n, (s, _) in shapes.items()} == {"a.weight": [2, 3], "b.bias": [4]}  # no buffer
        tensors = dict(checkpoint.tensors())
        assert sorted(tensors) == ["a.weight", "b.bias"] and tensors["b.bias"].dtype == np.float32
        np.testing.assert_array_equal(tensors["a.weight"], TENSORS["a.weight"])
    assert Checkpoint(single, skip=(".bias",)).shapes().keys() == {"a.weight", "layers.0.rotary_emb.inv_freq"}


def test_missing_weights_and_broken_indexes_are_named(tmp_path):
    with pytest.raises(UsageError, match=r"holds no weights: model\.safetensors \(or pytorch_model\.bin\) is "
                                         r"missing; save the model there with model\.save_pretrained\(folder\)"):
        Checkpoint(str(tmp_path))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(UsageError, match=r"model\.safetensors\.index\.json has no weight_map"):
        weight_files(str(tmp_path))
    index.write_text(json.dumps({"weight_map": {"a.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(UsageError, match=r"lists the shard model-00002-of-00002\.safetensors, which is not in "
                                         r"\S+; download every shard"):
        weight_files(str(tmp_path))
    (tmp_path / "model-00002-of-00002.safetensors").write_text("not a safetensors file")
    with pytest.raises(UsageError, match=r"model-00002-of-00002\.safetensors is not a readable safetensors file"):
        Checkpoint(str(tmp_path)).shapes()


def test_a_pytorch_bin_reads_with_pytorch_and_says_how_to_convert_without(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    torch.save({k: torch.tensor(v) for k, v in TENSORS.items()}, str(tmp_path / "pytorch_model.bin"))
    checkpoint = Checkpoint(str(tmp_path), model_class="AutoModelForSeq2SeqLM")
    assert checkpoint.files == [str(tmp_path / "pytorch_model.bin")]
    assert {n: s for n, (s, _) in checkpoint.shapes().items()} == {"a.weight": [2, 3], "b.bias": [4]}
    assert dict(checkpoint.tensors())["b.bias"].dtype == np.float32
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    with pytest.raises(UsageError, match=r"holds only pytorch_model\.bin, which needs PyTorch to read.*from "
                                         r"transformers import AutoModelForSeq2SeqLM as M"):
        Checkpoint(str(tmp_path), model_class="AutoModelForSeq2SeqLM")


def test_tensors_are_written_as_float32_in_pytorchs_format(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_tensors({"w": np.arange(4, dtype=np.float64).reshape(2, 2).T}, path)  # not contiguous, not float32
    written = load_file(path)
    assert written["w"].dtype == np.float32 and written["w"].tolist() == [[0.0, 2.0], [1.0, 3.0]]
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
