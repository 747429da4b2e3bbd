"""The trainer in one process: learning, exact resume, non-finite stop, model dir checks."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.train.support import VOCAB
from tests.train.support import small_config as _config
from tests.train.support import stream as _ids
from tests.train.support import train as _train


@pytest.fixture(autouse=True, scope="module")
def _init():
    dist.init()


def test_training_lowers_perplexity_and_follows_the_decay(tmp_path):
    cfg = _config(keep_prob=1.0, num_epochs=6, hidden_size=32, lr_decay_start_epoch=4)
    _, trainer, result = _train(cfg, None, 6)
    ppl = [e.train_perplexity for e in result.epochs]
    assert ppl[5] < 0.8 * ppl[0] and ppl[0] < VOCAB * 1.5
    assert [e.learning_rate for e in result.epochs] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.5, 0.25])
    assert all(e.valid_perplexity is not None for e in result.epochs)


def test_resume_is_exact_with_dropout_on(tmp_path):
    cfg = _config(keep_prob=0.7)
    straight, _, _ = _train(cfg, str(tmp_path / "a"), 2)
    _train(cfg, str(tmp_path / "b"), 1)
    resumed, _, result = _train(cfg, str(tmp_path / "b"), 2, seed=999)  # init seed must not matter
    assert result.resumed_from and result.epochs[0].epoch == 2
    for a, b in zip(straight.trainable_variables, resumed.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.name)


def test_dropout_really_is_on_in_that_test(tmp_path):
    """Guards the test above: with another seed, dropout gives other weights."""
    a, _, _ = _train(_config(keep_prob=0.7), None, 1)
    b, _, _ = _train(_config(keep_prob=0.7, seed=4), None, 1)
    assert any(not np.allclose(x.numpy(), y.numpy()) for x, y in
               zip(a.trainable_variables, b.trainable_variables))




@pytest.mark.parametrize("model", ["transformer", "lstm"])
def test_a_memory_mapped_cache_stream_trains_exactly_as_an_int32_array(tmp_path, model):
    ids = _ids()
    path = tmp_path / "ids.bin"
    ids.astype(np.uint16).tofile(path)
    mapped = np.memmap(path, dtype=np.uint16, mode="r", shape=ids.shape)
    losses = []
    for stream in (ids, mapped):
        cfg = _config(model=model, num_heads=2, keep_prob=1.0)
        tf.random.set_seed(5)
        trainer = Trainer(build_model(cfg.model_config()), cfg, record_step_losses=True, log=lambda s: None)
        losses.append(trainer.fit(stream, _ids(300, seed=1), num_epochs=1).step_losses)
    assert len(losses[0]) > 10
    np.testing.assert_array_equal(losses[0], losses[1])




