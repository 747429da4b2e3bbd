"""The model a run folder's ``config.json`` describes, whichever lmkit wrote it."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from lmkit.config.model import ModelConfig
from lmkit.config.sections import AdapterConfig
from lmkit.config.spelling import DEPRECATED, FLAT_KEYS, LEGACY_BACKEND_KEY, SECTIONS, spell

__all__ = ["stored_model_config"]


def stored_model_config(stored: Mapping[str, Any], source: str = "config.json") -> Dict[str, Any]:
    """The model's settings (as :meth:`TrainConfig.model_config` gives them) and the LoRA adapters'
    (``lora_rank``, ``lora_alpha``, ``lora_targets``) of a stored config, flat (0.x) or by section.

    A key the file lacks (an older lmkit did not store it) has its default;
    keys this lmkit does not know are left out. Nothing else is checked: it
    is for comparing the run in a folder with the config that resumes it.

    Raises:
      ConfigError: a known key of a type that cannot be read.
    """
    known = {k: v for k, v in stored.items()
             if k in FLAT_KEYS or k in SECTIONS or k in DEPRECATED or k == LEGACY_BACKEND_KEY}
    sections = spell(known, source)
    model = dict(sections["model"])
    config = ModelConfig(name=model.pop("name", None), arguments=model).model_config()
    adapters = {**AdapterConfig().to_dict(), **sections["adapters"]}
    config.update({k: adapters[k] for k in ("lora_rank", "lora_alpha", "lora_targets")})
    return config
