"""The converter skeleton: a Hugging Face folder in as an lmkit model, and an lmkit run out as a folder.

A model family supplies what is its own, in a :class:`Converter` subclass
beside its model (``lmkit/models/<family>/convert.py``): its declarations
(the ``model_type`` s it reads, the lmkit model they load as, the keys its
``config.json`` must give, transformers' defaults for the others), its
**config mapping** (:meth:`Converter.config_in`: ``config.json`` -> the
model's constructor arguments, with the checks of what lmkit does not
compute; :meth:`Converter.config_out`, the way back) and its **weight
mapping** (:meth:`Converter.weights`: the :class:`~lmkit.hub.weights.Port` s
from lmkit's variables to the checkpoint's tensors, with their transforms).

Everything else lives here once: reading and checking a folder
(:meth:`~Converter.read_config`), loading sharded safetensors into the model
(:meth:`~Converter.load_weights`, :mod:`lmkit.hub.weights`), export
(:meth:`~Converter.export`, :mod:`lmkit.hub.export`), LoRA adapters as PEFT
folders (:mod:`lmkit.hub.peft`) and the config of a fine-tune
(:meth:`~Converter.training_config`).

One switch on ``config.json``'s ``model_type`` picks the converter
(:func:`converter_of`). The table it reads is assembled from the model
families (:data:`lmkit.models.registry.CONVERTERS`); the hub sits below the
models, so it names that table by import path (:data:`CONVERTER_TABLE`), and
a converter's module loads on first use.
"""

from __future__ import annotations

import abc
import functools
import inspect
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object
from lmkit.hub.folders import HF_CONFIG, is_hf_folder, model_type_of, read_config_json
from lmkit.hub.safetensors import BUFFERS

__all__ = ["CONVERTER_TABLE", "Converter", "check_pretrained", "check_window", "converter_at",
           "converter_for", "converter_of", "converter_table", "fine_tuning_config", "load_pretrained_weights",
           "pair_framing", "pretrained_training_config"]

#: Where the table ``model_type -> "module:Class"`` of converters lives (assembled from the model families).
CONVERTER_TABLE = "lmkit.models.registry:CONVERTERS"


