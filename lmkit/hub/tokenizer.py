"""The tokenizer of a Hugging Face model folder (a byte-level BPE and the like), through ``tokenizers``.

lmkit does not train this kind: it comes with a pretrained model. It is
read from the folder ``--init_from`` names, or for a model trained from
scratch from the folder or Hub name of ``--tokenizer hf:<folder or name>``
(:func:`lmkit.hub.download.tokenizer_folder`; a Hub name downloads the
tokenizer's files alone), with :meth:`HFTokenizer.from_hf_folder`
(``tokenizer.json``, or a byte-level BPE's ``vocab.json`` + ``merges.txt``); saved into
the run's model folder as ``hf_tokenizer.json`` (lmkit's own
``tokenizer.json`` describes it there, as for every kind) and written back
in Hugging Face's layout by :meth:`HFTokenizer.save_hf` when a run is
exported. The ``tokenizers`` package does the work; nothing here
re-implements BPE.

Special ids in lmkit's sense: ``eos_id`` is the token of a line break
(``"\\n"``, which lmkit's text pipeline puts at the end of every line, as a
pretraining text has it) and ``bos_id`` the model's ``<|endoftext|>`` (the
document separator of byte-level BPE models: the text ``<|endoftext|>`` between documents of a text
file is that one id, as ``tokenizers`` reads an added token); there is no
unknown or padding token. In a source of records (JSON Lines, Parquet,
``datasets``) each document ends with that ``<|endoftext|>`` id
(:attr:`HFTokenizer.document_end`), a line break inside it being the newline's.

The ids that end a generated text (``end_ids``) are the model's, read from
the folder (:func:`lmkit.hub.generation_config.end_token_ids`: ``generation_config.json``'s
``eos_token_id``, one id or several, else ``config.json``'s) and kept with a
run's tokenizer, so a run fine-tuned from the folder stops where the model
does; a folder that names none ends at ``<|endoftext|>``.

An encoder-decoder's tokenizer is *framed* instead (``framing``,
from the folder's family, :func:`lmkit.hub.converters.pair_framing`): its ``bos_id``,
``eos_id`` and ``pad_id`` are the target's start, end and padding ids, every
text is encoded between ``prefix`` and ``suffix`` ids, the source side
(:meth:`HFTokenizer.source_side`) with its own suffix, and decoding drops
the special tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from lmkit.core.checks import is_token_id
from lmkit.core.errors import UsageError
from lmkit.core.fileio import atomic_write_text
from lmkit.data.errors import DataError
from lmkit.data.tokenizers import Tokenizer

__all__ = ["HFTokenizer", "HF_TOKENIZER_FILE", "END_OF_TEXT", "read_tokenizer"]

HF_TOKENIZER_FILE = "hf_tokenizer.json"  # in an lmkit run folder (lmkit's tokenizer.json is the record)
END_OF_TEXT = "<|endoftext|>"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError("reading a Hugging Face tokenizer needs the tokenizers package; "
                        "pip install 'lmkit[hf]' (or pip install tokenizers)") from None
    return tokenizers


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` behind lmkit's :class:`Tokenizer` interface.

    Args:
      tokenizer: the ``tokenizers.Tokenizer``.
      source: where it came from (shown in messages; kept in ``tokenizer.json``).
    """

    name = "hf"
    OPTIONS: Mapping[str, Any] = {"source": "", "framing": None, "end_ids": None}
    DERIVED = ("framing", "end_ids")  # read from the source folder
    READS_TEXT = False
    #: the keys of ``framing``: the target's start, end and padding ids, the ids around every text, and
    #: the source's suffix
    FRAMING_KEYS = ("bos", "eos", "pad", "prefix", "suffix", "source_suffix")

    def __init__(self, tokenizer: Any, source: str = "", framing: Optional[Mapping[str, Any]] = None,
                 end_ids: Optional[Sequence[int]] = None) -> None:
        self.hf = tokenizer
        self.source = source
        self.framing = None if framing is None else _check_framing(framing)
        self._end_ids = None if end_ids is None else _check_end_ids(end_ids)
        newline = tokenizer.encode("\n", add_special_tokens=False).ids
        self._newline = newline[0] if len(newline) == 1 else None
        self._end_of_text = tokenizer.token_to_id(END_OF_TEXT)
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self._vocab_size = max(ids, default=-1) + 1

    # -- the vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The largest id + 1 (added tokens included), not the number of tokens: ids may have gaps, and
        every id must fit the model's embedding and the data cache's integer type."""
        return self._vocab_size

    def _special_id(self, role: str) -> Optional[int]:
        if self.framing is not None:
            return self.framing.get(role) if role in ("bos", "eos", "pad") else None
        return {"eos": self._newline, "bos": self._end_of_text}.get(role)

    @property
    def end_ids(self) -> List[int]:
        """The ids that end a generated text: the model folder's ``eos_token_id`` (one or several; ids
        beyond this vocabulary name no text and are left out), else ``<|endoftext|>`` when the vocabulary
        has it; empty for a framed (encoder-decoder) tokenizer, whose target ends at ``eos_id``."""
        if self.framing is not None:
            return []
        ids = [i for i in self._end_ids or () if i < self.vocab_size]
        if ids:
            return ids
        return [] if self._end_of_text is None else [self._end_of_text]

    @property
    def start_ids(self) -> List[int]:
        """The ids the folder's tokenizer puts before a text when ``transformers`` encodes it with its
        special tokens (``tokenizer(text)``): ``<s>`` / ``<|begin_of_text|>``; empty for tokenizers that add
        none (byte-level BPE ones, most often), and for a framed (encoder-decoder) tokenizer."""
        if self.framing is not None:
            return []
        plain = list(self.hf.encode("a", add_special_tokens=False).ids)
        full = list(self.hf.encode("a", add_special_tokens=True).ids)
        for k in range(len(full) - len(plain) + 1):
            if full[k:k + len(plain)] == plain:
                return full[:k]
        return []

    @property
    def options(self) -> Dict[str, Any]:
        return {"source": self.source, "framing": self.framing, "end_ids": self._end_ids}

    def fingerprint(self) -> str:
        text = self.hf.to_str() + ("" if self.framing is None else json.dumps(self.framing, sort_keys=True))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def source_side(self) -> "HFTokenizer":
        """The tokenizer an encoder-decoder's sources are encoded with: framed ones end with ``source_suffix``."""
        if self.framing is None:
            return self
        return HFTokenizer(self.hf, self.source, {**self.framing, "suffix": self.framing["source_suffix"]})

    @property
    def document_end(self) -> Optional[str]:
        """``<|endoftext|>`` when the vocabulary has it as one id other than the newline's (a byte-level BPE's
        document separator, as nanoGPT's data preparation puts it after each document); None for a framed
        (encoder-decoder) tokenizer and one without it, whose documents end with a line break."""
        if self.framing is not None or self._end_of_text is None or self._end_of_text == self._newline:
            return None
        return END_OF_TEXT if self._encode_line(END_OF_TEXT) == [self._end_of_text] else None

    # -- text <-> ids -----------------------------------------------------------------------------
    def _encode_line(self, line: str) -> List[int]:
        return list(self.hf.encode(line, add_special_tokens=False).ids)

    def _decode_line(self, ids: List[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def encode(self, text: str) -> List[int]:
        if self.framing is None:
            return super().encode(text)
        return self.encode_batch([text])[0]

    def decode(self, ids: Any) -> str:
        if self.framing is None:
            return super().decode(ids)
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise DataError(f"id {bad} is out of range for the hf tokenizer of {self.vocab_size} ids")
        return self.hf.decode(ids, skip_special_tokens=True)

    def encode_batch(self, texts: List[str]) -> List[List[int]]:
        if self.framing is not None:
            if not all(isinstance(t, str) for t in texts):
                raise DataError("encode takes a str; decode bytes with .decode('utf-8') first")
            prefix, suffix = self.framing["prefix"], self.framing["suffix"]
            encoded = self.hf.encode_batch(list(texts), add_special_tokens=False)
            return [prefix + list(e.ids) + suffix for e in encoded]
        if self._newline is None:
            return [list(e.ids) for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]
        return super().encode_batch(texts)

    # -- files ------------------------------------------------------------------------------------
    def _write_files(self, folder: str) -> None:
        atomic_write_text(os.path.join(folder, HF_TOKENIZER_FILE), self.hf.to_str())

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Dict[str, Any]:
        framing, end_ids = options.get("framing"), options.get("end_ids")
        return {"source": str(options.get("source") or ""),
                "framing": None if framing is None else _check_framing(framing),
                "end_ids": None if end_ids is None else _check_end_ids(end_ids)}

    @classmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "HFTokenizer":
        """Not trained: read from the pretrained model's folder (``source``, set by ``--init_from``), or from
        ``tokenizer = "hf:<source>"``'s folder or Hub name (downloaded), which ``source`` then records."""
        source = options.get("source") or ""
        if not source:
            raise DataError("tokenizer = 'hf' comes with a pretrained model and is not trained by lmkit; "
                            "pass --init_from <a Hugging Face model folder>, or tokenizer = 'hf:<a tokenizer "
                            "folder or Hub name>' (or use tokenizer = 'sentencepiece' to train one on your text)")
        from lmkit.hub.download import tokenizer_folder
        tokenizer = cls.from_hf_folder(tokenizer_folder(source))
        tokenizer.source = source  # as asked (a Hub name, not its download's folder): a resumed run compares it
        return tokenizer

    @classmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "HFTokenizer":
        path = os.path.join(folder, HF_TOKENIZER_FILE)
        if not os.path.isfile(path):
            raise DataError(f"{path} is missing")
        options = cls.check_options(options)
        try:
            return cls(_tokenizers().Tokenizer.from_file(path), options["source"], options["framing"],
                       options["end_ids"])
        except Exception as exc:  # the tokenizers package raises its own exception types
            raise DataError(f"{path} is not a tokenizers file ({exc})") from None

    @classmethod
    def from_hf_folder(cls, folder: str) -> "HFTokenizer":
        """The tokenizer of a Hugging Face model folder.

        Reads ``tokenizer.json`` when present, else ``vocab.json`` and
        ``merges.txt`` as a byte-level BPE (its pre-tokenizer and
        decoder, ``<|endoftext|>`` a special token).

        Raises:
          DataError: neither is there, or a file is broken (naming it).
        """
        tk = _tokenizers()
        path = os.path.join(folder, "tokenizer.json")
        from lmkit.hub.converters import pair_framing
        from lmkit.hub.generation_config import end_token_ids
        framing = pair_framing(folder)  # an encoder-decoder's target start, end and padding ids
        end_ids = None if framing is not None else end_token_ids(folder)
        if os.path.isfile(path):
            try:
                return cls(tk.Tokenizer.from_file(path), os.path.abspath(folder), framing, end_ids)
            except Exception as exc:
                raise DataError(f"{path} is not a Hugging Face tokenizers file ({exc}); "
                                "save the tokenizer again with save_pretrained") from None
        vocab, merges = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
        missing = [p for p in (vocab, merges) if not os.path.isfile(p)]
        if missing:
            raise DataError(f"{folder} holds no tokenizer: neither tokenizer.json nor vocab.json + "
                            f"merges.txt ({missing[0]} is missing); save the model's tokenizer there with "
                            "tokenizer.save_pretrained(folder)")
        try:
            model = tk.models.BPE.from_file(vocab, merges)
        except Exception as exc:
            raise DataError(f"{vocab} / {merges} are not a BPE vocabulary and merges ({exc})") from None
        tokenizer = tk.Tokenizer(model)
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        if tokenizer.token_to_id(END_OF_TEXT) is not None:
            tokenizer.add_special_tokens([END_OF_TEXT])
        return cls(tokenizer, os.path.abspath(folder), None, end_ids)

    def model_token_ids(self) -> Dict[str, Any]:
        """A byte-level BPE's: a document starts and ends at ``<|endoftext|>`` (both null when the vocabulary
        lacks it)."""
        return {"bos_token_id": self._end_of_text, "eos_token_id": self._end_of_text}

    def save_hf(self, folder: str, model_max_length: int) -> None:
        """Writes the tokenizer as ``transformers`` reads it: ``tokenizer.json``, ``vocab.json``,
        ``merges.txt`` (BPE models), ``tokenizer_config.json`` and ``special_tokens_map.json``."""
        os.makedirs(folder, exist_ok=True)
        self.hf.save(os.path.join(folder, "tokenizer.json"))
        if type(self.hf.model).__name__ == "BPE":
            self.hf.model.save(folder)  # vocab.json, merges.txt
        special = {} if self._end_of_text is None else {
            "bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
        config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length,
                  "add_prefix_space": False, **special}
        atomic_write_text(os.path.join(folder, "tokenizer_config.json"), json.dumps(config, indent=2) + "\n")
        atomic_write_text(os.path.join(folder, "special_tokens_map.json"), json.dumps(special, indent=2) + "\n")


def read_tokenizer(folder: str) -> HFTokenizer:
    """The tokenizer of a Hugging Face folder (:meth:`HFTokenizer.from_hf_folder`), a problem as a
    :class:`UsageError` (one message naming the file)."""
    try:
        return HFTokenizer.from_hf_folder(folder)
    except DataError as exc:
        raise UsageError(str(exc)) from None


def _check_end_ids(end_ids: Any) -> List[int]:
    """``end_ids`` (token ids that end a text), checked."""
    if not isinstance(end_ids, (list, tuple)) or not all(is_token_id(i) for i in end_ids):
        raise DataError(f"the hf tokenizer's end_ids {end_ids!r} must be a list of token ids")
    return [int(i) for i in end_ids]


def _check_framing(framing: Mapping[str, Any]) -> Dict[str, Any]:
    """The framing (:attr:`HFTokenizer.FRAMING_KEYS`), checked: token ids, and lists of them for the
    prefix and the suffixes."""
    if not hasattr(framing, "items") or set(framing) != set(HFTokenizer.FRAMING_KEYS):
        raise DataError(f"the hf tokenizer's framing {framing!r} must have the keys "
                        f"{', '.join(HFTokenizer.FRAMING_KEYS)}")
    checked: Dict[str, Any] = {}
    for key, value in framing.items():
        listed = key in ("prefix", "suffix", "source_suffix")
        values = list(value) if listed and isinstance(value, (list, tuple)) else [value]
        if (listed and not isinstance(value, (list, tuple))) or not all(is_token_id(v) for v in values):
            raise DataError(f"the hf tokenizer's framing {key} = {value!r} must hold token ids"
                            + (" (a list)" if listed else ""))
        checked[key] = values if listed else value
    return checked
