"""What the trainer trains on: a task turns a run's data into batches, a batch into a loss, and evaluates.

The trainer (:mod:`lmkit.train.trainer`) is the same for every model; what
depends on the kind of data lives here, behind one small interface:

* :class:`LanguageModeling`: an id stream; a model that carries a state
  reads it as BPTT rows (:class:`~lmkit.data.batching.BpttBatches`), a
  stateless one as shuffled windows (:class:`~lmkit.data.windows.WindowBatches`);
  the loss of a step sums its ``num_steps`` positions (averaged over rows), or with
  ``loss_reduction = "mean"`` averages them (the loss per token).
* :class:`Transduction`: line-aligned source/target pairs
  (:class:`~lmkit.data.paired.Pairs`) for an encoder-decoder (a model with
  ``conditional = True``): length-bucketed batches
  (:class:`~lmkit.data.paired.PairBatches`), the model reads
  ``encode(source, mask)`` as its condition, and the loss of a step is the
  global batch's mean per target token.
* :class:`WeightedExamples`: conversations and completions as examples with
  a loss weight per token (:class:`~lmkit.data.examples.ExampleSet`), packed
  or padded (:mod:`lmkit.data.packing`); the loss of a step is the global
  batch's loss per weighted (assistant) token.

:func:`task_for` picks one from the model and the training data. Every task gives
``batches(data, epoch)`` (``len()`` steps, ``[i]`` = ``(inputs, targets)``,
nests of arrays split by rows), ``loss(inputs, targets, state, training)``,
``loss_tokens`` (a step's loss divided by it is per token), ``batch_unit``
(what a batch's rows are, for the log),
``tokens_per_step(batches)``, ``evaluator(...)`` (``mean_loss(data,
on_batch)``, one process) and ``check_eval_data(**data)``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.train.losses import sequence_softmax_cross_entropy, window_loss

__all__ = ["LanguageModeling", "Transduction", "WeightedBatches", "WeightedExamples", "task_for"]


class LanguageModeling:
    """Next-token prediction on an id stream (windows or BPTT rows, sharded by ``(rank, size)``)."""

    def __init__(self, model: Any, config: Any, rank: int, size: int) -> None:
        self.model, self.config, self.rank, self.size = model, config, rank, size
        self.stateful = bool(getattr(model, "stateful", False))
        self.reduction = config.optimization.loss_reduction
        self.loss_tokens = 1 if self.reduction == "mean" else config.data.num_steps
        self.batch_unit = f"x {config.data.num_steps} steps"  # for the start-up line
        self._bptt: Any = None  # a model with a state reads the same rows every epoch

    def reset(self) -> None:
        """Forgets the batches of an earlier ``fit``."""
        self._bptt = None

    def _check_stream(self, ids: Any) -> None:
        from lmkit.data.paired import Pairs
        if isinstance(ids, Pairs):
            raise UsageError(f"{type(self.model).__name__} is a language model, but source/target pairs train an "
                             "encoder-decoder: use model = 'transformer_seq2seq' or 'rnn_seq2seq' (config_seq2seq), "
                             "or give a language model an id stream")

    def batches(self, ids: np.ndarray, epoch: int) -> Any:
        from lmkit.data.batching import BpttBatches
        from lmkit.data.windows import WindowBatches

        self._check_stream(ids)
        cfg = self.config.data
        if self.stateful:
            if cfg.sampling != "windows":
                raise UsageError(f"sampling = {cfg.sampling!r} needs a model without a recurrent state "
                                 f"(a transformer); {type(self.model).__name__} reads the text in order: "
                                 "set sampling = 'windows'")
            if self._bptt is None:
                self._bptt = BpttBatches(ids, cfg.batch_size, cfg.num_steps, rank=self.rank, size=self.size)
            return self._bptt
        return WindowBatches(ids, cfg.batch_size, cfg.num_steps, epoch=epoch, seed=self.config.run.seed,
                             rank=self.rank, size=self.size, sampling=cfg.sampling)

    def tokens_per_step(self, batches: Any) -> float:
        return float(self.config.tokens_per_step)

    def loss(self, inputs: tf.Tensor, targets: tf.Tensor, state: Any, training: bool) -> Tuple[tf.Tensor, Any]:
        logits, new_state = self.model(inputs, state, training=training)  # [b, t, vocab], float32 logits
        return window_loss(targets, logits, self.reduction), new_state  # float32 under every precision

    def evaluator(self, batch_size: int, precision: str, jit_compile: bool, attention_kernel: str = "matmul") -> Any:
        from lmkit.train.evaluation import Evaluator
        return Evaluator(self.model, self.config.data.num_steps, batch_size, precision=precision,
                         jit_compile=jit_compile, attention_kernel=attention_kernel)

    def eval_sample(self, ids: Any, batches: int, batch_size: int) -> Any:
        """The first ``batches`` evaluation batches of ``ids`` (all when shorter): ``eval_steps``' sample."""
        return ids[:batch_size * (batches * self.config.data.num_steps + 1)]  # rows of batches x num_steps (+1 target)

    def check_eval_data(self, batch_size: int, **streams: Optional[np.ndarray]) -> None:
        """Evaluation data too small for one batch fails before training, on every rank."""
        from lmkit.data.batching import num_bptt_batches

        num_steps = self.config.data.num_steps
        for name, ids in streams.items():
            self._check_stream(ids)
            if ids is not None and num_bptt_batches(len(ids), batch_size, num_steps) < 1:
                raise UsageError(
                    f"the {name} data has {len(ids)} tokens, too few for one evaluation batch of "
                    f"{batch_size} rows x {num_steps} steps (needs {batch_size * (num_steps + 1)}); "
                    "give more text or set a smaller eval_batch_size")


