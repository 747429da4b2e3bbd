"""Hugging Face Gemma checkpoints (``GemmaForCausalLM``) onto lmkit's ``gemma`` model, and back.

A Gemma folder holds Llama's tensors under Llama's names, so the weights
go through the Llama family's map (:func:`lmkit.models.llama.convert.parameter_map`)
and the hub's shared loader. One thing differs: Gemma's RMSNorm multiplies
by ``1 + weight`` where lmkit's multiplies by ``scale``, so a norm's
``weight`` loads as ``scale = 1 + weight`` and exports as ``scale - 1``
(both in float32, as Gemma computes ``1 + weight``; for scales in [0.5, 2]
the export gives transformers back lmkit's scale exactly).

The config: Gemma's ``config.json`` is Llama's with other defaults (a tied
softmax, ``head_dim`` 256), a GeGLU gate (``hidden_act`` or, in older
folders, ``hidden_activation``) and one ``attention_bias``; the embeddings'
``sqrt(hidden_size)`` is not in it (the model's default).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.folders import HF_CONFIG, check_export_source, check_new_folder, read_config_json
from lmkit.hub.safetensors import load_mapped, write_new, write_pretrained
from lmkit.models.llama.convert import export_llama_adapters, llama_model_config, parameter_map

__all__ = ["ARCHITECTURE", "GemmaConverter", "config_json", "export_gemma", "export_gemma_from_scratch",
           "gemma_model_config", "gemma_tensors", "load_gemma_weights", "norm_names", "read_gemma_config"]

ARCHITECTURE = "GemmaForCausalLM"
#: transformers' GemmaConfig defaults for the keys a config.json may leave out (Llama's differ)
DEFAULTS: Dict[str, Any] = {"head_dim": 256, "num_key_value_heads": 16, "max_position_embeddings": 8192,
                            "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}
#: Hugging Face gate activations -> lmkit's (``gelu`` is the tanh form in both)
_GATES = {"gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "silu": "silu"}
_HF_GATES = {"gelu": "gelu_pytorch_tanh", "silu": "silu"}
#: the ``llama`` keys a Gemma does not take (no sliding window; one attention_bias for both)
_LLAMA_ONLY = ("sliding_window", "layer_types", "qkv_bias", "attention_output_bias")


def _gate(config: Dict[str, Any], path: str) -> str:
    """lmkit's gate activation of a Gemma ``config.json`` (its ``hidden_act``).

    Gemma's first folders wrote ``hidden_act = "gelu"`` meaning the tanh form, and transformers computes
    that; they may add ``hidden_activation``, which transformers 4 reads instead (transformers 5 ignores
    it), so it must name the same gate.
    """
    act = config.get("hidden_act")
    gates = {**_GATES, "gelu": "gelu"}
    if act not in gates:
        raise UsageError(f"{path}: hidden_act {act!r} is not supported (lmkit's gemma gates its feed-forward "
                         f"with {', '.join(sorted(gates))})")
    other = config.get("hidden_activation")
    if other is not None and _GATES.get(other) != gates[act]:
        raise UsageError(f"{path}: hidden_activation {other!r} is not the gate of hidden_act {act!r}, and "
                         "transformers 4 reads the one, 5 the other; make them agree (e.g. both "
                         "'gelu_pytorch_tanh')")
    return gates[act]


def read_gemma_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json`` (transformers' defaults filled in), checked to be a Gemma lmkit computes.

    Raises:
      UsageError: a missing file, another model type, a missing size, or a
        setting lmkit does not compute (naming the file, the key and the value).
    """
    path, config = read_config_json(folder)
    if config.get("model_type") != "gemma":
        raise UsageError(f"{path}: model_type {config.get('model_type')!r} is not gemma ({ARCHITECTURE})")
    config = {**DEFAULTS, **config}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    _gate(config, path)
    if config.get("use_bidirectional_attention"):
        raise UsageError(f"{path}: use_bidirectional_attention = true is not supported (lmkit's gemma is a "
                         "causal language model)")
    scaling = llama_model_config(config, path)["rope_scaling"]  # checks rope_theta too
    if scaling is not None and scaling["rope_type"] not in ("linear", "llama3"):
        raise UsageError(f"{path}: rope type {scaling['rope_type']!r} is not supported; lmkit computes "
                         "default, linear and llama3")
    return config


def gemma_model_config(config: Dict[str, Any], path: str = HF_CONFIG) -> Dict[str, Any]:
    """``lmkit.models.build_model`` keys of the model ``config`` (a checked ``config.json``) describes."""
    config = {**DEFAULTS, **config}
    keys = {k: v for k, v in llama_model_config(config, path).items() if k not in _LLAMA_ONLY}
    keys.update(model="gemma", attention_bias=bool(config.get("attention_bias", False)),
                tie_weights=bool(config["tie_word_embeddings"]), activation=_gate(config, path))
    return keys


def norm_names(model: Any) -> List[str]:
    """The Hugging Face names of the model's RMSNorm weights (``1 + weight`` in Gemma, ``scale`` in lmkit)."""
    return [name for name in parameter_map(model) if name.endswith("norm.weight")]


