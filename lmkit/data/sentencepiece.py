"""SentencePiece subwords (unigram or BPE), trained into the model folder.

:class:`SentencePieceTokenizer` is the ``sentencepiece`` kind of the
tokenizer registry (:mod:`lmkit.data.tokenizers`); :func:`train_sentencepiece`
trains a model with the special pieces at ids 0-3 (an unknown character, ``<s> </s> <pad>``)
and the text ``<unk>`` as one piece at id 4.

Why ``<unk>`` is a piece: PTB and WikiText mark their rare words with it, and
SentencePiece reserves the string for its own unknown piece and should never
see it in training text; given it anyway, it splits the mark into 5 pieces
and may leave ``>`` out of the vocabulary (a small vocabulary on a WikiText
sample decoded every mark as ``<unk ⁇``). Its unknown piece is named
``<unk_char>`` instead.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from lmkit.core.checks import check_choice
from lmkit.core.fileio import PathLike, atomic_write_bytes, atomic_write_text
from lmkit.data.errors import DataError
from lmkit.data.tokenizer_base import Tokenizer, check_size, short_hash

__all__ = ["MODEL_TYPES", "SentencePieceTokenizer", "train_sentencepiece"]

MODEL_TYPES = ("unigram", "bpe")
# Ids given to the special pieces of SentencePiece models trained here.
SPM_UNK_ID, SPM_BOS_ID, SPM_EOS_ID, SPM_PAD_ID = 0, 1, 2, 3
# SentencePiece's own unknown piece (a character it never saw), and the unknown-word mark of PTB and WikiText,
# which is text to it: one piece (id 4).
SPM_UNK_PIECE, UNKNOWN_WORD_MARK = "<unk_char>", "<unk>"


# SentencePiece's piece types, as its model proto numbers them.
_PIECE_KINDS = {1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte"}


def _proto_fields(data: bytes) -> Iterator[Tuple[int, Any]]:
    """``(field number, value)`` of a protobuf message's wire bytes: varints as ints, length-delimited
    fields as bytes (the few fields of a SentencePiece model read here; the ``sentencepiece`` package's
    generated module needs a protobuf runtime this environment's TensorFlow does not allow)."""
    def varint(i: int) -> Tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[i]
            value |= (byte & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if byte < 0x80:
                return value, i

    i = 0
    while i < len(data):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            size, i = varint(i)
            value, i = data[i:i + size], i + size
        elif wire in (1, 5):
            value, i = data[i:i + (8 if wire == 1 else 4)], i + (8 if wire == 1 else 4)
        else:
            raise DataError(f"a SentencePiece model with protobuf wire type {wire}, which lmkit does not read")
        yield key >> 3, value


def _import_sentencepiece():
    try:
        import sentencepiece
    except ImportError as exc:
        raise ImportError("subword tokenization needs the sentencepiece package: "
                          "pip install 'sentencepiece>=0.1.99'") from exc
    return sentencepiece


class SentencePieceTokenizer(Tokenizer):
    """A trained SentencePiece model (``.model`` file), unigram or BPE."""

    name = "sentencepiece"
    OPTIONS = {"vocab_size": None, "model_type": "unigram"}
    VERSION = 1  # 1: the text <unk> is one piece (id 4)
    MODEL_FILE = "spm.model"
    VOCAB_FILE = "spm.vocab"

    def __init__(self, model_file: PathLike, *, model_type: Optional[str] = None) -> None:
        """Args:
          model_file: the ``.model`` file written by SentencePiece training.
          model_type: ``"unigram"`` or ``"bpe"``, as trained (None: not known).

        Raises:
          DataError: the file is missing or not a SentencePiece model.
        """
        spm = _import_sentencepiece()
        model_file = os.fspath(model_file)
        if not os.path.isfile(model_file):
            raise DataError(f"SentencePiece model {model_file!r} does not exist; train one with "
                            "train_tokenizer('sentencepiece', ...) or train_sentencepiece")
        try:
            self._sp = spm.SentencePieceProcessor(model_file=model_file)
        except (RuntimeError, OSError) as exc:
            raise DataError(f"{model_file!r} is not a SentencePiece model ({exc}); "
                            "delete it and train again") from None
        self.model_file = model_file
        self.model_type = model_type

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def _special_id(self, role: str) -> Optional[int]:
        value = getattr(self._sp, f"{role}_id")()
        return None if value < 0 else int(value)  # SentencePiece says -1 for "disabled"

    @property
    def options(self) -> Dict[str, Any]:
        return {"vocab_size": self.vocab_size, "model_type": self.model_type}

    def _encode_line(self, line: str) -> List[int]:
        return list(self._sp.encode(line, out_type=int))

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """Piece ids of many texts at once (faster than one by one)."""
        if any("\n" in t for t in texts):
            return super().encode_batch(texts)
        return [list(ids) for ids in self._sp.encode(list(texts), out_type=int)]

    def _decode_line(self, ids: List[int]) -> str:
        # Pieces joined back into text; <unk> shows as " \u2047 ".
        return self._sp.decode(ids)

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def piece_to_id(self, piece: str) -> int:
        return int(self._sp.piece_to_id(piece))

    def pieces(self) -> List[Tuple[str, float, str]]:
        """``(piece, score, kind)`` of every id, from the model's protobuf; kind is ``normal``,
        ``unknown``, ``control``, ``user_defined``, ``unused`` or ``byte``."""
        found = []
        for field, value in _proto_fields(self._sp.serialized_model_proto()):
            if field == 1:  # ModelProto.pieces: piece (1), score (2, float), type (3, NORMAL when absent)
                parts = dict(_proto_fields(value))
                score = struct.unpack("<f", parts[2])[0] if 2 in parts else 0.0
                found.append((parts.get(1, b"").decode("utf-8"), score, _PIECE_KINDS.get(parts.get(3, 1), "normal")))
        return found

    def normalizer_spec(self) -> Dict[str, Any]:
        """The model's normalization: ``name`` (``nmt_nfkc``...), ``charsmap`` (its compiled table, bytes),
        ``add_dummy_prefix`` and ``remove_extra_whitespaces``, read from the model's protobuf."""
        spec: Dict[str, Any] = {"name": "", "charsmap": b"", "add_dummy_prefix": True,
                                "remove_extra_whitespaces": True}
        for field, value in _proto_fields(self._sp.serialized_model_proto()):
            if field == 3:  # ModelProto.normalizer_spec
                for number, v in _proto_fields(value):
                    if number == 1:
                        spec["name"] = v.decode("utf-8")
                    elif number == 2:
                        spec["charsmap"] = v
                    elif number == 3:
                        spec["add_dummy_prefix"] = bool(v)
                    elif number == 4:
                        spec["remove_extra_whitespaces"] = bool(v)
        return spec

    def fingerprint(self) -> str:
        """A short hash of the pieces, their scores and kinds (which also tell BPE from unigram).

        Not of the model file, which also records the paths it was trained
        from and to.
        """
        sp = self._sp
        kinds = (sp.is_unknown, sp.is_control, sp.is_unused, sp.is_byte)
        table = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i)!r}\t"
                        f"{''.join('1' if kind(i) else '0' for kind in kinds)}\n"
                        for i in range(self.vocab_size))
        return short_hash(table.encode("utf-8"))

    def _write_files(self, folder: str) -> None:
        # The .vocab file is for people (piece and score a line); the .model is what loads.
        pieces = "".join(f"{self._sp.id_to_piece(i)}\t{self._sp.get_score(i):g}\n"
                         for i in range(self.vocab_size))
        atomic_write_text(os.path.join(folder, self.VOCAB_FILE), pieces)
        atomic_write_bytes(os.path.join(folder, self.MODEL_FILE), self._sp.serialized_model_proto())

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Dict[str, Any]:
        options = super().check_options(options)
        if options["vocab_size"] is None:
            raise DataError("the sentencepiece tokenizer needs a vocab_size; give one "
                            "(--vocab_size), e.g. 8000 for a few MB of text")
        check_size("vocab_size", options["vocab_size"],
                    "give the number of pieces (--vocab_size), e.g. 8000")
        check_choice("sentencepiece model_type", options["model_type"], MODEL_TYPES, DataError)
        return options

    @classmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "SentencePieceTokenizer":
        """Trains ``folder/spm.model`` on the files ``train_file`` (one thread: reproducible).

        SentencePiece holds its whole training text in memory (about 25 times
        its size); a text larger than :data:`TRAINING_BYTES` is sampled first,
        every line kept with the same probability by a seeded generator, so
        the model is the same on every run and memory stays bounded. Lines
        longer than SentencePiece reads (:data:`MAX_SENTENCE_BYTES`) are cut
        into pieces first.
        """
        options = cls.check_options(options)
        os.makedirs(folder, exist_ok=True)
        sample = os.path.join(folder, f"spm-sample.tmp{os.getpid()}.txt")
        try:
            files = _sample_lines(list(train_file), sample, TRAINING_BYTES)
            model = train_sentencepiece(files, options["vocab_size"],
                                        os.path.join(folder, "spm"), options["model_type"], reuse=False)
        except DataError as exc:  # name the user's files, not the sample made of them
            names = train_file[0] if len(train_file) == 1 else f"{len(train_file)} files"
            raise DataError(str(exc).replace(repr(sample), f"{names!r} (sampled)")) from None
        finally:
            if os.path.exists(sample):
                os.remove(sample)
        return cls(model, model_type=options["model_type"])

    @classmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "SentencePieceTokenizer":
        options = cls.check_options(options)
        return cls(os.path.join(folder, cls.MODEL_FILE), model_type=options["model_type"])


