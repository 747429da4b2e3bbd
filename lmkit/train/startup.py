"""What every rank checks before the first training step.

* :func:`check_agreement`: all ranks loaded the same config, vocabulary and
  data sizes (one collective, on every rank);
* :func:`prepare_model_dir`: rank 0 checks that the model folder is writable
  and fits this run (config and PTB vocabulary of an earlier run), then
  writes them; every rank learns the outcome. (A tokenizer is saved, and
  checked against the one asked for, when it is trained:
  :func:`lmkit.data.train_tokenizer`.)
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from lmkit import distributed as dist
from lmkit.config import ADAPTER_KEYS, stored_model_config
from lmkit.core.errors import CheckpointError, UsageError
from lmkit.core.fileio import atomic_write_text
from lmkit.core.layout import CONFIG_FILE, VOCAB_FILE, read_config_dict
from lmkit.data.vocab import Vocab

__all__ = ["check_agreement", "prepare_model_dir"]


def check_agreement(config: Any, vocab: Any, facts: Dict[str, Any]) -> None:
    """Raises on every rank when any rank's config, vocabulary or ``facts`` differ from rank 0's.

    Args:
      config: the run's ``TrainConfig``.
      vocab: the vocabulary or tokenizer (compared by ``fingerprint()``), or None.
      facts: more values that must agree (data sizes, steps per epoch).

    Raises:
      UsageError: naming every value that differs and the rank.
    """
    vocab_fp = vocab.fingerprint() if hasattr(vocab, "fingerprint") else None
    mine = {"config": config.to_dict(), "vocab": vocab_fp, **facts}
    everyone = dist.allgather_object(mine)  # same call on every rank
    first = everyone[0]
    for r, theirs in enumerate(everyone):
        if theirs != first:
            # Name every value that differs; configs are compared key by key.
            ours, other = _dotted(first["config"]), _dotted(theirs["config"])
            diffs = [f"config key {k} (rank 0: {ours.get(k)!r}, rank {r}: {other.get(k)!r})"
                     for k in sorted(set(ours) | set(other)) if ours.get(k) != other.get(k)]
            diffs += [f"{k} (rank 0: {first[k]!r}, rank {r}: {theirs[k]!r})"
                      for k in mine if k != "config" and theirs[k] != first[k]]
            raise UsageError(f"ranks disagree at start-up: rank {r} differs from rank 0 in "
                             f"{'; '.join(diffs)}; make every rank read the same config and data files")


def _dotted(config: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``config``'s values by dotted key: a section's ``{"optimization": {"learning_rate": 1}}`` as
    ``{"optimization.learning_rate": 1}`` (the spelling ``--set`` takes)."""
    flat: Dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and not prefix:
            flat.update(_dotted(value, f"{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _check_writable(model_dir: str) -> None:
    try:
        os.makedirs(model_dir, exist_ok=True)
        probe = os.path.join(model_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise UsageError(f"model directory {model_dir} is not writable ({exc.strerror}); "
                         "pass a --model_dir you can write to") from None


def _check_stored(model_dir: str, config: Any, vocab: Any) -> None:
    """An earlier run's config and vocabulary in ``model_dir`` must match this run's."""
    if os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        # The model's constructor arguments (as model_config() gives them) and its adapters.
        # A key an older lmkit did not store had its default then.
        theirs = stored_model_config(read_config_dict(model_dir), f"{model_dir}/{CONFIG_FILE}")
        # As config.json stores them (tuples as lists).
        adapters = {k: getattr(config.adapters, k) for k in ADAPTER_KEYS}
        mine = json.loads(json.dumps({**config.model_config(), **adapters}))
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if diff:
            k, (old, new) = sorted(diff.items())[0]
            raise CheckpointError(
                f"{model_dir} holds a model trained with {k} = {old!r}, but the config says {new!r}; "
                "use the same config to resume, or another --model_dir")
    vocab_path = os.path.join(model_dir, VOCAB_FILE)
    if isinstance(vocab, Vocab) and os.path.exists(vocab_path):
        stored_vocab = Vocab.load(vocab_path)
        if stored_vocab.fingerprint() != vocab.fingerprint():
            raise CheckpointError(
                f"{vocab_path} ({len(stored_vocab)} tokens) differs from the vocabulary of the "
                f"data ({len(vocab)} tokens); resume with the same data, or use another --model_dir")


def prepare_model_dir(model_dir: Optional[str], config: Any, vocab: Any) -> None:
    """Rank 0 checks and fills ``model_dir``; every rank raises its error. Call on every rank.

    Raises:
      UsageError: the folder is not writable.
      CheckpointError: it holds a run with another model shape or vocabulary.
    """
    if model_dir is None:
        return

    def check() -> None:
        _check_writable(model_dir)
        _check_stored(model_dir, config, vocab)
        atomic_write_text(os.path.join(model_dir, CONFIG_FILE), config.to_json())
        if isinstance(vocab, Vocab):  # a tokenizer saved itself when it was trained
            vocab.save(os.path.join(model_dir, VOCAB_FILE))

    dist.run_on_chief(check)
