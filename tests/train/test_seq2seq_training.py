"""The trainer on source/target pairs (encoder-decoders): the loss is the global batch's mean per target
token whatever the split (micro-batches, 2 Horovod ranks, 2 native replicas), evaluation, resuming, and the
errors for a model that does not fit its data."""
import sys

import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import TrainConfig
from lmkit.core.errors import UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.helpers import ROOT, assert_within_rounding, mpirun_cmd, run
from tests.scripts.train_probe import ProbeSpecials, probe_pairs

PROBE = f"{ROOT}/tests/scripts/train_probe.py"


def _config(**changes):
    values = dict(model="transformer_seq2seq", data="pairs", source_file="s.txt", target_file="t.txt",
                  vocab_size=50, source_vocab_size=50, share_embeddings=True, hidden_size=16, num_layers=1,
                  num_heads=2, max_positions=16, max_source_positions=16, init_scale=0.1, keep_prob=1.0,
                  batch_size=8, num_steps=1, num_epochs=2, learning_rate=0.01, optimizer="adam",
                  max_grad_norm=1.0, seed=3)
    values.update(changes)
    return TrainConfig.from_dict(values)


def _trainer(cfg, model_dir=None, **options):
    tf.random.set_seed(7)
    model = build_model(cfg.model_config())
    return Trainer(model, cfg, model_dir=model_dir, vocab=ProbeSpecials(), log=lambda s: None, **options)


def _load(prefix, rank=0):
    return np.load(f"{prefix}.rank{rank}.npz")


def _probe(tmp_path, name, np_, *extra, timeout=400):
    prefix = str(tmp_path / name)
    args = [PROBE, "--out", prefix, "--ids", "160", "--steps", "20", *extra]
    res = run(mpirun_cmd(np_, args) if np_ > 1 else [sys.executable, *args], timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return prefix


def test_trains_evaluates_and_a_run_stopped_inside_an_epoch_resumes_exactly(tmp_path):
    """What a preemption leaves (a checkpoint 5 steps into epoch 2) continues as if never stopped."""
    cfg, train, valid = _config(), probe_pairs(160), probe_pairs(30)
    whole = _trainer(cfg, str(tmp_path / "whole"), record_step_losses=True).fit(train, valid, test_ids=valid)
    assert len(whole.step_losses) == 2 * 20 and whole.global_step == 40  # 160 pairs / 8 a batch
    assert np.mean(whole.step_losses[-10:]) < np.mean(whole.step_losses[:10])
    assert whole.epochs[-1].valid_perplexity < whole.epochs[0].valid_perplexity < 50
    assert whole.test_perplexity == pytest.approx(whole.epochs[-1].valid_perplexity, rel=1e-5)
    # A step's loss is per token already: the epoch's perplexity is the exponential of their mean.
    assert whole.epochs[0].train_perplexity == pytest.approx(np.exp(np.mean(whole.step_losses[:20])), rel=1e-5)
    first = _trainer(cfg, str(tmp_path / "cut"), record_step_losses=True).fit(train, max_steps=25)
    rest = _trainer(cfg, str(tmp_path / "cut"), record_step_losses=True).fit(train)
    assert rest.resumed_from and len(first.step_losses) == 25 and len(rest.step_losses) == 15
    np.testing.assert_allclose(first.step_losses + rest.step_losses, whole.step_losses, rtol=1e-6)


def test_evaluation_is_the_mean_loss_per_target_token(tmp_path):
    trainer = _trainer(_config())
    pairs = probe_pairs(13)  # not a multiple of the batch: the last one is filled up
    trainer.build(1)
    model = trainer.model
    total, tokens = 0.0, 0
    for s, t in zip(pairs.source, pairs.target):  # one pair at a time, no padding at all
        memory = model.encode(tf.constant([s]))
        inputs = np.concatenate([[ProbeSpecials.bos_id], t])[np.newaxis]
        outputs = np.concatenate([t, [ProbeSpecials.eos_id]])
        logits, _ = model(tf.constant(inputs, tf.int32), condition=memory)
        total += float(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(outputs, logits[0])))
        tokens += len(outputs)
    assert trainer.evaluate_loss(pairs) == pytest.approx(total / tokens, rel=1e-5)


