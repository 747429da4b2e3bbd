"""What training records: the result of a run, an epoch's sums, the counters and generators a checkpoint carries."""
import numpy as np
import tensorflow as tf

from lmkit.train.records import EpochRun, EpochStats, Progress, TrainResult, dropout_generator


def test_a_result_gives_results_json_its_keys_and_the_last_epochs_figures():
    result = TrainResult(epochs=[EpochStats(epoch=1, train_perplexity=9.0, valid_perplexity=8.0, learning_rate=0.1,
                                            tokens_per_sec=1.0, epoch_time=1.0, cumulative_time=1.0, steps=3)])
    out = result.to_dict()
    assert set(out) == {"epochs", "test_perplexity", "test_word_perplexity", "global_step", "resumed_from",
                        "checkpoint", "skipped_steps", "loss_scale", "validations", "final_train_perplexity",
                        "final_valid_perplexity", "final_train_word_perplexity", "final_valid_word_perplexity"}
    assert (out["final_train_perplexity"], out["final_valid_perplexity"]) == (9.0, 8.0)
    assert out["epochs"][0]["steps"] == 3 and TrainResult().to_dict()["final_train_perplexity"] is None


def test_an_epochs_loss_per_token_leaves_skipped_steps_out():
    run = EpochRun(loss_sum=30.0, steps=4, skipped=1)
    assert run.token_loss(5) == 2.0  # 30 over 3 applied steps of 5 tokens
    assert EpochRun().token_loss(5) == 0.0


def test_each_rank_draws_its_own_dropout_stream_the_same_for_the_same_seed():
    def draws(seed, rank):
        return dropout_generator(seed, rank).uniform([4]).numpy()

    np.testing.assert_array_equal(draws(3, 0), draws(3, 0))
    assert not np.array_equal(draws(3, 0), draws(3, 1)) and not np.array_equal(draws(3, 0), draws(4, 0))
    progress = Progress(seed=3, rank=1)
    assert [int(v.numpy()) for v in (progress.epoch, progress.global_step, progress.steps_in_epoch)] == [0, 0, 0]
    np.testing.assert_array_equal(progress.rng.uniform([4]).numpy(), draws(3, 1))
    assert all(v.dtype == tf.int64 for v in (progress.epoch, progress.global_step, progress.steps_in_epoch))
