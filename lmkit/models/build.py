"""A run's model as its config describes it: built, pretrained weights loaded, LoRA adapters added; and
the model of a Hugging Face folder (:func:`load_pretrained`).

``lmkit train`` (:func:`build_run_model`) and :func:`lmkit.train.load_model`
(:func:`restore_lora_run`) share these steps, so a LoRA run is rebuilt for
generation, evaluation and export exactly as it was trained: the base from
its ``init_from`` folder, the adapters from the run's checkpoint (which holds
nothing else), merged into the base's kernels.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from lmkit.core.errors import UsageError

__all__ = ["build_run_model", "describe_lora", "load_pretrained", "lora_targets_of"]


def load_pretrained(folder: str, tokenizer: Any = None, converter: Optional[Any] = None
                    ) -> Tuple[Any, Any, Dict[str, Any]]:
    """``(model, tokenizer, config.json)`` of a Hugging Face folder of any family lmkit reads.

    The family's converter (:func:`lmkit.hub.converters.converter_of`, by the folder's ``model_type``)
    checks the config and gives the model's keys; the tokenizer (read when None) is checked against the
    vocabulary; the model is built and filled with the folder's weights.

    Args:
      folder: the Hugging Face folder.
      tokenizer: its tokenizer when already read (:func:`lmkit.hub.tokenizer.read_tokenizer`).
      converter: the family's converter, when known (a folder of another family is refused by it).

    Raises:
      UsageError: any problem with the folder (one message naming the file).
    """
    from lmkit.hub.converters import converter_of
    from lmkit.hub.folders import check_vocabulary
    from lmkit.hub.tokenizer import read_tokenizer
    from lmkit.models.registry import build_model

    converter = converter if converter is not None else converter_of(folder)
    config = converter.read_config(folder)
    tokenizer = tokenizer if tokenizer is not None else read_tokenizer(folder)
    check_vocabulary(tokenizer, config["vocab_size"], folder)
    model = build_model(converter.model_config(config, folder))
    converter.load_weights(model, folder)
    return model, tokenizer, config


def lora_targets_of(config: Any, model: Any) -> Tuple[str, ...]:
    """The Linear layer names ``config.adapters.lora_targets`` lists, or the model's defaults when it is empty."""
    listed = config.adapters.lora_targets
    if listed.strip():
        return tuple(t.strip() for t in listed.split(",") if t.strip())
    targets = tuple(getattr(model, "lora_targets", ()))
    if not targets:
        raise UsageError(f"model {config.model.name!r} names no default LoRA targets; set lora_targets "
                         "(comma-separated names of its linear layers)")
    return targets


def build_run_model(config: Any, *, load_pretrained: bool = True) -> Any:
    """The model of ``config`` (a TrainConfig), with ``init_from``'s weights and ``lora_rank``'s adapters.

    With ``lora_rank`` > 0 the base's variables are created not trainable
    (so neither gradients nor optimizer slots are made for them) and the
    adapters are the only trainable variables. Call it inside the backend's
    ``dist.scope()``. ``load_pretrained=False`` skips reading the folder (a
    checkpoint restores every weight next).
    """
    from lmkit.layers.lora import add_lora, frozen
    from lmkit.models.registry import build_model

    adapters, init_from = config.adapters, config.checkpoints.init_from
    if adapters.lora_rank:
        with frozen():
            model = build_model(config.model_config())
    else:
        model = build_model(config.model_config())
    if init_from and load_pretrained:
        from lmkit.hub.converters import load_pretrained_weights
        if not os.path.isdir(init_from):
            raise UsageError(f"the base model folder {init_from} (init_from) is gone; a LoRA run "
                             "keeps only its adapters: put the folder back or edit init_from in the run's "
                             "config.json")
        load_pretrained_weights(model, init_from)
    if adapters.lora_rank:
        add_lora(model, rank=adapters.lora_rank, alpha=adapters.lora_alpha, dropout=adapters.lora_dropout,
                 targets=lora_targets_of(config, model))
    return model


def describe_lora(model: Any) -> str:
    """One line: the adapters' size against the frozen base's (empty without adapters)."""
    from lmkit.layers.lora import lora_of

    lora = lora_of(model)
    if lora is None:
        return ""
    trained = lora.num_parameters()
    total = int(sum(v.shape.num_elements() for v in model.variables))
    base = total - trained
    return (f"LoRA: rank {lora.rank}, alpha {lora.alpha:g} on {', '.join(lora.targets)} "
            f"({len(lora.adapters)} layers): {trained:,} trained parameters, {trained / base:.3%} of the "
            f"frozen base's {base:,}")