#: Text SentencePiece trains on at most (bytes); a larger corpus is sampled by line (about 2.5 GB
#: of memory for 100 MB of text).
TRAINING_BYTES = 100_000_000
#: SentencePiece skips the training lines longer than this (its ``max_sentence_length``, bytes).
MAX_SENTENCE_BYTES = 4192
#: Longer lines are cut into pieces this long or at most twice as long (at a space where there is one).
_PIECE_BYTES = 2048


def _longest_line(files: Sequence[str]) -> int:
    """The longest line of ``files`` in bytes (a line ends at "\n" or "\r"), read in blocks."""
    import numpy as np

    longest = 0
    for path in files:
        run = 0  # bytes of the line still open at the end of the last block
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 22)
                if not chunk:
                    break
                data = np.frombuffer(chunk, np.uint8)
                ends = np.flatnonzero((data == 10) | (data == 13))
                if ends.size == 0:
                    run += len(chunk)
                    continue
                gaps = np.diff(ends) - 1 if ends.size > 1 else np.zeros(1, np.int64)
                longest = max(longest, run + int(ends[0]), int(gaps.max()))
                run = len(chunk) - int(ends[-1]) - 1
        longest = max(longest, run)
    return longest


def _sample_lines(files: Sequence[str], sample: str, budget: int, seed: int = 0) -> List[str]:
    """``files`` when they are plain text files holding at most ``budget`` bytes in lines SentencePiece
    reads whole, else ``[sample]``: their lines, each kept with probability ``budget / total`` (a seeded
    generator, so always the same lines), a line longer than :data:`MAX_SENTENCE_BYTES` cut into pieces
    (which SentencePiece would otherwise skip: a corpus of one long line would leave it nothing).

    SentencePiece reads only plain text: the text of another format (JSON Lines, Parquet, a datasets
    folder, compressed text) always goes through the sample, its size measured by reading it once
    (its size on disk says little of its text's)."""
    import numpy as np

    from lmkit.data import formats
    from lmkit.data.textfile import text_pieces

    if all(formats.is_plain(f) for f in files):
        total = sum(os.path.getsize(f) for f in files)
        if total <= budget and _longest_line(files) <= MAX_SENTENCE_BYTES:
            return list(files)
    else:
        total = sum(_text_bytes(f) for f in files)
    keep = min(1.0, budget / max(total, 1))
    rng = np.random.default_rng(seed)
    with open(sample, "w", encoding="utf-8") as out:
        for path in files:
            for text, has_text, _ in text_pieces(path, "train_file", block_bytes=_PIECE_BYTES):
                if has_text and text.strip() and rng.random() < keep:
                    out.write(text.strip() + "\n")
    return [sample]


