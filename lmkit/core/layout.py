"""The files of a model directory (no TensorFlow import)::

    model_dir/
      config.json              TrainConfig of the run (rebuilds the model)
      vocab.txt                the vocabulary, one token a line (word-level data)
      tokenizer.json, ...      the tokenizer of text data (an encoder-decoder's target side)
      source_tokenizer/        an encoder-decoder's source tokenizer (share_vocab = False)
      checkpoints/
        ckpt-000001200/        one complete checkpoint (renamed into place)
          ckpt.index, ckpt.data-00000-of-00001, meta.json
      results.json, tensorboard/

Training writes it (:mod:`lmkit.train`), generation and resume read it; the
names live here so that tools can check a folder before TensorFlow loads.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from lmkit.core.errors import UsageError

__all__ = [
    "CONFIG_FILE", "VOCAB_FILE", "SOURCE_TOKENIZER_DIR", "CHECKPOINT_DIR", "RESULTS_FILE", "TENSORBOARD_DIR",
    "CHECKPOINT_PREFIX", "META_FILE", "checkpoint_folder_name", "complete_checkpoints",
    "read_config_dict", "resolve_checkpoint",
]

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
SOURCE_TOKENIZER_DIR = "source_tokenizer"  # an encoder-decoder's own source tokenizer (share_vocab = False)
CHECKPOINT_DIR = "checkpoints"
RESULTS_FILE = "results.json"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_PREFIX = "ckpt"  # inside a checkpoint folder: ckpt.index, ckpt.data-*
META_FILE = "meta.json"  # written last: its presence marks a complete checkpoint

_CKPT_RE = re.compile(r"^ckpt-(\d+)$")
# What a re-save of a step that was killed between its two renames leaves: the previous copy of that step.
_OLD_RE = re.compile(r"^ckpt-(\d+)\.old-\d+$")


def checkpoint_folder_name(step: int) -> str:
    """``ckpt-000001200`` for step 1200."""
    return f"ckpt-{step:09d}"


def complete_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """The complete checkpoints in ``directory`` as ``(step, path)``, oldest first.

    A complete ``ckpt-<step>.old-<pid>`` counts for its step when no complete
    ``ckpt-<step>`` exists: a re-save of that step killed between moving the
    old copy aside and moving the new one in left it as the only copy
    (:meth:`lmkit.train.checkpoint.CheckpointManager.recover` renames it back).
    """
    if not os.path.isdir(directory):
        return []
    names = os.listdir(directory)
    found: Dict[int, str] = {}
    for name in names:
        m = _CKPT_RE.match(name)
        if m and _is_complete(os.path.join(directory, name)):
            found[int(m.group(1))] = os.path.join(directory, name)
    for name in sorted(names):
        m = _OLD_RE.match(name)
        if m and _is_complete(os.path.join(directory, name)):
            found.setdefault(int(m.group(1)), os.path.join(directory, name))
    return sorted(found.items())


def _is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, META_FILE))


def resolve_checkpoint(model_dir: str, checkpoint: Optional[str]) -> Optional[str]:
    """The folder of ``checkpoint`` (a path, or a name inside ``<model_dir>/checkpoints``).

    Returns None when ``checkpoint`` is None (the latest is meant).

    Raises:
      UsageError: no checkpoint folder by that name, listing those that exist.
    """
    if checkpoint is None:
        return None
    ckpt_dir = os.path.join(model_dir, CHECKPOINT_DIR)
    for path in (checkpoint, os.path.join(ckpt_dir, checkpoint)):
        if os.path.isfile(os.path.join(path, CHECKPOINT_PREFIX + ".index")):
            return path
    names = [os.path.basename(p) for _, p in complete_checkpoints(ckpt_dir)]
    raise UsageError(f"--checkpoint {checkpoint} is not a checkpoint folder (no "
                     f"{CHECKPOINT_PREFIX}.index); those in {ckpt_dir}: {', '.join(names) or 'none'}")


def read_config_dict(model_dir: str) -> Dict[str, Any]:
    """The config stored in ``model_dir`` as a dict (no TensorFlow needed)."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise UsageError(f"{model_dir} holds no {CONFIG_FILE}; pass the --model_dir of a training run")
    with open(path, encoding="utf-8") as f:
        return json.load(f)
