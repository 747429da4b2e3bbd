"""Hugging Face Llama, Qwen2 and Mistral checkpoints onto lmkit's ``llama`` model, and back.

A folder as ``save_pretrained`` writes it: ``config.json`` (``model_type``
``llama``, ``qwen2`` or ``mistral``), the weights in ``model.safetensors`` or
in shards listed by ``model.safetensors.index.json``, and the tokenizer
(``tokenizer.json``). The weights go through the hub's shared loader
(:func:`lmkit.hub.safetensors.load_mapped`: TensorFlow tensors, so bfloat16
checkpoints load without PyTorch, one shard at a time; every tensor is
checked against the variable it fills, shape by shape, before any is
assigned).

Hugging Face keeps linear weights as [out, in]; lmkit's kernels are
[in, out], so they are transposed on the way in (:func:`parameter_map`
names each pair).

Uses the model's attributes ``embedder``, ``projection`` (untied),
``tie_weights``, ``decoder.final_norm``, ``decoder.layers[i]``
(``attention_norm``, ``ffn_norm``, ``attention.query/key/value/output``,
``ffn.gate/up/down``; each a Linear with ``kernel``, ``use_bias``,
``bias``) and ``get_config``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.folders import (
    HF_CONFIG,
    check_export_source,
    check_new_folder,
    read_config_json,
    write_folder,
    write_json,
)
from lmkit.hub.safetensors import load_mapped, save_tensors, write_new, write_pretrained

__all__ = ["ARCHITECTURES", "LlamaConverter", "config_json", "export_llama", "export_llama_adapters",
           "export_llama_from_scratch", "llama_model_config", "load_llama_weights", "parameter_map",
           "read_llama_config"]

#: model_type -> the transformers class whose checkpoints load here
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def read_llama_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json``, checked to be a model lmkit's ``llama`` computes exactly.

    Raises:
      UsageError: a missing file, another model type, a missing size, or a
        setting lmkit does not compute (naming the file, the key and the value).
    """
    path, config = read_config_json(folder)
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise UsageError(f"{path}: model_type {model_type!r} is not one of {', '.join(ARCHITECTURES)} "
                         f"({', '.join(ARCHITECTURES.values())})")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    if config.get("hidden_act", "silu") != "silu":
        raise UsageError(f"{path}: hidden_act {config.get('hidden_act')!r} is not supported (lmkit's llama "
                         "gates its feed-forward with silu)")
    if config.get("mlp_bias"):
        raise UsageError(f"{path}: mlp_bias = true is not supported (no Llama, Qwen2 or Mistral release uses it)")
    rope = _rope(config, path)
    if rope[1] is not None and rope[1]["rope_type"] not in ("linear", "llama3"):
        raise UsageError(f"{path}: rope type {rope[1]['rope_type']!r} is not supported; lmkit computes "
                         "default, linear and llama3")
    return config


def _rope(config: Dict[str, Any], path: str) -> Tuple[float, Optional[Dict[str, Any]]]:
    """``(rope_theta, rope_scaling or None)`` from a config of any transformers version.

    transformers 5 writes ``rope_parameters`` (theta and type in one dict);
    earlier versions ``rope_theta`` and ``rope_scaling``.
    """
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = config.get("rope_theta", 10000.0)
        scaling = dict(config.get("rope_scaling") or {})
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UsageError(f"{path}: rope_theta = {theta!r} must be a number > 0")
    kind = scaling.pop("rope_type", scaling.pop("type", "default")) if scaling else "default"
    if kind == "default":
        return float(theta), None
    return float(theta), {"rope_type": kind, **scaling}


def _windows(config: Dict[str, Any]) -> Tuple[int, Optional[List[str]]]:
    """``(sliding_window, layer_types)``: Mistral's window on every layer, Qwen2's on the layers it names."""
    if config["model_type"] == "mistral":
        return config.get("sliding_window") or 0, None
    if config["model_type"] == "qwen2" and config.get("use_sliding_window"):
        layer_types = config.get("layer_types")
        if layer_types is None:  # transformers < 5: layers from max_window_layers on slide
            first = config.get("max_window_layers", config["num_hidden_layers"])
            layer_types = ["full_attention" if i < first else "sliding_attention"
                           for i in range(config["num_hidden_layers"])]
        return config.get("sliding_window") or 0, layer_types
    return 0, None


def llama_model_config(config: Dict[str, Any], path: str = HF_CONFIG) -> Dict[str, Any]:
    """``lmkit.models.build_model`` keys of the model ``config`` (a checked ``config.json``) describes."""
    theta, scaling = _rope(config, path)
    heads = config["num_attention_heads"]
    window, layer_types = _windows(config)
    attention_bias = bool(config.get("attention_bias", False))
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {
        "model": "llama", "vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"],
        "num_layers": config["num_hidden_layers"], "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": head_dim if head_dim != config["hidden_size"] // heads else 0,
        "ffn_dim": config["intermediate_size"],
        "max_positions": config.get("max_position_embeddings", 2048), "rope_theta": theta,
        "rope_scaling": scaling, "sliding_window": window, "layer_types": layer_types,
        "qkv_bias": config["model_type"] == "qwen2" or attention_bias, "attention_output_bias": attention_bias,
        "rms_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "tie_weights": bool(config.get("tie_word_embeddings", False)), "activation": "silu",
        "dropout": float(config.get("attention_dropout", 0.0) or 0.0),
        "init_scale": float(config.get("initializer_range", 0.02)),
    }


