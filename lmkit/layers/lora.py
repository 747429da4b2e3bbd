"""Low-rank adapters (LoRA; Hu et al., 2021) on the :class:`~lmkit.layers.Linear` layers of any module.

A frozen layer ``y = x W (+ b)`` gains ``(alpha / rank) * dropout(x) A B``
with ``A`` [in, rank] (small uniform values) and ``B`` [rank, out] (zeros),
so an adapted model starts out computing exactly what its base computes and
only ``A`` and ``B`` train.

    with frozen():                          # the base's variables: trainable=False
        model = build_model(config)         # then load its pretrained weights
    adapters = add_lora(model, rank=8, alpha=16, targets=("query", "value"))
    model.trainable_variables               # only the adapters' A and B
    tf.train.Checkpoint(model=adapters)     # saves the adapters alone
    merge_lora(model)                       # W += (alpha / rank) A B; a plain model again

Targets are the names of the Linear layers (``query``, ``key``, ``value``,
``output``, ``gate``, ``up``, ``down`` in a Llama; ``qkv``, ``output``,
``ffn_inner``, ``ffn_outer`` in a transformer/GPT-2), matched wherever they
occur; an unknown name is an error that lists the names the model has.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import (
    Linear,
    Module,
    Training,
    check_positive_float,
    check_positive_int,
    check_rate,
    dropout,
    uniform_initializer,
    zeros_initializer,
)
from lmkit.layers.precision import cast_like

__all__ = ["LoRAAdapter", "LoRA", "add_lora", "frozen", "linear_layers", "lora_of", "merge_lora"]


class LoRAAdapter(Module):
    """The low-rank update of one Linear layer: ``x -> scale * dropout(x) @ A @ B``.

    Variables: ``a`` [input_size, rank] (uniform in +-1/sqrt(input_size), as
    PEFT's Kaiming initialisation) and ``b`` [rank, output_size] (zeros).
    """

    def __init__(self, *, input_size: int, output_size: int, rank: int, alpha: float,
                 dropout: float = 0.0, name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          input_size, output_size: the adapted layer's sizes.
          rank: the inner size ``r``.
          alpha: the update is scaled by ``alpha / rank``.
          dropout: on the adapter's input while training.
          name: module name.
        """
        super().__init__(name=name)
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = check_positive_int("output_size", output_size)
        self.rank = check_positive_int("lora_rank", rank)
        self.alpha = check_positive_float("lora_alpha", alpha)
        self.dropout = check_rate("lora_dropout", dropout)
        with self.name_scope:
            self.a = tf.Variable(uniform_initializer(1.0 / math.sqrt(input_size))([input_size, rank], tf.float32),
                                 name="a")
            self.b = tf.Variable(zeros_initializer()([rank, output_size], tf.float32), name="b")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def __call__(self, inputs: tf.Tensor, training: Training = False) -> tf.Tensor:
        """inputs [..., input_size] -> [..., output_size] in the input's dtype."""
        x = dropout(inputs, self.dropout, training)
        width = tf.shape(x)[:-1]
        flat = tf.reshape(x, [-1, self.input_size])
        low = tf.matmul(flat, cast_like(self.a, flat))  # [rows, rank]
        out = tf.matmul(low, cast_like(self.b * self.scale, flat))
        return tf.reshape(out, tf.concat([width, [self.output_size]], axis=0))

    def delta(self) -> tf.Tensor:
        """The update of the kernel, ``scale * A @ B`` [input_size, output_size] float32."""
        return self.scale * tf.matmul(self.a, self.b)

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "output_size": self.output_size, "rank": self.rank,
                "alpha": self.alpha, "dropout": self.dropout, "name": self.name}


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Every ``tf.Variable`` created inside is not trainable (the base of a LoRA model)."""
    def creator(next_creator, **kwargs):
        kwargs["trainable"] = False
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


def linear_layers(module: tf.Module) -> List[Tuple[str, Linear]]:
    """``(path, layer)`` of every Linear inside ``module``, in a fixed order (paths like ``decoder/layers/0/...``)."""
    found: Dict[int, Tuple[str, Linear]] = {}
    for path, layer in module._flatten(with_path=True, predicate=lambda m: isinstance(m, Linear)):  # noqa: SLF001
        if id(layer) not in found:  # a layer reached twice (a shared module) is adapted once
            found[id(layer)] = ("/".join(str(p) for p in path), layer)
    return sorted(found.values(), key=lambda item: item[0])


class LoRA(Module):
    """The adapters of one model, by the path of the layer each adapts: what a LoRA run checkpoints.

    Build it with :func:`add_lora`; ``tf.train.Checkpoint(model=lora)`` saves
    and restores the adapters alone (the base comes from its own folder).
    """

    def __init__(self, adapters: Dict[str, LoRAAdapter], *, rank: int, alpha: float, dropout: float,
                 targets: Sequence[str], name: Optional[str] = "lora") -> None:
        super().__init__(name=name)
        self.adapters = dict(adapters)
        self.rank, self.alpha, self.dropout, self.targets = rank, alpha, dropout, tuple(targets)

    def num_parameters(self) -> int:
        return int(sum(v.shape.num_elements() for v in self.variables))

    def get_config(self) -> Dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}


def add_lora(model: tf.Module, *, rank: int, alpha: float, dropout: float = 0.0,
             targets: Sequence[str] = ("query", "value")) -> LoRA:
    """Gives each Linear layer of ``model`` named in ``targets`` an adapter; returns them (also ``model.lora``).

    The adapters' variables are trainable (create the base inside
    :func:`frozen` so that only they are). Raises UsageError for a target that
    names no layer, listing the layer names the model has, or for a model that
    already has adapters.
    """
    check_positive_int("lora_rank", rank)
    check_positive_float("lora_alpha", alpha)
    check_rate("lora_dropout", dropout)
    if lora_of(model) is not None:
        raise UsageError("this model already has LoRA adapters; merge_lora(model) first to add new ones")
    targets = tuple(dict.fromkeys(t.strip() for t in targets if t.strip()))
    if not targets:
        raise UsageError("lora_targets is empty; name the linear layers to adapt, e.g. query,value")
    layers = linear_layers(model)
    names = sorted({layer.name for _, layer in layers})
    unknown = [t for t in targets if t not in names]
    if unknown:
        raise UsageError(f"lora_targets {', '.join(unknown)} name(s) no linear layer of this "
                         f"{type(model).__name__}; its linear layers are {', '.join(names) or 'none'}")
    adapters: Dict[str, LoRAAdapter] = {}
    with tf.name_scope("lora"):
        for path, layer in layers:
            if layer.name in targets:
                adapter = LoRAAdapter(input_size=layer.input_size, output_size=layer.output_size, rank=rank,
                                      alpha=alpha, dropout=dropout, name="adapter")
                layer.adapter = adapter
                adapters[path] = adapter
    lora = LoRA(adapters, rank=rank, alpha=alpha, dropout=dropout, targets=targets)
    model.lora = lora
    return lora


def lora_of(model: tf.Module) -> Optional[LoRA]:
    """The adapters :func:`add_lora` gave ``model``, or None."""
    return getattr(model, "lora", None)


def merge_lora(model: tf.Module) -> int:
    """Adds each adapter's update into its layer's kernel and removes the adapters; returns how many.

    The model then computes what it computed with the adapters (up to
    rounding) at a plain model's cost, and exports as one.
    """
    lora = lora_of(model)
    if lora is None:
        return 0
    for _, layer in linear_layers(model):
        adapter = layer.adapter
        if adapter is not None:
            layer.kernel.assign_add(adapter.delta())
            layer.adapter = None
    count = len(lora.adapters)
    model.lora = None
    return count
