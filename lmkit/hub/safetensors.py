"""The weights of a Hugging Face folder: safetensors files (one, or shards), read and written without PyTorch.

Reading goes through the ``safetensors`` package: :func:`read_tensors`
gives TensorFlow tensors cast to float32 (so bfloat16 checkpoints load
without PyTorch), one file and one tensor at a time; :func:`load_mapped`
checks every tensor of a folder against the variable it fills, name and
shape, before any is assigned (the loader of the families whose tensors map
one to one, as Llama's). :func:`read_state_dict` reads a folder's single
weights file whole, falling back to a PyTorch ``pytorch_model.bin``.

Writing: :func:`write_pretrained` (a fine-tune: the model's tensors with the
source folder's config and tokenizer) and :func:`write_new` (a model trained
from scratch: its own config and tokenizer), both whole or not at all.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Collection, Dict, Iterator, List, Mapping, Tuple

from lmkit.core.errors import UsageError
from lmkit.hub.folders import GENERATION_CONFIG, HF_CONFIG, read_json, write_folder, write_json

__all__ = ["BUFFERS", "PYTORCH_BIN", "SAFETENSORS", "SAFETENSORS_INDEX", "load_mapped", "read_state_dict",
           "read_tensors", "save_tensors", "tensor_shapes", "weight_files", "write_new", "write_pretrained"]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
#: Tensors some checkpoints carry that are not parameters.
BUFFERS = ("rotary_emb.inv_freq",)
# Files of the source folder a fine-tune's export carries over unchanged (the architecture and the
# tokenizer do not change in fine-tuning).
_CARRIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "tokenizer.model")


def weight_files(folder: str, auto_class: str = "AutoModelForCausalLM") -> List[str]:
    """The safetensors files of the folder: one, or the shards its index lists.

    Raises:
      UsageError: no weights, an index naming a missing shard, or only a
        PyTorch ``.bin`` checkpoint (with the command that converts it).
    """
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UsageError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.isfile(os.path.join(folder, name)):
                raise UsageError(f"{index} lists the shard {name}, which is not in {folder}; download every "
                                 "shard of the checkpoint")
        return [os.path.join(folder, name) for name in files]
    single = os.path.join(folder, SAFETENSORS)
    if os.path.isfile(single):
        return [single]
    raise UsageError(f"{folder} holds no {SAFETENSORS} (nor {SAFETENSORS_INDEX}); lmkit reads safetensors "
                     "checkpoints: convert a PyTorch one where PyTorch is with "
                     f"{auto_class}.from_pretrained(folder).save_pretrained(folder)")


def read_tensors(path: str) -> Iterator[Tuple[str, Any]]:
    """(name, float32 NumPy array) of one safetensors file, one tensor at a time (:data:`BUFFERS` left out)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise UsageError(f"reading {path} needs the safetensors package; pip install 'lmkit[hf]'") from None
    import tensorflow as tf
    try:
        handle = safe_open(path, framework="tf")
    except Exception as exc:
        raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None
    with handle as f:
        for name in f.keys():
            if name.endswith(BUFFERS):
                continue
            yield name, tf.cast(f.get_tensor(name), tf.float32).numpy()


def tensor_shapes(path: str) -> Dict[str, List[int]]:
    """name -> shape of every tensor of one safetensors file (read from its header, no data)."""
    from safetensors import safe_open
    try:
        with safe_open(path, framework="tf") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys() if not name.endswith(BUFFERS)}
    except Exception as exc:
        raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None


def load_mapped(folder: str, targets: Mapping[str, Tuple[Any, bool]], owner: str,
                ignore: Collection[str] = ()) -> List[str]:
    """Fills variables from the folder's checkpoint, one tensor each (transposed where the map says).

    Every tensor's name and shape is checked, shard by shard, before any is
    assigned, so a mismatch leaves the model as it was; the values are then
    read one file at a time.

    Args:
      folder: the Hugging Face folder.
      targets: Hugging Face tensor name -> (lmkit variable, whether the tensor is transposed to fill it).
      owner: the model, in messages ("lmkit's llama").
      ignore: tensor names a checkpoint may hold that fill nothing (a tied softmax stored twice).

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the file,
        the tensor and both shapes).
    """
    files = weight_files(folder)
    config = os.path.join(folder, HF_CONFIG)
    where: Dict[str, str] = {}
    for path in files:
        for name, shape in tensor_shapes(path).items():
            if name in ignore:
                continue
            if name not in targets:
                raise UsageError(f"{path} holds {name}, which {owner} has no use for; is {config} the config "
                                 "of these weights?")
            variable, transposed = targets[name]
            want = list(variable.shape)[::-1] if transposed else list(variable.shape)
            if shape != want:
                raise UsageError(f"{path}: {name} has shape {shape} but {config} gives {want}; the weights and "
                                 "the config come from different models")
            where[name] = path
    missing = [name for name in targets if name not in where]
    if missing:
        raise UsageError(f"{folder} lacks {missing[0]} ({len(missing)} tensors missing); the checkpoint is "
                         "incomplete or of another model")
    for path in files:
        for name, value in read_tensors(path):
            if name in targets:
                variable, transposed = targets[name]
                variable.assign(value.T if transposed else value)
    return files


