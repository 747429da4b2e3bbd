"""Token-id prompts in, results out: the batch every sampler decodes and what a decode returns.

:func:`prepare_prompts` checks the prompts against the model (their ids,
their lengths) and pads them into one :class:`PromptBatch`;
:class:`DecodeResult` is what a decode returns. The ranges of the settings
themselves are :class:`~lmkit.decoding.config.GenerationConfig`'s. NumPy only.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import check_setting

__all__ = ["DecodeResult", "EndIds", "PromptBatch", "check_seed", "end_ids", "prepare_prompts"]

#: What ends a sequence: None, one token id, or several (a Hugging Face ``generation_config.json``
#: may list an end of text and an end of turn).
EndIds = Union[None, int, Sequence[int]]


# eq=False: the fields are arrays, which have no single truth value.
@dataclasses.dataclass(frozen=True, eq=False)
class DecodeResult:
    """Output of :func:`decode` (NumPy arrays).

    Attributes:
      ids: int32 `[batch, max_length]`, prompt then generated tokens, then
        ``pad_id`` after ``<eos>``.
      lengths: int32 `[batch]`, tokens before the padding (prompt and the
        ``<eos>`` included).
      prompt_lengths: int32 `[batch]`, tokens of ``ids`` that came from the prompt.
      log_probs: float32 `[batch]`, the model's log-probability of the generated
        tokens (not the prompt), from the untempered softmax.
      seed: the seed used (drawn at random when none was given), so a sampled
        output can be reproduced; None for beam search.
    """

    ids: np.ndarray
    lengths: np.ndarray
    prompt_lengths: np.ndarray
    log_probs: np.ndarray
    seed: Optional[int]

    def sequences(self, include_prompt: bool = True) -> List[List[int]]:
        """The unpadded sequences as lists of ids."""
        out = []
        for row, length, start in zip(self.ids, self.lengths, self.prompt_lengths):
            out.append(row[0 if include_prompt else start:length].tolist())
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class PromptBatch:
    """The prompts of one decode, padded, with what ends and pads each row: what a sampler's
    :meth:`~lmkit.decoding.sampler.Sampler.generate` decodes.

    Attributes:
      ids: int32 `[batch, max_length]`, each prompt padded with ``pad_id``.
      lengths: int32 `[batch]`, the prompts' lengths.
      pad_id: the token after the end of a sequence.
      ends: the ids that end a sequence (none: each row runs to ``max_length``).
      min_new_tokens: int32 `[batch]`, tokens each row generates before an end may be chosen.
    """

    ids: np.ndarray
    lengths: np.ndarray
    pad_id: int
    ends: Tuple[int, ...] = ()
    min_new_tokens: Optional[np.ndarray] = None

    @property
    def max_length(self) -> int:
        """The length of every output row, the prompt included."""
        return int(self.ids.shape[1])

    @property
    def holds_ends(self) -> bool:
        """Whether some row must generate tokens before an end id may come."""
        return bool(self.ends) and self.min_new_tokens is not None and bool(np.any(self.min_new_tokens > 0))


def check_seed(seed: Optional[int]) -> int:
    """``seed``, or one drawn at random when None.

    Raises:
      UsageError: not an integer in [0, 2**63).
    """
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    return int(check_setting("seed", seed))


def end_ids(eos_id: EndIds) -> Tuple[int, ...]:
    """``eos_id`` as a tuple of distinct ids, in the order given (None: the empty tuple).

    Raises:
      UsageError: not an id, or an empty list.
    """
    if eos_id is None:
        return ()
    check_setting("eos_id", list(eos_id) if isinstance(eos_id, np.ndarray) else eos_id)
    ids = list(eos_id) if isinstance(eos_id, (list, tuple, np.ndarray)) else [eos_id]
    return tuple(dict.fromkeys(int(i) for i in ids))


class _Vocabulary:
    """The model's ids, for messages that name a bad one."""

    def __init__(self, model: Any) -> None:
        self.size = int(model.vocab_size)

    def check(self, name: str, value: Optional[int]) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < self.size:
            raise UsageError(f"{name} = {value!r} is not a token id of the model "
                             f"(vocab_size {self.size}); use an id in [0, {self.size})")


def _rows(prompts: Optional[Sequence[Sequence[int]]], batch_size: Optional[int], first: Optional[int],
          start_id: Optional[int]) -> List[List[int]]:
    """Each row's ids before padding: the prompt after ``start_id``, or ``first`` alone without prompts."""
    if prompts is None:
        if batch_size is None:
            raise UsageError("give batch_size or prompts")
        if first is None:
            raise UsageError("without prompts every sequence needs a first token; "
                             "pass start_id (or eos_id, whose first id is then used as the start)")
        return [[first]] * int(batch_size)
    if isinstance(prompts, (str, bytes)) or any(isinstance(p, (int, np.integer)) for p in prompts):
        raise UsageError("prompts must be a list of token-id lists, one per sequence; "
                         "wrap a single prompt: prompts=[[...]]")
    rows = [([] if start_id is None else [start_id]) + [int(i) for i in p] for p in prompts]
    if batch_size is not None and batch_size != len(rows):
        raise UsageError(f"batch_size = {batch_size} but {len(rows)} prompts were given; "
                         f"drop batch_size or pass one prompt per sequence")
    return rows


def prepare_prompts(model: Any,
                    max_length: int,
                    *,
                    batch_size: Optional[int],
                    prompts: Optional[Sequence[Sequence[int]]],
                    eos_id: EndIds,
                    start_id: Optional[int],
                    pad_id: Optional[int]) -> Tuple[np.ndarray, np.ndarray, int]:
    """Checks the prompts and the ids against the model and pads the prompts into one array.

    Returns:
      ``(prompt_ids, prompt_lengths, pad_id)``: int32 `[batch, max_length]` prompts padded with ``pad_id``
      (default the first ``eos_id``, or 0), int32 `[batch]` their lengths, and the resolved ``pad_id``.

    Raises:
      UsageError: naming the bad argument.
    """
    vocabulary, ends = _Vocabulary(model), end_ids(eos_id)
    for end in ends:
        vocabulary.check("eos_id", end)
    vocabulary.check("start_id", start_id)
    vocabulary.check("pad_id", pad_id)
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise UsageError(f"max_length = {max_length!r} must be an integer >= 1")
    first_end = ends[0] if ends else None
    pad_id = (0 if first_end is None else first_end) if pad_id is None else pad_id
    rows = _rows(prompts, batch_size, first_end if start_id is None else start_id, start_id)
    for b, row in enumerate(rows if prompts is not None else []):
        if not row:
            raise UsageError(f"prompt {b} is empty; give it a first token or pass start_id")
        if len(row) > max_length:
            raise UsageError(f"prompt {b} has {len(row)} tokens (start_id included), more than "
                             f"max_length = {max_length}; raise max_length")
        for i in row:
            vocabulary.check(f"prompt {b} token", i)
    if not rows:
        raise UsageError(f"batch_size = {len(rows)} must be >= 1")
    prompt_ids = np.full((len(rows), max_length), pad_id, dtype=np.int32)
    for b, row in enumerate(rows):
        prompt_ids[b, :len(row)] = row
    return prompt_ids, np.array([len(r) for r in rows], dtype=np.int32), int(pad_id)
