"""Hugging Face BART checkpoints in and out: lmkit's ``transformer_seq2seq`` from a ``BartForConditionalGeneration``
folder, and its fine-tunes back.

BART (Lewis et al., 2020) is a post-layer-norm transformer encoder-decoder
with learned positions, a layer norm on each side's embeddings
(``layernorm_embedding``), one token table for the encoder, the decoder and
the tied softmax, and a softmax bias (``final_logits_bias``). lmkit's
``transformer_seq2seq`` holds it with ``pre_layer_norm = False``,
``share_embeddings``, ``tie_weights``, ``embedding_norm`` and the
activation of the config (``gelu`` there is the erf form, lmkit's
``gelu_exact``). The parameters map as :func:`parameter_map` says: the
decoder's query, key and value projections become one ``qkv`` kernel, the
cross-attention's key and value one ``key_value`` kernel, and the position
tables lose BART's two offset rows.

Sources and targets are framed as BART's pretraining framed them
(:func:`framing`, which the folder's tokenizer carries): a source is ``<s> tokens </s>``; the decoder starts
from ``decoder_start_token_id`` (``</s>``) and writes ``<s> tokens </s>``.
So ``lmkit generate --model_dir <a BART folder> --source_file F`` (or
``--prompt``) decodes with every strategy of :mod:`lmkit.decoding`, as for
an encoder-decoder lmkit trained, ``lmkit evaluate`` scores it, and ``lmkit
train --init_from <folder> --source_file ... --target_file ...`` fine-tunes
it (:meth:`BartConverter.training_config`). The weights are read with the
``safetensors`` package (no PyTorch); the tokenizer with ``tokenizers``.

Uses the model's attributes ``target_embedder``, ``source_positions``,
``target_positions``, ``projection.bias``, ``source_embedding_norm``,
``target_embedding_norm``, ``vocab_size``, ``hidden_size``,
``encoder.layers[i]`` (``attention.query``, ``attention.key_value``,
``attention.output``, ``attention_norm``, ``ffn_inner``, ``ffn_outer``,
``ffn_norm``) and ``decoder.layers[i]`` (``attention.qkv``,
``attention.output``, ``attention_norm``, ``cross_attention.query``,
``cross_attention.key_value``, ``cross_attention.output``, ``cross_norm``,
``ffn_inner``, ``ffn_outer``, ``ffn_norm``); norms with ``scale`` and
``offset``, linears with ``kernel`` and ``bias``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.folders import HF_CONFIG, check_export_source, read_config_json
from lmkit.hub.safetensors import read_tensors, weight_files, write_pretrained

__all__ = ["BartConverter", "bart_model_config", "export_bart", "framing", "load_bart_weights", "parameter_map",
           "read_bart_config"]

# Hugging Face activation_function -> lmkit's activation.
_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "relu": "relu"}
# BART's learned position tables have two rows before position 0.
_POSITION_OFFSET = 2
# Where checkpoints keep the one token table (tied copies may be stored too, or not at all).
_TABLE_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight")


def read_bart_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json``, checked to be a BART that lmkit's ``transformer_seq2seq`` computes exactly.

    Raises:
      UsageError: a missing file, another model type, a missing size, or a
        setting lmkit does not compute (naming the file, the key and the value).
    """
    path, config = read_config_json(folder)
    if config.get("model_type") != "bart":
        raise UsageError(f"{path}: model_type {config.get('model_type')!r} is not 'bart' "
                         "(BartForConditionalGeneration)")
    for key in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"):
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    for first, second in (("encoder_attention_heads", "decoder_attention_heads"),
                          ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config[first] != config[second]:
            raise UsageError(f"{path}: {first} = {config[first]} and {second} = {config[second]} differ; "
                             "lmkit's transformer_seq2seq has one size for both sides")
    activation = config.get("activation_function", "gelu")
    if activation not in _ACTIVATIONS:
        raise UsageError(f"{path}: activation_function {activation!r} is not supported; lmkit computes "
                         f"{', '.join(_ACTIVATIONS)}")
    for key in ("add_final_layer_norm", "normalize_before"):  # mBART's pre-layer-norm layout, not BART's
        if config.get(key):
            raise UsageError(f"{path}: {key} = true is mBART's layout, not BART's; lmkit reads BART checkpoints")
    if config.get("tie_word_embeddings") is False:
        raise UsageError(f"{path}: tie_word_embeddings = false; lmkit's BART shares one table between the "
                         "encoder, the decoder and the softmax, as every BART release does")
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < config["vocab_size"]:
            raise UsageError(f"{path}: {key} = {value!r} must be a token id below vocab_size "
                             f"{config['vocab_size']}; BART's sources and targets are framed with it")
    return config


def bart_model_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """lmkit's ``transformer_seq2seq`` keys for a checked BART ``config.json`` (:func:`read_bart_config`)."""
    dropout = float(config.get("dropout", 0.1) or 0.0)
    return {"model": "transformer_seq2seq", "source_vocab_size": config["vocab_size"],
            "vocab_size": config["vocab_size"], "hidden_size": config["d_model"],
            "num_layers": config["encoder_layers"], "decoder_layers": config["decoder_layers"],
            "num_heads": config["encoder_attention_heads"], "ffn_dim": config["encoder_ffn_dim"],
            "max_source_positions": config["max_position_embeddings"],
            "max_positions": config["max_position_embeddings"], "dropout": dropout,
            "pre_layer_norm": False, "share_embeddings": True, "tie_weights": True,
            "init_scale": float(config.get("init_std", 0.02)),
            "activation": _ACTIVATIONS[config.get("activation_function", "gelu")], "embedding_norm": True,
            "scale_embedding": bool(config.get("scale_embedding", False))}


# (lmkit variable, the Hugging Face tensors that fill it, how it is built from them, and how they are
# taken back from it, for export)
Target = Tuple[Any, List[str], Callable[..., np.ndarray], Callable[[np.ndarray], List[np.ndarray]]]


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _linear(prefix: str, linear: Any) -> List[Target]:
    """A torch ``nn.Linear`` [out, in] (and bias) onto an lmkit ``Linear`` [in, out]."""
    return [(linear.kernel, [prefix + ".weight"], lambda w: w.T, lambda k: [k.T]),
            (linear.bias, [prefix + ".bias"], _same, lambda b: [b])]


def _fused(prefix: str, names: Sequence[str], linear: Any) -> List[Target]:
    """Several torch projections side by side in one lmkit kernel (queries, keys, values in that order)."""
    parts = len(names)
    return [(linear.kernel, [f"{prefix}.{n}.weight" for n in names],
             lambda *ws: np.concatenate([w.T for w in ws], 1), lambda k: [w.T for w in np.split(k, parts, 1)]),
            (linear.bias, [f"{prefix}.{n}.bias" for n in names], lambda *bs: np.concatenate(bs),
             lambda b: np.split(b, parts))]


def _norm(prefix: str, norm: Any) -> List[Target]:
    return [(norm.scale, [prefix + ".weight"], _same, lambda w: [w]),
            (norm.offset, [prefix + ".bias"], _same, lambda b: [b])]


def _positions(name: str, table: Any) -> Target:
    """BART's rows 0-1 come before position 0: never read (exported as zeros)."""
    return (table.embeddings, [name], lambda w: w[_POSITION_OFFSET:],
            lambda t: [np.concatenate([np.zeros([_POSITION_OFFSET, t.shape[1]], t.dtype), t])])


def parameter_map(model: Any) -> List[Target]:
    """Every lmkit variable with the Hugging Face tensors that fill it, how, and how they come back. The
    token table is ``model.shared.weight``, read from whichever copy a checkpoint stores (:data:`_TABLE_NAMES`)."""
    targets: List[Target] = [
        (model.target_embedder.embeddings, ["model.shared.weight"], _same, lambda t: [t]),
        _positions("model.encoder.embed_positions.weight", model.source_positions),
        _positions("model.decoder.embed_positions.weight", model.target_positions),
        (model.projection.bias, ["final_logits_bias"], lambda b: b.reshape(-1), lambda b: [b[np.newaxis]]),
        *_norm("model.encoder.layernorm_embedding", model.source_embedding_norm),
        *_norm("model.decoder.layernorm_embedding", model.target_embedding_norm)]
    for i, layer in enumerate(model.encoder.layers):
        prefix = f"model.encoder.layers.{i}"
        targets += [*_linear(f"{prefix}.self_attn.q_proj", layer.attention.query),
                    *_fused(f"{prefix}.self_attn", ("k_proj", "v_proj"), layer.attention.key_value),
                    *_linear(f"{prefix}.self_attn.out_proj", layer.attention.output),
                    *_norm(f"{prefix}.self_attn_layer_norm", layer.attention_norm),
                    *_linear(f"{prefix}.fc1", layer.ffn_inner), *_linear(f"{prefix}.fc2", layer.ffn_outer),
                    *_norm(f"{prefix}.final_layer_norm", layer.ffn_norm)]
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"model.decoder.layers.{i}"
        targets += [*_fused(f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj"), layer.attention.qkv),
                    *_linear(f"{prefix}.self_attn.out_proj", layer.attention.output),
                    *_norm(f"{prefix}.self_attn_layer_norm", layer.attention_norm),
                    *_linear(f"{prefix}.encoder_attn.q_proj", layer.cross_attention.query),
                    *_fused(f"{prefix}.encoder_attn", ("k_proj", "v_proj"), layer.cross_attention.key_value),
                    *_linear(f"{prefix}.encoder_attn.out_proj", layer.cross_attention.output),
                    *_norm(f"{prefix}.encoder_attn_layer_norm", layer.cross_norm),
                    *_linear(f"{prefix}.fc1", layer.ffn_inner), *_linear(f"{prefix}.fc2", layer.ffn_outer),
                    *_norm(f"{prefix}.final_layer_norm", layer.ffn_norm)]
    return targets


def load_bart_weights(model: Any, folder: str) -> List[str]:
    """Fills ``model`` (a ``transformer_seq2seq`` of the folder's sizes, :func:`bart_model_config`)
    from the folder's checkpoint.

    Every value is built and its shape checked before any is assigned, so a
    mismatch leaves the model as it was. A checkpoint without
    ``final_logits_bias`` (transformers does not require it) gets zeros, as
    transformers gives it.

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the folder and the tensor).
    """
    files = weight_files(folder, "AutoModelForSeq2SeqLM")
    tensors: Dict[str, np.ndarray] = {}
    for path in files:
        tensors.update(read_tensors(path))
    targets = parameter_map(model)
    config_path = os.path.join(folder, HF_CONFIG)
    known = set(_TABLE_NAMES) | {n for _, hf_names, _, _ in targets for n in hf_names}
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        raise UsageError(f"{folder} holds {unexpected[0]} ({len(unexpected)} tensors lmkit's BART has no use "
                         f"for); is {config_path} the config of these weights?")
    if "final_logits_bias" not in tensors:
        tensors["final_logits_bias"] = np.zeros([1, model.vocab_size], np.float32)
    table = next((tensors[n] for n in _TABLE_NAMES if n in tensors), None)
    if table is None:
        raise UsageError(f"{folder} lacks the token table (model.shared.weight); the checkpoint is incomplete")
    tensors["model.shared.weight"] = table
    values = []
    for variable, hf_names, build, _ in targets:
        missing = [n for n in hf_names if n not in tensors]
        if missing:
            raise UsageError(f"{folder} lacks {missing[0]}; the checkpoint is incomplete or of another model")
        arrays = [tensors[n] for n in hf_names]
        try:
            value = build(*arrays)
        except ValueError:  # fused projections whose sizes do not fit together
            value = None
        if value is None or list(value.shape) != list(variable.shape):
            given = ", ".join(f"{n} of shape {list(a.shape)}" for n, a in zip(hf_names, arrays))
            raise UsageError(f"{folder}: {given} cannot fill {variable.name} {list(variable.shape)} of the model "
                             f"{config_path} describes; the weights and the config come from different models")
        values.append((variable, value))
    for variable, value in values:
        variable.assign(value)
    return files


def framing(config: Dict[str, Any]) -> Dict[str, Any]:
    """BART's framing of texts (:class:`lmkit.hub.tokenizer.HFTokenizer`'s ``framing``): the
    decoder starts from ``decoder_start_token_id`` and ends at ``eos_token_id``; every text begins with
    ``<s>`` (``bos_token_id``), and a source ends with ``</s>``."""
    start = config.get("bos_token_id")
    return {"bos": config["decoder_start_token_id"], "eos": config["eos_token_id"], "pad": config["pad_token_id"],
            "prefix": [] if start is None else [start], "suffix": [], "source_suffix": [config["eos_token_id"]]}


def export_bart(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a run fine-tuned from a BART folder as a folder ``transformers`` loads
    (``BartForConditionalGeneration``): the weights are the model's (:func:`parameter_map` backwards),
    the config and tokenizer files the ``source`` folder's (the run's ``init_from``).

    Raises:
      UsageError: a run not started from a BART folder, a source folder that is
        gone or does not describe the model, or an ``output`` that exists and is not empty.
    """
    check_export_source(source, "transformer_seq2seq", output)
    config = read_bart_config(source)
    if (config["encoder_layers"], config["decoder_layers"], config["d_model"]) != (
            model.encoder.num_layers, model.decoder.num_layers, model.hidden_size):
        raise UsageError(f"{source} does not describe this run's model (other layers or sizes)")
    tensors: Dict[str, np.ndarray] = {}
    for variable, names, _, unbuild in parameter_map(model):
        tensors.update(zip(names, unbuild(variable.numpy())))
    return write_pretrained(tensors, source, output)


class BartConverter(Converter):
    """BART folders (``BartForConditionalGeneration``) onto lmkit's ``transformer_seq2seq``, and fine-tunes back.

    An encoder-decoder: it fine-tunes on pairs, with the folder's tokenizer for both sides framed as BART
    frames texts (:func:`framing`).
    """

    title = "BART"
    conditional = True
    train_settings = {"share_vocab": True}

    def read_config(self, folder: str) -> Dict[str, Any]:
        return read_bart_config(folder)

    def model_config(self, config: Dict[str, Any], folder: str) -> Dict[str, Any]:
        return bart_model_config(config)

    def load_weights(self, model: Any, folder: str) -> List[str]:
        return load_bart_weights(model, folder)

    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        return export_bart(model, config.checkpoints.init_from, output)

    def framing(self, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        return framing(config)
