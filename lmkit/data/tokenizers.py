"""Tokenizers: text <-> ids, four kinds in one registry, saved in the model folder.

Every tokenizer is a :class:`Tokenizer`: ``encode(text) -> ids``,
``decode(ids) -> text``, ``vocab_size``, the special ids (``unk_id``,
``eos_id``, ``bos_id``, ``pad_id``, each None when absent), ``fingerprint()``
and ``save(folder)``. The kinds, by registry name (:data:`TOKENIZERS`):

* ``word``: whitespace-separated words through a :class:`Vocab`
  (options ``max_vocab``, ``min_count``), file ``vocab.txt``;
* ``sentencepiece`` (:mod:`lmkit.data.sentencepiece`): a SentencePiece
  model, ``model_type`` unigram or BPE, ``vocab_size`` pieces, files
  ``spm.model`` and ``spm.vocab``;
* ``char``: the Unicode characters of the training text, file ``chars.txt``;
* ``byte``: the 256 byte values of UTF-8, no training and no file;
* ``hf`` (:mod:`lmkit.hub.tokenizer`): the tokenizer of a pretrained
  Hugging Face model (GPT-2's byte-level BPE), read with the ``tokenizers``
  package from the folder ``--init_from`` names, file ``hf_tokenizer.json``;
  ``hf:<folder or Hub name>`` (:data:`PRETRAINED_PREFIX`) reads it from that
  folder or downloads it, for a model trained from scratch.

The first four have the special symbols unknown, end and start of sentence, and
padding (``<unk> <eos> <bos> <pad>``; SentencePiece calls the middle two
``</s>`` and ``<s>``). A line break in the text is the end-of-sentence id,
both ways: ``encode`` turns ``"\\n"`` into ``eos_id``, ``decode`` turns
``eos_id`` back into ``"\\n"`` and drops ``bos_id`` and ``pad_id``, so
``decode(encode(text))`` gives readable text.

:func:`train_tokenizer` trains one into a folder (the model folder, never
next to the user's data) or reuses the one saved there;
:func:`load_tokenizer` reads it back. ``folder/tokenizer.json`` names the
kind, its options, its size and its fingerprint, and is written last: a
folder without it holds no tokenizer, whatever else a killed save left.

The interface lives in :mod:`lmkit.data.tokenizer_base`, lmkit's own kinds
(word, char, byte) in :mod:`lmkit.data.basic_tokenizers`; this module holds
the registry and the training, loading and reuse of any kind. Adding a kind
is one :class:`Tokenizer` subclass plus one line in :data:`TOKENIZERS`.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from lmkit.core.checks import check_choice, check_known_keys
from lmkit.core.errors import UsageError
from lmkit.core.fileio import PathLike
from lmkit.core.registry import import_object
from lmkit.data.basic_tokenizers import ByteTokenizer, CharTokenizer, WordTokenizer
from lmkit.data.errors import DataError
from lmkit.data.textfile import check_text_file, source_identity
from lmkit.data.tokenizer_base import TOKENIZER_FILE, Tokenizer, short_hash
from lmkit.data.vocab import Vocab

__all__ = [
    "Tokenizer", "WordTokenizer", "CharTokenizer", "ByteTokenizer", "TOKENIZERS", "TOKENIZER_FILE",
    "tokenizer_class", "train_tokenizer", "load_tokenizer", "tokenizer_of_run", "check_vocabulary",
    "PRETRAINED_PREFIX", "split_tokenizer",
]


#: name -> "module:Class" (imported on use); adding a kind is one class and one line here.
TOKENIZERS: Dict[str, str] = {
    "word": "lmkit.data.basic_tokenizers:WordTokenizer",
    "sentencepiece": "lmkit.data.sentencepiece:SentencePieceTokenizer",
    "char": "lmkit.data.basic_tokenizers:CharTokenizer",
    "byte": "lmkit.data.basic_tokenizers:ByteTokenizer",
    "hf": "lmkit.hub.tokenizer:HFTokenizer",  # a pretrained model's (GPT-2's byte-level BPE); not trained
}


#: ``tokenizer = "hf:<folder or Hub name>"``: the ``hf`` kind read from that folder (or downloaded), for a model
#: trained from scratch with a pretrained tokenizer (``hf`` alone is an ``--init_from`` model's own).
PRETRAINED_PREFIX = "hf:"


def split_tokenizer(spec: str) -> Tuple[str, str]:
    """``(kind, source)`` of a ``tokenizer`` setting: ``"hf:gpt2"`` -> ``("hf", "gpt2")``, ``"char"`` ->
    ``("char", "")``; ``"hf:"`` with nothing after it stays itself, an unknown kind."""
    if isinstance(spec, str) and spec.startswith(PRETRAINED_PREFIX) and spec[len(PRETRAINED_PREFIX):].strip():
        return "hf", spec[len(PRETRAINED_PREFIX):].strip()
    return spec, ""


def tokenizer_class(name: str) -> Type[Tokenizer]:
    """The class registered as ``name``.

    Raises:
      DataError: ``unknown tokenizer 'wrod'; did you mean 'word'?``.
    """
    check_choice("tokenizer", name, TOKENIZERS, DataError)
    return import_object(TOKENIZERS[name], "tokenizer")


def train_tokenizer(name: str, train_file: Union[PathLike, Sequence[PathLike]], folder: PathLike, *,
                    vocab_size: Optional[int] = None, max_vocab: Optional[int] = None,
                    min_count: int = 1, model_type: str = "unigram", source: str = "",
                    cache_dir: Optional[str] = None) -> Tokenizer:
    """Trains a tokenizer into ``folder``, or reuses the one saved there.

    When ``folder/tokenizer.json`` exists with the same kind and options it is loaded (nothing is trained);
    otherwise the tokenizer is trained on ``train_file`` and saved into ``folder``. In a distributed job run it
    on the chief, then :func:`load_tokenizer` on the other ranks. Options a kind does not take are ignored.

    Args:
      name: a key of :data:`TOKENIZERS`: ``word``, ``sentencepiece``,
        ``char`` or ``byte``; or ``hf:<folder or Hub name>``, a pretrained
        tokenizer read from that folder or downloaded (not trained; the
        ``source`` below).
      train_file: UTF-8 text, one sentence or paragraph a line (checked with
        :func:`check_text_file`; not read by ``byte``): a file, a folder, a
        glob pattern, several separated by commas, or a list
        (:func:`~lmkit.data.sources.resolve_sources`).
      folder: the model folder; every file goes here, none beside the data.
      vocab_size: number of pieces (``sentencepiece``; required there).
      max_vocab: largest word vocabulary, specials included (``word``).
      min_count: drop words seen fewer times (``word``).
      model_type: ``"unigram"`` or ``"bpe"`` (``sentencepiece``).
      source: the pretrained model folder the ``hf`` kind is read from
        (``name`` ``hf:<source>`` gives it too).
      cache_dir: a data cache folder (:func:`lmkit.data.token_cache.cache_root`): a tokenizer trained there
        before on the same files (:func:`_cached_tokenizer_dir`) with the same kind and options is copied
        instead of trained again, and a newly trained one is kept there.

    Returns:
      The tokenizer, saved in ``folder``.

    Raises:
      DataError: an unknown ``name``, a bad option, a bad training file, a
        corpus too small for ``vocab_size`` (naming the largest that works),
        or a tokenizer already in ``folder`` that differs from the one asked
        for (naming both).
    """
    name, named_source = split_tokenizer(name)
    if named_source and source and named_source != source:
        raise DataError(f"tokenizer hf:{named_source} and source {source!r} name two tokenizers; give one")
    kind = tokenizer_class(name)
    options = kind.check_options({"vocab_size": vocab_size, "max_vocab": max_vocab, "source": named_source or source,
                                  "min_count": min_count, "model_type": model_type})
    folder = os.fspath(folder)
    if os.path.isfile(os.path.join(folder, TOKENIZER_FILE)):
        return _saved_tokenizer(folder, kind, options)
    from lmkit.data.sources import resolve_sources
    files: List[str] = resolve_sources(train_file, "train_file") if kind.READS_TEXT else []
    cached = _cached_tokenizer_dir(cache_dir, kind, options, files) if files else None
    if cached is not None and os.path.isfile(os.path.join(cached, TOKENIZER_FILE)):
        tokenizer = load_tokenizer(cached)
        tokenizer.save(folder)
        return tokenizer
    tokenizer = _train_into(kind, files, folder, options)
    if cached is not None:
        _keep_in_cache(tokenizer, cached)
    return tokenizer


def _train_into(kind: Type[Tokenizer], files: Sequence[str], folder: str, options: Mapping[str, Any]) -> Tokenizer:
    """``kind`` trained on the checked ``files`` and saved into ``folder``; a folder this call made is removed
    again when training fails or is stopped."""
    for path in files:
        check_text_file(path, "train_file")
    made = not os.path.isdir(folder)
    try:
        tokenizer = kind.train(files, folder, **options)
        tokenizer.save(folder)
    except BaseException:
        if made:  # everything in it is this call's: leave no half-made model folder
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return tokenizer


def _saved_tokenizer(folder: str, kind: Type[Tokenizer], options: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer saved in ``folder`` when it is the ``kind`` with the ``options`` asked for (those read from a
    source aside).

    Raises:
      DataError: another kind or other options, naming both.
    """
    saved = load_tokenizer(folder)

    def asked(opts: Mapping[str, Any]) -> Dict[str, Any]:  # the options that are chosen, not read from a source
        return {k: v for k, v in opts.items() if k not in kind.DERIVED}

    if saved.name == kind.name and asked(saved.options) == asked(options):
        return saved
    raise DataError(f"{os.path.join(folder, TOKENIZER_FILE)} holds a {saved.name} tokenizer "
                    f"with options {saved.options}, but a {kind.name} tokenizer with options "
                    f"{options} was asked for; ask for the saved one (the settings of the run "
                    "that wrote this folder) or use another folder")


