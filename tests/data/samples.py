"""Text and tokenizers that several data test files share (the fixtures built on them are in conftest.py)."""
import os
import random

import numpy as np

from lmkit.data.tokenizers import train_tokenizer

# name, options, the files besides tokenizer.json
KINDS = [
    ("word", {}, ["vocab.txt"]),
    ("char", {}, ["chars.txt"]),
    ("byte", {}, []),
    ("sentencepiece", {"vocab_size": 70}, ["spm.model", "spm.vocab"]),
    ("sentencepiece", {"vocab_size": 70, "model_type": "bpe"}, ["spm.model", "spm.vocab"]),
]
KIND_IDS = ["word", "char", "byte", "spm-unigram", "spm-bpe"]
WORDS = "the a cat dog sat ran on under mat log and then quickly slowly big small red blue".split()


def lexicon_lines(path, lines=200, seed=0):
    """Lines of words from a 120-word lexicon (with a few accented letters), written to ``path``."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzé"
    lexicon = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(120)]
    text = [" ".join(rng.choice(lexicon) for _ in range(rng.randint(3, 10))) for _ in range(lines)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return text


def subword_corpus(path, lines=300, seed=0):
    """Lines of words from a 150-word lexicon of plain letters, for SentencePiece, written to ``path``."""
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
               for _ in range(150)]
    text = [" ".join(rng.choice(lexicon) for _ in range(rng.randint(3, 12))) for _ in range(lines)]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return text


def words_file(path, lines, seed):
    """``lines`` lines of :data:`WORDS` (a blank line every 9, ``café`` and a CRLF every 7) into ``path``."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for k in range(lines):
            if k % 9 == 4:
                f.write("\n")  # blank lines are skipped
            words = rng.choice(WORDS, size=rng.integers(1, 12))
            f.write(" ".join(words) + (" café\r\n" if k % 7 == 3 else "\n"))
    return str(path)


def text_files(root):
    """Three shards (one in a subfolder, beside a hidden binary file) and a validation file under ``root``."""
    os.makedirs(root / "shards" / "sub")
    files = {"a": words_file(root / "shards" / "a.txt", 300, 0),
             "b": words_file(root / "shards" / "b.txt", 200, 1),
             "c": words_file(root / "shards" / "sub" / "c.txt", 100, 2),
             "valid": words_file(root / "valid.txt", 80, 3)}
    (root / "shards" / ".hidden").write_text("not text\0")
    return root, files


def saved_tokenizer(corpus, tmp_path, name="char", **options):
    """The folder of a ``name`` tokenizer trained on the ``corpus`` fixture's file."""
    path, _ = corpus
    folder = tmp_path / "run"
    train_tokenizer(name, str(path), str(folder), **options)
    return folder
