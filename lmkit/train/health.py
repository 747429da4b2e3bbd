"""The steps' results read back from the device, and the checks that stop a run that cannot go on.

Reading a step's loss back waits for the device, so the loop keeps the
results of the last few steps pending and reads them together (every
``log_every_steps`` steps, at an epoch's end, before a checkpoint). Their
losses are the ranks' average, so every rank raises at the same step:

* a non-finite loss or gradient (with ``mixed_float16``: ``max_consecutive_skips``
  of them in a row) is a :class:`~lmkit.core.errors.NonFiniteError`;
* so is a loss above ``divergence_factor x ln(vocab_size)`` per token for
  ``divergence_steps`` steps in a row (a uniform guess scores ``ln(vocab_size)``).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

from lmkit.core.errors import NonFiniteError

__all__ = ["PendingSteps", "divergence_bound"]


def divergence_bound(config: Any) -> float:
    """The loss per token above which a step counts towards divergence (inf: the check is off)."""
    factor = config.run.divergence_factor
    return factor * math.log(max(config.model.get("vocab_size"), 2)) if factor > 0 else math.inf


class PendingSteps:
    """The results of the steps not yet read back, and the checks on them.

    Args:
      config: the run's config (``run.divergence_factor``, ``run.divergence_steps``, ``model``'s vocab_size).
      loss_tokens: a step's loss divided by it is per token (a window's ``num_steps``, 1 for pairs).
      loss_scale: the ``mixed_float16`` loss scale, or None.
    """

    def __init__(self, config: Any, loss_tokens: int, loss_scale: Any = None) -> None:
        self.config = config
        self.loss_tokens = loss_tokens
        self.loss_scale = loss_scale
        self.bound = divergence_bound(config)
        self.diverging = 0  # steps in a row with a loss above the bound
        self._pending: List[Any] = []  # (loss, finite, applied) tensors

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, result: Any) -> None:
        """Keeps a step's :class:`~lmkit.train.records.StepResult` to read later."""
        self._pending.append((result.loss, result.finite, result.applied))

    def read(self, epoch: int, last_index: int) -> List[Optional[float]]:
        """Reads every pending step (None for a skipped one); the last is step ``last_index`` (0-based) of
        ``epoch``.

        Raises:
          NonFiniteError: a step's loss or gradients were not finite, or the loss diverged.
        """
        pending, self._pending = self._pending, []
        values: List[Optional[float]] = []
        for k, (loss, finite, applied) in enumerate(pending):
            value, applied = float(loss), bool(applied)
            where = f"at epoch {epoch + 1}, step {last_index - len(pending) + 1 + k + 1}"
            if applied and math.isfinite(value):  # a window's loss sums its num_steps positions
                self._count_divergence(value / self.loss_tokens, where)
            if not bool(finite) or (applied and not math.isfinite(value)):
                raise self._non_finite(value, where)
            values.append(value if applied else None)
        return values

    def _count_divergence(self, per_token: float, where: str) -> None:
        self.diverging = self.diverging + 1 if per_token > self.bound else 0
        run = self.config.run
        if self.diverging >= run.divergence_steps:
            raise NonFiniteError(
                f"the loss diverged: {self.diverging} steps in a row above {self.bound:.2f} per token "
                f"(divergence_factor {run.divergence_factor:g} x ln(vocab_size "
                f"{self.config.model.get('vocab_size')}); a uniform guess scores "
                f"{self.bound / run.divergence_factor:.2f}), "
                f"the last {per_token:.4g}, {where}; training "
                "stopped and the last good checkpoint stays the latest. Lower the learning rate or "
                "max_grad_norm, or check the data (divergence_factor = 0 turns this check off)")

    def _non_finite(self, value: float, where: str) -> NonFiniteError:
        if self.loss_scale is not None:
            return NonFiniteError(
                f"{self.loss_scale.max_consecutive_skips} steps in a row had non-finite gradients "
                f"(loss {value}) {where}, although the loss scale fell to "
                f"{float(self.loss_scale.scale.numpy()):g}; none was applied and the last good "
                "checkpoint stays the latest. Lower the learning rate or max_grad_norm, check "
                "the data, or train with precision = 'mixed_bfloat16' or 'float32'")
        return NonFiniteError(
            f"non-finite loss or gradient (loss {value}) {where}; the update was not applied and "
            "the last good checkpoint stays the latest. Lower the learning rate or max_grad_norm, "
            "or check the data")
