"""lmkit's own models trace their steps without AutoGraph (a faster start); a user's model keeps it."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import layers as modules
from lmkit.config import TrainConfig
from lmkit.core.xla import use_autograph
from lmkit.models import LanguageModel, build_model
from lmkit.train import Trainer
from lmkit.train.evaluation import Evaluator


class BranchingLM(LanguageModel):
    """A user's model with Python control flow on a tensor: it traces only with AutoGraph."""

    stateful = False

    def __init__(self, *, vocab_size, hidden_size):
        super().__init__(name="branching_lm")
        self.vocab_size = vocab_size
        with self.name_scope:
            self.embedder = modules.WordEmbedder(vocab_size=vocab_size, dim=hidden_size)
            self.projection = modules.OutputProjection(dim=hidden_size, vocab_size=vocab_size)

    def initial_state(self, batch_size, max_length=None):
        return ()

    def __call__(self, ids, state=None, training=False):
        x = self.embedder(ids)
        if tf.reduce_sum(ids) >= 0:  # always true; a Python `if` on a tensor
            x = 2.0 * x
        return self.projection(x), state


def _config(**changes):
    values = dict(model="lstm", vocab_size=20, hidden_size=8, num_layers=1, init_scale=0.1, keep_prob=1.0,
                  batch_size=2, num_steps=4, num_epochs=1, learning_rate=0.1, max_grad_norm=5.0)
    values.update(changes)
    return TrainConfig.from_dict(values)


@pytest.mark.parametrize("name,extra", [
    ("lstm", {}), ("transformer", {"num_heads": 2, "max_positions": 8}),
    ("transformer_seq2seq", {"num_heads": 2, "max_positions": 8, "max_source_positions": 8, "data": "pairs",
                             "source_file": "s.txt", "target_file": "t.txt", "source_vocab_size": 20})])
def test_lmkit_models_trace_without_autograph(name, extra):
    assert use_autograph(build_model(_config(model=name, **extra).model_config())) is False


def test_the_trainer_and_evaluator_steps_follow_the_model():
    ids = (np.arange(200) % 20).astype(np.int32)
    ours = Trainer(build_model(_config().model_config()), _config(), log=lambda s: None)
    ours.fit(ids, max_steps=2)
    assert ours.autograph is False and ours.step.function._autograph is False
    user = BranchingLM(vocab_size=20, hidden_size=8)
    assert use_autograph(user) is True
    trainer = Trainer(user, _config(), log=lambda s: None)
    result = trainer.fit(ids, max_steps=3)  # traces: the Python `if` on a tensor needs AutoGraph
    assert trainer.autograph is True and result.global_step == 3
    assert np.isfinite(Evaluator(user, num_steps=4, batch_size=2).mean_loss(ids))
    with pytest.raises(TypeError, match="(?i)autograph|python bool"):  # what AutoGraph spares it
        tf.function(lambda x: user(x)[0], autograph=False)(tf.constant(ids[:8].reshape(2, 4)))
