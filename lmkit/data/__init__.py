"""Data for language models: tokenizers, PTB, any text corpus, BPTT batches and windows.

Nothing here imports Horovod: sharding takes ``rank`` and ``size`` as plain
arguments, and the trainer runs downloads and tokenizer training on the
chief (``lmkit.dist.run_on_chief``). ``docs/data.md`` describes the layer.
"""

from lmkit.data.batching import bptt_arrays, bptt_dataset, num_bptt_batches
from lmkit.data.download import download, git_blob_sha1
from lmkit.data.errors import DataError
from lmkit.data.ptb import (DEFAULT_URL, FALLBACK_URL, PTB_SHA1, PTBData, ensure_ptb, find_ptb,
                            load_ptb)
from lmkit.data.text import TextCorpus, TextData, load_text_data, sentence_dataset
from lmkit.data.textfile import check_text_file, count_words
from lmkit.data.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from lmkit.data.tokenizers import (TOKENIZERS, ByteTokenizer, CharTokenizer, Tokenizer, WordTokenizer,
                                   load_tokenizer, tokenizer_class, train_tokenizer)
from lmkit.data.vocab import Vocab
from lmkit.data.windows import num_window_batches, window_arrays

__all__ = [
    "DataError",
    "Vocab",
    "download",
    "git_blob_sha1",
    "DEFAULT_URL",
    "FALLBACK_URL",
    "PTB_SHA1",
    "PTBData",
    "find_ptb",
    "ensure_ptb",
    "load_ptb",
    "bptt_arrays",
    "bptt_dataset",
    "num_bptt_batches",
    "window_arrays",
    "num_window_batches",
    "Tokenizer",
    "TOKENIZERS",
    "WordTokenizer",
    "SentencePieceTokenizer",
    "CharTokenizer",
    "ByteTokenizer",
    "tokenizer_class",
    "train_tokenizer",
    "load_tokenizer",
    "train_sentencepiece",
    "check_text_file",
    "count_words",
    "TextCorpus",
    "TextData",
    "load_text_data",
    "sentence_dataset",
]
