"""Data for language models: tokenizers, PTB, any text corpus, the token cache, BPTT batches and windows,
and the pieces of a run's data (:mod:`lmkit.data.pipeline`).

Nothing here talks to other ranks (``lmkit.data`` imports nothing of
``lmkit.distributed``): sharding takes ``rank`` and ``size`` as plain
arguments, and :func:`lmkit.train.run_data.load_run_data` runs downloads,
tokenizer training and encoding on rank 0 while the others wait
(``lmkit.distributed.rank0_first``). ``docs/data.md`` describes the layer.
Importing the package loads no TensorFlow; each name loads its module on use.
"""

from __future__ import annotations

import importlib
from typing import Any

# Eager, and TensorFlow-free: the function shares its name with its module,
# so a lazy lookup would find the module once something imported it.
from lmkit.data.download import download, git_blob_sha1

__all__ = [
    "DataError",
    "Vocab",
    "download",
    "git_blob_sha1",
    "DEFAULT_URL",
    "FALLBACK_URL",
    "PTB_SHA1",
    "PTBData",
    "find_ptb",
    "ensure_ptb",
    "load_ptb",
    "bptt_arrays",
    "bptt_dataset",
    "num_bptt_batches",
    "window_arrays",
    "num_window_batches",
    "WindowBatches",
    "BpttBatches",
    "resolve_sources",
    "Source",
    "open_text",
    "cache_root",
    "TokenStream",
    "Tokenizer",
    "TOKENIZERS",
    "WordTokenizer",
    "SentencePieceTokenizer",
    "CharTokenizer",
    "ByteTokenizer",
    "tokenizer_class",
    "train_tokenizer",
    "load_tokenizer",
    "train_sentencepiece",
    "check_text_file",
    "count_words",
    "TextCorpus",
    "TextData",
    "load_text_data",
    "sentence_dataset",
    "LineBatching",
    "RunData",
]

_HOMES = {
    "bptt_arrays": "batching",
    "bptt_dataset": "batching",
    "num_bptt_batches": "batching",
    "DataError": "errors",
    "DEFAULT_URL": "ptb",
    "FALLBACK_URL": "ptb",
    "PTB_SHA1": "ptb",
    "PTBData": "ptb",
    "ensure_ptb": "ptb",
    "find_ptb": "ptb",
    "load_ptb": "ptb",
    "TextCorpus": "text",
    "TextData": "text",
    "load_text_data": "text",
    "sentence_dataset": "text",
    "LineBatching": "text",
    "check_text_file": "textfile",
    "count_words": "textfile",
    "SentencePieceTokenizer": "sentencepiece",
    "train_sentencepiece": "sentencepiece",
    "TOKENIZERS": "tokenizers",
    "ByteTokenizer": "tokenizers",
    "CharTokenizer": "tokenizers",
    "Tokenizer": "tokenizers",
    "WordTokenizer": "tokenizers",
    "load_tokenizer": "tokenizers",
    "tokenizer_class": "tokenizers",
    "train_tokenizer": "tokenizers",
    "Vocab": "vocab",
    "num_window_batches": "windows",
    "window_arrays": "windows",
    "WindowBatches": "windows",
    "BpttBatches": "batching",
    "resolve_sources": "sources",
    "Source": "formats",
    "open_text": "formats",
    "cache_root": "token_cache",
    "TokenStream": "token_cache",
    "RunData": "pipeline",
}


def __getattr__(name: str) -> Any:  # PEP 562: names load their module (and TensorFlow) on use
    if name in _HOMES:
        return getattr(importlib.import_module(f"lmkit.data.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'lmkit.data' has no attribute {name!r}")


def __dir__() -> list:
    return __all__
