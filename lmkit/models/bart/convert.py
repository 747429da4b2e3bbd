"""Hugging Face BART checkpoints in and out: lmkit's ``transformer_seq2seq`` from a ``BartForConditionalGeneration``
folder, and its fine-tunes back.

BART (Lewis et al., 2020) is a post-layer-norm transformer encoder-decoder
with learned positions, a layer norm on each side's embeddings
(``layernorm_embedding``), one token table for the encoder, the decoder and
the tied softmax, and a softmax bias (``final_logits_bias``). lmkit's
``transformer_seq2seq`` holds it with ``pre_layer_norm = False``,
``share_embeddings``, ``tie_weights``, ``embedding_norm`` and the
activation of the config (``gelu`` there is the erf form, lmkit's
``gelu_exact``). The parameters map as :meth:`BartConverter.weights` says: the
decoder's query, key and value projections become one ``qkv`` kernel, the
cross-attention's key and value one ``key_value`` kernel, the position
tables lose BART's two offset rows, and the one token table may be stored
under any of four names.

Sources and targets are framed as BART's pretraining framed them
(:meth:`BartConverter.framing`, which the folder's tokenizer carries): a
source is ``<s> tokens </s>``; the decoder starts from
``decoder_start_token_id`` (``</s>``) and writes ``<s> tokens </s>``.
So ``lmkit generate --model_dir <a BART folder> --source_file F`` (or
``--prompt``) decodes with every strategy of :mod:`lmkit.decoding`, as for
an encoder-decoder lmkit trained, ``lmkit evaluate`` scores it, and ``lmkit
train --init_from <folder> --source_file ... --target_file ...`` fine-tunes
it. A fine-tune exports with its folder's config and tokenizer.

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

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.weights import Port, fused, linear, norm, same

__all__ = ["BartConverter"]

# Hugging Face activation_function -> lmkit's activation.
_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "relu": "relu"}
# BART's learned position tables have two rows before position 0.
_POSITION_OFFSET = 2
# Where checkpoints keep the one token table (tied copies may be stored too, or not at all).
_TABLE_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight")


def _check(config: Dict[str, Any], path: str) -> None:
    """Raises unless lmkit's ``transformer_seq2seq`` computes the BART ``config`` describes."""
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


def _positions(name: str, table: Any) -> Port:
    """BART's rows 0-1 come before position 0: never read (exported as zeros)."""
    return Port(table.embeddings, (name,), lambda w: w[_POSITION_OFFSET:],
                lambda t: [np.concatenate([np.zeros([_POSITION_OFFSET, t.shape[1]], t.dtype), t])])


def _encoder_layer(prefix: str, layer: Any) -> List[Port]:
    return [*linear(f"{prefix}.self_attn.q_proj", layer.attention.query),
            *fused(f"{prefix}.self_attn", ("k_proj", "v_proj"), layer.attention.key_value),
            *linear(f"{prefix}.self_attn.out_proj", layer.attention.output),
            *norm(f"{prefix}.self_attn_layer_norm", layer.attention_norm),
            *linear(f"{prefix}.fc1", layer.ffn_inner), *linear(f"{prefix}.fc2", layer.ffn_outer),
            *norm(f"{prefix}.final_layer_norm", layer.ffn_norm)]


def _decoder_layer(prefix: str, layer: Any) -> List[Port]:
    return [*fused(f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj"), layer.attention.qkv),
            *linear(f"{prefix}.self_attn.out_proj", layer.attention.output),
            *norm(f"{prefix}.self_attn_layer_norm", layer.attention_norm),
            *linear(f"{prefix}.encoder_attn.q_proj", layer.cross_attention.query),
            *fused(f"{prefix}.encoder_attn", ("k_proj", "v_proj"), layer.cross_attention.key_value),
            *linear(f"{prefix}.encoder_attn.out_proj", layer.cross_attention.output),
            *norm(f"{prefix}.encoder_attn_layer_norm", layer.cross_norm),
            *linear(f"{prefix}.fc1", layer.ffn_inner), *linear(f"{prefix}.fc2", layer.ffn_outer),
            *norm(f"{prefix}.final_layer_norm", layer.ffn_norm)]


class BartConverter(Converter):
    """BART folders (``BartForConditionalGeneration``) onto lmkit's ``transformer_seq2seq``, and fine-tunes back.

    An encoder-decoder: it fine-tunes on pairs, with the folder's tokenizer for both sides framed as BART
    frames texts (:meth:`framing`).
    """

    title = "BART"
    model = "transformer_seq2seq"
    architectures = {"bart": "BartForConditionalGeneration"}
    sizes = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
             "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")
    conditional = True
    train_settings = {"data.share_vocab": True}

    def config_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        _check(config, path)
        return {"source_vocab_size": config["vocab_size"], "vocab_size": config["vocab_size"],
                "hidden_size": config["d_model"], "num_layers": config["encoder_layers"],
                "decoder_layers": config["decoder_layers"], "num_heads": config["encoder_attention_heads"],
                "ffn_dim": config["encoder_ffn_dim"], "max_source_positions": config["max_position_embeddings"],
                "max_positions": config["max_position_embeddings"],
                "dropout": float(config.get("dropout", 0.1) or 0.0), "pre_layer_norm": False,
                "share_embeddings": True, "tie_weights": True, "init_scale": float(config.get("init_std", 0.02)),
                "activation": _ACTIVATIONS[config.get("activation_function", "gelu")], "embedding_norm": True,
                "scale_embedding": bool(config.get("scale_embedding", False))}

    def weights(self, model: Any) -> List[Port]:
        """The token table is ``model.shared.weight``, read from whichever copy a checkpoint stores; a
        checkpoint without ``final_logits_bias`` (transformers does not require it) gets zeros, as
        transformers gives it."""
        ports = [same("model.shared.weight", model.target_embedder.embeddings),
                 _positions("model.encoder.embed_positions.weight", model.source_positions),
                 _positions("model.decoder.embed_positions.weight", model.target_positions),
                 Port(model.projection.bias, ("final_logits_bias",), lambda b: b.reshape(-1),
                      lambda b: [b[np.newaxis]], fill=0.0),
                 *norm("model.encoder.layernorm_embedding", model.source_embedding_norm),
                 *norm("model.decoder.layernorm_embedding", model.target_embedding_norm)]
        for i, layer in enumerate(model.encoder.layers):
            ports += _encoder_layer(f"model.encoder.layers.{i}", layer)
        for i, layer in enumerate(model.decoder.layers):
            ports += _decoder_layer(f"model.decoder.layers.{i}", layer)
        return ports

    def stored_names(self, name: str) -> Sequence[str]:
        return _TABLE_NAMES if name == _TABLE_NAMES[0] else (name,)

    def framing(self, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """BART's framing of texts: the decoder starts from ``decoder_start_token_id`` and ends at
        ``eos_token_id``; every text begins with ``<s>`` (``bos_token_id``), and a source ends with ``</s>``."""
        start = config.get("bos_token_id")
        return {"bos": config["decoder_start_token_id"], "eos": config["eos_token_id"], "pad": config["pad_token_id"],
                "prefix": [] if start is None else [start], "suffix": [], "source_suffix": [config["eos_token_id"]]}
