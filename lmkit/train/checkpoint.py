"""Atomic, rotating checkpoints of a training run, and loading for inference.

The layout of a model directory is in :mod:`lmkit.core.layout`. A checkpoint is
written into ``ckpt-<step>.tmp-<pid>/``, every file in it is flushed to disk,
``meta.json`` is written last, and the folder is renamed to ``ckpt-<step>/``:
a job killed during a save leaves the previous checkpoint intact, and a
folder with ``meta.json`` is complete even after a power cut. Saving a step
again swaps the new folder with the old one in one step (Linux
``renameat2(RENAME_EXCHANGE)``); elsewhere two renames leave, if killed
between them, the old copy as ``ckpt-<step>.old-<pid>``, which still counts
as that step. A save that fails (a full disk) removes its temporary folder
and says why; what killed saves left is removed before the next save.

Reading takes the newest complete checkpoint whose files read back; one
that does not (truncated, a bad checksum) is named as corrupt and the one
before it is used. A checkpoint that reads but does not fit the model (the
config changed) is an error, never skipped.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import tensorflow as tf

from lmkit.core.errors import CheckpointError, UsageError
from lmkit.core.fileio import atomic_write_bytes, atomic_write_text, fsync_dir
from lmkit.core.layout import (
    CHECKPOINT_DIR,
    CHECKPOINT_PREFIX,
    CONFIG_FILE,
    META_FILE,
    checkpoint_folder_name,
    complete_checkpoints,
    read_config_dict,
)

__all__ = ["CheckpointManager", "CorruptCheckpointError", "load_model"]

T = TypeVar("T")
Log = Callable[[str], None]


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose files do not read back (truncated, damaged or missing)."""


