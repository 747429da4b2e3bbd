"""A run's task: its data as batches (BPTT rows, shuffled or random windows) and a batch as a loss."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.helpers import assert_relatively_close
from tests.train.support import small_config as _config
from tests.train.support import stream as _ids


def test_stateless_models_train_on_shuffled_windows_a_new_order_each_epoch():
    from lmkit.data import bptt_arrays, window_arrays

    ids = _ids()
    for model, stateful in (("transformer", False), ("lstm", True)):
        cfg = _config(model=model, num_heads=2)
        trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
        first, second = trainer.epoch_arrays(ids, 0), trainer.epoch_arrays(ids, 1)
        if stateful:  # BPTT rows in order, the same every epoch
            np.testing.assert_array_equal(first[0], bptt_arrays(ids, 4, 5)[0])
            np.testing.assert_array_equal(first[0], second[0])
        else:
            np.testing.assert_array_equal(first[0], window_arrays(ids, 4, 5, epoch=0, seed=cfg.run.seed)[0])
            assert first[0].shape == second[0].shape and not np.array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1][:, :, :-1], first[0][:, :, 1:])  # targets: next ids


def test_random_offset_sampling_trains_a_transformer_and_is_refused_for_an_rnn():
    ids = _ids()
    cfg = _config(model="transformer", num_heads=2, sampling="random")
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    first, second = trainer.epoch_arrays(ids, 0), trainer.epoch_arrays(ids, 0)
    np.testing.assert_array_equal(first[0], second[0])  # a function of (seed, epoch): resumable
    assert first[0].shape[0] == (len(ids) - 1) // 5 // 4  # as many steps as fixed windows give
    result = trainer.fit(ids, num_epochs=1)
    assert result.epochs and np.isfinite(result.epochs[-1].train_perplexity)
    cfg = _config(model="lstm", sampling="random")
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    with pytest.raises(UsageError, match="sampling = 'random' needs a model without a recurrent state"):
        trainer.fit(ids, num_epochs=1)


def test_a_mean_loss_steps_a_window_length_less_far_and_reports_the_same_perplexity():
    """loss_reduction = "mean": the step's loss and SGD's update are 1/num_steps of the summed loss's (no
    clipping), and the perplexity reported is per token either way."""
    ids = _ids()
    deltas, losses, perplexities = {}, {}, {}
    for reduction in ("sum", "mean"):
        cfg = _config(model="transformer", num_heads=2, keep_prob=1.0, learning_rate=0.1, max_grad_norm=0.0,
                      loss_reduction=reduction)
        tf.random.set_seed(5)
        model = build_model(cfg.model_config())
        before = [v.numpy() for v in model.trainable_variables]
        result = Trainer(model, cfg, log=lambda s: None, record_step_losses=True).fit(ids, max_steps=1)
        deltas[reduction] = [v.numpy() - b for v, b in zip(model.trainable_variables, before)]
        losses[reduction], perplexities[reduction] = result.step_losses[0], result.epochs[-1].train_perplexity
    np.testing.assert_allclose(losses["sum"], 5 * losses["mean"], rtol=1e-5)  # num_steps = 5
    np.testing.assert_allclose(perplexities["sum"], perplexities["mean"], rtol=1e-5)
    assert any(np.abs(d).max() > 1e-4 for d in deltas["mean"])
    for summed, mean in zip(deltas["sum"], deltas["mean"]):
        np.testing.assert_allclose(summed, 5 * mean, rtol=1e-3, atol=1e-6)  # float32 rounding of w + dw - w


def test_the_task_follows_the_model_and_refuses_data_of_the_other_kind():
    from lmkit.train.tasks import LanguageModeling, Transduction, task_for
    from tests.scripts.train_probe import ProbeSpecials, probe_pairs

    lm = task_for(build_model(_config().model_config()), _config(), None, 0, 1)
    assert isinstance(lm, LanguageModeling) and lm.loss_tokens == 5 and lm.batch_unit == "x 5 steps"
    assert task_for(build_model(_config().model_config()), _config(loss_reduction="mean"), None, 0, 1).loss_tokens == 1
    with pytest.raises(UsageError, match="is a language model, but source/target pairs train an encoder-decoder"):
        lm.batches(probe_pairs(8), 0)
    seq2seq = dict(model="transformer_seq2seq", data="pairs", source_file="s", target_file="t", source_vocab_size=50,
                   vocab_size=50, share_embeddings=True, max_positions=16, max_source_positions=16, num_heads=2)
    cfg = _config(**seq2seq)
    model = build_model(cfg.model_config())
    with pytest.raises(UsageError, match="an encoder-decoder trains with its target tokenizer: pass vocab="):
        task_for(model, cfg, None, 0, 1)
    pairs = task_for(model, cfg, ProbeSpecials(), 0, 1)
    assert isinstance(pairs, Transduction) and pairs.loss_tokens == 1
    with pytest.raises(UsageError, match="an encoder-decoder trains on lmkit.data.paired.Pairs .* the training data "
                                         "is a ndarray"):
        pairs.batches(_ids(), 0)
    assert len(pairs.eval_sample(probe_pairs(20), 2, 4)) == 8  # eval_steps batches of pairs


def test_the_evaluation_sample_and_too_little_evaluation_data():
    from lmkit.train.tasks import task_for
    lm = task_for(build_model(_config().model_config()), _config(), None, 0, 1)
    assert len(lm.eval_sample(_ids(), 2, 4)) == 4 * (2 * 5 + 1)  # rows of 2 windows of 5, and their targets
    with pytest.raises(UsageError, match=r"the valid data has 20 tokens, too few for one evaluation batch of 4 rows "
                                         r"x 5 steps \(needs 24\)"):
        lm.check_eval_data(4, valid=_ids(20), test=None)


# ------------------------------------------------------------------ examples with loss weights
def _examples(count=10, seed=4):
    from lmkit.data.chat import Example
    from lmkit.data.examples import ExampleSet
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = int(rng.integers(3, 9))
        weights = (rng.random(n) < 0.5).astype(np.uint8)
        weights[-1] = 1
        out.append(Example(rng.integers(1, 40, n).astype(np.int32), weights))
    return ExampleSet.of(out)


def _weighted_task(batch_size, packing, seed=5):
    from lmkit.config import TrainConfig
    from lmkit.train.tasks import WeightedExamples
    cfg = TrainConfig.from_dict(dict(
        model=dict(name="llama", vocab_size=40, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
                   max_positions=32, init_scale=0.1, dropout=0.0),
        data=dict(batch_size=batch_size, num_steps=16, packing=packing),
        optimization=dict(learning_rate=0.1, max_grad_norm=0.0, max_steps=1)))
    tf.random.set_seed(seed)
    return WeightedExamples(build_model(cfg.model_config()), cfg, 0, 1)


def _loss_and_gradients(task, batch):
    inputs, targets = tf.nest.map_structure(tf.constant, batch)
    with tf.GradientTape() as tape:
        loss, _ = task.loss(inputs, targets, None, training=True)
    return loss, tape.gradient(loss, task.model.trainable_variables)


def test_a_packed_batch_trains_like_the_same_examples_padded():
    # The trainer's loss and gradients (not only the model's logits): one global batch holding every example,
    # packed into rows or one a row, gives the same loss per weighted token and the same gradients.
    from lmkit.data.packing import PackedBatches
    examples = _examples()
    rows = len(PackedBatches(examples, 1, 16, epoch=0, seed=_weighted_task(1, True).config.run.seed))
    packed, padded = _weighted_task(rows, True), _weighted_task(len(examples), False)
    for mine, theirs in zip(padded.model.variables, packed.model.variables):
        mine.assign(theirs)
    packed_batches, padded_batches = packed.batches(examples, 0), padded.batches(examples, 0)
    assert len(packed_batches) == len(padded_batches) == 1  # every example in the one global batch
    (ids, positions, segments), (targets, weights) = packed_batches[0]
    assert ids.shape == (rows, 16) and segments.max() > 1 and rows < len(examples)  # several to a row
    assert len(padded_batches[0][0]) == 1 and padded_batches[0][0][0].shape[0] == len(examples)
    loss, grads = _loss_and_gradients(packed, packed_batches[0])
    alone_loss, alone_grads = _loss_and_gradients(padded, padded_batches[0])
    np.testing.assert_allclose(float(loss), float(alone_loss), rtol=1e-5)
    per_token = 0.0  # the loss is per weighted target: the examples' own, one at a time
    for ids_, w in examples:
        logits, _ = padded.model(ids_[None, :-1])
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids_[None, 1:], logits=logits)
        per_token += float(tf.reduce_sum(losses * w[None, 1:].astype(np.float32)))
    np.testing.assert_allclose(float(loss), per_token / examples.targets().sum(), rtol=1e-5)
    for got, want in zip(grads, alone_grads):
        assert_relatively_close(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(), 1e-5)


def test_a_batch_whose_targets_are_all_masked_has_no_loss_and_a_zero_gradient():
    from lmkit.data.chat import Example
    from lmkit.data.examples import ExampleSet
    task = _weighted_task(2, True)
    masked = ExampleSet.of([Example(np.arange(1, 9, dtype=np.int32), np.zeros(8, np.uint8))] * 6)
    batches = task.batches(masked, 0)
    assert batches.weighted_tokens[0] == 0
    loss, grads = _loss_and_gradients(task, batches[0])
    assert float(loss) == 0.0
    assert all(np.all(tf.convert_to_tensor(g).numpy() == 0) for g in grads if g is not None)


def test_weighted_examples_are_picked_from_the_data_and_refuse_other_data():
    from lmkit.train.tasks import WeightedExamples, task_for
    task = _weighted_task(2, False)
    cfg, model = task.config, task.model
    examples = _examples()
    assert isinstance(task_for(model, cfg, None, 0, 1, examples), WeightedExamples)
    assert not isinstance(task_for(model, cfg, None, 0, 1, _ids()), WeightedExamples)
    with pytest.raises(UsageError, match=r"the valid data is a ndarray, but a run on conversations"):
        task.check_eval_data(4, valid=_ids())
    assert len(task.eval_sample(examples, 2, 3)) == 6 and len(task.eval_sample(examples, 9, 3)) == len(examples)
    trainer = Trainer(model, cfg, log=lambda s: None)
    trainer.use_data(examples)
    assert isinstance(trainer.task, WeightedExamples) and trainer.task.batch_unit.startswith("examples, padded")
    lstm = _config(model="lstm", packing=True)
    with pytest.raises(UsageError, match=r"RNNLanguageModel carries a recurrent state, but examples with loss weights"):
        WeightedExamples(build_model(lstm.model_config()), lstm, 0, 1)


def test_a_packed_batch_of_a_shorter_window_has_more_rows_and_the_same_loss_per_weighted_token(monkeypatch):
    # rows of 16 positions when num_steps is 32 (attention priced high: the short window wins): twice the rows,
    # and the loss is still the batch's weighted sum over its weight (the weights carry rows / W, not batch_size / W)
    from lmkit.config import TrainConfig
    from lmkit.train import tasks
    from lmkit.train.tasks import WeightedExamples
    monkeypatch.setattr(tasks, "ATTENTION_COST", 1000.0)
    cfg = TrainConfig.from_dict(dict(
        model=dict(name="llama", vocab_size=40, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
                   max_positions=32, init_scale=0.1, dropout=0.0),
        data=dict(batch_size=2, num_steps=32, packing=True),
        optimization=dict(learning_rate=0.1, max_grad_norm=0.0, max_steps=1)))
    tf.random.set_seed(5)
    task = WeightedExamples(build_model(cfg.model_config()), cfg, 0, 1)
    examples = _examples(count=40)
    batches = task.batches(examples, 0)
    assert batches.rows.windows[0] == 16 and "rows of 16, 32 positions" in task.batch_unit
    (ids, _, _), _ = batches[0]
    assert ids.shape == (4, 16)
    loss, _ = _loss_and_gradients(task, batches[0])
    total, weight = 0.0, 0.0
    for row in batches.rows.groups[0]:
        for index in row:
            ids_, w = examples[index]
            logits, _ = task.model(ids_[None, :-1])
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids_[None, 1:], logits=logits)
            total += float(tf.reduce_sum(losses * w[None, 1:].astype(np.float32)))
            weight += float(w[1:].sum())
    np.testing.assert_allclose(float(loss), total / weight, rtol=1e-5)