def parameter_map(model: Any) -> Dict[str, Tuple[Any, bool]]:
    """Hugging Face tensor name -> (lmkit variable, whether the tensor is transposed to fill it)."""
    names: Dict[str, Tuple[Any, bool]] = {"model.embed_tokens.weight": (model.embedder.embeddings, False),
                                          "model.norm.weight": (model.decoder.final_norm.scale, False)}
    if not model.tie_weights:
        names["lm_head.weight"] = (model.projection.kernel, True)
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"model.layers.{i}."
        attention, ffn = layer.attention, layer.ffn
        names[prefix + "input_layernorm.weight"] = (layer.attention_norm.scale, False)
        names[prefix + "post_attention_layernorm.weight"] = (layer.ffn_norm.scale, False)
        for hf, linear in (("q_proj", attention.query), ("k_proj", attention.key), ("v_proj", attention.value),
                           ("o_proj", attention.output)):
            names[f"{prefix}self_attn.{hf}.weight"] = (linear.kernel, True)
            if linear.use_bias:
                names[f"{prefix}self_attn.{hf}.bias"] = (linear.bias, False)
        for hf, linear in (("gate_proj", ffn.gate), ("up_proj", ffn.up), ("down_proj", ffn.down)):
            names[f"{prefix}mlp.{hf}.weight"] = (linear.kernel, True)
    return names


def load_llama_weights(model: Any, folder: str) -> List[str]:
    """Fills ``model`` (a ``llama`` model of the folder's sizes) from the folder's checkpoint.

    Every tensor's name and shape is checked before any is assigned, so a
    mismatch leaves the model as it was.

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the file,
        the tensor and both shapes).
    """
    # some tied checkpoints store the shared table twice
    ignore = ("lm_head.weight",) if model.tie_weights else ()
    return load_mapped(folder, parameter_map(model), "lmkit's llama", ignore)


def _hf_tensors(model: Any) -> Dict[str, Any]:
    """The model's weights under their Hugging Face names, in Hugging Face's layouts."""
    return {name: v.numpy().T if transposed else v.numpy() for name, (v, transposed) in parameter_map(model).items()}


def export_llama(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a fine-tuned ``llama`` run as a folder ``transformers`` loads (``AutoModelForCausalLM``).

    The config, tokenizer and chat template are the ``source`` folder's (the
    run's ``init_from``: fine-tuning keeps the architecture); the weights
    are the model's, in ``model.safetensors`` (float32, Hugging Face names
    and layouts). Written aside and renamed into place.

    Raises:
      UsageError: a run not started from a Hugging Face folder, a source
        folder that is gone or does not fit the model, or an ``output``
        that exists and is not empty.
    """
    check_export_source(source, "llama", output)
    if llama_model_config(read_llama_config(source))["num_layers"] != model.decoder.num_layers:
        raise UsageError(f"{source} does not describe this run's model (another number of layers)")
    return write_pretrained(_hf_tensors(model), source, output)


def _family_of(c: Dict[str, Any]) -> str:
    """The family whose folder holds a ``llama`` model trained from scratch (``c``: its ``get_config()``)."""
    window, types = c.get("sliding_window") or 0, c.get("layer_types")
    bias = bool(c.get("qkv_bias")) or bool(c.get("attention_output_bias"))
    if c.get("activation", "silu") != "silu":
        raise UsageError(f"activation = {c['activation']!r}: Llama and Mistral compute SwiGLU with silu")
    if not window:
        return "llama"
    if types is None and not bias:
        return "mistral"
    raise UsageError(f"this model cannot be written as a Hugging Face folder (sliding_window {window}, "
                     f"layer_types {types}, attention biases {bias}): Llama has no window, Mistral's every "
                     "layer slides and it has no biases, and transformers reads a Qwen2 folder (per-layer "
                     "windows) with its own tokenizer; train with sliding_window = 0, or on every layer "
                     "without biases")


def config_json(model_config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``config.json`` of a ``llama`` model trained from scratch (``model.get_config()``), in the family
    that holds it: the inverse of :func:`llama_model_config`.

    Llama without a sliding window (``attention_bias`` when any attention projection has a bias: the
    others get zero biases, see :func:`export_llama_from_scratch`), Mistral when every layer slides and
    no projection has a bias. Qwen2's per-layer windows (``layer_types``) are not written:
    ``transformers`` reads a Qwen2 folder with its own tokenizer class, whatever ``tokenizer.json`` says.

    Raises:
      UsageError: a model no family holds here (naming the keys).
    """
    c = model_config
    family = _family_of(c)
    heads, hidden = c["num_heads"], c["hidden_size"]
    config: Dict[str, Any] = {
        "model_type": family, "architectures": [ARCHITECTURES[family]], "vocab_size": c["vocab_size"],
        "hidden_size": hidden, "intermediate_size": c["ffn_dim"], "num_hidden_layers": c["num_layers"],
        "num_attention_heads": heads, "num_key_value_heads": c.get("num_kv_heads") or heads,
        "head_dim": c.get("head_dim") or hidden // heads, "max_position_embeddings": c["max_positions"],
        "rms_norm_eps": c["rms_norm_epsilon"], "rope_theta": c["rope_theta"], "rope_scaling": c.get("rope_scaling"),
        "tie_word_embeddings": bool(c["tie_weights"]), "hidden_act": "silu",
        "attention_dropout": c.get("dropout", 0.0), "initializer_range": c.get("init_scale", 0.02),
        "torch_dtype": "float32", "dtype": "float32"}
    if family == "llama":
        config.update(attention_bias=bool(c.get("qkv_bias")) or bool(c.get("attention_output_bias")),
                      mlp_bias=False)
    else:
        config["sliding_window"] = c.get("sliding_window") or 0
    return config