class Transduction:
    """Target given source, for an encoder-decoder, on :class:`~lmkit.data.paired.Pairs`.

    Args:
      model: a conditional model (``encode(source, mask, training)`` and
        ``__call__(target_inputs, condition=, training=)``).
      config: the run's config (``data.batch_size``, ``run.seed``).
      special: the target side's :class:`~lmkit.data.paired.SpecialIds`.
    """

    loss_tokens = 1  # the loss of a step is already the mean per target token
    batch_unit = "pairs"

    def __init__(self, model: Any, config: Any, rank: int, size: int, special: Any) -> None:
        self.model, self.config, self.rank, self.size, self.special = model, config, rank, size, special

    def reset(self) -> None:
        pass

    def _check_pairs(self, pairs: Any, name: str = "training") -> None:
        from lmkit.data.paired import Pairs
        if pairs is not None and not isinstance(pairs, Pairs):
            raise UsageError(f"an encoder-decoder trains on lmkit.data.paired.Pairs (source/target pairs), but the "
                             f"{name} data is a {type(pairs).__name__}; read them with lmkit.data.paired "
                             "(read_pairs, encode_pairs) or train a language model on an id stream")

    def batches(self, pairs: Any, epoch: int) -> Any:
        from lmkit.data.paired import PairBatches
        self._check_pairs(pairs)
        return PairBatches(pairs, self.config.data.batch_size, self.special, epoch=epoch, seed=self.config.run.seed,
                           rank=self.rank, size=self.size)

    def tokens_per_step(self, batches: Any) -> float:
        return batches.tokens_per_step

    def loss(self, inputs: Any, targets: Any, state: Any, training: bool) -> Tuple[tf.Tensor, Any]:
        source, source_mask, target_inputs = inputs
        target_outputs, weights = targets
        condition = self.model.encode(source, source_mask, training=training)
        logits, _ = self.model(target_inputs, condition=condition, training=training)
        # The weights hold batch_size / (the global batch's target tokens): the mean over rows of
        # the weighted sums is the global batch's mean loss per token, on any number of ranks.
        loss = sequence_softmax_cross_entropy(target_outputs, logits, mask=weights, average_across_batch=True,
                                              sum_over_timesteps=True)
        return loss, None

    def evaluator(self, batch_size: int, precision: str, jit_compile: bool, attention_kernel: str = "matmul") -> Any:
        from lmkit.train.evaluation import PairEvaluator
        return PairEvaluator(self.model, batch_size, self.special, precision=precision, jit_compile=jit_compile,
                             attention_kernel=attention_kernel)

    def eval_sample(self, pairs: Any, batches: int, batch_size: int) -> Any:
        """The first ``batches * batch_size`` pairs (all when fewer): ``eval_steps``' fixed sample."""
        from lmkit.data.paired import Pairs
        count = min(len(pairs), batches * batch_size)
        return Pairs([pairs.source[i] for i in range(count)], [pairs.target[i] for i in range(count)], pairs.report)

    def check_eval_data(self, batch_size: int, **pairs: Any) -> None:
        """The evaluation data are pairs (any number of them: the last batch is filled up)."""
        for name, data in pairs.items():
            self._check_pairs(data, name)