class Converter(abc.ABC):
    """One model family's Hugging Face folders onto lmkit's model, and back.

    A family subclasses it, sets the declarations below and writes :meth:`config_in` and :meth:`weights`
    (and :meth:`config_out` where it writes models trained from scratch); it overrides no other method.

    Attributes:
      title: the family in messages (the names of the models it reads, joined by slashes).
      model: the lmkit model (a name of ``lmkit.models.MODELS``) its folders load as.
      architectures: ``model_type`` -> the ``transformers`` class of its folders.
      sizes: ``config.json`` keys that must be positive integers.
      defaults: ``transformers``' values of keys a ``config.json`` may leave out (the family's own).
      positions_key: ``config.json``'s key for the longest window (named when a training window exceeds it).
      buffers: endings of tensor names that are not parameters (left out when loading).
      train_settings: settings a fine-tune of the family fixes beside the model's (dotted: ``"data.share_vocab"``).
      conditional: an encoder-decoder: it fine-tunes on ``data = "pairs"``, frames its texts (:meth:`framing`).
      exports_adapters: a LoRA run's adapters export as a PEFT folder (its adapted layers are torch Linears).
      exports_own_config: a fine-tune exports with :meth:`config_out`'s config, not its source folder's.
    """

    title: str = ""
    model: str = ""
    architectures: Mapping[str, str] = {}
    sizes: Tuple[str, ...] = ()
    defaults: Mapping[str, Any] = {}
    positions_key: str = "max_position_embeddings"
    buffers: Tuple[str, ...] = BUFFERS
    train_settings: Mapping[str, Any] = {}
    conditional: bool = False
    exports_adapters: bool = False
    exports_own_config: bool = False

    # ---------------------------------------------------------------- what a family supplies
    @abc.abstractmethod
    def config_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        """The model's constructor arguments for ``config`` (a ``config.json`` with :attr:`defaults`).

        Raises:
          UsageError: a setting lmkit does not compute (naming ``path``, the key and the value).
        """

    def config_out(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        """The ``config.json`` of a model with these constructor ``arguments`` (a ``model_type`` of
        :attr:`architectures` when the family has several; the hub adds the architecture, dtype and ids).

        Raises:
          UsageError: a model the family cannot write (this default: every model without a folder behind it).
        """
        raise UsageError(f"export --format hf of a {self.model} run needs the Hugging Face folder it was "
                         "fine-tuned from (its init_from), for the config and the tokenizer; this run started "
                         "from scratch")

    @abc.abstractmethod
    def weights(self, model: Any) -> List[Any]:
        """The :class:`~lmkit.hub.weights.Port` s of ``model``: every variable with the tensors that fill it."""

    def stored_names(self, name: str) -> Sequence[str]:
        """The names a checkpoint may store the tensor ``name`` under, best first (``name`` first)."""
        return (name,)

    def extra_tensors(self, tensors: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
        """Tensors a written ``config`` asks for that the model has no variable of (zeros, say)."""
        return {}

    def framing(self, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """An encoder-decoder's framing of texts (:class:`lmkit.hub.tokenizer.HFTokenizer`'s ``framing``)."""
        return None

    # ---------------------------------------------------------------- the skeleton
    def read_config(self, folder: str) -> Dict[str, Any]:
        """The folder's ``config.json`` (with :attr:`defaults`), checked to be a model of the family that
        lmkit computes exactly.

        Raises:
          UsageError: a missing file, another model type, a missing size or a setting lmkit does not
            compute (naming the file, the key and the value).
        """
        path, config = read_config_json(folder)
        model_type = config.get("model_type")
        if model_type not in self.architectures:
            raise UsageError(f"{path}: model_type {model_type!r} is not one of {', '.join(self.architectures)} "
                             f"({', '.join(self.architectures.values())}), which lmkit's {self.model} reads")
        config = {**self.defaults, **config}
        for key in self.sizes:
            if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or config[key] < 1:
                raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
        self.config_in(config, path)  # the family's checks
        return config

    def model_config(self, config: Dict[str, Any], folder: str = "") -> Dict[str, Any]:
        """``lmkit.models.build_model``'s keys of the model ``config`` (a checked ``config.json``) describes."""
        return {"model": self.model, **self.config_in({**self.defaults, **config}, os.path.join(folder, HF_CONFIG))}

    def arguments(self, model: Any) -> Dict[str, Any]:
        """The constructor arguments of ``model`` (its ``get_config()`` without the name)."""
        config = dict(model.get_config())
        config.pop("model", None)
        return config

    def check_model(self, model: Any, what: str) -> None:
        """Raises unless ``model`` is the family's model (the one its folders load as)."""
        name = model.get_config().get("model")
        if name != self.model:
            raise UsageError(f"{what} needs a model of {self.title}'s architecture (model = {self.model!r}); this "
                             f"one is {type(model).__name__} with model = {name!r}")

    def tensors(self, model: Any) -> Dict[str, Any]:
        """The model's weights under their Hugging Face names, in Hugging Face's layouts."""
        from lmkit.hub.weights import hf_tensors
        return hf_tensors(self.weights(model))

    def load_weights(self, model: Any, folder: str) -> List[str]:
        """Fills ``model`` (built from :meth:`model_config`) with the folder's weights; returns the files read.

        Raises:
          UsageError: a missing, unexpected or mis-shaped tensor (naming the file, the tensor and both
            shapes); the model is left as it was.
        """
        from lmkit.hub.safetensors import Checkpoint
        from lmkit.hub.weights import load_ports
        self.check_model(model, f"loading a {self.title} checkpoint")
        checkpoint = Checkpoint(folder, self.buffers,
                                "AutoModelForSeq2SeqLM" if self.conditional else "AutoModelForCausalLM")
        return load_ports(self.weights(model), checkpoint, self.stored_names, f"lmkit's {self.model}")

    def export(self, model: Any, tokenizer: Any, config: Any, output: str) -> List[str]:
        """Writes a run's ``model`` and ``tokenizer`` (``config``: its TrainConfig) as a new folder
        ``transformers`` loads, whole or not at all; returns the names of the files written."""
        from lmkit.hub import export
        return export.export(self, model, tokenizer, config.checkpoints.init_from, output)

    def export_adapters(self, model: Any, config: Any, output: str) -> List[str]:
        """Writes a LoRA run's adapters alone as a PEFT adapter folder (where :attr:`exports_adapters`)."""
        if not self.exports_adapters:
            raise UsageError(f"export --format peft is not available for {self.title} runs; use --format hf")
        from lmkit.hub.peft import export_adapters
        return export_adapters(self, model, config.checkpoints.init_from, output)

    def training_config(self, config: Any, folder: str) -> Any:
        """``config`` (a :class:`lmkit.config.TrainConfig`) for fine-tuning the model in ``folder``.

        The model's arguments come from the checkpoint (they must fit its weights); the tokenizer is the
        folder's; the optimizer, schedule, batch and window stay the config's.

        Raises:
          UsageError: a folder the family does not read, or a language model's training window
            (``num_steps``) longer than the checkpoint's positions.
        """
        arguments = self.config_in(self.read_config(folder), os.path.join(folder, HF_CONFIG))
        if not self.conditional:
            check_window(config.data.num_steps, arguments["max_positions"], self.positions_key, folder)
        return fine_tuning_config(config, folder, self.model, arguments, "pairs" if self.conditional else "text",
                                  self.train_settings)


def check_window(num_steps: int, max_positions: int, key: str, folder: str) -> None:
    """A training window must fit the positions a checkpoint has (``key`` of its ``config.json``)."""
    if num_steps > max_positions:
        raise UsageError(f"num_steps = {num_steps} (the training window) exceeds {key} = {max_positions} of "
                         f"{os.path.join(folder, HF_CONFIG)}; pass --set num_steps={max_positions} or less")


def fine_tuning_config(config: Any, folder: str, model: str, arguments: Mapping[str, Any], kind: str,
                       settings: Mapping[str, Any]) -> Any:
    """``config`` with the model of ``folder``: ``model`` with ``arguments`` in the model section, the
    folder's tokenizer, ``init_from`` the folder, data of ``kind``, and ``settings`` on top."""
    return config.replace(model={"name": model, "embedding_dim": 0, **arguments},
                          data={"kind": kind, "tokenizer": "hf"},
                          checkpoints={"init_from": os.path.abspath(folder)}, **settings)


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
