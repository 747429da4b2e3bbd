"""What a run folder's ``config.json`` holds, whichever lmkit wrote it: by section (0.3) or flat (0.2).

lmkit 0.2 wrote every setting flat, ``keep_prob`` for the dropout and
``model_params`` for the model's other arguments; 0.3 writes the sections
(:meth:`lmkit.config.TrainConfig.to_dict`). Both read back through the
loader's spellings (:mod:`lmkit.config.spelling`), which translate the
deprecated keys without a word: :meth:`TrainConfig.from_dict` gives the whole
config, :func:`stored_setting` one setting, :func:`stored_model_config` the
model and its adapters.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from lmkit.config.model import ModelConfig
from lmkit.config.sections import AdapterConfig
from lmkit.config.spelling import DEPRECATED, FLAT_KEYS, LEGACY_BACKEND_KEY, SECTIONS, spell

__all__ = ["stored_model_config", "stored_setting"]


def stored_setting(stored: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The setting whose flat name is ``key`` (``"init_from"``, ``"data"``, ``"model"``) in a stored config,
    flat or by section; ``default`` where it holds none.

    ``"model"`` is the model's name and ``"data"`` the data's kind in either
    format. Nothing is checked: it reads one value without building the config
    (no TensorFlow, no registry).
    """
    section, field = FLAT_KEYS[key]
    values = stored.get(section)
    if isinstance(values, Mapping):  # by section
        return values.get(field, default)
    return stored.get(key, default)  # flat: 0.2's "model": "<name>", "data": "text", "init_from": ...


def stored_model_config(stored: Mapping[str, Any], source: str = "config.json") -> Dict[str, Any]:
    """The model's settings (as :meth:`TrainConfig.model_config` gives them) and the LoRA adapters'
    (``lora_rank``, ``lora_alpha``, ``lora_targets``) of a stored config, flat (0.2) or by section.

    A key the file lacks (an older lmkit did not store it) has its default: the
    constructor's for the model, the section's for the adapters; keys this lmkit
    does not know are left out. Nothing else is checked: it is for comparing the
    run in a folder with the config that resumes it.

    Raises:
      ConfigError: a known key of a type that cannot be read.
      UsageError: the model's class cannot be imported.
    """
    known = {k: v for k, v in stored.items()
             if k in FLAT_KEYS or k in SECTIONS or k in DEPRECATED or k == LEGACY_BACKEND_KEY}
    sections = spell(known, source)
    model = dict(sections["model"])
    config = ModelConfig(name=model.pop("name", None), arguments=model).model_config()
    adapters = {**AdapterConfig().to_dict(), **sections["adapters"]}
    config.update({k: adapters[k] for k in ("lora_rank", "lora_alpha", "lora_targets")})
    return config