class WeightedExamples:
    """Examples with a loss weight per target (conversations, completions: :mod:`lmkit.data.chat`), on an
    :class:`~lmkit.data.examples.ExampleSet`: packed rows (``data.packing``) or one example a row, padded.

    A batch is ``((ids, positions, segment_ids), (targets, weights))`` when packed (the model attends within
    each example, positions restarting) and ``((ids,), (targets, weights))`` when padded. ``weights`` hold
    each target's weight times ``R / W``, ``R`` the global batch's rows (``batch_size``; a multiple of it for
    a packed batch of a shorter window, :func:`lmkit.data.packing.window_lengths`) and ``W`` its weight
    (``weighted_tokens``, known on every rank from the batch itself: no collective); the loss is the mean
    over rows of the weighted sums, so the mean over micro-batches and ranks is the global batch's loss per
    weighted token, however the rows are split. A batch with no weight has weights 0: loss and gradient 0.
    """

    loss_tokens = 1  # the loss of a step is already the mean per weighted token

    def __init__(self, model: Any, config: Any, rank: int, size: int) -> None:
        self.model, self.config, self.rank, self.size = model, config, rank, size
        self.packing = bool(config.data.packing)
        self._layouts: Dict[Any, Any] = {}  # example set -> its PackLayout
        if getattr(model, "stateful", False):
            raise UsageError(f"{type(model).__name__} carries a recurrent state, but examples with loss weights "
                             "(conversations, completions) train a transformer: use a transformer model")
        self.batch_unit = (f"x {config.data.num_steps} steps, examples packed" if self.packing else
                           f"examples, padded (at most {config.data.num_steps} steps)")

    def reset(self) -> None:
        pass

    def _check_examples(self, examples: Any, name: str = "training") -> None:
        from lmkit.data.examples import ExampleSet
        if examples is not None and not isinstance(examples, ExampleSet):
            raise UsageError(f"the {name} data is a {type(examples).__name__}, but a run on conversations or "
                             "completions reads examples (lmkit.data.examples.ExampleSet) in every split; give "
                             "every split in the same format")

    def batches(self, examples: Any, epoch: int) -> Any:
        from lmkit.data.packing import PackedBatches, PaddedBatches
        self._check_examples(examples)
        cfg = self.config.data
        if self.packing:
            rows = PackedBatches(examples, cfg.batch_size, cfg.num_steps, epoch=epoch, seed=self.config.run.seed,
                                 rank=self.rank, size=self.size, layout=self._layout(examples))
        else:
            rows = PaddedBatches(examples, cfg.batch_size, cfg.num_steps, epoch=epoch, seed=self.config.run.seed,
                                 rank=self.rank, size=self.size)
        return WeightedBatches(rows, cfg.batch_size, self.packing)

    def _layout(self, examples: Any) -> Any:
        """The packed rows' :class:`~lmkit.data.packing.PackLayout` for ``examples``: the cheapest for this model
        (:func:`lmkit.data.packing.cheapest_packing`), chosen once per example set."""
        from lmkit.data.packing import cheapest_packing, window_lengths
        key = (id(examples), len(examples))
        if key not in self._layouts:
            cfg = self.config.data
            self._layouts[key] = cheapest_packing(examples, cfg.batch_size, cfg.num_steps, windows=cfg.pack_windows,
                                                  seed=self.config.run.seed,
                                                  position_cost=lambda w: position_cost(self.model, w))
            windows = window_lengths(cfg.num_steps, self._layouts[key].windows)
            if len(windows) > 1:  # the start-up line says so
                self.batch_unit = (f"x {cfg.num_steps} steps, examples packed in rows of "
                                   f"{', '.join(str(w) for w in windows)} positions (a batch of rows of "
                                   f"{cfg.num_steps} / m has m times the rows)")
        return self._layouts[key]

    def tokens_per_step(self, batches: Any) -> float:
        return batches.tokens_per_step

    def loss(self, inputs: Any, targets: Any, state: Any, training: bool) -> Tuple[tf.Tensor, Any]:
        if self.packing:
            ids, positions, segment_ids = inputs
            logits, _ = self.model(ids, training=training, positions=positions, segment_ids=segment_ids)
        else:
            logits, _ = self.model(inputs[0], training=training)  # [b, t, vocab], float32 logits
        target_ids, weights = targets
        # sum over time of weight * loss (float32), mean over rows: see the class's docstring
        return sequence_softmax_cross_entropy(target_ids, logits, mask=weights, average_across_batch=True,
                                              sum_over_timesteps=True), None

    def evaluator(self, batch_size: int, precision: str, jit_compile: bool, attention_kernel: str = "matmul") -> Any:
        from lmkit.train.evaluation import ExampleEvaluator
        return ExampleEvaluator(self.model, self.config.data.num_steps, batch_size, precision=precision,
                                jit_compile=jit_compile, attention_kernel=attention_kernel)

    def eval_sample(self, examples: Any, batches: int, batch_size: int) -> Any:
        """The first ``batches * batch_size`` examples (all when fewer): ``eval_steps``' fixed sample."""
        return examples.subset(np.arange(min(len(examples), batches * batch_size)))

    def check_eval_data(self, batch_size: int, **examples: Any) -> None:
        """The evaluation data are examples (any number of them: the last batch is filled up)."""
        for name, data in examples.items():
            self._check_examples(data, name)


