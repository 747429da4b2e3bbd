"""A run written as a Hugging Face folder that ``transformers`` loads, whole or not at all.

Two ways, both driven by the family's converter (:class:`lmkit.hub.converters.Converter`):

- a fine-tune (:func:`export_fine_tune`): the model's weights with the config, tokenizer and chat template of
  the folder it was fine-tuned from (fine-tuning keeps the architecture);
- a model with no folder behind it (:func:`export_new`): the ``config.json`` its family writes from the
  model's arguments (``Converter.config_out``), ``generation_config.json`` and the run's tokenizer in
  Hugging Face's form (``tokenizer.save_hf``).

Either is written into a temporary folder next to ``output`` and renamed into place
(:func:`lmkit.hub.folders.write_folder`); the weights are float32, as the config says.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Mapping, Optional

from lmkit.core.errors import UsageError
from lmkit.hub.folders import (
    GENERATION_CONFIG,
    HF_CONFIG,
    check_export_source,
    check_new_folder,
    read_json,
    write_folder,
    write_json,
)
from lmkit.hub.safetensors import SAFETENSORS, save_tensors

__all__ = ["CARRIED", "config_json", "export", "export_fine_tune", "export_new", "write_new", "write_pretrained"]

#: Files of the source folder a fine-tune's export carries over unchanged.
CARRIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "special_tokens_map.json", "chat_template.jinja", "tokenizer.model")
#: The arguments a fine-tune's source folder must give as the run's model has them.
_SHAPE_KEYS = ("hidden_size", "num_layers", "decoder_layers")
#: What every written config.json says of the weights beside it.
_FLOAT32 = {"torch_dtype": "float32", "dtype": "float32"}


def write_pretrained(tensors: Mapping[str, Any], source: str, output: str) -> List[str]:
    """The folder ``output``: ``tensors`` (Hugging Face names and layouts) in ``model.safetensors`` as float32,
    and the config and tokenizer files of ``source``. Returns the names of the files written."""

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, SAFETENSORS))
        for name in CARRIED:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(tmp, name))
        config = read_json(os.path.join(tmp, HF_CONFIG))
        write_json(os.path.join(tmp, HF_CONFIG), {**config, **_FLOAT32})  # the weights as written

    return write_folder(output, fill)


def write_new(tensors: Mapping[str, Any], config: Dict[str, Any], generation: Dict[str, Any], tokenizer: Any,
              model_max_length: int, output: str) -> List[str]:
    """The folder ``output``: ``tensors`` in ``model.safetensors`` (float32), ``config`` as ``config.json``,
    ``generation`` as ``generation_config.json`` and the tokenizer's files (``tokenizer.save_hf``).
    Returns the names of the files written."""

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, SAFETENSORS))
        write_json(os.path.join(tmp, HF_CONFIG), config)
        write_json(os.path.join(tmp, GENERATION_CONFIG), generation)
        tokenizer.save_hf(tmp, model_max_length)

    return write_folder(output, fill)


def export_fine_tune(converter: Any, model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a run fine-tuned from the folder ``source`` (its ``init_from``): the model's weights, the
    folder's config and tokenizer files.

    Raises:
      UsageError: a run started from scratch, a source folder that is gone or describes another model, or
        an ``output`` that exists and is not empty.
    """
    check_export_source(source, converter.model, output)
    theirs = converter.config_in(converter.read_config(source), os.path.join(source, HF_CONFIG))
    mine = converter.arguments(model)
    for key in _SHAPE_KEYS:
        if key in theirs and key in mine and theirs[key] != mine[key]:
            raise UsageError(f"{source} does not describe this run's model (its {key} is {theirs[key]}, the "
                             f"run's {mine[key]})")
    return write_pretrained(converter.tensors(model), source, output)


def config_json(converter: Any, arguments: Dict[str, Any]) -> Dict[str, Any]:
    """The ``config.json`` of a model with these constructor ``arguments``, as the family writes it
    (``Converter.config_out``), with its architecture and the float32 weights beside it.

    Raises:
      UsageError: a model the family cannot write.
    """
    written = converter.config_out(arguments)
    model_type = written.get("model_type", next(iter(converter.architectures)))
    return {"model_type": model_type, "architectures": [converter.architectures[model_type]], **written, **_FLOAT32}


def export_new(converter: Any, model: Any, tokenizer: Any, output: str) -> List[str]:
    """Writes a model with its own tokenizer: the ``config.json`` its family writes, the weights, and
    the tokenizer's Hugging Face form, whose start and end ids (``tokenizer.model_token_ids()``) the
    configs name. lmkit's own tokenizers start a text after a line break (``bos_token_id``) and end
    no document (``eos_token_id`` null).

    Raises:
      UsageError: a model the family cannot write, a tokenizer without a Hugging Face form, or an
        ``output`` that exists and is not empty; nothing is written then.
    """
    arguments = converter.arguments(model)
    config = config_json(converter, arguments)
    ids = tokenizer.model_token_ids()  # a tokenizer without a form stops here
    check_new_folder(output)
    config.update(ids)
    tensors = converter.tensors(model)
    tensors.update(converter.extra_tensors(tensors, config))
    return write_new(tensors, config, ids, tokenizer, arguments["max_positions"], output)


def export(converter: Any, model: Any, tokenizer: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a run (``source``: the folder it was fine-tuned from, or None) as the family exports it:
    a fine-tune with its folder's config, unless the family writes its own (``exports_own_config``)."""
    converter.check_model(model, "export --format hf")
    if source and not converter.exports_own_config:
        return export_fine_tune(converter, model, source, output)
    return export_new(converter, model, tokenizer, output)
