"""Hugging Face Hub names to local folders: ``--init_from hf:<name>`` and ``--tokenizer hf:<name>`` download with
``huggingface_hub``.

Nothing is downloaded unless asked: a plain path is used as it is. The
download fetches only the files lmkit reads (the config, safetensors
weights, tokenizer and generation config; for a tokenizer alone, no weights)
into ``huggingface_hub``'s cache.
"""

from __future__ import annotations

import os
from typing import Sequence

from lmkit.core.errors import UsageError

__all__ = ["HUB_FILES", "TOKENIZER_FILES", "resolve_source", "tokenizer_folder"]

#: The files of a model repository that a download fetches.
HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
             "tokenizer.json", "vocab.json", "merges.txt",
             "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
#: The files a tokenizer alone needs (``--tokenizer hf:<name>``): its own, and the configs that name its end ids.
TOKENIZER_FILES = ["tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "config.json", "generation_config.json"]


def resolve_source(spec: str) -> str:
    """A local folder for ``spec``: a folder path, or ``hf:<name>`` fetched from the Hugging Face Hub.

    Raises:
      UsageError: a missing folder, or a download that fails (no network,
        unknown name, no huggingface_hub), with what to do instead.
    """
    if not spec.startswith("hf:"):
        if not os.path.isdir(spec):
            from lmkit.hub.converters import converter_table
            raise UsageError(f"--init_from {spec} is not a folder; pass a Hugging Face model folder (model_type "
                             f"{', '.join(converter_table())}: config.json, model.safetensors, tokenizer files) or "
                             "hf:<name> to download one")
        return spec
    return _download(spec[3:], HUB_FILES, f"--init_from {spec}", "pass --init_from DIR")


def _looks_like_a_path(source: str) -> bool:
    """A Hub name is ``name`` or ``owner/name``; anything else is meant as a folder."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source)


def tokenizer_folder(source: str) -> str:
    """The folder of ``tokenizer = "hf:<source>"``: ``source`` when it is a folder, else a Hub name (``name``,
    ``owner/name``) whose tokenizer files (:data:`TOKENIZER_FILES`, no weights) are downloaded.

    Raises:
      UsageError: a path that is not a folder, or a download that fails, with what to do instead.
    """
    what = f"--tokenizer hf:{source}"
    if os.path.isdir(source):
        return source
    if _looks_like_a_path(source):
        raise UsageError(f"{what}: {source} is not a folder; pass a folder with tokenizer.json (or vocab.json + "
                         "merges.txt), or a Hugging Face Hub name such as hf:owner/name")
    return _download(source, TOKENIZER_FILES, what, f"pass --tokenizer hf:DIR (no folder {source!r} is here either)")


def _download(name: str, patterns: Sequence[str], what: str, instead: str) -> str:
    """``snapshot_download`` of the files ``patterns`` of the Hub repository ``name``; its folder.

    Raises:
      UsageError: naming ``what`` asked for it and the way around (``instead``).
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(f"{what} downloads with huggingface_hub, which is not installed; "
                         "pip install 'lmkit[hf]', or pass a folder") from None
    try:
        return snapshot_download(repo_id=name, allow_patterns=list(patterns))
    except Exception as exc:  # network, unknown repository, offline mode: all mean "cannot get it"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{what}: could not download {name!r} from the Hugging Face Hub "
                         f"({type(exc).__name__}: {first}); without a network, download the folder "
                         f"elsewhere (huggingface-cli download NAME --local-dir DIR), copy it here and "
                         f"{instead}") from None