class WeightedBatches:
    """An epoch's batches of :class:`WeightedExamples`: ``len()`` steps, ``[i]`` = ``(inputs, targets)``.

    Args:
      rows: :class:`~lmkit.data.packing.PackedBatches` or :class:`~lmkit.data.packing.PaddedBatches`.
      batch_size: the global batch, in rows.
      packing: whether the inputs carry positions and segment ids.
    """

    def __init__(self, rows: Any, batch_size: int, packing: bool) -> None:
        self.rows, self.batch_size, self.packing = rows, int(batch_size), packing
        self.weighted_tokens = rows.weighted_tokens  # [steps]: every rank's weight of each global batch
        lengths = rows.examples.lengths
        ids = [sum(int(lengths[i]) for row in batch for i in row) for batch in rows.groups]
        #: ids of the global batch a step reads, padding left out (the log's tokens/sec)
        self.tokens_per_step = float(np.mean(ids)) if ids else 0.0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Tuple[Tuple[np.ndarray, ...], Tuple[np.ndarray, np.ndarray]]:
        rows = self.rows[i]
        total = float(self.weighted_tokens[i])
        global_rows = len(self.rows.groups[i % len(self)])  # batch_size, or a multiple: a shorter packed window
        scale = np.float32(global_rows / total if total > 0 else 0.0)  # all masked: no loss, no gradient
        targets = (rows.targets, rows.weights * scale)
        if self.packing:
            return (rows.inputs, rows.positions, rows.segment_ids), targets
        return (rows.inputs,), targets


#: What a window's attention costs per position against its FLOPs (``12 x layers x window x width``), for
#: choosing packed rows' windows: 1, the FLOPs. On 2 CPU cores a position of a row of 64 cost 0.70x one of a
#: row of 256 (the benchmark's tiny Qwen2), where the FLOPs say 0.79x (``window_costs`` in
#: benchmarks/results/chat_packing.json): priced at its FLOPs, a short window is chosen only when its rows
#: are nearly as full.
ATTENTION_COST = 1.0


def position_cost(model: Any, window: int) -> float:
    """A training step's cost per position of ``model`` in windows of ``window``: its FLOPs per token
    (:func:`lmkit.train.flops.flops_per_token`), the attention's weighed by :data:`ATTENTION_COST`; the
    matmul parameters' count alone when the model has no attention."""
    from lmkit.train.flops import attention_flops_per_token, flops_per_token
    attention = attention_flops_per_token(model, window)
    return float(flops_per_token(model, window) or 0.0) + (ATTENTION_COST - 1.0) * attention


def task_for(model: Any, config: Any, vocab: Any, rank: int, size: int, data: Any = None) -> Any:
    """The task of ``model`` (and of the training ``data``, when given): :class:`Transduction` for a conditional
    model, :class:`WeightedExamples` for examples with loss weights, else :class:`LanguageModeling`.

    Raises:
      UsageError: a conditional model without a tokenizer that has start, end and padding ids
        (a DataError naming the missing ids).
    """
    if getattr(model, "conditional", False):
        from lmkit.data.paired import SpecialIds
        if vocab is None:
            raise UsageError("an encoder-decoder trains with its target tokenizer: pass vocab=<the tokenizer> "
                             "(its start, end and padding ids frame the targets)")
        return Transduction(model, config, rank, size, SpecialIds.of(vocab))
    from lmkit.data.examples import ExampleSet
    if isinstance(data, ExampleSet):
        return WeightedExamples(model, config, rank, size)
    return LanguageModeling(model, config, rank, size)
