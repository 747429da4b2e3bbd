"""The converter protocol: a Hugging Face folder in as an lmkit model, and an lmkit run out as a folder.

Each model family keeps its converter beside its model
(``lmkit/models/<family>/convert.py``), a :class:`Converter` with four
parts: the folder's ``config.json`` checked (:meth:`Converter.read_config`)
and turned into the model's keys (:meth:`Converter.model_config`), the
weights loaded (:meth:`Converter.load_weights`), and a run written back as
a folder (:meth:`Converter.export`). Fine-tuning configs
(:meth:`Converter.training_config`) follow from the first two.

One switch on ``config.json``'s ``model_type`` picks the converter
(:func:`converter_of`). The table it reads is assembled from the model
families (:data:`lmkit.models.registry.CONVERTERS`, a family's
``__init__.py`` declares its model types); the hub sits below the models,
so it names that table by import path (:data:`CONVERTER_TABLE`) instead of
importing it, and a converter's module loads on first use.
"""

from __future__ import annotations

import abc
import functools
import inspect
import os
from typing import Any, Dict, List, Mapping, Optional

from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object
from lmkit.hub.folders import HF_CONFIG, is_hf_folder, model_type_of

__all__ = ["CONVERTER_TABLE", "Converter", "check_pretrained", "check_window", "converter_at", "converter_for",
           "converter_of", "converter_table", "fine_tuning_config", "load_pretrained_weights", "pair_framing",
           "pretrained_training_config"]

#: Where the table ``model_type -> "module:Class"`` of converters lives (assembled from the model families).
CONVERTER_TABLE = "lmkit.models.registry:CONVERTERS"


