"""What the trainer's tests share: a tiny LSTM config, a learnable id stream, a vocabulary, a run."""
import numpy as np
import tensorflow as tf

from lmkit.config import TrainConfig
from lmkit.models import build_model
from lmkit.train import Trainer

VOCAB = 40


def small_config(**kw):
    """A 2-layer LSTM of 16 units on windows of 5 ids, 4 rows; SGD with a decay after epoch 1."""
    values = dict(model="lstm", vocab_size=VOCAB, hidden_size=16, num_layers=2, init_scale=0.1,
                  keep_prob=0.7, batch_size=4, num_steps=5, num_epochs=2, learning_rate=1.0,
                  max_grad_norm=5.0, lr_decay=0.5, lr_decay_start_epoch=1, seed=3)
    values.update(kw)
    return TrainConfig.from_dict(values)


def stream(n=1200, seed=0):
    """``n`` ids of a learnable language: mostly ``next = (prev * 7 + 2) % VOCAB`` (59 steps an epoch)."""
    rng = np.random.RandomState(seed)
    ids = np.zeros(n, np.int32)
    for i in range(1, n):
        ids[i] = (ids[i - 1] * 7 + 2) % VOCAB if rng.rand() < 0.85 else rng.randint(VOCAB)
    return ids


class TinyVocab:
    """The least a trainer needs of a vocabulary."""

    def __init__(self, n=VOCAB):
        self.tokens = [f"t{i}" for i in range(n)]

    def __len__(self):
        return len(self.tokens)

    def fingerprint(self):
        return str(len(self.tokens))

    def save(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.tokens) + "\n")


def train(cfg, model_dir, num_epochs, seed=11, **options):
    """``(model, trainer, result)`` of ``num_epochs`` on :func:`stream`, validated on another stream."""
    tf.random.set_seed(seed)
    model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, model_dir=model_dir, log=lambda s: None, **options)
    result = trainer.fit(stream(), stream(300, seed=1), num_epochs=num_epochs)
    return model, trainer, result


def checkpoint_metas(model_dir):
    """The ``meta.json`` of every checkpoint of ``model_dir``, oldest first."""
    import json
    import os
    folder = os.path.join(model_dir, "checkpoints")
    return [json.loads(open(os.path.join(folder, name, "meta.json")).read()) for name in sorted(os.listdir(folder))]