def test_micro_batches_train_like_the_whole_batch():
    """The RNN here; the transformer's micro-batches are the controls of the 2-rank tests below."""
    cfg = _config(model="rnn_seq2seq", optimizer="sgd", learning_rate=0.5)
    pairs = probe_pairs(96)
    whole, split = [_trainer(cfg.replace(grad_accum_steps=k), record_step_losses=True).fit(
        pairs, num_epochs=1).step_losses for k in (1, 4)]
    # The 4 micro-batches of 2 rows hold different numbers of tokens: only a per-token weighting of
    # the whole batch makes these equal (measured 6e-8 apart; the bound leaves 300 times that).
    np.testing.assert_allclose(split, whole, rtol=2e-5)


def test_a_model_that_does_not_fit_its_data_is_named():
    with pytest.raises(UsageError, match="an encoder-decoder trains with its target tokenizer: pass vocab="):
        Trainer(build_model(_config().model_config()), _config())
    lm_cfg = _config(model="lstm", data="ptb", source_file="", target_file="")
    lm = Trainer(build_model(lm_cfg.model_config()), lm_cfg, log=lambda s: None)
    with pytest.raises(UsageError, match="source/target pairs train an encoder-decoder"):
        lm.fit(probe_pairs(40))
    with pytest.raises(UsageError, match="an encoder-decoder trains on lmkit.data.paired.Pairs"):
        _trainer(_config()).fit(np.arange(500, dtype=np.int32) % 50)


MODEL = ("--model", "transformer_seq2seq", "--learning_rate", "0.5")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process reference (k1) and its controls: the same global batch in 2 and 4 micro-batches."""
    one = _probe(tmp_path_factory.mktemp("pairs"), "one", 1, *MODEL, "--backend", "local",
                 "--grad_accum_steps", "1,2,4")
    ref, controls = _load(f"{one}.sgd.k1"), [_load(f"{one}.sgd.k{k}") for k in (2, 4)]
    # The controls are the transformer's accumulation test: 2 and 4 micro-batches of rows holding
    # different numbers of tokens train as the whole batch does (measured 1e-7 apart; a mean per
    # micro-batch would weigh their tokens unequally, and widen the rounding bound of the tests below).
    for control in controls:
        np.testing.assert_allclose(control["losses"], ref["losses"], rtol=2e-5)
    return ref, controls


@pytest.mark.horovod
@pytest.mark.mpi
def test_two_workers_match_one_process_on_pairs(tmp_path, one_process):
    """Each rank's rows hold another number of target tokens: the ranks' mean of their weighted
    losses is still the global batch's mean per token."""
    two = _probe(tmp_path, "two", 2, *MODEL)
    ref, controls = one_process
    r0, r1 = _load(two, 0), _load(two, 1)
    assert len(ref["losses"]) == 20 == len(r0["losses"])
    np.testing.assert_array_equal(r0["losses"], r1["losses"])
    names = [k for k in ref.files if k.startswith(("var", "slot"))]
    for k in names:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    assert_within_rounding(r0, ref, controls, names)


def test_two_native_replicas_match_one_process_on_pairs(tmp_path, one_process):
    native = _load(_probe(tmp_path, "two", 1, *MODEL, "--backend", "native", "--num_replicas", "2"))
    ref, controls = one_process
    assert float(native["copy_spread"]) == 0.0  # both replicas applied the same update
    names = [k for k in ref.files if k.startswith(("var", "slot"))]
    assert_within_rounding(native, ref, controls, names)


def test_mixed_precision_trains_pairs_like_float32():
    """bfloat16 (mixed_float16's loss scaling is the same code for every model: tests/train/test_precision.py)."""
    pairs = probe_pairs(48)
    reference = _trainer(_config(), record_step_losses=True).fit(pairs, num_epochs=1)
    mixed = _trainer(_config(precision="mixed_bfloat16"), record_step_losses=True).fit(pairs, num_epochs=1)
    assert len(mixed.step_losses) == 6 and np.all(np.isfinite(mixed.step_losses))
    # The same initial weights and batches; bfloat16 keeps 8 bits of mantissa (0.4 %): the loss of a
    # step moved by 1e-3 at most here (measured), the bound is 10 times that.
    np.testing.assert_allclose(mixed.step_losses, reference.step_losses, rtol=0.01)