class Converter(abc.ABC):
    """One model family's Hugging Face folders onto lmkit's model, and back.

    Attributes:
      title: the family in messages ("GPT-2", "Llama/Qwen2/Mistral").
      conditional: an encoder-decoder: it fine-tunes on ``data = "pairs"`` and ``lmkit generate``
        decodes sources with it.
      positions_key: ``config.json``'s key for the longest window (named when a training window exceeds it).
      train_settings: ``TrainConfig`` settings a fine-tune of the family fixes beside the model's keys.
      exports_adapters: whether :meth:`export_adapters` writes a LoRA run's adapters as a PEFT folder.
    """

    title: str = ""
    conditional: bool = False
    positions_key: str = "max_position_embeddings"
    train_settings: Mapping[str, Any] = {}
    exports_adapters: bool = False

    @abc.abstractmethod
    def read_config(self, folder: str) -> Dict[str, Any]:
        """The folder's ``config.json``, checked to be a model of the family that lmkit computes exactly.

        Raises:
          UsageError: a missing file, another model type, a missing size or a setting lmkit does not
            compute (naming the file, the key and the value).
        """

    @abc.abstractmethod
    def model_config(self, config: Dict[str, Any], folder: str) -> Dict[str, Any]:
        """``lmkit.models.build_model`` keys of the model that ``config`` (:meth:`read_config`'s) describes."""

    @abc.abstractmethod
    def load_weights(self, model: Any, folder: str) -> Any:
        """Fills ``model`` (built from :meth:`model_config`) with the folder's weights; returns the file(s)
        read. A tensor that does not fit is a UsageError, and leaves the model as it was."""

    @abc.abstractmethod
    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        """Writes a run's ``model`` and ``tokenizer`` (``config``: its TrainConfig) as a new folder
        ``transformers`` loads, whole or not at all; returns the names of the files written."""

    def export_adapters(self, model: Any, config: Any, output: str) -> List[str]:
        """Writes a LoRA run's adapters alone as a PEFT adapter folder (where :attr:`exports_adapters`)."""
        raise UsageError(f"export --format peft is not available for {self.title} runs; use --format hf")

    def framing(self, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """An encoder-decoder's framing of texts (:class:`lmkit.hub.tokenizer.HFTokenizer`'s ``framing``)."""
        return None

    def training_config(self, config: Any, folder: str) -> Any:
        """``config`` (a :class:`lmkit.config.TrainConfig`) for fine-tuning the model in ``folder``.

        The model keys come from the checkpoint (they must fit its weights); the tokenizer is the
        folder's; the optimizer, schedule, batch and window stay the config's.

        Raises:
          UsageError: a folder the family does not read, or a language model's training window
            (``num_steps``) longer than the checkpoint's positions.
        """
        keys = self.model_config(self.read_config(folder), folder)
        if not self.conditional:
            check_window(config.data.num_steps, keys["max_positions"], self.positions_key, folder)
        return fine_tuning_config(config, folder, keys, data="pairs" if self.conditional else "text",
                                  **self.train_settings)


def check_window(num_steps: int, max_positions: int, key: str, folder: str) -> None:
    """A training window must fit the positions a checkpoint has (``key`` of its ``config.json``)."""
    if num_steps > max_positions:
        raise UsageError(f"num_steps = {num_steps} (the training window) exceeds {key} = {max_positions} of "
                         f"{os.path.join(folder, HF_CONFIG)}; pass --set num_steps={max_positions} or less")


def fine_tuning_config(config: Any, folder: str, keys: Mapping[str, Any], **settings: Any) -> Any:
    """``config`` with the model of ``folder``: its ``keys`` (``model`` and the constructor's arguments) over
    the config's model section (an argument the checkpoint does not set stays); the tokenizer the folder's,
    ``init_from`` the folder, and ``settings`` on top."""
    keys = dict(keys)
    model = {"name": keys.pop("model"), "embedding_dim": 0, **keys}
    return config.replace(model=model, init_from=os.path.abspath(folder), tokenizer="hf", **settings)


def converter_table() -> Mapping[str, str]:
    """``model_type -> "module:Class"`` of every converter, in the families' order."""
    return import_object(CONVERTER_TABLE, "converter table")


@functools.lru_cache(maxsize=None)
def converter_at(path: str) -> Converter:
    """The converter class at ``path`` (``"module:Class"``), made once.

    Raises:
      UsageError: a path that does not import, or a class that is not a :class:`Converter`.
    """
    cls = import_object(path, "converter")
    if not (inspect.isclass(cls) and issubclass(cls, Converter)):
        raise UsageError(f"converter {path!r} is not a subclass of lmkit.hub.converters.Converter")
    return cls()


def converter_for(model_type: Any, path: str = HF_CONFIG) -> Converter:
    """The converter of the family that reads ``model_type`` (``path``: the config.json, in messages).

    Raises:
      UsageError: a model type lmkit does not read (listing those it does).
    """
    table = converter_table()
    if model_type not in table:
        raise UsageError(f"{path}: model_type {model_type!r} is not one lmkit reads; it reads "
                         f"{', '.join(table)}")
    return converter_at(table[model_type])


def converter_of(folder: str) -> Converter:
    """The converter of a Hugging Face folder (by its config.json's ``model_type``).

    Raises:
      UsageError: no config.json, or a model type lmkit does not read (listing those it does).
    """
    path, model_type = model_type_of(folder)
    return converter_for(model_type, path)


def check_pretrained(folder: str) -> Dict[str, Any]:
    """The folder's config.json, checked by its family (one message naming the file)."""
    return converter_of(folder).read_config(folder)


def load_pretrained_weights(model: Any, folder: str) -> Any:
    """Fills ``model`` (built from the folder's config) with the folder's weights."""
    return converter_of(folder).load_weights(model, folder)


def pretrained_training_config(config: Any, folder: str) -> Any:
    """``config`` (a TrainConfig) for fine-tuning the model in ``folder``: its family's model keys."""
    return converter_of(folder).training_config(config, folder)


def pair_framing(folder: str) -> Optional[Dict[str, Any]]:
    """How an encoder-decoder family frames its texts (:class:`lmkit.hub.tokenizer.HFTokenizer`'s
    ``framing``), or None for a language model's folder (or a folder that is not a model's)."""
    if not is_hf_folder(folder):
        return None
    try:
        converter = converter_of(folder)
    except UsageError:
        return None
    return converter.framing(converter.read_config(folder)) if converter.conditional else None
