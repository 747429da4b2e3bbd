"""Hugging Face GPT-2 checkpoints in and out: lmkit's ``gpt2`` model from a folder, and back.

A Hugging Face GPT-2 folder holds ``config.json`` (``model_type: gpt2``),
the weights (``model.safetensors``, or ``pytorch_model.bin``) and the
tokenizer (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``), as
``save_pretrained`` writes them. lmkit reads the weights with the
``safetensors`` package's NumPy API (no PyTorch; a folder with only
``pytorch_model.bin`` needs PyTorch installed) and the tokenizer with the
``tokenizers`` package (:class:`lmkit.hub.tokenizer.HFTokenizer`).

The model is lmkit's transformer in GPT-2's shape (``MODELS["gpt2"]``): the
sizes come from the folder's ``config.json`` (``n_layer``, ``n_head``,
``n_embd``, ``n_positions``, ``n_inner``, ``vocab_size``,
``layer_norm_epsilon``), so distilgpt2 through gpt2-xl load alike. The
parameters map one to one (:func:`parameter_map`; ``docs/gpt2.md`` has the
table): GPT-2's ``Conv1D`` weights are stored [in, out], as lmkit's kernels.

Uses the model's attributes ``embedder``, ``position_embedder``,
``decoder.final_norm``, ``decoder.layers[i]`` (``attention_norm``,
``attention.qkv``, ``attention.output``, ``ffn_norm``, ``ffn_inner``,
``ffn_outer``), ``is_gpt2`` and the sizes ``get_config`` reports.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.folders import HF_CONFIG, check_new_folder, read_config_json
from lmkit.hub.safetensors import read_state_dict, write_new

__all__ = ["GPT2Converter", "default_dropout", "export_gpt2", "gpt2_model_config", "load_gpt2_weights",
           "parameter_map", "read_gpt2_config", "read_weights"]

# GPT-2 activations that are the tanh approximation of GELU (lmkit's "gelu").
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Buffers some checkpoints carry that are not parameters (the causal mask).
_BUFFERS = (".attn.bias", ".attn.masked_bias")


def read_gpt2_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json``, checked to be a GPT-2 that lmkit's ``gpt2`` model can hold.

    Raises:
      UsageError: no config, another model type, a missing size or an
        activation other than GELU's tanh approximation (naming the file).
    """
    path, config = read_config_json(folder)
    model_type = config.get("model_type")
    if model_type != "gpt2":
        raise UsageError(f"{path}: model_type {model_type!r} is not 'gpt2'; lmkit loads GPT-2 checkpoints "
                         "(gpt2, distilgpt2, gpt2-medium/large/xl and fine-tunes of them)")
    for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GELU_TANH:
        raise UsageError(f"{path}: activation_function {activation!r} is not GPT-2's gelu_new; lmkit's gpt2 "
                         f"computes {', '.join(_GELU_TANH)}")
    if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
        raise UsageError(f"{path}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not "
                         "supported (GPT-2 checkpoints leave them off)")
    return config