def export_llama_from_scratch(model: Any, tokenizer: Any, output: str) -> List[str]:
    """Writes a ``llama`` model trained from scratch, with lmkit's own tokenizer, as a folder ``transformers``
    loads (``AutoModelForCausalLM``, ``AutoTokenizer``): its :func:`config_json`, its weights (float32; a
    projection without a bias gets zeros where Llama's ``attention_bias`` gives all four one) and the
    tokenizer's Hugging Face form (:mod:`lmkit.data.hf_form`). As with a GPT-2 trained from scratch, a text
    starts after a line break (``bos_token_id``) and none ends a document (``eos_token_id`` null).

    Raises:
      UsageError: a model no family holds, a tokenizer without a form, or an ``output`` that exists and is
        not empty; nothing is written then.
    """
    import numpy as np

    config = config_json(model.get_config())
    ids = tokenizer.model_token_ids()  # a tokenizer without a form stops here
    check_new_folder(output)
    config.update(ids)
    tensors = _hf_tensors(model)
    if config.get("attention_bias"):
        for weight in [name for name in tensors if name.endswith(("_proj.weight",)) and ".self_attn." in name]:
            tensors.setdefault(weight[:-len("weight")] + "bias", np.zeros(tensors[weight].shape[0], np.float32))
    return write_new(tensors, config, ids, tokenizer, model.max_positions, output)


def export_llama_adapters(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a LoRA run's adapters alone as a PEFT adapter folder (``adapter_config.json``,
    ``adapter_model.safetensors``): ``peft.PeftModel.from_pretrained(base, output)`` on the
    ``source`` model computes what the run computes.

    Raises:
      UsageError: a model without adapters (a run trained without ``lora_rank``),
        or an ``output`` that exists and is not empty.
    """
    import numpy as np

    from lmkit.layers.lora import linear_layers, lora_of
    lora = lora_of(model)
    if lora is None:
        raise UsageError("export --format peft writes LoRA adapters, and this run has none (it trained every "
                         "weight); train with --lora_rank, or export --format hf")
    check_new_folder(output)
    owners = {id(layer.kernel): layer for _, layer in linear_layers(model)}
    tensors: Dict[str, Any] = {}
    targets = set()
    for name, (variable, _) in parameter_map(model).items():
        layer = owners.get(id(variable))
        if layer is None or layer.adapter is None or not name.endswith(".weight"):
            continue
        module = name[:-len(".weight")]
        targets.add(module.rsplit(".", 1)[1])
        # PEFT's nn.Linear layouts: lora_A [rank, in], lora_B [out, rank]; lmkit's a [in, rank], b [rank, out].
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(layer.adapter.a.numpy().T)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(layer.adapter.b.numpy().T)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": source or None,
              "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
              "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "use_rslora": False, "init_lora_weights": True, "modules_to_save": None}

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, ADAPTER_WEIGHTS))
        write_json(os.path.join(tmp, ADAPTER_CONFIG), config)

    return write_folder(output, fill)


class LlamaConverter(Converter):
    """Llama, Qwen2 and Mistral folders onto lmkit's ``llama`` model, and ``llama`` runs back."""

    title = "Llama/Qwen2/Mistral"
    exports_adapters = True

    def read_config(self, folder: str) -> Dict[str, Any]:
        return read_llama_config(folder)

    def model_config(self, config: Dict[str, Any], folder: str) -> Dict[str, Any]:
        return llama_model_config(config, os.path.join(folder, HF_CONFIG))

    def load_weights(self, model: Any, folder: str) -> List[str]:
        return load_llama_weights(model, folder)

    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        if not config.checkpoints.init_from:  # trained from scratch: written in the family that holds it
            return export_llama_from_scratch(model, tokenizer, output)
        return export_llama(model, config.checkpoints.init_from, output)  # a fine-tune: its source folder's family

    def export_adapters(self, model: Any, config: Any, output: str) -> List[str]:
        return export_llama_adapters(model, config.checkpoints.init_from, output)
