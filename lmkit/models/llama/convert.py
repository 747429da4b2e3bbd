"""Hugging Face Llama, Qwen2 and Mistral folders onto lmkit's ``llama`` model, and ``llama`` runs back.

The three differ by settings: Qwen2's biases on the query, key and value
projections and its sliding window on the layers it names, Mistral's window
on every layer. The weights are Hugging Face's ``nn.Linear`` s [out, in],
transposed into lmkit's [in, out] kernels; a tied checkpoint may store the
token table a second time as ``lm_head.weight``. A model trained from
scratch is written in the family that holds it (:func:`family_of`).

Gemma's folders (``lmkit.models.gemma.convert``) keep these tensor names and
most of these keys: :meth:`LlamaConverter.decoder_in`, :meth:`~LlamaConverter.decoder_out`
and :meth:`~LlamaConverter.weights` serve both.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.mapping import renamed, renamed_back, rope_in, rope_out
from lmkit.hub.weights import Port, linear, same, transposed

__all__ = ["ARCHITECTURES", "LlamaConverter", "family_of"]

#: model_type -> the transformers class whose checkpoints load here
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# (config.json key, lmkit argument) pairs that only change their name.
_KEYS = (("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("intermediate_size", "ffn_dim"),
         ("num_hidden_layers", "num_layers"), ("num_attention_heads", "num_heads"),
         ("max_position_embeddings", "max_positions"), ("rms_norm_eps", "rms_norm_epsilon"),
         ("tie_word_embeddings", "tie_weights"))


def _windows(config: Dict[str, Any]) -> Dict[str, Any]:
    """``sliding_window`` and ``layer_types``: Mistral's window on every layer, Qwen2's on the layers it names."""
    if config["model_type"] == "mistral":
        return {"sliding_window": config.get("sliding_window") or 0, "layer_types": None}
    if config["model_type"] == "qwen2" and config.get("use_sliding_window"):
        layer_types = config.get("layer_types")
        if layer_types is None:  # transformers < 5: layers from max_window_layers on slide
            first = config.get("max_window_layers", config["num_hidden_layers"])
            layer_types = ["full_attention" if i < first else "sliding_attention"
                           for i in range(config["num_hidden_layers"])]
        return {"sliding_window": config.get("sliding_window") or 0, "layer_types": layer_types}
    return {"sliding_window": 0, "layer_types": None}


def family_of(arguments: Dict[str, Any]) -> str:
    """The ``model_type`` whose folder holds a ``llama`` model trained from scratch (its ``arguments``).

    Raises:
      UsageError: a model no family holds (naming its settings).
    """
    window, types = arguments.get("sliding_window") or 0, arguments.get("layer_types")
    bias = bool(arguments.get("qkv_bias")) or bool(arguments.get("attention_output_bias"))
    if arguments.get("activation", "silu") != "silu":
        raise UsageError(f"activation = {arguments['activation']!r}: Llama and Mistral compute SwiGLU with silu")
    if not window:
        return "llama"
    if types is None and not bias:
        return "mistral"
    raise UsageError(f"this model cannot be written as a Hugging Face folder (sliding_window {window}, "
                     f"layer_types {types}, attention biases {bias}): Llama has no window, Mistral's every "
                     "layer slides and it has no biases, and transformers reads a Qwen2 folder (per-layer "
                     "windows) with its own tokenizer; train with sliding_window = 0, or on every layer "
                     "without biases")


class LlamaConverter(Converter):
    """Llama, Qwen2 and Mistral folders onto lmkit's ``llama`` model, and ``llama`` runs back."""

    title = "Llama/Qwen2/Mistral"
    model = "llama"
    architectures = ARCHITECTURES
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    defaults = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
    exports_adapters = True

    def decoder_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        """The arguments of the decoder every family of these folders shares (sizes, heads, rotary positions,
        norms, the tied softmax, dropout)."""
        theta, scaling = rope_in(config, path)
        heads, hidden = config["num_attention_heads"], config["hidden_size"]
        head_dim = config.get("head_dim") or hidden // heads
        arguments = renamed(config, _KEYS)
        arguments.update(num_kv_heads=config.get("num_key_value_heads") or heads, rope_theta=theta,
                         head_dim=head_dim if head_dim != hidden // heads else 0, rope_scaling=scaling,
                         tie_weights=bool(config["tie_word_embeddings"]),
                         rms_norm_epsilon=float(config["rms_norm_eps"]),
                         dropout=float(config.get("attention_dropout", 0.0) or 0.0),
                         init_scale=float(config.get("initializer_range", 0.02)))
        return arguments

    def decoder_out(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`decoder_in`'s inverse."""
        heads, hidden = arguments["num_heads"], arguments["hidden_size"]
        return {**renamed_back(arguments, _KEYS), "num_key_value_heads": arguments.get("num_kv_heads") or heads,
                "head_dim": arguments.get("head_dim") or hidden // heads,
                **rope_out(arguments["rope_theta"], arguments.get("rope_scaling")),
                "tie_word_embeddings": bool(arguments["tie_weights"]),
                "attention_dropout": arguments.get("dropout", 0.0),
                "initializer_range": arguments.get("init_scale", 0.02)}

    def config_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        if config.get("hidden_act", "silu") != "silu":
            raise UsageError(f"{path}: hidden_act {config.get('hidden_act')!r} is not supported (lmkit's llama "
                             "gates its feed-forward with silu)")
        if config.get("mlp_bias"):
            raise UsageError(f"{path}: mlp_bias = true is not supported (no Llama, Qwen2 or Mistral release uses it)")
        attention_bias = bool(config.get("attention_bias", False))
        return {**self.decoder_in(config, path), **_windows(config),
                "qkv_bias": config["model_type"] == "qwen2" or attention_bias,
                "attention_output_bias": attention_bias, "activation": "silu"}

    def config_out(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        """Llama without a sliding window (``attention_bias`` when any attention projection has a bias: the
        others get zero biases, :meth:`extra_tensors`), Mistral when every layer slides and no projection
        has a bias. Qwen2's per-layer windows are not written: ``transformers`` reads a Qwen2 folder with
        its own tokenizer class, whatever ``tokenizer.json`` says."""
        model_type = family_of(arguments)
        config = {"model_type": model_type, **self.decoder_out(arguments), "hidden_act": "silu"}
        if model_type == "llama":
            config.update(attention_bias=bool(arguments.get("qkv_bias"))
                          or bool(arguments.get("attention_output_bias")), mlp_bias=False)
        else:
            config["sliding_window"] = arguments.get("sliding_window") or 0
        return config

    def extra_tensors(self, tensors: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
        if not config.get("attention_bias"):
            return {}
        return {name[:-len("weight")] + "bias": np.zeros(value.shape[0], np.float32) for name, value in tensors.items()
                if ".self_attn." in name and name.endswith("_proj.weight")
                and name[:-len("weight")] + "bias" not in tensors}

    def weights(self, model: Any) -> List[Port]:
        decoder = model.decoder
        ports = [same("model.embed_tokens.weight", model.embedder.embeddings),
                 same("model.norm.weight", decoder.final_norm.scale)]
        if not model.tie_weights:
            ports.append(transposed("lm_head.weight", model.projection.kernel))
        for i, layer in enumerate(decoder.layers):
            prefix = f"model.layers.{i}."
            attention, ffn = layer.attention, layer.ffn
            ports += [same(prefix + "input_layernorm.weight", layer.attention_norm.scale),
                      same(prefix + "post_attention_layernorm.weight", layer.ffn_norm.scale)]
            for name, projection in (("q_proj", attention.query), ("k_proj", attention.key),
                                     ("v_proj", attention.value), ("o_proj", attention.output)):
                ports += linear(f"{prefix}self_attn.{name}", projection)
            for name, projection in (("gate_proj", ffn.gate), ("up_proj", ffn.up), ("down_proj", ffn.down)):
                ports += linear(f"{prefix}mlp.{name}", projection)
        return ports

    def stored_names(self, name: str) -> Sequence[str]:
        # a tied checkpoint may store the token table twice (lm_head.weight is the softmax's own where untied)
        return (name, "lm_head.weight") if name == "model.embed_tokens.weight" else (name,)