def _text_bytes(path: str) -> int:
    """The bytes of a source's text as a plain file would hold it (read once, in blocks)."""
    from lmkit.data import formats

    if formats.is_plain(path):
        return os.path.getsize(path)
    size = 0
    with formats.open_text(path, "train_file") as stream:
        while True:
            block = stream.read(1 << 22)
            if not block:
                return size
            size += len(block)


# The special pieces' ids and the text <unk>'s own piece (ids 0-4), as lmkit's tokenizers number them.
_SPECIALS = dict(unk_id=SPM_UNK_ID, bos_id=SPM_BOS_ID, eos_id=SPM_EOS_ID, pad_id=SPM_PAD_ID, unk_piece=SPM_UNK_PIECE,
                 user_defined_symbols=[UNKNOWN_WORD_MARK])


def train_sentencepiece(train_file: Union[PathLike, Sequence[PathLike]], vocab_size: int, model_prefix: PathLike,
                        model_type: str = "unigram", *, character_coverage: float = 1.0,
                        num_threads: int = 1, input_sentence_size: int = 0,
                        progress: bool = False, reuse: bool = True) -> str:
    """Trains a SentencePiece model on ``train_file``, or reuses the one at ``model_prefix``.

    With ``reuse``, the model is reused when ``<model_prefix>.model`` exists,
    is not older than ``train_file`` and has ``vocab_size`` pieces. Training
    writes to temporary names renamed into place, so a killed run leaves no
    broken model. The pieces ``<unk_char>``, ``<s>``, ``</s>``, ``<pad>`` get
    ids 0-3, the text ``<unk>`` id 4. In a distributed job train on the chief only. Most callers want
    :func:`train_tokenizer`, which trains into the model folder.

    Args:
      train_file: UTF-8 text, one sentence or paragraph a line (a file or a
        list of files).
      vocab_size: number of pieces (specials included).
      model_prefix: where to write ``<prefix>.model`` and ``<prefix>.vocab``
        (a path in the model folder; there is no default beside the data).
      model_type: ``"unigram"`` or ``"bpe"``.
      character_coverage: share of characters the model must cover (1.0
        for small alphabets, 0.9995 for CJK).
      num_threads: training threads (1 gives a reproducible model).
      input_sentence_size: train on at most this many lines (0 = all).
      progress: let SentencePiece log its training on stderr.
      reuse: reuse an up-to-date model at ``model_prefix`` instead of training.

    Returns:
      The path of the ``.model`` file.

    Raises:
      DataError: a bad ``vocab_size`` or ``model_type``, a missing training
        file, or failed training; a corpus too small for ``vocab_size`` names
        the largest size that works.
    """
    check_size("vocab_size", vocab_size, "give the number of pieces (--vocab_size)")
    check_choice("sentencepiece model_type", model_type, MODEL_TYPES, DataError)
    files = [os.fspath(train_file)] if isinstance(train_file, (str, os.PathLike)) else \
        [os.fspath(f) for f in train_file]
    missing = next((path for path in files if not os.path.isfile(path)), None)
    if missing is not None:
        raise DataError(f"training file {missing!r} does not exist; check the path")
    train_file = files[0] if len(files) == 1 else f"{len(files)} files ({files[0]}, ...)"
    prefix = os.fspath(model_prefix)
    model_file = prefix + ".model"
    if reuse and all(_model_is_fresh(model_file, f, vocab_size) for f in files):
        return model_file
    _train_into_place(files, prefix, train_file, dict(
        vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage, num_threads=num_threads,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=input_sentence_size > 0,
        minloglevel=0 if progress else 2))
    return model_file


