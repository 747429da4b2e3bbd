"""Hugging Face Hub names to local folders: ``--init_from hf:<name>`` downloads with ``huggingface_hub``.

Nothing is downloaded unless asked: a plain path is used as it is. The
download fetches only the files lmkit reads (the config, safetensors
weights, tokenizer and generation config) into ``huggingface_hub``'s cache.
"""

from __future__ import annotations

import os

from lmkit.core.errors import UsageError

__all__ = ["HUB_FILES", "resolve_source"]

#: The files of a model repository that a download fetches.
HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
             "tokenizer.json", "vocab.json", "merges.txt",
             "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]


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
    name = spec[3:]
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(f"--init_from {spec} downloads with huggingface_hub, which is not installed; "
                         "pip install 'lmkit[hf]', or pass a folder") from None
    try:
        return snapshot_download(repo_id=name, allow_patterns=HUB_FILES)
    except Exception as exc:  # network, unknown repository, offline mode: all mean "cannot get it"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--init_from {spec}: could not download {name!r} from the Hugging Face Hub "
                         f"({type(exc).__name__}: {first}); without a network, download the folder "
                         "elsewhere (huggingface-cli download NAME --local-dir DIR), copy it here and "
                         "pass --init_from DIR") from None
