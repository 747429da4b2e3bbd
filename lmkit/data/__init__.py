"""Data for language models: vocabularies, PTB, any text corpus, BPTT batches.

Nothing here imports Horovod: sharding takes ``rank`` and ``size`` as plain
arguments, and the trainer runs downloads on the chief
(``lmkit.dist.run_on_chief``).
"""

from lmkit.data.batching import bptt_arrays, bptt_dataset, num_bptt_batches
from lmkit.data.download import download
from lmkit.data.errors import DataError
from lmkit.data.ptb import DEFAULT_URL, PTBData, ensure_ptb, find_ptb, load_ptb
from lmkit.data.text import (SentencePieceTokenizer, TextCorpus, WordTokenizer, sentence_dataset,
                             train_sentencepiece)
from lmkit.data.vocab import Vocab

__all__ = [
    "DataError",
    "Vocab",
    "download",
    "DEFAULT_URL",
    "PTBData",
    "find_ptb",
    "ensure_ptb",
    "load_ptb",
    "bptt_arrays",
    "bptt_dataset",
    "num_bptt_batches",
    "WordTokenizer",
    "SentencePieceTokenizer",
    "train_sentencepiece",
    "TextCorpus",
    "sentence_dataset",
]
