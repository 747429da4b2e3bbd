#!/usr/bin/env python
"""Trains a language model composed in user code on any text corpus.

    python examples/train_custom_model.py --train ../shared/data/wikitext-2/valid.txt \
        --valid ../shared/data/wikitext-2/test.txt --max_steps 200
    mpirun -np 2 python examples/train_custom_model.py --train corpus.txt --subword 8000

The model (WordEmbedder + PositionEmbedder + TransformerDecoder + tied
OutputProjection) is defined here, not in lmkit; the same Trainer as the PTB
examples trains it, on one process or under mpirun.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.train.cli import _Parser, run_main  # noqa: E402


def make_model_class():
    import tensorflow as tf

    from lmkit import modules
    from lmkit.models import LanguageModel

    class TinyGPT(LanguageModel):
        """A small GPT: the user's own composition of lmkit modules."""

        stateful = False  # every training window stands alone

        def __init__(self, vocab_size: int, dim: int, num_layers: int, num_heads: int,
                     max_positions: int, dropout: float) -> None:
            super().__init__(name="tiny_gpt")
            self.vocab_size = vocab_size
            with self.name_scope:
                self.embedder = modules.WordEmbedder(vocab_size=vocab_size, dim=dim)
                self.positions = modules.PositionEmbedder(max_positions=max_positions, dim=dim)
                self.decoder = modules.TransformerDecoder(num_layers=num_layers, dim=dim, num_heads=num_heads,
                                                          dropout=dropout, max_positions=max_positions)
                self.projection = modules.OutputProjection(dim=dim, vocab_size=vocab_size,
                                                           tied_embedder=self.embedder)

        def initial_state(self, batch_size, max_length=None):
            return self.decoder.initial_state(batch_size, max_length)

        def __call__(self, ids, state=None, training=False):
            start = 0 if state is None else state.positions[:, None]
            x = self.embedder(ids) + self.positions(start + tf.range(tf.shape(ids)[1]))  # [b, t, dim]
            h, state = self.decoder(x, state, training)
            return self.projection(h), state  # [b, t, vocab]

        def step(self, ids, state):
            h, state = self.decoder.step(self.embedder(ids) + self.positions(state.positions), state)
            return self.projection(h), state

    return TinyGPT


def main(argv=None) -> int:
    p = _Parser(prog="train_custom_model.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", required=True, help="training text, one sentence or paragraph a line")
    p.add_argument("--valid", default=None, help="validation text (rank 0 evaluates it)")
    p.add_argument("--subword", type=int, default=0,
                   help="sentencepiece vocabulary size (0: words, with --max_vocab)")
    p.add_argument("--max_vocab", type=int, default=10000)
    p.add_argument("--model_dir", default=None)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=16, help="global batch, split across workers")
    p.add_argument("--num_steps", type=int, default=64, help="window length")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=None)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    args = p.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from lmkit import dist
    from lmkit.config import TrainConfig
    from lmkit.data import TextCorpus, load_tokenizer, train_tokenizer
    from lmkit.errors import UsageError
    from lmkit.train import Trainer

    dist.init()
    for path in filter(None, [args.train, args.valid]):
        if not os.path.isfile(path):
            raise UsageError(f"text file {path} does not exist; pass --train/--valid paths to UTF-8 text")
    if args.subword:  # rank 0 trains the sentencepiece model; the others wait, then load it
        folder = args.model_dir or os.path.join("runs", "custom_model")
        dist.run_on_chief(lambda: train_tokenizer("sentencepiece", args.train, folder,
                                                  vocab_size=args.subword) and None)
        corpus = TextCorpus(load_tokenizer(folder))  # saved in the model folder by rank 0
    else:
        corpus = TextCorpus.word_level(args.train, max_size=args.max_vocab)
    train = corpus.encode_stream(args.train)
    valid = corpus.encode_stream(args.valid) if args.valid else None
    vocab_size = corpus.tokenizer.vocab_size
    config = TrainConfig.from_dict(dict(
        model="transformer", vocab_size=vocab_size, hidden_size=args.dim, num_layers=args.layers,
        num_heads=args.heads, max_positions=args.num_steps, init_scale=0.05, keep_prob=0.9,
        batch_size=args.batch_size, num_steps=args.num_steps, num_epochs=args.epochs,
        optimizer="adam", learning_rate=args.learning_rate, max_grad_norm=1.0), source="flags")
    tf.random.set_seed(config.seed)
    with dist.scope():  # variables are created where the backend wants them
        model = make_model_class()(vocab_size, args.dim, args.layers, args.heads, args.num_steps, 0.1)
    trainer = Trainer(model, config, model_dir=args.model_dir)
    result = trainer.fit(np.asarray(train, np.int32), None if valid is None else np.asarray(valid, np.int32),
                         max_steps=args.max_steps)
    if dist.is_chief() and result.epochs:
        print(f"done: train perplexity {result.epochs[-1].train_perplexity:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
