"""Old module names of lmkit, and where each one lives now (no TensorFlow import).

lmkit 0.3 laid the package out by the data flow (``core``, ``config``,
``layers``, ``models``, ``hub``, ``data``, ``decoding``, ``train``,
``optim``, ``distributed``, ``cli``). Code written for 0.2 keeps working for
one release: importing an old name gives a :class:`DeprecationWarning` that
names the new home, and a module object that forwards every attribute to it
(``from lmkit.modules.llama import RMSNorm`` still works). A name that left
its module has its own line in :data:`NAMES`; one that is gone for good
(``lmkit.dist``, the three attention classes now one) is an ``ImportError``
naming its replacement (:data:`GONE`, :data:`GONE_NAMES`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any, Dict, Optional, Sequence

__all__ = ["MODULES", "NAMES", "GONE", "GONE_NAMES", "install", "new_home"]

#: old module -> the module that holds its contents now
MODULES: Dict[str, str] = {
    "lmkit.attention_kernels": "lmkit.layers.kernels",
    "lmkit.chat": "lmkit.hub.chat",
    "lmkit.checks": "lmkit.core.checks",
    "lmkit.cli.data": "lmkit.data.pipeline",
    "lmkit.console": "lmkit.core.console",
    "lmkit.data.hf_tokenizer": "lmkit.hub.tokenizer",
    "lmkit.errors": "lmkit.core.errors",
    "lmkit.fileio": "lmkit.core.fileio",
    "lmkit.generation": "lmkit.decoding.generation",
    "lmkit.hf": "lmkit.models.gpt2.convert",
    "lmkit.hf_bart": "lmkit.models.bart.convert",
    "lmkit.hf_llama": "lmkit.models.llama.convert",
    "lmkit.layout": "lmkit.core.layout",
    "lmkit.lora": "lmkit.models.build",
    "lmkit.losses": "lmkit.train.losses",
    "lmkit.models.base": "lmkit.models.protocols",
    "lmkit.models.rnn_seq2seq": "lmkit.models.rnn.seq2seq",
    "lmkit.models.transformer": "lmkit.models.gpt2.model",
    "lmkit.models.transformer_seq2seq": "lmkit.models.bart.model",
    "lmkit.modules": "lmkit.layers",
    "lmkit.modules.attention_rnn": "lmkit.layers.attention_rnn",
    "lmkit.modules.base": "lmkit.layers.base",
    "lmkit.modules.cells": "lmkit.layers.cells",
    "lmkit.modules.cudnn_attention": "lmkit.layers.kernels.cudnn",
    "lmkit.modules.embedders": "lmkit.layers.embeddings",
    "lmkit.modules.encoder_decoder": "lmkit.layers.encoder_decoder",
    "lmkit.modules.llama": "lmkit.models.llama.blocks",
    "lmkit.modules.lora": "lmkit.layers.lora",
    "lmkit.modules.projection": "lmkit.layers.projection",
    "lmkit.modules.rnn": "lmkit.layers.rnn",
    "lmkit.modules.transformer": "lmkit.layers.transformer",
    "lmkit.precision": "lmkit.layers.precision",
    "lmkit.preemption": "lmkit.core.preemption",
    "lmkit.progress": "lmkit.core.progress",
    "lmkit.registry": "lmkit.core.registry",
    "lmkit.transduction": "lmkit.decoding.transduction",
    "lmkit.xla": "lmkit.core.xla",
}

#: ``old.module.Name`` -> ``new.module:Name``, for names that left the module of :data:`MODULES`
NAMES: Dict[str, str] = {
    "lmkit.generation.readable": "lmkit.decoding.text:readable",
    "lmkit.generation.check_stop_strings": "lmkit.decoding.text:check_stop_strings",
    "lmkit.generation.end_of_document_ids": "lmkit.decoding.text:end_of_document_ids",
    "lmkit.transduction.is_seq2seq_run": "lmkit.decoding.source:is_seq2seq_run",
    "lmkit.transduction.source_tokenizer_of_run": "lmkit.decoding.source:source_tokenizer_of_run",
    "lmkit.hf.FAMILIES": "lmkit.models.registry:CONVERTERS",
    "lmkit.hf.HF_CONFIG": "lmkit.hub.folders:HF_CONFIG",
    "lmkit.hf.PYTORCH_BIN": "lmkit.hub.safetensors:PYTORCH_BIN",
    "lmkit.hf.SAFETENSORS": "lmkit.hub.safetensors:SAFETENSORS",
    "lmkit.hf.build_pretrained": "lmkit.models.build:load_pretrained",
    "lmkit.hf.check_new_folder": "lmkit.hub.folders:check_new_folder",
    "lmkit.hf.check_pretrained": "lmkit.hub.converters:check_pretrained",
    "lmkit.hf.check_vocabulary": "lmkit.hub.folders:check_vocabulary",
    "lmkit.hf.end_token_ids": "lmkit.hub.generation_config:end_token_ids",
    "lmkit.hf.family_of": "lmkit.hub.converters:converter_of",
    "lmkit.hf.generation_preset": "lmkit.hub.generation_config:generation_preset",
    "lmkit.hf.is_hf_folder": "lmkit.hub.folders:is_hf_folder",
    "lmkit.hf.load": "lmkit.models.build:load_pretrained",
    "lmkit.hf.load_gpt2": "lmkit.models.build:load_pretrained",
    "lmkit.hf.load_pretrained": "lmkit.models.build:load_pretrained",
    "lmkit.hf.load_pretrained_weights": "lmkit.hub.converters:load_pretrained_weights",
    "lmkit.hf.load_weights": "lmkit.models.gpt2.convert:load_gpt2_weights",
    "lmkit.hf.model_generation_preset": "lmkit.hub.generation_config:model_generation_preset",
    "lmkit.hf.pair_framing": "lmkit.hub.converters:pair_framing",
    "lmkit.hf.pretrained_training_config": "lmkit.hub.converters:pretrained_training_config",
    "lmkit.hf.read_config": "lmkit.models.gpt2.convert:read_gpt2_config",
    "lmkit.hf.read_config_json": "lmkit.hub.folders:read_config_json",
    "lmkit.hf.read_tokenizer": "lmkit.hub.tokenizer:read_tokenizer",
    "lmkit.hf.resolve_source": "lmkit.hub.download:resolve_source",
    "lmkit.hf.training_config": "lmkit.hub.converters:pretrained_training_config",
    "lmkit.hf.write_folder": "lmkit.hub.folders:write_folder",
    "lmkit.hf_bart.load": "lmkit.models.build:load_pretrained",
    "lmkit.hf_bart.load_bart": "lmkit.models.build:load_pretrained",
    "lmkit.hf_bart.load_seq2seq": "lmkit.decoding.transduction:load_seq2seq",
    "lmkit.hf_bart.load_weights": "lmkit.models.bart.convert:load_bart_weights",
    "lmkit.hf_bart.read_config": "lmkit.models.bart.convert:read_bart_config",
    "lmkit.hf_bart.training_config": "lmkit.hub.converters:pretrained_training_config",
    "lmkit.hf_llama.FAMILIES": "lmkit.models.llama.convert:ARCHITECTURES",
    "lmkit.hf_llama.HF_CONFIG": "lmkit.hub.folders:HF_CONFIG",
    "lmkit.hf_llama.SAFETENSORS": "lmkit.hub.safetensors:SAFETENSORS",
    "lmkit.hf_llama.SAFETENSORS_INDEX": "lmkit.hub.safetensors:SAFETENSORS_INDEX",
    "lmkit.hf_llama.check_export_source": "lmkit.hub.folders:check_export_source",
    "lmkit.hf_llama.load": "lmkit.models.build:load_pretrained",
    "lmkit.hf_llama.load_llama": "lmkit.models.build:load_pretrained",
    "lmkit.hf_llama.load_weights": "lmkit.models.llama.convert:load_llama_weights",
    "lmkit.hf_llama.read_config": "lmkit.models.llama.convert:read_llama_config",
    "lmkit.hf_llama.read_tensors": "lmkit.hub.safetensors:read_tensors",
    "lmkit.hf_llama.training_config": "lmkit.hub.converters:pretrained_training_config",
    "lmkit.hf_llama.weight_files": "lmkit.hub.safetensors:weight_files",
    "lmkit.hf_llama.write_pretrained": "lmkit.hub.safetensors:write_pretrained",
    "lmkit.modules.LlamaDecoder": "lmkit.models.llama.blocks:LlamaDecoder",
    "lmkit.modules.LlamaLayer": "lmkit.models.llama.blocks:LlamaLayer",
    "lmkit.modules.llama.GatedFeedForward": "lmkit.layers.feedforward:GatedFeedForward",
    "lmkit.modules.llama.RMSNorm": "lmkit.layers.norms:RMSNorm",
    "lmkit.modules.llama.ROPE_TYPES": "lmkit.layers.rotary:ROPE_TYPES",
    "lmkit.modules.llama.RotaryEmbedding": "lmkit.layers.rotary:RotaryEmbedding",
    "lmkit.modules.llama.plain": "lmkit.layers.base:plain",
    "lmkit.modules.transformer.ACTIVATIONS": "lmkit.layers.feedforward:ACTIVATIONS",
    "lmkit.modules.transformer.AUTO_BLOCKS": "lmkit.layers.attention:AUTO_BLOCKS",
    "lmkit.modules.transformer.AUTO_BLOCKS_FROM": "lmkit.layers.attention:AUTO_BLOCKS_FROM",
    "lmkit.modules.transformer.AttentionCache": "lmkit.layers.attention:AttentionCache",
    "lmkit.modules.transformer.LayerNorm": "lmkit.layers.norms:LayerNorm",
    "lmkit.modules.transformer.attend": "lmkit.layers.attention:attend",
    "lmkit.modules.transformer.attention_blocks_for": "lmkit.layers.attention:attention_blocks_for",
    "lmkit.modules.transformer.causal_attend": "lmkit.layers.attention:causal_attend",
    "lmkit.modules.transformer.causal_mask": "lmkit.layers.attention:causal_mask",
    "lmkit.modules.transformer.check_attention_blocks": "lmkit.layers.attention:check_attention_blocks",
    "lmkit.modules.transformer.grouped_attend": "lmkit.layers.attention:grouped_attend",
    "lmkit.modules.transformer.masked_softmax": "lmkit.layers.attention:masked_softmax",
    "lmkit.modules.transformer.write_cache": "lmkit.layers.attention:write_cache",
}

#: ``old.module.Name`` -> how to write it now, for names that have no one-to-one replacement
GONE_NAMES: Dict[str, str] = {
    "lmkit.generation.load_for_generation":
        "lmkit.decoding.load_generator(path) (a Generator: .model, .tokenizer, .description)",
    "lmkit.generation.trained_context": "lmkit.decoding.source.open_folder(path).trained_context()",
    "lmkit.generation.hf_folder_tokenizer": "lmkit.decoding.source.open_folder(path).tokenizer(checkpoint)",
    "lmkit.generation.check_hf_checkpoint": "lmkit.decoding.source.open_folder(path).check_checkpoint(checkpoint)",
    "lmkit.generation.default_context": "nothing: lmkit.generate() picks the context itself",
    "lmkit.modules.transformer.MultiHeadAttention":
        "lmkit.layers.attention.Attention(dim, num_heads, fused='qkv')",
    "lmkit.modules.llama.GroupedQueryAttention":
        "lmkit.layers.attention.Attention(dim, num_heads, num_kv_heads=..., rotary={'theta': ..., "
        "'scaling': ...}, qkv_bias=False, output_bias=False, init_scale=0.02)",
    "lmkit.modules.encoder_decoder.MemoryAttention":
        "lmkit.layers.attention.Attention(dim, num_heads, causal=False, fused='kv'), called as "
        "attention(x, memory=..., mask=...)[0]",
    "lmkit.modules.MultiHeadAttention": "lmkit.layers.attention.Attention(dim, num_heads, fused='qkv')",
    "lmkit.modules.GroupedQueryAttention": "lmkit.layers.attention.Attention(..., num_kv_heads=..., rotary=...)",
    "lmkit.modules.MemoryAttention": "lmkit.layers.attention.Attention(..., causal=False, fused='kv')",
    "lmkit.hf_bart.conditional": "the converter's attribute: lmkit.models.bart.convert.BartConverter.conditional",
}

#: old module -> what replaces it; importing it fails with a message that says so
GONE: Dict[str, str] = {
    "lmkit.dist": "lmkit.distributed (`from lmkit import distributed as dist`)",
}


def new_home(old: str) -> Optional[str]:
    """Where the module or name ``old`` (dotted) lives now, or None when it did not move."""
    if old in MODULES:
        return MODULES[old]
    module, _, name = old.rpartition(".")
    if old in NAMES:
        return NAMES[old].replace(":", ".")
    if module in MODULES:
        return f"{MODULES[module]}.{name}"
    return None


class _Moved(types.ModuleType):
    """An old module name: every attribute read comes from the new module (or the new home of the name)."""

    def __getattr__(self, name: str) -> Any:
        old = f"{self.__name__}.{name}"
        if old in GONE_NAMES:  # an ImportError, so that `from old import name` shows this message
            raise ImportError(f"{old} was removed in lmkit 0.3; write {GONE_NAMES[old]}", name=self.__name__)
        if old in NAMES:
            module, _, attr = NAMES[old].partition(":")
            return getattr(importlib.import_module(module), attr)
        target = importlib.import_module(MODULES[self.__name__])
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"{self.__name__} (now {target.__name__}) has no {name!r}") from None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None):
        if name in MODULES or name in GONE:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name in GONE:
            raise ImportError(f"{spec.name} was removed in lmkit 0.3; use {GONE[spec.name]}", name=spec.name)
        warnings.warn(f"{spec.name} is now {MODULES[spec.name]}; import it from there (the old name goes in "
                      "the next release)", DeprecationWarning, stacklevel=3)
        module = _Moved(spec.name)
        module.__path__ = []  # a package, so that old submodule names import too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Puts the finder of old names on ``sys.meta_path`` (once); ``import lmkit`` calls it."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