def load_gemma_weights(model: Any, folder: str) -> List[str]:
    """Fills ``model`` (a ``gemma`` model of the folder's sizes) from the folder's checkpoint.

    Every tensor's name and shape is checked before any is assigned, so a
    mismatch leaves the model as it was.

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the file,
        the tensor and both shapes).
    """
    names = parameter_map(model)
    # a tied checkpoint may store the shared table twice
    files = load_mapped(folder, names, "lmkit's gemma", ("lm_head.weight",) if model.tie_weights else ())
    for name in norm_names(model):
        scale = names[name][0]
        scale.assign(scale + 1.0)  # Gemma's weight w scales by 1 + w (float32, as Gemma adds)
    return files


def gemma_tensors(model: Any) -> Dict[str, Any]:
    """The model's weights under their Hugging Face names, in Hugging Face's layouts (norms as ``scale - 1``)."""
    tensors = {name: v.numpy().T if transposed else v.numpy()
               for name, (v, transposed) in parameter_map(model).items()}
    for name in norm_names(model):
        tensors[name] = tensors[name] - 1.0  # float32: exact for scales in [0.5, 2]
    return tensors


def export_gemma(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a fine-tuned ``gemma`` run as a folder ``transformers`` loads (``GemmaForCausalLM``).

    The config, tokenizer and chat template are the ``source`` folder's (the
    run's ``init_from``); the weights are the model's (float32). Written aside
    and renamed into place.

    Raises:
      UsageError: a run not started from a Hugging Face folder, a source
        folder that is gone or does not fit the model, or an ``output``
        that exists and is not empty.
    """
    check_export_source(source, "gemma", output)
    if gemma_model_config(read_gemma_config(source))["num_layers"] != model.decoder.num_layers:
        raise UsageError(f"{source} does not describe this run's model (another number of layers)")
    return write_pretrained(gemma_tensors(model), source, output)


def config_json(model_config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``config.json`` of a ``gemma`` model trained from scratch (``model.get_config()``): the inverse of
    :func:`gemma_model_config`.

    Raises:
      UsageError: an ``embedding_scale`` other than ``sqrt(hidden_size)``, which Gemma does not store.
    """
    c = model_config
    heads, hidden = c["num_heads"], c["hidden_size"]
    if c.get("embedding_scale", math.sqrt(hidden)) != math.sqrt(hidden):
        raise UsageError(f"embedding_scale = {c['embedding_scale']!r}: a Gemma folder multiplies the embeddings "
                         f"by sqrt(hidden_size) = {math.sqrt(hidden):g}; train without embedding_scale")
    activation = _HF_GATES[c.get("activation", "gelu")]
    return {
        "model_type": "gemma", "architectures": [ARCHITECTURE], "vocab_size": c["vocab_size"],
        "hidden_size": hidden, "intermediate_size": c["ffn_dim"], "num_hidden_layers": c["num_layers"],
        "num_attention_heads": heads, "num_key_value_heads": c.get("num_kv_heads") or heads,
        "head_dim": c.get("head_dim") or hidden // heads, "max_position_embeddings": c["max_positions"],
        "rms_norm_eps": c["rms_norm_epsilon"], "rope_theta": c["rope_theta"], "rope_scaling": c.get("rope_scaling"),
        "tie_word_embeddings": bool(c["tie_weights"]), "hidden_act": activation, "hidden_activation": activation,
        "attention_bias": bool(c.get("attention_bias")), "attention_dropout": c.get("dropout", 0.0),
        "initializer_range": c.get("init_scale", 0.02), "torch_dtype": "float32", "dtype": "float32"}


def export_gemma_from_scratch(model: Any, tokenizer: Any, output: str) -> List[str]:
    """Writes a ``gemma`` model trained from scratch, with lmkit's own tokenizer, as a folder ``transformers``
    loads (``AutoModelForCausalLM``, ``AutoTokenizer``): its :func:`config_json`, its weights (float32) and
    the tokenizer's Hugging Face form. As with a Llama trained from scratch, a text starts after a line break
    (``bos_token_id``) and none ends a document (``eos_token_id`` null).

    Raises:
      UsageError: a model Gemma cannot hold, a tokenizer without a form, or an ``output`` that exists and is
        not empty; nothing is written then.
    """
    config = config_json(model.get_config())
    ids = tokenizer.model_token_ids()  # a tokenizer without a form stops here
    check_new_folder(output)
    config.update({"pad_token_id": None, **ids})  # not Gemma's default 0: the tokenizer's, or none
    return write_new(gemma_tensors(model), config, ids, tokenizer, model.max_positions, output)


class GemmaConverter(Converter):
    """Gemma folders onto lmkit's ``gemma`` model, and ``gemma`` runs back."""

    title = "Gemma"
    exports_adapters = True

    def read_config(self, folder: str) -> Dict[str, Any]:
        return read_gemma_config(folder)

    def model_config(self, config: Dict[str, Any], folder: str) -> Dict[str, Any]:
        return gemma_model_config(config, os.path.join(folder, HF_CONFIG))

    def load_weights(self, model: Any, folder: str) -> List[str]:
        return load_gemma_weights(model, folder)

    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        if not config.checkpoints.init_from:  # trained from scratch: the config written from the model's keys
            return export_gemma_from_scratch(model, tokenizer, output)
        return export_gemma(model, config.checkpoints.init_from, output)  # a fine-tune: its source folder's config

    def export_adapters(self, model: Any, config: Any, output: str) -> List[str]:
        # PEFT names a Gemma's projections as a Llama's (q_proj, v_proj, ...), and LoRA leaves the norms be
        return export_llama_adapters(model, config.checkpoints.init_from, output)