def gpt2_model_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """``lmkit.models.build_model`` keys of the GPT-2 that ``config`` (a ``config.json``) describes."""
    dropout = float(config.get("resid_pdrop", 0.1))
    return {"model": "gpt2", "vocab_size": config["vocab_size"], "hidden_size": config["n_embd"],
            "num_layers": config["n_layer"], "num_heads": config["n_head"],
            "max_positions": config["n_positions"], "ffn_dim": config.get("n_inner") or 0,
            "dropout": dropout, "init_scale": float(config.get("initializer_range", 0.02)),
            "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-5))}


def read_weights(folder: str) -> Tuple[Dict[str, Any], str]:
    """The folder's tensors as NumPy arrays (names without a ``transformer.`` prefix), and the file read.

    Raises:
      UsageError: no weights file, or only ``pytorch_model.bin`` without PyTorch.
    """
    tensors, path = read_state_dict(folder, "GPT2LMHeadModel")
    out = {}
    for name, value in tensors.items():
        if name.endswith(_BUFFERS) or name == "lm_head.weight":  # a mask buffer; the tied softmax
            continue
        out[name[len("transformer."):] if name.startswith("transformer.") else name] = value
    return out, path


def parameter_map(model: Any) -> Dict[str, Any]:
    """Hugging Face parameter name -> lmkit variable, for a ``gpt2`` model."""
    decoder = model.decoder
    names: Dict[str, Any] = {"wte.weight": model.embedder.embeddings,
                             "wpe.weight": model.position_embedder.embeddings,
                             "ln_f.weight": decoder.final_norm.scale, "ln_f.bias": decoder.final_norm.offset}
    for i, layer in enumerate(decoder.layers):
        pairs = {"ln_1": (layer.attention_norm.scale, layer.attention_norm.offset),
                 "attn.c_attn": (layer.attention.qkv.kernel, layer.attention.qkv.bias),
                 "attn.c_proj": (layer.attention.output.kernel, layer.attention.output.bias),
                 "ln_2": (layer.ffn_norm.scale, layer.ffn_norm.offset),
                 "mlp.c_fc": (layer.ffn_inner.kernel, layer.ffn_inner.bias),
                 "mlp.c_proj": (layer.ffn_outer.kernel, layer.ffn_outer.bias)}
        for hf_name, (weight, bias) in pairs.items():
            names[f"h.{i}.{hf_name}.weight"] = weight
            names[f"h.{i}.{hf_name}.bias"] = bias
    return names


def _check_gpt2(model: Any, what: str) -> None:
    if not getattr(model, "is_gpt2", False):
        raise UsageError(f"{what} needs a model of GPT-2's shape (model = 'gpt2': tied softmax without bias, "
                         f"learned positions, pre-layer-norm, GELU); this one is {type(model).__name__} with "
                         f"model = {model.get_config().get('model')!r}")


def load_gpt2_weights(model: Any, folder: str) -> str:
    """Assigns the folder's weights to ``model`` (a ``gpt2`` model of the same sizes).

    Returns:
      The weights file read.

    Raises:
      UsageError: a missing or unexpected tensor, or a shape that differs
        from the model's (naming the file, the tensor and both shapes).
    """
    _check_gpt2(model, "loading a GPT-2 checkpoint")
    weights, path = read_weights(folder)
    targets = parameter_map(model)
    missing = [name for name in targets if name not in weights]
    if missing:
        raise UsageError(f"{path} lacks {missing[0]} ({len(missing)} of GPT-2's tensors missing); it is not "
                         f"the checkpoint of the GPT-2 that {os.path.join(folder, HF_CONFIG)} describes")
    unexpected = sorted(set(weights) - set(targets))
    if unexpected:
        raise UsageError(f"{path} holds {unexpected[0]}, which GPT-2 has no use for ({len(unexpected)} "
                         "unexpected tensors); is it the checkpoint of another architecture?")
    for name, variable in targets.items():
        if tuple(weights[name].shape) != tuple(variable.shape):
            raise UsageError(f"{path}: {name} has shape {list(weights[name].shape)} but "
                             f"{os.path.join(folder, HF_CONFIG)} gives {list(variable.shape)}; the weights "
                             "and the config come from different models")
    for name, variable in targets.items():
        variable.assign(weights[name])
    return path


def export_gpt2(model: Any, tokenizer: Any, output: str, dropout: float = 0.1) -> List[str]:
    """Writes ``model`` and ``tokenizer`` as a folder ``transformers.GPT2LMHeadModel.from_pretrained`` loads.

    Files: ``config.json``, ``model.safetensors`` (float32, ``transformer.``
    names; the softmax is tied to ``wte``), ``generation_config.json`` and
    the tokenizer's files. Written into a temporary folder next to
    ``output`` and renamed into place, so a failed export leaves nothing.

    The tokenizer is a Hugging Face one (a fine-tune's, or ``--tokenizer hf:...`` from scratch), or lmkit's own
    word, char, byte or unigram sentencepiece tokenizer (a model trained from scratch), written as
    a ``tokenizer.json`` that encodes every text to lmkit's ids
    (:mod:`lmkit.data.hf_form`); such a model starts a text after a line
    break (``bos_token_id`` is the line break's id, which ``tokenizer(text)``
    puts first) and has no end of document (``eos_token_id`` null).

    Returns:
      The names of the files written.

    Raises:
      UsageError: not a GPT-2-shaped model, a tokenizer without a Hugging
        Face form (BPE SentencePiece), or an ``output`` that exists and is not empty.
    """
    _check_gpt2(model, "export --format hf")
    # A Hugging Face tokenizer's (GPT-2's, a fine-tune's or a model's trained from scratch with it): a document
    # starts and ends at <|endoftext|>; lmkit's own: a line starts after a line break, no end of document (a kind
    # without a form stops here).
    ids = tokenizer.model_token_ids()
    check_new_folder(output)
    tensors = {f"transformer.{name}": v.numpy() for name, v in parameter_map(model).items()}
    return write_new(tensors, config_json(model, dropout, ids), ids, tokenizer, model.max_positions, output)


def config_json(model: Any, dropout: float, ids: Dict[str, Any]) -> Dict[str, Any]:
    """The ``config.json`` of a ``gpt2`` model (``ids``: its start and end ids; ``dropout``: the run's)."""
    layer = model.decoder.layers[0]
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": model.vocab_size,
        "n_positions": model.max_positions, "n_embd": model.hidden_size, "n_layer": model.decoder.num_layers,
        "n_head": model.decoder.num_heads,
        "n_inner": None if model.decoder.ffn_dim == 4 * model.hidden_size else model.decoder.ffn_dim,
        "activation_function": "gelu_new", "resid_pdrop": dropout, "embd_pdrop": dropout,
        "attn_pdrop": dropout if getattr(model, "attention_dropout", None) is None else model.attention_dropout,
        "layer_norm_epsilon": layer.attention_norm.epsilon, "initializer_range": model.init_scale,
        "tie_word_embeddings": True, "use_cache": True, **ids}


def default_dropout(config: Optional[Any]) -> float:
    """The dropout an exported config.json states: the run's, or GPT-2's 0.1."""
    return 0.1 if config is None else float(config.model["dropout"])


class GPT2Converter(Converter):
    """GPT-2 folders (``model_type: gpt2``) onto lmkit's ``gpt2`` model, and ``gpt2`` runs back."""

    title = "GPT-2"
    positions_key = "n_positions"
    # the architecture the name "gpt2" fixes, stated in the run's config too
    train_settings = {"tie_weights": True, "pre_layer_norm": True}

    def read_config(self, folder: str) -> Dict[str, Any]:
        return read_gpt2_config(folder)

    def model_config(self, config: Dict[str, Any], folder: str) -> Dict[str, Any]:
        return gpt2_model_config(config)

    def load_weights(self, model: Any, folder: str) -> str:
        return load_gpt2_weights(model, folder)

    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        return export_gpt2(model, tokenizer, output, dropout=default_dropout(config))
