"""Atomic, rotating checkpoints of a training run, and loading for inference.

The layout of a model directory is in :mod:`lmkit.layout`. A checkpoint is written into ``ckpt-<step>.tmp-<pid>/`` and renamed to
``ckpt-<step>/`` only when complete, so a job killed during a save leaves
the previous checkpoint intact; stray temporary folders are ignored and
removed by the next save.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from lmkit.errors import CheckpointError, UsageError
from lmkit.fileio import atomic_write_bytes, atomic_write_text, fsync_dir
from lmkit.layout import (CHECKPOINT_DIR, CHECKPOINT_PREFIX, CONFIG_FILE, META_FILE, read_config_dict,
                          checkpoint_folder_name, complete_checkpoints)



class CheckpointManager:
    """Saves and finds complete checkpoints in ``directory``, keeping the last ``keep``.

    Args:
      directory: folder that holds the ``ckpt-<step>`` folders.
      checkpoint: the ``tf.train.Checkpoint`` to write and read.
      keep: how many complete checkpoints to keep (older ones are deleted).
    """

    def __init__(self, directory: str, checkpoint: tf.train.Checkpoint, keep: int = 3) -> None:
        if keep < 1:
            raise UsageError(f"keep = {keep} must be >= 1")
        self.directory = directory
        self.checkpoint = checkpoint
        self.keep = keep

    def all(self) -> List[Tuple[int, str]]:
        """Complete checkpoints as ``(step, path)``, oldest first."""
        return complete_checkpoints(self.directory)

    def latest(self) -> Optional[str]:
        """Path of the newest complete checkpoint folder, or None."""
        found = self.all()
        return found[-1][1] if found else None

    def save(self, step: int, meta: Optional[Dict[str, Any]] = None,
             files: Optional[Dict[str, bytes]] = None) -> str:
        """Writes a checkpoint for ``step`` atomically and prunes old ones.

        Args:
          step: the global step (names the folder).
          meta: JSON-friendly facts stored in ``meta.json`` (written last).
          files: more files of the checkpoint, by name (e.g. the carried RNN
            state), written inside it before ``meta.json``.

        Returns:
          The checkpoint's folder.
        """
        os.makedirs(self.directory, exist_ok=True)
        final = os.path.join(self.directory, checkpoint_folder_name(step))
        tmp = f"{final}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self.checkpoint.write(os.path.join(tmp, CHECKPOINT_PREFIX))
        for name, data in (files or {}).items():
            atomic_write_bytes(os.path.join(tmp, name), data)
        info = {"step": int(step), "time": time.time(), **(meta or {})}
        atomic_write_text(os.path.join(tmp, META_FILE), json.dumps(info, indent=2, sort_keys=True))
        fsync_dir(tmp)
        if os.path.exists(final):  # a re-save of the same step replaces it
            old = f"{final}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(self.directory)
        self._prune()
        return final

    def _prune(self) -> None:
        for _, path in self.all()[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.directory):  # leftovers of killed saves
            if ".tmp-" in name or ".old-" in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def restore(self, path: str) -> Dict[str, Any]:
        """Restores ``path`` into the checkpoint's objects; returns its meta data."""
        try:
            status = self.checkpoint.read(os.path.join(path, CHECKPOINT_PREFIX))
            status.assert_existing_objects_matched()
        except (tf.errors.OpError, AssertionError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {path} does not match the model or optimizer of this config "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); use another "
                "--model_dir or the config the checkpoint was trained with") from exc
        with open(os.path.join(path, META_FILE), encoding="utf-8") as f:
            return json.load(f)


def load_model(model_dir: str, checkpoint: Optional[str] = None, merge_adapters: bool = True):
    """Rebuilds a trained model from its model directory, for generation and evaluation.

    A LoRA run (``lora_rank`` > 0) is its base, read from the ``init_from``
    folder again, with the checkpoint's adapters: merged into the base's
    kernels (a plain model) unless ``merge_adapters`` is False.

    Args:
      model_dir: the ``--model_dir`` of a training run (single-process or
        distributed: both write the same layout).
      checkpoint: a specific ``ckpt-<step>`` folder; default the latest.
      merge_adapters: a LoRA run's adapters merged (True) or kept apart.

    Returns:
      ``(model, tokenizer, config)``: the tokenizer the run saved (a PTB
      run's vocabulary as a word tokenizer, ``lmkit.data.tokenizer_of_run``).

    Raises:
      UsageError: no config, tokenizer or checkpoint in ``model_dir``, or a
        model class that cannot be imported.
      CheckpointError: weights that do not fit the stored config.
    """
    from lmkit.config import TrainConfig
    from lmkit.data.tokenizers import tokenizer_of_run
    from lmkit.lora import build_run_model
    from lmkit.modules.lora import lora_of, merge_lora

    config = TrainConfig.from_dict(read_config_dict(model_dir), source=f"{model_dir}/{CONFIG_FILE}")
    tokenizer = tokenizer_of_run(model_dir)
    # A LoRA run's checkpoints hold its adapters alone: the base comes from init_from.
    model = build_run_model(config, load_pretrained=bool(config.lora_rank))
    lora = lora_of(model)
    ckpt = tf.train.Checkpoint(model=model if lora is None else lora)
    path = checkpoint or CheckpointManager(os.path.join(model_dir, CHECKPOINT_DIR), ckpt).latest()
    if path is None:
        raise UsageError(f"{model_dir}/{CHECKPOINT_DIR} holds no complete checkpoint; "
                         "train first or pass another --model_dir")
    try:
        ckpt.read(os.path.join(path, CHECKPOINT_PREFIX)).expect_partial().assert_existing_objects_matched()
    except (AssertionError, tf.errors.OpError) as exc:  # weights that do not fit config.json
        raise CheckpointError(f"the checkpoint {path} does not match {model_dir}/{CONFIG_FILE} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                              "pass the --model_dir of one training run, unchanged") from None
    if merge_adapters:
        merge_lora(model)
    return model, tokenizer, config