def _cached_tokenizer_dir(cache_dir: Optional[str], kind: Type[Tokenizer], options: Mapping[str, Any],
                          files: Sequence[str]) -> Optional[str]:
    """Where the data cache keeps ``kind`` trained with ``options`` on ``files`` (None: no cache).

    The name holds each file's path, size, modification time and a sample of its content: a file edited
    and copied back with ``cp -p`` or ``rsync -t`` (same size and time) gets another folder.
    """
    if not cache_dir:
        return None
    sources = []
    try:
        for path in files:
            found = source_identity(path)
            # Where a JSON Lines, Parquet or datasets source holds its text, after the values plain text had.
            sources.append([found["path"], found["size"], found["mtime_ns"], found["sample"],
                            *([found["read"]] if "read" in found else [])])
    except OSError:  # unreadable: no cache (check_text_file says what is wrong)
        return None
    record = json.dumps({"kind": kind.name, "options": dict(options), "files": sources,
                         **({"version": kind.VERSION} if kind.VERSION else {})}, sort_keys=True)
    return os.path.join(cache_dir, f"tokenizer-{kind.name}-{short_hash(record.encode('utf-8'))}")


def _keep_in_cache(tokenizer: Tokenizer, cached: str) -> None:
    """Saves a trained tokenizer into the data cache (best effort: a cache that cannot be written is skipped),
    through a locked temporary folder (:class:`lmkit.core.fileio.TempFolder`); the leftovers of killed
    saves and encodings there go first."""
    from lmkit.core.fileio import TempFolder
    from lmkit.data.cache_folders import TEMP_PREFIX, sweep_temp_folders

    root, temp = os.path.dirname(cached), None
    try:
        sweep_temp_folders(root)
        temp = TempFolder(root, f"{TEMP_PREFIX}{os.path.basename(cached)}-")
        tokenizer.save(temp.path)
        temp.publish(cached)
    except OSError:
        pass
    finally:
        if temp is not None:
            temp.close()


