"""The names the config checks, looked up in the registries of the layers that own them.

The config sits at the bottom of lmkit (it imports only :mod:`lmkit.core`):
it reads a registry by its import path (:func:`lmkit.core.registry.names`),
which loads the owning module when a config is checked, not when
:mod:`lmkit.config` is imported.
"""

from __future__ import annotations

from typing import Any, Tuple

from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object, names

__all__ = ["attention_kernel_problem", "backends", "check_family_config", "is_import_path", "launcher_rank",
           "model_arguments", "model_class", "models", "precisions", "pretrained_models", "samplings",
           "seq2seq_models", "split_tokenizer", "spm_model_types", "tokenizers"]


def models() -> Tuple[str, ...]:
    """The registered model names (:data:`lmkit.models.registry.MODELS`)."""
    return names("lmkit.models.registry:MODELS", "model registry")


def pretrained_models() -> Tuple[str, ...]:
    """The model names ``init_from`` fills from a Hugging Face folder."""
    return tuple(import_object("lmkit.models.registry:pretrained_models", "model registry")())


def seq2seq_models() -> Tuple[str, ...]:
    """The registered names of encoder-decoders (they train on ``data = "pairs"``)."""
    return names("lmkit.models.registry:SEQ2SEQ_MODELS", "model registry")


def model_class(name: str) -> Tuple[type, dict]:
    """The class a model name builds and the arguments the name fixes (imports it, and TensorFlow)."""
    return import_object("lmkit.models.registry:model_class", "model registry")(name)


def model_arguments(name: str) -> Any:
    """The constructor arguments of the class a model name builds, those the name fixes left out:
    ``.defaults`` (name -> default), ``.required`` (names without one) and ``.open`` (it takes ``**kwargs``)
    (:func:`lmkit.models.registry.model_arguments`; imports the class, and TensorFlow).

    Raises:
      UsageError: an unknown model, or a class that does not import.
    """
    return import_object("lmkit.models.registry:model_arguments", "model registry")(name)


def check_family_config(cfg: Any, source: str) -> None:
    """The checks the model's family makes of a config (:func:`lmkit.models.registry.check_config`).

    Raises:
      ConfigError: what the family finds wrong.
    """
    import_object("lmkit.models.registry:check_config", "model registry")(cfg, source)


def is_import_path(name: Any) -> bool:
    """True for a user's model, ``"package.module:Class"``."""
    return isinstance(name, str) and ":" in name


def tokenizers() -> Tuple[str, ...]:
    return names("lmkit.data.tokenizers:TOKENIZERS", "tokenizer registry")


def split_tokenizer(spec: Any) -> Tuple[str, str]:
    """``(kind, source)`` of a ``tokenizer`` setting: ``hf:<folder or Hub name>`` is the ``hf`` kind read from
    there (:func:`lmkit.data.tokenizers.split_tokenizer`)."""
    return import_object("lmkit.data.tokenizers:split_tokenizer", "tokenizer registry")(spec)


def samplings() -> Tuple[str, ...]:
    return names("lmkit.data.windows:SAMPLINGS", "samplings")


def spm_model_types() -> Tuple[str, ...]:
    return names("lmkit.data.sentencepiece:MODEL_TYPES", "sentencepiece model types")


def precisions() -> Tuple[str, ...]:
    return names("lmkit.layers.precision:PRECISIONS", "precisions")


def backends() -> Tuple[str, ...]:
    return names("lmkit.distributed:BACKEND_CHOICES", "backends")


def attention_kernel_problem(value: Any) -> str:
    """Why ``value`` names no attention kernel setting ("" when it does), in the kernels' own words."""
    check_setting = import_object("lmkit.layers.kernels:check_setting", "attention kernels")
    try:
        check_setting(value)
    except UsageError as exc:
        return str(exc)
    return ""


def launcher_rank() -> int:
    """This process's rank as its launcher set it (0 without one)."""
    return int(import_object("lmkit.distributed.env:launcher_rank", "launcher rank")())
