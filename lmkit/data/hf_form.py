"""lmkit's own tokenizers as Hugging Face ``tokenizers`` objects: what ``lmkit export`` writes as ``tokenizer.json``.

The form of a tokenizer gives every text the ids lmkit's :meth:`~lmkit.data.tokenizers.Tokenizer.encode`
gives it, so a model trained from scratch reads the same ids in ``transformers``:

* a line break is the tokenizer's ``eos_id`` (its token is ``"\\n"``; the byte
  kind's is GPT-2's byte-level ``"Ċ"``), and a carriage return before one, or at
  the end of the text, is dropped, as lmkit reads lines;
* ``tokenizer(text)`` with its special tokens puts a line break first, where
  lmkit's models start (every line of their training text follows one);
* ``<unk> <bos> <pad>`` are vocabulary entries that text never spells: the
  text ``<unk>`` (WikiText's mark) is a word to the word kind and characters
  to the others, as in lmkit (``transformers`` is told by
  ``split_special_tokens``). The text ``<eos>``, a word lmkit's word kind
  reads as its eos id, is an unknown word in the form, whose eos is the line
  break.

A unigram SentencePiece model keeps its normalization (the compiled table
in its model file) and its pieces' scores; its control pieces ``<s>`` and
``<pad>`` are pieces of the form's model, so the texts ``<s>`` and ``<pad>``
read as them there (SentencePiece spells them out), as in ``transformers``'
own conversions. A BPE SentencePiece model has no form: its merges are not
in the model file.

Decoding in ``transformers`` writes the word kind's tokens with a space
between each two, line breaks included, and a SentencePiece line after the
first with a space first (lmkit's own ``decode`` reads line by line). Adding
a kind is one function and one line in :data:`FORMS`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List

from lmkit.core.fileio import atomic_write_text
from lmkit.data.errors import DataError

__all__ = ["FORMS", "build_form", "model_token_ids", "save_form"]

NEWLINE = "\n"


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError("writing a Hugging Face tokenizer needs the tokenizers package; "
                        "pip install 'lmkit[hf]' (or pip install tokenizers)") from None
    return tokenizers


def _vocab_model(tk: Any, tokenizer: Any) -> Any:
    """A ``WordLevel`` model of the vocabulary, the line break at ``eos_id``."""
    vocab = tokenizer.vocab
    # The eos entry's string is the line break it stands for (so the text "<eos>" is an unknown word).
    table = {NEWLINE if i == tokenizer.eos_id else token: i for i, token in enumerate(vocab.tokens)}
    unk = None if vocab.unk_id is None else vocab.tokens[vocab.unk_id]
    return tk.models.WordLevel(table, unk_token=unk)


def _word(tk: Any, tokenizer: Any) -> Any:
    form = tk.Tokenizer(_vocab_model(tk, tokenizer))
    form.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    return form


def _char(tk: Any, tokenizer: Any) -> Any:
    form = tk.Tokenizer(_vocab_model(tk, tokenizer))
    # One piece a character ("." matches all but a line break, which is a token already).
    form.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex("."), behavior="isolated")
    form.decoder = tk.decoders.Fuse()
    return form


def _byte_chars() -> List[str]:
    """GPT-2's printable stand-in of each byte value (``tokenizers``' ``ByteLevel`` alphabet), by byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _byte(tk: Any, tokenizer: Any) -> Any:
    offset, eos = tokenizer.vocab_size - 256, tokenizer.eos_id
    chars = _byte_chars()
    table = {"<unk>": tokenizer.unk_id, "<bos>": tokenizer.bos_id, "<pad>": tokenizer.pad_id}
    for byte, char in enumerate(chars):
        table[char] = byte + offset
    # The line break's byte reads as eos, as lmkit reads it; the id of its byte is never written.
    table[chars[ord(NEWLINE)]] = eos
    table["<unused_newline_byte>"] = ord(NEWLINE) + offset
    if sorted(table.values()) != list(range(tokenizer.vocab_size)):
        raise DataError("the byte tokenizer's ids do not cover its vocabulary; this lmkit cannot write its form")
    form = tk.Tokenizer(tk.models.BPE(vocab=table, merges=[], unk_token="<unk>"))
    form.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    form.decoder = tk.decoders.ByteLevel()
    return form