def load_tokenizer(folder: PathLike) -> Tokenizer:
    """Reads the tokenizer that :meth:`Tokenizer.save` wrote into ``folder``.

    Args:
      folder: the model folder.

    Returns:
      The tokenizer, checked against the size and fingerprint in
      ``tokenizer.json``.

    Raises:
      DataError: ``folder`` holds no ``tokenizer.json``, or it or the files
        it names are broken (naming the file and the fix).
    """
    folder = os.fspath(folder)
    meta = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(meta):
        raise DataError(f"{folder!r} holds no tokenizer ({TOKENIZER_FILE} is missing); give the "
                        "model folder of a run trained on text, or train one there with "
                        "train_tokenizer(name, train_file, folder)")
    fix = f"delete {meta} and train the tokenizer again"
    try:
        with open(meta, "r", encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, OSError) as exc:
        raise DataError(f"{meta} is not readable JSON ({exc}); {fix}") from None
    if not isinstance(record, dict) or not {"name", "options", "vocab_size",
                                            "fingerprint"} <= set(record):
        raise DataError(f"{meta} lacks some of the keys name, options, vocab_size, fingerprint; "
                        f"{fix}")
    kind = _kind_named_in(meta, record["name"], fix)
    options = record["options"]
    if not isinstance(options, dict):
        raise DataError(f"{meta}: options must be a JSON object, got {options!r}; {fix}")
    try:
        check_known_keys(meta, options, kind.OPTIONS, DataError)
    except DataError as exc:
        raise DataError(f"{exc} for a {kind.name} tokenizer; {fix}") from None
    try:
        tokenizer = kind.load(folder, options)
    except DataError as exc:
        raise DataError(f"{meta} names a {kind.name} tokenizer that cannot be read: {exc}; "
                        f"{fix}") from None
    found = (tokenizer.vocab_size, tokenizer.fingerprint())
    expected = (record["vocab_size"], record["fingerprint"])
    if found != expected:
        raise DataError(f"{meta} describes a {kind.name} tokenizer of {expected[0]} ids with "
                        f"fingerprint {expected[1]}, but the files in {folder!r} give "
                        f"{found[0]} ids with fingerprint {found[1]} (changed after saving); "
                        f"{fix}")
    return tokenizer


