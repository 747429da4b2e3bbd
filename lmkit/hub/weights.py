"""A family's weight-name mapping, and the one loader and exporter that it drives.

A family maps its model's variables onto a Hugging Face checkpoint as a list
of :class:`Port` s (``Converter.weights``): each names the tensors that fill
one variable, how they become its value (``load``) and how the value goes
back to them (``save``, for export). The builders here cover the usual
cases: a tensor as it is (:func:`same`), a torch ``nn.Linear`` [out, in]
onto lmkit's [in, out] kernel (:func:`linear`), a norm (:func:`norm`),
projections stored apart and fused in one lmkit kernel (:func:`fused`) and
a value stored with an offset (:func:`shifted`).

:func:`load_ports` checks every tensor of a folder against the ports, names
(through the family's ``stored_names``: a prefix some folders leave out, a
tied table stored under several names) and shapes (from the files'
headers), before it assigns any, so a checkpoint that does not fit leaves
the model as it was; it then reads the tensors one file at a time.
:func:`hf_tensors` is the way back.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.hub.folders import HF_CONFIG
from lmkit.hub.safetensors import Checkpoint

__all__ = ["Port", "fused", "hf_tensors", "linear", "load_ports", "norm", "same", "shifted", "transposed"]


def _value(x: np.ndarray) -> np.ndarray:
    return x


def _listed(x: np.ndarray) -> List[np.ndarray]:
    return [x]


@dataclasses.dataclass(frozen=True, eq=False)  # a variable compares by value: ports compare by identity
class Port:
    """One lmkit variable and the Hugging Face tensors that fill it.

    Attributes:
      variable: the ``tf.Variable``.
      names: the tensors' names, as an export writes them (several for a fused kernel).
      load: the tensors (float32 arrays, in ``names``' order) -> the variable's value.
      save: the variable's value -> the tensors, in ``names``' order (``load``'s inverse).
      fill: the value of every entry where a checkpoint lacks the tensor (``transformers``' own default
        for it); None: the tensor is required.
      torch_linear: the tensor is a torch ``nn.Linear``'s weight [out, in] (where PEFT attaches adapters).
    """

    variable: Any
    names: Tuple[str, ...]
    load: Callable[..., np.ndarray] = _value
    save: Callable[[np.ndarray], Sequence[np.ndarray]] = _listed
    fill: Optional[float] = None
    torch_linear: bool = False


def same(name: str, variable: Any, fill: Optional[float] = None) -> Port:
    """A tensor stored as lmkit holds it."""
    return Port(variable, (name,), fill=fill)


def transposed(name: str, variable: Any) -> Port:
    """A torch ``nn.Linear`` weight [out, in] onto an lmkit kernel [in, out]."""
    return Port(variable, (name,), lambda w: w.T, lambda k: [k.T], torch_linear=True)


def linear(prefix: str, layer: Any, torch: bool = True) -> List[Port]:
    """An lmkit ``Linear``: ``<prefix>.weight`` (a torch ``nn.Linear``'s, transposed; with ``torch=False``
    one stored [in, out], as a ``Conv1D``'s) and ``<prefix>.bias`` where the layer has one."""
    kernel = transposed(prefix + ".weight", layer.kernel) if torch else same(prefix + ".weight", layer.kernel)
    return [kernel, same(prefix + ".bias", layer.bias)] if layer.use_bias else [kernel]


def norm(prefix: str, layer: Any) -> List[Port]:
    """A layer norm's ``scale`` (``<prefix>.weight``) and ``offset`` (``<prefix>.bias``, where it has one)."""
    offset = getattr(layer, "offset", None)
    return [same(prefix + ".weight", layer.scale)] + ([] if offset is None else [same(prefix + ".bias", offset)])


def fused(prefix: str, parts: Sequence[str], layer: Any) -> List[Port]:
    """Torch projections ``<prefix>.<part>`` side by side in one lmkit ``Linear`` (queries, keys, values in
    ``parts``' order): weights transposed and joined on the output axis, biases joined."""
    count = len(parts)
    kernel = Port(layer.kernel, tuple(f"{prefix}.{p}.weight" for p in parts),
                  lambda *ws: np.concatenate([w.T for w in ws], 1), lambda k: [w.T for w in np.split(k, count, 1)])
    bias = Port(layer.bias, tuple(f"{prefix}.{p}.bias" for p in parts), lambda *bs: np.concatenate(bs),
                lambda b: np.split(b, count))
    return [kernel, bias]


def shifted(port: Port, offset: float) -> Port:
    """``port`` for a value stored as ``value - offset`` (float32 both ways)."""
    delta = np.float32(offset)
    load, save = port.load, port.save
    return dataclasses.replace(port, load=lambda *xs: load(*xs) + delta,
                               save=lambda v: save(np.asarray(v, np.float32) - delta))


def hf_tensors(ports: Sequence[Port]) -> Dict[str, np.ndarray]:
    """Every port's tensors under its Hugging Face names, in Hugging Face's layouts (for export)."""
    tensors: Dict[str, np.ndarray] = {}
    for port in ports:
        tensors.update(zip(port.names, port.save(port.variable.numpy())))
    return tensors


def _sources(ports: Sequence[Port], shapes: Dict[str, Any], stored_names: Callable[[str], Sequence[str]],
             folder: str, owner: str) -> Dict[int, Optional[Tuple[str, ...]]]:
    """Port index -> the stored tensors that fill it (None: filled with its ``fill``).

    Raises:
      UsageError: a tensor no port uses, or one a port needs that the checkpoint lacks.
    """
    canonical = {name for port in ports for name in port.names}
    known, missing = set(), []
    sources: Dict[int, Optional[Tuple[str, ...]]] = {}
    for i, port in enumerate(ports):
        found = []
        for name in port.names:  # the first of the names it may be stored under; another port's is not one
            candidates = [c for c in stored_names(name) if c == name or c not in canonical] or [name]
            known.update(candidates)
            found.append(next((c for c in candidates if c in shapes), None))
        if None not in found:
            sources[i] = tuple(found)
        elif port.fill is not None and not any(found):
            sources[i] = None
        else:
            missing += [name for name, got in zip(port.names, found) if got is None]
    unexpected = [name for name in shapes if name not in known]
    if unexpected:
        raise UsageError(f"{shapes[unexpected[0]][1]} holds {unexpected[0]}, which {owner} has no use for "
                         f"({len(unexpected)} unexpected tensors); is {os.path.join(folder, HF_CONFIG)} the "
                         "config of these weights?")
    if missing:
        raise UsageError(f"{folder} lacks {missing[0]} ({len(missing)} tensors missing); the checkpoint is "
                         "incomplete or of another model")
    return sources


def _check_shapes(ports: Sequence[Port], sources: Dict[int, Optional[Tuple[str, ...]]], shapes: Dict[str, Any],
                  folder: str) -> None:
    """Raises unless every stored tensor has the shape its port's variable gives it (through ``save``)."""
    for i, stored in sources.items():
        if stored is None:
            continue
        port = ports[i]
        # the shapes an export of the variable would write: save() of a zero array (broadcast: no memory)
        wanted = port.save(np.broadcast_to(np.float32(0.0), tuple(port.variable.shape.as_list())))
        for name, want in zip(stored, wanted):
            shape, path = shapes[name]
            if list(shape) != list(want.shape):
                raise UsageError(f"{path}: {name} has shape {list(shape)} but {os.path.join(folder, HF_CONFIG)} "
                                 f"gives {list(want.shape)}; the weights and the config come from different models")


def load_ports(ports: Sequence[Port], checkpoint: Checkpoint, stored_names: Callable[[str], Sequence[str]],
               owner: str) -> List[str]:
    """Fills every port's variable from ``checkpoint``, all tensors checked before any is assigned.

    Args:
      ports: the family's weight map of the model.
      checkpoint: the folder's tensors.
      stored_names: a port's tensor name -> the names a checkpoint may store it under, best first.
      owner: the model, in messages ("lmkit's <model>").

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the file, the tensor and both shapes).
    """
    shapes = checkpoint.shapes()
    sources = _sources(ports, shapes, stored_names, checkpoint.folder, owner)
    _check_shapes(ports, sources, shapes, checkpoint.folder)
    slots = {name: (i, k) for i, stored in sources.items() for k, name in enumerate(stored or ())}
    pending: Dict[int, List[Any]] = {}
    for name, value in checkpoint.tensors():
        if name not in slots:  # a tied copy also stored, a buffer
            continue
        i, k = slots[name]
        arrays = pending.setdefault(i, [None] * len(ports[i].names))
        arrays[k] = value
        if all(a is not None for a in arrays):  # a fused kernel's parts may lie in different shards
            ports[i].variable.assign(ports[i].load(*pending.pop(i)))
    for i, stored in sources.items():
        if stored is None:
            variable = ports[i].variable
            variable.assign(np.full(variable.shape.as_list(), ports[i].fill, np.float32))
    return list(checkpoint.files)