def _sentencepiece(tk: Any, tokenizer: Any) -> Any:
    """A unigram SentencePiece model as a ``Unigram`` model with its own normalization table.

    ``Metaspace`` puts the word mark before each line (SentencePiece's dummy
    prefix: lmkit encodes line by line) and splits at whitespace, as
    SentencePiece does; its user-defined piece ``<unk>`` is a piece of the
    model, which the search always takes (score 0).
    """
    if tokenizer.options.get("model_type") != "unigram":
        raise DataError(f"a sentencepiece tokenizer of model_type {tokenizer.options.get('model_type')!r} "
                        "cannot be written as a Hugging Face tokenizer.json (its merges are not in the model); "
                        "train with --set spm_model_type='unigram' (the default), or another tokenizer")
    pieces = tokenizer.pieces()
    if any(kind == "byte" for _, _, kind in pieces):
        raise DataError("a sentencepiece model with byte fallback cannot be written as a Hugging Face "
                        "tokenizer.json by this lmkit; train one without it")
    vocab = [(NEWLINE if i == tokenizer.eos_id else piece, score) for i, (piece, score, _) in enumerate(pieces)]
    form = tk.Tokenizer(tk.models.Unigram(vocab, unk_id=tokenizer.unk_id, byte_fallback=False))
    spec = tokenizer.normalizer_spec()
    steps = [tk.normalizers.Precompiled(spec["charsmap"])] if spec["charsmap"] else []
    if spec["remove_extra_whitespaces"]:
        steps += [tk.normalizers.Replace(tk.Regex(" {2,}"), " "), tk.normalizers.Strip()]
    form.normalizer = tk.normalizers.Sequence(steps)
    prepend = "always" if spec["add_dummy_prefix"] else "never"
    form.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=True)
    form.decoder = tk.decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=True)
    return form


#: tokenizer kind -> the function that builds its form (``tokenizers`` module, lmkit tokenizer).
FORMS: Dict[str, Callable[[Any, Any], Any]] = {"word": _word, "char": _char, "byte": _byte,
                                               "sentencepiece": _sentencepiece}


def build_form(tokenizer: Any) -> Any:
    """``tokenizer`` as a ``tokenizers.Tokenizer`` that encodes every text to the same ids.

    Raises:
      DataError: a kind without a form (a BPE SentencePiece model), naming what can be exported.
    """
    if tokenizer.name not in FORMS:
        raise DataError(f"a {tokenizer.name} tokenizer cannot be written as a Hugging Face tokenizer.json "
                        f"(the kinds that can: {', '.join(FORMS)}, and a Hugging Face model's own); train "
                        f"with one of those, or fine-tune from a Hugging Face folder with --init_from")
    tk = _tokenizers()
    form = FORMS[tokenizer.name](tk, tokenizer)
    newline = form.id_to_token(tokenizer.eos_id)
    # lmkit reads a line without the carriage return that ends it ("$": before a line break or at the end).
    strip_return = tk.normalizers.Replace(tk.Regex("\r$"), "")
    form.normalizer = strip_return if form.normalizer is None else \
        tk.normalizers.Sequence([strip_return, form.normalizer])
    if newline == NEWLINE:  # a token of its own, split off first: the pre-tokenizers drop or split it
        form.add_tokens([tk.AddedToken(NEWLINE, special=False, normalized=False)])
    form.post_processor = tk.processors.TemplateProcessing(single=f"{newline} $A", pair=f"{newline} $A {newline} $B",
                                                           special_tokens=[(newline, tokenizer.eos_id)])
    return form


def model_token_ids(tokenizer: Any) -> Dict[str, Any]:
    """The ``config.json`` / ``generation_config.json`` ids of a model trained from scratch with ``tokenizer``:
    a text starts after a line break (``bos_token_id``, which ``tokenizer(text)`` puts first) and none ends
    a document (``eos_token_id`` null); ``pad_token_id`` where the tokenizer has one.

    Raises:
      DataError: a kind without a form, before anything is written.
    """
    build_form(tokenizer)
    ids = {"bos_token_id": tokenizer.eos_id, "eos_token_id": None}
    return ids if tokenizer.pad_id is None else {**ids, "pad_token_id": tokenizer.pad_id}


def save_form(tokenizer: Any, folder: str, model_max_length: int) -> List[str]:
    """Writes ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``folder``,
    as ``transformers.AutoTokenizer`` reads them.

    Returns:
      The names of the files written.
    """
    form = build_form(tokenizer)
    os.makedirs(folder, exist_ok=True)
    form.save(os.path.join(folder, "tokenizer.json"))
    special = {role: form.id_to_token(i) for role, i in (("unk_token", tokenizer.unk_id),
                                                           ("pad_token", tokenizer.pad_id)) if i is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "split_special_tokens": True, "clean_up_tokenization_spaces": False, **special}
    atomic_write_text(os.path.join(folder, "tokenizer_config.json"), json.dumps(config, indent=2) + "\n")
    atomic_write_text(os.path.join(folder, "special_tokens_map.json"), json.dumps(special, indent=2) + "\n")
    return ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