def _kind_named_in(meta: str, name: Any, fix: str) -> Type[Tokenizer]:
    """The class named in ``tokenizer.json``; an unknown name is a broken file."""
    try:
        return tokenizer_class(name)
    except DataError as exc:
        raise DataError(f"{meta}: {exc}; {fix}") from None


def tokenizer_of_run(model_dir: PathLike) -> Tokenizer:
    """The tokenizer a training run left in ``model_dir``.

    A run on text data saved its tokenizer (``tokenizer.json``); a PTB run
    saved its vocabulary (``vocab.txt``), read here as word tokens.

    Raises:
      DataError: the folder holds neither, or they are broken.
    """
    from lmkit.core.layout import VOCAB_FILE

    model_dir = os.fspath(model_dir)
    if os.path.isfile(os.path.join(model_dir, TOKENIZER_FILE)):
        return load_tokenizer(model_dir)
    vocab_path = os.path.join(model_dir, VOCAB_FILE)
    if os.path.isfile(vocab_path):
        return WordTokenizer(Vocab.load(vocab_path))
    raise DataError(f"{model_dir} holds no {TOKENIZER_FILE} or {VOCAB_FILE}, so no training run "
                    "wrote it; pass the --model_dir of a training run")


def check_vocabulary(tokenizer: Any, vocab_size: int, folder: str) -> None:
    """A tokenizer with ids beyond a pretrained model's vocabulary is refused (naming the tokenizer file).

    Args:
      tokenizer: the run's tokenizer.
      vocab_size: the model's vocabulary (its Hugging Face ``config.json``).
      folder: the Hugging Face folder the model and the tokenizer come from.

    Raises:
      UsageError: the tokenizer has more ids than the model.
    """
    if tokenizer.vocab_size > vocab_size:
        name = "tokenizer.json" if os.path.isfile(os.path.join(folder, "tokenizer.json")) else "vocab.json"
        raise UsageError(f"{os.path.join(folder, name)} has ids up to {tokenizer.vocab_size - 1} but the model's "
                         f"vocab_size is {vocab_size} ({os.path.join(folder, 'config.json')}); the tokenizer "
                         "belongs to another model")
