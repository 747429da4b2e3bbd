"""LoRA adapters as a PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``), out and in.

PEFT attaches an adapter to a torch ``nn.Linear`` by the module's name
(``model.layers.0.self_attn.q_proj``), which the family's weight map gives
for each lmkit ``Linear`` it fills from such a weight (a :class:`~lmkit.hub.weights.Port`
with ``torch_linear``). Layouts: PEFT's ``lora_A`` is [rank, in] and
``lora_B`` [out, rank]; lmkit's ``a`` is [in, rank] and ``b`` [rank, out].

:func:`export_adapters` writes a LoRA run's adapters alone, so that
``peft.PeftModel.from_pretrained(base, folder)`` on the run's base computes
what the run computes; :func:`load_adapters` puts a PEFT folder's adapters
on an lmkit model of the base.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.hub.folders import check_new_folder, read_json, write_folder, write_json
from lmkit.hub.safetensors import read_tensors, save_tensors

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "PREFIX", "adapted_modules", "export_adapters", "load_adapters"]

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: What PEFT puts before a module's name in the adapters' tensor names.
PREFIX = "base_model.model."


def adapted_modules(converter: Any, model: Any) -> Dict[str, Any]:
    """PEFT module name -> the lmkit ``Linear`` the family fills from that module's weight (a torch
    ``nn.Linear``), for every such layer of ``model``."""
    from lmkit.layers.lora import linear_layers

    owners = {id(layer.kernel): layer for _, layer in linear_layers(model)}
    return {port.names[0][:-len(".weight")]: owners[id(port.variable)] for port in converter.weights(model)
            if port.torch_linear and id(port.variable) in owners}


def export_adapters(converter: Any, model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes the LoRA adapters of ``model`` (a run of the base in ``source``) as a PEFT adapter folder.

    Raises:
      UsageError: a model without adapters, or an ``output`` that exists and is not empty.
    """
    from lmkit.layers.lora import lora_of

    lora = lora_of(model)
    if lora is None:
        raise UsageError("export --format peft writes LoRA adapters, and this run has none (it trained every "
                         "weight); train with --lora_rank, or export --format hf")
    check_new_folder(output)
    tensors: Dict[str, Any] = {}
    targets = set()
    for module, layer in adapted_modules(converter, model).items():
        if layer.adapter is not None:
            targets.add(module.rsplit(".", 1)[-1])
            tensors[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(layer.adapter.a.numpy().T)
            tensors[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(layer.adapter.b.numpy().T)
    config = {"peft_type": "LORA", "task_type": "SEQ_2_SEQ_LM" if converter.conditional else "CAUSAL_LM",
              "base_model_name_or_path": source or None, "r": lora.rank, "lora_alpha": lora.alpha,
              "lora_dropout": lora.dropout, "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
              "inference_mode": True, "use_rslora": False, "init_lora_weights": True, "modules_to_save": None}

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, ADAPTER_WEIGHTS))
        write_json(os.path.join(tmp, ADAPTER_CONFIG), config)

    return write_folder(output, fill)


def _read_config(folder: str) -> Tuple[str, Dict[str, Any]]:
    """The checked ``adapter_config.json`` of a PEFT folder (LoRA, no options lmkit does not compute)."""
    path = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        raise UsageError(f"{folder} is not a PEFT adapter folder: {path} is missing")
    config = read_json(path)
    if config.get("peft_type") != "LORA":
        raise UsageError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA; lmkit reads LoRA adapters")
    for key, plain in (("use_rslora", False), ("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if config.get(key, plain) != plain:
            raise UsageError(f"{path}: {key} = {config[key]!r} is not supported (lmkit computes {key} = {plain!r})")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise UsageError(f"{path}: rank_pattern / alpha_pattern are not supported (one rank and alpha for all)")
    return path, config


def load_adapters(converter: Any, model: Any, folder: str) -> Any:
    """Adds the PEFT folder's LoRA adapters to ``model`` (an lmkit model of their base, without adapters)
    and fills them; returns them (:class:`lmkit.layers.lora.LoRA`).

    Raises:
      UsageError: not a LoRA folder, options lmkit does not compute, or adapters that do not fit the model
        (naming the file and the tensor); the model keeps no adapter then.
    """
    from lmkit.layers.lora import add_lora

    path, config = _read_config(folder)
    modules = adapted_modules(converter, model)
    tensors = dict(read_tensors(os.path.join(folder, ADAPTER_WEIGHTS)))
    named = {name[len(PREFIX):].rsplit(".", 2)[0] for name in tensors if name.startswith(PREFIX)}
    unknown = sorted(named - set(modules)) or sorted(n for n in tensors if not n.startswith(PREFIX))
    if unknown:
        raise UsageError(f"{folder}: the adapters of {unknown[0]} fit no layer of lmkit's {converter.model}; are "
                         f"they adapters of this base ({config.get('base_model_name_or_path')})?")
    rank = config.get("r")
    values = []
    for module in sorted(named):
        layer = modules[module]
        a, b = tensors.get(f"{PREFIX}{module}.lora_A.weight"), tensors.get(f"{PREFIX}{module}.lora_B.weight")
        if a is None or b is None or a.shape != (rank, layer.input_size) or b.shape != (layer.output_size, rank):
            raise UsageError(f"{folder}: {module}'s lora_A / lora_B do not fit r = {rank} and its layer "
                             f"[{layer.input_size}, {layer.output_size}] ({path})")
        values.append((layer, a.T, b.T))
    lora = add_lora(model, rank=rank, alpha=float(config.get("lora_alpha", rank)),
                    dropout=float(config.get("lora_dropout", 0.0)),
                    targets=sorted({layer.name for layer, _, _ in values}))
    for layer, a, b in values:
        layer.adapter.a.assign(a)
        layer.adapter.b.assign(b)
    return lora
