"""The weight-map vocabulary and the one loader (lmkit.hub.weights), on plain variables and safetensors files
written here: every port's transforms go both ways, names are found under the names a family allows, and a
checkpoint that does not fit is one message naming the file and the tensor, with nothing assigned."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from lmkit.core.errors import UsageError
from lmkit.hub.safetensors import Checkpoint
from lmkit.hub.weights import Port, fused, hf_tensors, linear, load_ports, norm, same, shifted, transposed


class Layer:
    """What the builders read: a Linear's kernel, bias and use_bias; a norm's scale and offset."""

    def __init__(self, shape, rng, bias=True):
        self.kernel = tf.Variable(rng.normal(size=shape).astype(np.float32))
        self.use_bias = bias
        self.bias = tf.Variable(rng.normal(size=shape[-1:]).astype(np.float32)) if bias else None
        self.scale, self.offset = self.kernel, self.bias


def ports_of(rng):
    """One port of each kind: a table, a torch Linear with a bias, GPT-2's [in, out] Linear without one, a norm,
    q/k/v fused in one kernel, a norm stored around 1, and a bias transformers gives zeros when absent."""
    table, torch_linear, conv, qkv = (Layer(s, rng) for s in ([7, 4], [4, 6], [4, 5], [4, 9]))
    layer_norm, gemma_norm, bias = Layer([4], rng), Layer([4], rng), Layer([7], rng)
    conv.use_bias = False
    return [same("embed.weight", table.kernel), *linear("proj", torch_linear), *linear("conv", conv, torch=False),
            *norm("ln", layer_norm), *fused("attn", ("q", "k", "v"), qkv),
            shifted(same("rms.weight", gemma_norm.scale), 1.0),
            Port(bias.kernel, ("final_bias",), lambda b: b.reshape(-1), lambda b: [b[np.newaxis]], fill=0.0)]


def write(folder, tensors, shards=None):
    """``tensors`` as model.safetensors, or as shards (lists of names) with their index."""
    os.makedirs(folder, exist_ok=True)
    tensors = {n: np.ascontiguousarray(v) for n, v in tensors.items()}  # save_file writes a view's memory as it is
    if shards is None:
        save_file(tensors, os.path.join(folder, "model.safetensors"))
        return
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i:05d}.safetensors"
        save_file({n: tensors[n] for n in names}, os.path.join(folder, file))
        weight_map.update({n: file for n in names})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)


def values(ports):
    return [p.variable.numpy().copy() for p in ports]


def own_names(name):
    return (name,)


def test_every_port_round_trips_through_a_sharded_folder(tmp_path):
    rng = np.random.default_rng(0)
    ports = ports_of(rng)
    tensors = hf_tensors(ports)
    assert tensors["proj.weight"].shape == (6, 4) and tensors["conv.weight"].shape == (4, 5)  # torch's [out, in]
    assert [tensors[f"attn.{p}.weight"].shape for p in "qkv"] == [(3, 4)] * 3 and tensors["final_bias"].shape == (1, 7)
    np.testing.assert_array_equal(tensors["rms.weight"], ports[-2].variable.numpy() - np.float32(1.0))
    expected = values(ports)
    names = sorted(tensors)  # q in one shard, k and v in the other: a fused kernel waits for its parts
    write(str(tmp_path), tensors, [names[: len(names) // 2], names[len(names) // 2:]])
    for port in ports:
        port.variable.assign(tf.zeros_like(port.variable))
    files = load_ports(ports, Checkpoint(str(tmp_path)), own_names, "the test's model")
    assert len(files) == 2
    for port, want in zip(ports, expected):
        np.testing.assert_allclose(port.variable.numpy(), want, rtol=0, atol=1e-6, err_msg=port.names[0])


def test_a_tensor_found_under_another_name_and_a_default_for_an_absent_one(tmp_path):
    rng = np.random.default_rng(1)
    ports = ports_of(rng)
    tensors = hf_tensors(ports)
    del tensors["final_bias"]  # absent: transformers' zeros
    tensors["old.embed.weight"] = tensors.pop("embed.weight")  # stored under an older name
    tensors["lm_head.weight"] = tensors["old.embed.weight"].copy()  # a tied copy: read from neither, refused by none
    write(str(tmp_path), tensors)
    ports[0].variable.assign(tf.zeros_like(ports[0].variable))

    def stored(name):
        return ("embed.weight", "old.embed.weight", "lm_head.weight") if name == "embed.weight" else (name,)

    load_ports(ports, Checkpoint(str(tmp_path)), stored, "the test's model")
    np.testing.assert_array_equal(ports[0].variable.numpy(), tensors["old.embed.weight"])
    assert not ports[-1].variable.numpy().any()


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("proj.bias"), r"\S+ lacks proj\.bias \(1 tensors missing\); the checkpoint is incomplete"),
    (lambda t: t.update(extra=np.zeros(2, np.float32)),
     r"model\.safetensors holds extra, which the test's model has no use for \(1 unexpected tensors\); is "
     r"\S+config\.json the config of these weights\?"),
    (lambda t: t.update({"attn.k.weight": np.zeros([2, 4], np.float32)}),
     r"model\.safetensors: attn\.k\.weight has shape \[2, 4\] but \S+config\.json gives \[3, 4\]; the weights and "
     r"the config come from different models"),
])
def test_a_checkpoint_that_does_not_fit_is_named_and_nothing_is_assigned(change, message, tmp_path):
    rng = np.random.default_rng(2)
    ports = ports_of(rng)
    tensors = hf_tensors(ports)
    change(tensors)
    write(str(tmp_path), {k: v * 2 + 1 for k, v in tensors.items()})
    before = values(ports)
    with pytest.raises(UsageError, match=message):
        load_ports(ports, Checkpoint(str(tmp_path)), own_names, "the test's model")
    assert all(np.array_equal(a, b) for a, b in zip(before, values(ports)))


def test_another_ports_name_is_never_taken_as_an_alias(tmp_path):
    # An untied softmax owns lm_head.weight: it is not the token table's stored copy then.
    rng = np.random.default_rng(3)
    table, head = Layer([5, 3], rng), Layer([3, 5], rng)
    ports = [same("embed.weight", table.kernel), transposed("lm_head.weight", head.kernel)]
    tensors = hf_tensors(ports)
    del tensors["embed.weight"]
    write(str(tmp_path), tensors)

    def stored(name):
        return (name, "lm_head.weight") if name == "embed.weight" else (name,)

    with pytest.raises(UsageError, match=r"lacks embed\.weight"):
        load_ports(ports, Checkpoint(str(tmp_path)), stored, "the test's model")
