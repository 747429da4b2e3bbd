"""A run's task: its data as batches (BPTT rows, shuffled or random windows) and a batch as a loss."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
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
