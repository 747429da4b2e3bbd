"""What a run tells: rank 0's log lines, the TensorBoard summaries and ``results.json``.

Rank 0 alone reports (the others' ``log`` prints nothing and they write no
file); nothing here is a collective, so it may run on rank 0's path alone.
The lines:

* at the start, ``training <Model> on N worker(s): global batch ...`` (and
  ``resumed from <checkpoint> (epoch E, step S...)``);
* ``compiled the training step in T s`` after the first step;
* inside an epoch, a progress bar (``epoch e/E step i/n ppl P T tokens/s``),
  or for a plan in steps ``step S/N | loss L | lr R | T tokens/s | MFU M% | eta E``
  (:class:`~lmkit.train.metrics.StepLines`);
* ``step S/N | val loss L | val ppl P`` for every ``eval_every_steps`` evaluation;
* ``Epoch e/E: lr R | train ppl P | valid ppl P | T tokens/sec (N worker(s)) | ...``;
* ``Test perplexity: P`` at the end.

The scalars go to ``<model_dir>/tensorboard`` (``train/perplexity``,
``train/learning_rate``, ``train/tokens_per_sec``, ``valid/perplexity``,
their per-word forms, ``valid/loss``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from lmkit.core.fileio import atomic_write_text
from lmkit.core.layout import RESULTS_FILE, TENSORBOARD_DIR
from lmkit.train.metrics import ProgressBar, StepLines, Summaries, perplexity
from lmkit.train.records import EpochRun, EpochStats, TrainResult

__all__ = ["Flops", "Reporter", "epoch_line", "epoch_summaries"]


@dataclass(frozen=True)
class Flops:
    """The model's FLOPs per token (None for encoder-decoders) and one device's peak (None when unknown)."""

    per_token: Optional[float] = None
    peak_tflops: Optional[float] = None
    peak_source: str = ""


def epoch_line(stats: EpochStats, epochs: int, world: int) -> str:
    """``Epoch e/E: lr R | train ppl P | valid ppl P | ... tokens/sec (N worker(s)) | epoch time ...``."""
    valid_text = "-" if stats.valid_perplexity is None else f"{stats.valid_perplexity:.2f}"
    scaling = ("" if stats.loss_scale is None else
               f" | loss scale {stats.loss_scale:g}, {stats.skipped_steps} step(s) skipped")
    if stats.model_tflops is not None:
        scaling += f" | model {stats.model_tflops:.3g} TFLOP/s" + (
            "" if stats.mfu is None else f", MFU {100 * stats.mfu:.1f}%")
    return (f"Epoch {stats.epoch}/{epochs}: lr {stats.learning_rate:.4g} | train ppl {stats.train_perplexity:.2f}"
            f"{per_word_text(stats.train_word_perplexity)} | valid ppl {valid_text}"
            f"{per_word_text(stats.valid_word_perplexity)} | {stats.tokens_per_sec:.0f} "
            f"tokens/sec ({world} worker(s)) | epoch time {stats.epoch_time:.1f} s | "
            f"cumulative training time {stats.cumulative_time:.1f} s{scaling}")


def epoch_summaries(stats: EpochStats) -> Dict[str, Optional[float]]:
    """The TensorBoard scalars of an epoch (None: not written)."""
    return {"train/perplexity": stats.train_perplexity, "train/learning_rate": stats.learning_rate,
            "train/tokens_per_sec": stats.tokens_per_sec, "train/word_perplexity": stats.train_word_perplexity,
            "valid/perplexity": stats.valid_perplexity, "valid/word_perplexity": stats.valid_word_perplexity}


def per_word_text(value: Optional[float]) -> str:
    return "" if value is None else f" (per word {value:.2f})"


class Reporter:
    """A run's log lines, TensorBoard summaries and ``results.json`` (rank 0 writes; elsewhere they are no-ops).

    Args:
      config: the run's config.
      log: prints a line on rank 0 (and nothing elsewhere).
      world: the run's replicas.
      loss_tokens: a step's loss divided by it is per token.
      flops: the model's FLOPs per token and the device's peak (:class:`Flops`).
    """

    def __init__(self, config: Any, log: Callable[[str], None], world: int, loss_tokens: int,
                 flops: Flops = Flops()) -> None:
        self.config, self.log, self.world, self.loss_tokens, self.flops = config, log, world, loss_tokens, flops
        self.summaries = Summaries(None)
        self.chief = False  # whether this rank writes (open())
        self.step_lines: Optional[StepLines] = None  # a run planned in steps prints these
        self.tokens_per_word: Dict[str, float] = {}

    def open(self, model_dir: Optional[str], chief: bool, streams: Mapping[str, Any],
             words: Mapping[str, int]) -> None:
        """Opens rank 0's summaries in ``model_dir``; ``words`` of each stream give perplexities per word."""
        self.chief = chief
        self.summaries = Summaries(os.path.join(model_dir, TENSORBOARD_DIR) if chief and model_dir else None)
        self.tokens_per_word = {k: len(streams[k]) / n for k, n in words.items()
                                if streams.get(k) is not None and n}

    def resumed(self, path: str, progress: Any, steps_in_epoch: int) -> None:
        epoch = int(progress.epoch.numpy())
        self.log(f"resumed from {path} (epoch {epoch}, step {int(progress.global_step.numpy())}"
                 + (f", {steps_in_epoch} steps into epoch {epoch + 1}" if steps_in_epoch else "")
                 + f") on {self.world} worker(s)")

    def announce(self, model: Any, batching: Mapping[str, Any], steps_per_epoch: int, start_epoch: int,
                 epochs: int) -> None:
        """Says what the run trains and sets up the step lines of a plan in steps.

        ``batching``: ``local_batch``, ``micro_batch`` and ``unit`` (what a batch's rows are).
        """
        cfg, planned = self.config, self.config.planned_steps
        peak = self.flops.peak_tflops
        self.step_lines = None if planned is None else StepLines(
            planned, cfg.run.log_every_steps, self.log, self.flops.per_token, peak * self.world if peak else None)
        accum_steps, precision = cfg.optimization.grad_accum_steps, cfg.compute.precision
        accum = f" = {accum_steps} micro-batches of {batching['micro_batch']}" if accum_steps > 1 else ""
        self.log(f"training {type(model).__name__} on {self.world} worker(s): global batch "
                 f"{cfg.data.batch_size} ({batching['local_batch']} per worker{accum}) {batching['unit']}, "
                 f"{steps_per_epoch} steps/epoch, "
                 + (f"epochs {start_epoch + 1}..{epochs}" if planned is None else
                    f"{planned} steps ({planned * cfg.tokens_per_step:,} tokens; {epochs} epoch(s))")
                 + ("" if precision == "float32" else f", precision {precision}"))

    def compiled(self, seconds: float, compilation: Any, declined: Any = ()) -> None:
        """Says that the first step traced and compiled in ``seconds`` (not training speed)."""
        kernel = "" if compilation.attention_kernel == "matmul" else f" ({compilation.attention_kernel} attention)"
        self.log(f"compiled the training step{' with XLA' if compilation.xla else ''}{kernel} in {seconds:.1f} s")
        for line in declined:
            self.log(line)

    def progress_bar(self, epoch: int, epochs: int, steps_per_epoch: int, chief: bool) -> ProgressBar:
        """The epoch's progress bar (shown on rank 0 when the run is planned in epochs)."""
        return ProgressBar(steps_per_epoch, f"epoch {epoch + 1}/{epochs}",
                           enabled=chief and self.step_lines is None, every=self.config.run.log_every_steps)

    def losses_read(self, applied_sum: float, applied: int) -> None:
        """Counts ``applied`` steps whose losses sum to ``applied_sum`` into the next step line."""
        if self.step_lines is not None:
            self.step_lines.add(applied_sum / self.loss_tokens, applied)

    def progress(self, bar: ProgressBar, run: EpochRun, position: Mapping[str, int], seconds: float,
                 lr: Callable[[], float]) -> None:
        """The epoch's progress bar, or in a plan in steps the step line (rank 0 prints).

        ``position``: ``done_in_epoch`` and ``step`` (global); ``lr`` reads the learning rate (a host read).
        """
        timed = run.steps - run.timed_from
        tokens_per_sec = run.tokens_per_step * timed / max(seconds, 1e-9)
        if self.step_lines is None:
            bar.update(position["done_in_epoch"], f"ppl {perplexity(run.token_loss(self.loss_tokens)):.2f} "
                       f"{tokens_per_sec:.0f} tokens/s")
        else:
            self.step_lines.show(position["step"], lr(), tokens_per_sec, timed / max(seconds, 1e-9))

    def validation(self, step: int, loss: float, result: TrainResult) -> None:
        """An evaluation every ``eval_every_steps``: its line, its scalars, its entry in the result."""
        result.validations.append({"step": step, "valid_loss": loss, "valid_perplexity": perplexity(loss)})
        total = self.config.planned_steps
        self.log(f"step {step}{'' if total is None else f'/{total}'} | val loss {loss:.4f} | "
                 f"val ppl {perplexity(loss):.2f}")
        self.summaries.write(step, {"valid/loss": loss, "valid/perplexity": perplexity(loss)})

    def epoch_stats(self, epoch: int, run: EpochRun, cumulative: float, valid_loss: Optional[float],
                    lr: float, loss_scale: Optional[float] = None) -> EpochStats:
        """What the epoch ``epoch`` (0-based) measured; ``valid_loss`` is rank 0's (None: not evaluated),
        ``loss_scale`` the ``mixed_float16`` scale at its end."""
        train_loss = run.token_loss(self.loss_tokens)
        tokens = run.tokens_per_step * (run.steps - run.timed_from)
        stats = EpochStats(
            epoch=epoch + 1, train_perplexity=perplexity(train_loss),
            valid_perplexity=None if valid_loss is None else perplexity(valid_loss),
            learning_rate=lr, tokens_per_sec=tokens / max(run.seconds, 1e-9), epoch_time=run.seconds,
            cumulative_time=cumulative, steps=run.steps,
            train_word_perplexity=self.word_perplexity(train_loss, "train"),
            valid_word_perplexity=None if valid_loss is None else self.word_perplexity(valid_loss, "valid"),
            skipped_steps=run.skipped, loss_scale=loss_scale)
        if self.flops.per_token is not None and run.steps > run.timed_from:
            stats.model_tflops = stats.tokens_per_sec * self.flops.per_token / 1e12
            if self.flops.peak_tflops:
                stats.mfu = stats.model_tflops / (self.flops.peak_tflops * self.world)
        return stats

    def epoch_end(self, stats: EpochStats, epochs: int, global_step: int, result: TrainResult) -> None:
        """The epoch's line and scalars, and its statistics in the result."""
        result.epochs.append(stats)
        self.log(epoch_line(stats, epochs, self.world))
        self.summaries.write(global_step, epoch_summaries(stats))

    def test(self, loss: float, result: TrainResult) -> None:
        result.test_perplexity = perplexity(loss)
        result.test_word_perplexity = self.word_perplexity(loss, "test")
        self.log(f"Test perplexity: {result.test_perplexity:.2f}" + per_word_text(result.test_word_perplexity))

    def word_perplexity(self, mean_token_loss: float, split: str) -> Optional[float]:
        ratio = self.tokens_per_word.get(split)
        return None if ratio is None else perplexity(mean_token_loss * ratio)

    def write_results(self, model_dir: Optional[str], result: TrainResult) -> None:
        """``results.json``: the config, the world size, the result and the FLOPs figures (rank 0 writes)."""
        if model_dir is None or not self.chief:
            return
        summary = {"config": self.config.to_dict(), "world_size": self.world, **result.to_dict(),
                   "flops_per_token": self.flops.per_token, "peak_tflops": self.flops.peak_tflops,
                   "peak_source": self.flops.peak_source}
        atomic_write_text(os.path.join(model_dir, RESULTS_FILE), json.dumps(summary, indent=2, sort_keys=True))