def read_state_dict(folder: str, model_class: str) -> Tuple[Dict[str, Any], str]:
    """Every tensor of the folder's one weights file as a float32 NumPy array, and the file read:
    ``model.safetensors``, else a PyTorch ``pytorch_model.bin`` (which needs PyTorch).

    Args:
      folder: the Hugging Face folder.
      model_class: the ``transformers`` class that converts a ``.bin`` folder, in the message that says how.

    Raises:
      UsageError: no weights file, or only ``pytorch_model.bin`` without PyTorch.
    """
    import numpy as np

    path = os.path.join(folder, SAFETENSORS)
    if os.path.isfile(path):
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise UsageError(f"reading {path} needs the safetensors package; pip install 'lmkit[hf]'") from None
        try:
            tensors = load_file(path)
        except Exception as exc:
            raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None
        return {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}, path
    path = os.path.join(folder, PYTORCH_BIN)
    if not os.path.isfile(path):
        raise UsageError(f"{folder} holds no weights: {SAFETENSORS} (or {PYTORCH_BIN}) is missing; save "
                         "the model there with model.save_pretrained(folder)")
    try:
        import torch
    except ImportError:
        raise UsageError(f"{folder} holds only {PYTORCH_BIN}, which needs PyTorch to read, and PyTorch is "
                         "not installed; convert it once where PyTorch is: python -c \"from transformers "
                         f"import {model_class} as M; M.from_pretrained('{folder}').save_pretrained("
                         f"'{folder}')\" (writes {SAFETENSORS}), or pip install torch") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"{path} is not a readable PyTorch state dict ({exc})") from None
    return {k: np.asarray(v.detach().float().numpy(), dtype=np.float32) for k, v in state.items()}, path


def save_tensors(tensors: Mapping[str, Any], path: str) -> None:
    """Writes ``tensors`` (Hugging Face names and layouts) as one float32 safetensors file, as PyTorch's."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}, path,
              metadata={"format": "pt"})


def write_pretrained(tensors: Mapping[str, Any], source: str, output: str) -> List[str]:
    """The folder ``output`` as ``transformers`` reads it: ``tensors`` (Hugging Face names and layouts) in
    ``model.safetensors`` as float32, and the config and tokenizer files of ``source`` (the folder a run
    was fine-tuned from: fine-tuning keeps the architecture). Written aside and renamed into place."""

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, SAFETENSORS))
        for name in _CARRIED:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(tmp, name))
        config = read_json(os.path.join(tmp, HF_CONFIG))
        config["torch_dtype"] = config["dtype"] = "float32"  # the weights as written
        write_json(os.path.join(tmp, HF_CONFIG), config)

    return write_folder(output, fill)


def write_new(tensors: Mapping[str, Any], config: Dict[str, Any], generation: Dict[str, Any], tokenizer: Any,
              model_max_length: int, output: str) -> List[str]:
    """The folder ``output`` of a model with no Hugging Face folder behind it: ``tensors`` in
    ``model.safetensors`` (float32), its ``config.json``, ``generation_config.json`` and the tokenizer's
    files (``tokenizer.save_hf``). Written aside and renamed into place.

    Returns:
      The names of the files written.
    """

    def fill(tmp: str) -> None:
        save_tensors(tensors, os.path.join(tmp, SAFETENSORS))
        write_json(os.path.join(tmp, HF_CONFIG), config)
        write_json(os.path.join(tmp, GENERATION_CONFIG), generation)
        tokenizer.save_hf(tmp, model_max_length)

    return write_folder(output, fill)
