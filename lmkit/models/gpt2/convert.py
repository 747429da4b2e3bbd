"""Hugging Face GPT-2 folders (``model_type: gpt2``) onto lmkit's ``gpt2`` model, and ``gpt2`` runs back.

The config: the sizes are ``config.json``'s ``n_layer``, ``n_head``,
``n_embd``, ``n_positions``, ``n_inner`` and ``vocab_size`` (distilgpt2
through gpt2-xl load alike). The weights map one to one (``docs/gpt2.md``
has the table): GPT-2's ``Conv1D`` weights are stored [in, out], as lmkit's
kernels; older folders leave out the ``transformer.`` prefix, and the
softmax is the token table (``lm_head.weight``, where stored, is a copy).
A run exports with its own ``config.json`` (:meth:`GPT2Converter.config_out`),
fine-tuned or not, and its tokenizer's Hugging Face form.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from lmkit.core.errors import UsageError
from lmkit.hub.converters import Converter
from lmkit.hub.mapping import renamed, renamed_back
from lmkit.hub.safetensors import BUFFERS
from lmkit.hub.weights import Port, linear, norm, same

__all__ = ["GPT2Converter"]

# GPT-2 activations that are the tanh approximation of GELU (lmkit's "gelu").
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# (config.json key, lmkit argument) pairs that only change their name.
_KEYS = (("vocab_size", "vocab_size"), ("n_embd", "hidden_size"), ("n_layer", "num_layers"),
         ("n_head", "num_heads"), ("n_positions", "max_positions"))
_PREFIX = "transformer."


class GPT2Converter(Converter):
    """GPT-2 folders onto lmkit's ``gpt2`` model (tied softmax without bias, learned positions,
    pre-layer-norm, GELU), and ``gpt2`` runs back."""

    title = "GPT-2"
    model = "gpt2"
    architectures = {"gpt2": "GPT2LMHeadModel"}
    sizes = tuple(key for key, _ in _KEYS)
    positions_key = "n_positions"
    buffers = (*BUFFERS, ".attn.bias", ".attn.masked_bias")  # the causal mask
    # the architecture the name "gpt2" fixes, stated in the run's config too
    train_settings = {"model.tie_weights": True, "model.pre_layer_norm": True}
    exports_own_config = True

    def config_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        activation = config.get("activation_function", "gelu_new")
        if activation not in _GELU_TANH:
            raise UsageError(f"{path}: activation_function {activation!r} is not GPT-2's gelu_new; lmkit's gpt2 "
                             f"computes {', '.join(_GELU_TANH)}")
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
            raise UsageError(f"{path}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not "
                             "supported (GPT-2 checkpoints leave them off)")
        return {**renamed(config, _KEYS), "ffn_dim": config.get("n_inner") or 0,
                "dropout": float(config.get("resid_pdrop", 0.1)),
                "init_scale": float(config.get("initializer_range", 0.02)),
                "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-5))}

    def config_out(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        hidden, dropout = arguments["hidden_size"], arguments.get("dropout", 0.0)
        ffn = arguments.get("ffn_dim") or 4 * hidden
        attention = arguments.get("attention_dropout")
        return {**renamed_back(arguments, _KEYS), "n_inner": None if ffn == 4 * hidden else ffn,
                "activation_function": "gelu_new", "resid_pdrop": dropout, "embd_pdrop": dropout,
                "attn_pdrop": dropout if attention is None else attention,
                "layer_norm_epsilon": arguments.get("layer_norm_epsilon", 1e-5),
                "initializer_range": arguments["init_scale"], "tie_word_embeddings": True, "use_cache": True}

    def weights(self, model: Any) -> List[Port]:
        decoder = model.decoder
        ports = [same(_PREFIX + "wte.weight", model.embedder.embeddings),
                 same(_PREFIX + "wpe.weight", model.position_embedder.embeddings),
                 *norm(_PREFIX + "ln_f", decoder.final_norm)]
        for i, layer in enumerate(decoder.layers):
            prefix = f"{_PREFIX}h.{i}."
            ports += [*norm(prefix + "ln_1", layer.attention_norm),
                      *linear(prefix + "attn.c_attn", layer.attention.qkv, torch=False),
                      *linear(prefix + "attn.c_proj", layer.attention.output, torch=False),
                      *norm(prefix + "ln_2", layer.ffn_norm),
                      *linear(prefix + "mlp.c_fc", layer.ffn_inner, torch=False),
                      *linear(prefix + "mlp.c_proj", layer.ffn_outer, torch=False)]
        return ports

    def stored_names(self, name: str) -> Sequence[str]:
        bare = name[len(_PREFIX):]  # older folders' names
        return (name, bare, "lm_head.weight") if bare == "wte.weight" else (name, bare)