class _Mismatch(Exception):
    """A checkpoint that reads back but does not fit the objects it is read into (its message: why)."""


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

    # ------------------------------------------------------------------ writing
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

        Raises:
          CheckpointError: the checkpoint could not be written (a full disk, a
            folder that is not writable); its temporary folder is removed and
            the earlier checkpoints are untouched.
        """
        os.makedirs(self.directory, exist_ok=True)
        self.recover()  # frees what killed saves left before this one needs the space
        final = os.path.join(self.directory, checkpoint_folder_name(step))
        tmp = f"{final}.tmp-{os.getpid()}"
        try:
            os.makedirs(tmp)
            self._write(tmp, step, meta, files)
            self._put_in_place(tmp, final)
        except BaseException as exc:
            written = _folder_bytes(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, (OSError, tf.errors.OpError)):
                raise self._save_failed(final, written, exc) from exc
            raise
        fsync_dir(self.directory)
        self._prune()
        return final

    def _write(self, tmp: str, step: int, meta: Optional[Dict[str, Any]],
               files: Optional[Dict[str, bytes]]) -> None:
        self.checkpoint.write(os.path.join(tmp, CHECKPOINT_PREFIX))
        for name, data in (files or {}).items():
            atomic_write_bytes(os.path.join(tmp, name), data)
        # meta.json marks the checkpoint complete: everything it vouches for is on disk first
        # (TensorFlow's writer does not fsync its data and index files).
        _fsync_tree(tmp)
        info = {"step": int(step), "time": time.time(), **(meta or {})}
        atomic_write_text(os.path.join(tmp, META_FILE), json.dumps(info, indent=2, sort_keys=True))
        fsync_dir(tmp)

    @staticmethod
    def _put_in_place(tmp: str, final: str) -> None:
        """Renames ``tmp`` to ``final``; a re-save of the same step never leaves a temporary name as the only copy."""
        if not os.path.lexists(final):
            os.replace(tmp, final)
        elif _exchange(tmp, final):  # one atomic step: final is the old, then the new checkpoint
            shutil.rmtree(tmp, ignore_errors=True)  # the old one now
        else:
            # Two renames: a kill between them leaves the old copy as ckpt-<step>.old-<pid>, which
            # complete_checkpoints counts and recover() puts back.
            old = f"{final}.old-{os.getpid()}"
            os.replace(final, old)
            try:
                os.replace(tmp, final)
            except BaseException:
                os.replace(old, final)
                raise
            shutil.rmtree(old, ignore_errors=True)

    def _save_failed(self, final: str, written: int, exc: BaseException) -> CheckpointError:
        previous = self.latest()
        kept = (f"the previous checkpoint {previous} is kept" if previous
                else "there is no earlier checkpoint")
        if _disk_full(exc):
            free = shutil.disk_usage(self.directory).free
            need = (f"about {_size(_folder_bytes(previous))}, as the previous one" if previous
                    else f"more than the {_size(written)} written before the disk was full")
            rerun = "continues from there" if previous else "starts again"
            return CheckpointError(
                f"cannot write checkpoint {final}: no space left on the disk of {self.directory} "
                f"({_size(free)} free; a checkpoint needs {need}); the partial checkpoint was removed "
                f"and {kept}. Free space on that disk and rerun the same command (it {rerun}), or pass "
                "a --model_dir on a disk with room")
        return CheckpointError(
            f"cannot write checkpoint {final} ({_first_line(exc)}); the partial checkpoint was removed "
            f"and {kept}. Check that {self.directory} is writable, or pass another --model_dir")

    def recover(self) -> None:
        """Puts back a checkpoint that a killed re-save left only as ``ckpt-<step>.old-<pid>``, and
        removes what killed saves left (temporary folders, superseded old copies)."""
        if not os.path.isdir(self.directory):
            return
        for step, path in self.all():
            final = os.path.join(self.directory, checkpoint_folder_name(step))
            if path != final:
                shutil.rmtree(final, ignore_errors=True)  # an incomplete folder (no meta.json), if any
                os.replace(path, final)
        fsync_dir(self.directory)
        for name in os.listdir(self.directory):
            if ".tmp-" in name or ".old-" in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def _prune(self) -> None:
        for _, path in self.all()[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ reading
    def restore(self, path: str) -> Dict[str, Any]:
        """Restores ``path`` into the checkpoint's objects; returns its meta data.

        Raises:
          CorruptCheckpointError: its files do not read back.
          CheckpointError: it does not fit the model or optimizer.
        """
        meta = _read_meta(path)
        try:
            _read_into(self.checkpoint, path, partial=False)
        except _Mismatch as exc:
            raise CheckpointError(
                f"checkpoint {path} does not match the model or optimizer of this config ({exc}); use "
                "another --model_dir or the config the checkpoint was trained with") from exc.__cause__
        return meta

    def restore_latest(self, log: Log, read_more: Optional[Callable[[str], T]] = None
                       ) -> Tuple[Optional[str], Optional[Dict[str, Any]], Optional[T]]:
        """Restores the newest checkpoint that reads back; a corrupt one is named on ``log`` and skipped.

        Args:
          log: where the skipped checkpoints and the one used instead are named.
          read_more: reads more of a checkpoint folder (raising
            :class:`CorruptCheckpointError` when that is damaged).

        Returns:
          ``(path, meta, what read_more returned)``, or three Nones without a checkpoint.

        Raises:
          CheckpointError: no checkpoint reads back, or the newest readable one
            does not fit the model.
        """
        found = self.all()
        if not found:
            return None, None, None

        def read(path: str) -> Tuple[Dict[str, Any], Optional[T]]:
            meta = self.restore(path)
            return meta, read_more(path) if read_more is not None else None

        path, (meta, more) = _newest_readable(found, read, log, self.directory)
        return path, meta, more


def _newest_readable(found: Sequence[Tuple[int, str]], read: Callable[[str], T], log: Log,
                     directory: str) -> Tuple[str, T]:
    """``(path, read(path))`` of the newest of ``found`` (oldest first) that ``read`` reads back.

    A corrupt one is named on ``log``, one line each, and the one before it tried;
    a checkpoint that does not fit the model stops the search (its error is raised).
    """
    skipped: List[CorruptCheckpointError] = []
    for step, path in reversed(found):
        try:
            value = read(path)
        except CorruptCheckpointError as exc:
            log(f"warning: {exc}; skipping it")
            skipped.append(exc)
            continue
        if skipped:
            log(f"warning: continuing from the previous complete checkpoint {path} (step {step}) "
                "instead of the corrupt one(s) after it")
        return path, value
    raise CheckpointError(
        f"none of the {len(found)} checkpoint(s) in {directory} reads back: the newest, {skipped[0]}. "
        "Restore the folder from a copy, or move the checkpoints away to train from step 0")


def _read_meta(path: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(path, META_FILE), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt ({META_FILE}: {_first_line(exc)})") from exc
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt ({META_FILE} is not a JSON object)")
    return meta


def _read_into(checkpoint: tf.train.Checkpoint, path: str, partial: bool) -> None:
    """Reads the checkpoint in ``path`` into ``checkpoint``'s objects.

    Raises:
      CorruptCheckpointError: the files do not read back in full.
      _Mismatch: they do, but do not fit (TensorFlow's ValueError for a shape,
        AssertionError for a missing variable, InvalidArgumentError for a dtype).
    """
    prefix = os.path.join(path, CHECKPOINT_PREFIX)
    try:
        status = checkpoint.read(prefix)
        if partial:
            status = status.expect_partial()
        status.assert_existing_objects_matched()
    except Exception as exc:  # noqa: BLE001 - the files decide whether this is damage or a mismatch
        # TensorFlow reports damaged files in many ways (IndexError for a short file, DataLossError
        # for a bad checksum, a bare OpError for a broken index): re-reading every tensor tells.
        damage = _damage(prefix)
        if damage is not None:
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt ({damage})") from exc
        if isinstance(exc, (tf.errors.OpError, AssertionError, ValueError)):
            raise _Mismatch(_first_line(exc)) from exc
        raise


def _damage(prefix: str) -> Optional[str]:
    """Why the checkpoint files at ``prefix`` do not read back (checksums included), or None when they do."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
    except Exception as exc:  # noqa: BLE001 - any failure to read is damage
        return _first_line(exc)
    return None


