"""Hugging Face model folders: telling one apart, reading its ``config.json``, and the checks on the way in and out.

A folder as ``save_pretrained`` writes it holds ``config.json`` (whose
``model_type`` names the family, :mod:`lmkit.hub.converters`), the weights
(:mod:`lmkit.hub.safetensors`), the tokenizer files
(:func:`lmkit.hub.tokenizer.read_tokenizer`) and often a
``generation_config.json`` (:mod:`lmkit.hub.generation_config`). An export
writes a new folder whole or not at all (:func:`write_folder`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.core.fileio import TempFolder, sweep_temp_folders
from lmkit.data.tokenizers import check_vocabulary

__all__ = ["GENERATION_CONFIG", "HF_CONFIG", "check_export_source", "check_new_folder", "check_vocabulary",
           "is_hf_folder", "model_type_of", "read_config_json", "read_json", "write_folder", "write_json"]

HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"


def read_json(path: str) -> Dict[str, Any]:
    """The JSON object in ``path``; an unreadable file or another JSON value is a UsageError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def write_json(path: str, content: Dict[str, Any]) -> None:
    """Writes ``content`` as indented JSON (into a folder that :func:`write_folder` publishes whole)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2)


def read_config_json(folder: str) -> Tuple[str, Dict[str, Any]]:
    """``(path, contents)`` of the folder's ``config.json``; a missing or unreadable one is a UsageError."""
    path = os.path.join(folder, HF_CONFIG)
    if not os.path.isfile(path):
        raise UsageError(f"{folder} is not a Hugging Face model folder: {path} is missing")
    return path, read_json(path)


def model_type_of(folder: str) -> Tuple[str, Any]:
    """``(path of config.json, its model_type)``, which picks the family's converter (None when unset)."""
    path, config = read_config_json(folder)
    return path, config.get("model_type")


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model folder (its ``config.json`` has ``model_type``)."""
    config = os.path.join(path, HF_CONFIG)
    if not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            return "model_type" in json.load(f)
    except (OSError, ValueError):
        return False


def check_new_folder(output: str) -> None:
    """Raises unless ``output`` is missing or an empty folder (an export never overwrites)."""
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise UsageError(f"--output {output} exists and is not an empty folder; pass a new folder")


def check_export_source(source: Optional[str], model: str, output: str) -> None:
    """Raises unless ``source`` (a run's ``init_from``) is a folder an export can take its config and
    tokenizer from, and ``output`` is missing or empty."""
    if not source:
        raise UsageError(f"export --format hf of a {model} run needs the Hugging Face folder it was fine-tuned "
                         "from (its init_from), for the config and the tokenizer; this run started from scratch")
    if not os.path.isdir(source):
        raise UsageError(f"the run was fine-tuned from {source}, which is gone; export needs its config and "
                         "tokenizer files")
    check_new_folder(output)


def write_folder(output: str, fill: Callable[[str], None]) -> List[str]:
    """Makes the folder ``output`` whole or not at all: ``fill(tmp)`` writes into a temporary folder
    next to it, which is then renamed into place (``output`` must be missing or empty).

    Returns:
      The names of the files written.
    """
    parent = os.path.dirname(os.path.abspath(output)) or "."
    # The folders of exports killed midway are swept; a live export's folder is locked.
    sweep_temp_folders(parent, ".export-")
    with TempFolder(parent, ".export-") as tmp:
        fill(tmp.path)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked by the caller)
        tmp.publish(output)
    return sorted(os.listdir(output))