def _train_into_place(files: List[str], prefix: str, what: str, options: Dict[str, Any]) -> None:
    """SentencePiece trained on ``files`` under temporary names, renamed to ``<prefix>.vocab`` and then
    ``<prefix>.model`` (what a reuse looks for, so it comes last); nothing is left of a failed training."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    temp_prefix = f"{prefix}.tmp{os.getpid()}"
    try:
        _import_sentencepiece().SentencePieceTrainer.train(input=files, model_prefix=temp_prefix, **options,
                                                           **_SPECIALS)
        os.replace(temp_prefix + ".vocab", prefix + ".vocab")
        os.replace(temp_prefix + ".model", prefix + ".model")
    except RuntimeError as exc:
        raise DataError(_training_failure(what, options["vocab_size"], str(exc))) from None
    finally:
        for suffix in (".model", ".vocab"):
            if os.path.exists(temp_prefix + suffix):
                os.remove(temp_prefix + suffix)


def _training_failure(train_file: str, vocab_size: int, message: str) -> str:
    """The DataError text for a failed SentencePiece training, with the size that works."""
    head = f"SentencePiece training on {train_file!r} with vocab_size {vocab_size} failed"
    # "Vocabulary size too high (5000). Please set it to a value <= 327."
    limit = re.search(r"value\s*<=\s*(\d+)", message)
    if limit:
        return (f"{head}: Vocabulary size too high for this text; the largest vocab_size that "
                f"works is {limit.group(1)}: set vocab_size (--vocab_size) to at most "
                f"{limit.group(1)}, or train on more text")
    # "Vocabulary size is smaller than required_chars. 6 vs 15." (characters + special pieces)
    chars = re.search(r"smaller than required_chars\.\s*\d+\s*vs\s*(\d+)", message)
    if chars:
        return (f"{head}: Vocabulary size too small for this text; every distinct character and "
                f"the special pieces need {chars.group(1)}: set vocab_size (--vocab_size) to at "
                f"least {chars.group(1)}")
    return f"{head}: {message.strip().splitlines()[-1] if message.strip() else 'no reason given'}"


def _model_is_fresh(model_file: str, train_file: str, vocab_size: int) -> bool:
    if not os.path.isfile(model_file):
        return False
    if os.stat(model_file).st_mtime_ns < os.stat(train_file).st_mtime_ns:
        return False  # the data changed after the model was trained
    try:
        return SentencePieceTokenizer(model_file).vocab_size == vocab_size
    except DataError:
        return False