def _fsync_tree(folder: str) -> None:
    """Flushes every file below ``folder`` to disk, then the folders' entries."""
    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


@functools.lru_cache(maxsize=1)
def _renameat2() -> Optional[Any]:
    """libc's ``renameat2`` (Linux, glibc 2.28+), or None."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _exchange(a: str, b: str) -> bool:
    """Swaps the paths ``a`` and ``b`` in one atomic step; False where the system or file system cannot."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), a)


def _disk_full(exc: BaseException) -> bool:
    """True for an error of a full disk or quota, as Python (``OSError``) or TensorFlow (text only) reports it."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def _folder_bytes(folder: Optional[str]) -> int:
    total = 0
    for root, _, names in os.walk(folder or ""):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _size(n: float) -> str:
    """``n`` bytes for a message: ``1.3 GB``, ``12.0 MB``, ``4 KB``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def load_model(model_dir: str, checkpoint: Optional[str] = None, merge_adapters: bool = True,
               log: Optional[Log] = None):
    """Rebuilds a trained model from its model directory, for generation and evaluation.

    A LoRA run (``lora_rank`` > 0) is its base, read from the ``init_from``
    folder again, with the checkpoint's adapters: merged into the base's
    kernels (a plain model) unless ``merge_adapters`` is False.

    Without ``checkpoint`` the newest checkpoint that reads back is loaded: a
    corrupt newer one is named on ``log`` (default stderr) and skipped, as a
    resumed training run does. A ``checkpoint`` asked for by name is never
    replaced by another one.

    Args:
      model_dir: the ``--model_dir`` of a training run (single-process or
        distributed: both write the same layout).
      checkpoint: a specific ``ckpt-<step>`` folder; default the newest readable one.
      merge_adapters: a LoRA run's adapters merged (True) or kept apart.
      log: where a skipped corrupt checkpoint is named (default: a line on stderr).

    Returns:
      ``(model, tokenizer, config)``: the tokenizer the run saved (a PTB
      run's vocabulary as a word tokenizer, ``lmkit.data.tokenizer_of_run``).

    Raises:
      UsageError: no config, tokenizer or checkpoint in ``model_dir``, or a
        model class that cannot be imported.
      CorruptCheckpointError: ``checkpoint`` does not read back.
      CheckpointError: weights that do not fit the stored config (another run's
        checkpoint), or no checkpoint of ``model_dir`` reads back.
    """
    from lmkit.config import TrainConfig
    from lmkit.data.tokenizers import tokenizer_of_run
    from lmkit.layers.lora import lora_of, merge_lora
    from lmkit.models.build import build_run_model

    config = TrainConfig.from_dict(read_config_dict(model_dir), source=f"{model_dir}/{CONFIG_FILE}")
    tokenizer = tokenizer_of_run(model_dir)
    # A LoRA run's checkpoints hold its adapters alone: the base comes from init_from.
    model = build_run_model(config, load_pretrained=bool(config.adapters.lora_rank))
    lora = lora_of(model)
    _read_weights(tf.train.Checkpoint(model=model if lora is None else lora), model_dir, checkpoint, log)
    if merge_adapters:
        merge_lora(model)
    return model, tokenizer, config


def _read_weights(ckpt: tf.train.Checkpoint, model_dir: str, checkpoint: Optional[str], log: Optional[Log]) -> None:
    """Reads ``checkpoint`` (by name: never another one), else the newest readable checkpoint of ``model_dir``."""
    from lmkit.core.progress import stderr_line

    directory = os.path.join(model_dir, CHECKPOINT_DIR)

    def read(path: str) -> None:
        try:
            _read_into(ckpt, path, partial=True)
        except _Mismatch as exc:  # weights that do not fit config.json: another run's checkpoint
            raise CheckpointError(f"the checkpoint {path} does not match {model_dir}/{CONFIG_FILE} "
                                  f"({str(exc)[:200]}); pass a --checkpoint of this run, or the "
                                  "--model_dir of the run that wrote it") from None

    if checkpoint is not None:
        try:
            read(checkpoint)
        except CorruptCheckpointError as exc:  # asked for by name: never replaced by another one
            others = [os.path.basename(p) for _, p in complete_checkpoints(directory)]
            raise CorruptCheckpointError(f"{exc}; pass another --checkpoint (those in {directory}: "
                                         f"{', '.join(others) or 'none'}) or none for the newest readable "
                                         "one") from None
        return
    found = complete_checkpoints(directory)
    if not found:
        raise UsageError(f"{directory} holds no complete checkpoint; train first or pass another --model_dir")
    _newest_readable(found, read, log or stderr_line, directory)
