"""The tensors of a Hugging Face folder, read and written without PyTorch where it can be.

:class:`Checkpoint` is a folder's tensors, however they are stored:
``model.safetensors``, the shards ``model.safetensors.index.json`` lists
(:func:`weight_files`), or PyTorch's ``pytorch_model.bin``, which needs
PyTorch. Its :meth:`~Checkpoint.shapes` come from the files' headers, so a
loader (:func:`lmkit.hub.weights.load_ports`) checks every tensor before it
reads one; :meth:`~Checkpoint.tensors` gives them as float32 NumPy arrays,
one file and one tensor at a time (read through TensorFlow, so bfloat16
checkpoints load without PyTorch). :func:`save_tensors` writes one float32
file, as ``save_pretrained`` does.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError
from lmkit.hub.folders import read_json

__all__ = ["BUFFERS", "PYTORCH_BIN", "SAFETENSORS", "SAFETENSORS_INDEX", "Checkpoint", "read_tensors",
           "save_tensors", "tensor_shapes", "weight_files"]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
#: Tensors some checkpoints carry that are not parameters (name endings).
BUFFERS = ("rotary_emb.inv_freq",)


def weight_files(folder: str) -> List[str]:
    """The safetensors files of the folder: one, or the shards its index lists; empty when it has none.

    Raises:
      UsageError: an index without a weight map, or naming a shard that is not there.
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
    return [single] if os.path.isfile(single) else []


def _safe_open(path: str) -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise UsageError(f"reading {path} needs the safetensors package; pip install 'lmkit[hf]'") from None
    try:
        return safe_open(path, framework="tf")
    except Exception as exc:  # the package's own error types: a truncated or foreign file
        raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None


def read_tensors(path: str) -> Iterator[Tuple[str, Any]]:
    """(name, float32 NumPy array) of one safetensors file, one tensor at a time."""
    import tensorflow as tf

    with _safe_open(path) as f:
        for name in f.keys():
            yield name, tf.cast(f.get_tensor(name), tf.float32).numpy()


def tensor_shapes(path: str) -> Dict[str, List[int]]:
    """name -> shape of every tensor of one safetensors file (read from its header, no data)."""
    try:
        with _safe_open(path) as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None


def _read_bin(path: str, model_class: str) -> Dict[str, Any]:
    """Every tensor of a PyTorch ``pytorch_model.bin`` as a float32 NumPy array.

    Raises:
      UsageError: PyTorch is not installed (with the command that converts the folder where it is), or the
        file is not a state dict.
    """
    import numpy as np

    folder = os.path.dirname(path)
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
    return {k: np.asarray(v.detach().float().numpy(), dtype=np.float32) for k, v in state.items()}


class Checkpoint:
    """The tensors of a Hugging Face folder: safetensors (one file or shards), else ``pytorch_model.bin``.

    Args:
      folder: the folder.
      skip: endings of tensor names that are no parameters (buffers), left out of everything below.
      model_class: the ``transformers`` class that converts a ``.bin`` folder, in the message that says how.

    Raises:
      UsageError: the folder holds no weights, a broken index, or only ``pytorch_model.bin`` without PyTorch.
    """

    def __init__(self, folder: str, skip: Sequence[str] = BUFFERS,
                 model_class: str = "AutoModelForCausalLM") -> None:
        self.folder = folder
        self.skip = tuple(skip)
        self.files = weight_files(folder)
        self._state: Optional[Dict[str, Any]] = None
        if not self.files:
            path = os.path.join(folder, PYTORCH_BIN)
            if not os.path.isfile(path):
                raise UsageError(f"{folder} holds no weights: {SAFETENSORS} (or {PYTORCH_BIN}) is missing; save "
                                 "the model there with model.save_pretrained(folder)")
            self._state, self.files = _read_bin(path, model_class), [path]

    def _kept(self, name: str) -> bool:
        return not name.endswith(self.skip)

    def shapes(self) -> Dict[str, Tuple[List[int], str]]:
        """name -> (shape, the file that holds it), from the files' headers (no tensor is read)."""
        if self._state is not None:
            return {n: (list(v.shape), self.files[0]) for n, v in self._state.items() if self._kept(n)}
        return {name: (shape, path) for path in self.files for name, shape in tensor_shapes(path).items()
                if self._kept(name)}

    def tensors(self) -> Iterator[Tuple[str, Any]]:
        """(name, float32 NumPy array) of every tensor, one file at a time."""
        if self._state is not None:
            yield from ((n, v) for n, v in self._state.items() if self._kept(n))
            return
        for path in self.files:
            yield from ((n, v) for n, v in read_tensors(path) if self._kept(n))


def save_tensors(tensors: Mapping[str, Any], path: str) -> None:
    """Writes ``tensors`` (Hugging Face names and layouts) as one float32 safetensors file, as PyTorch's."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}, path,
              metadata={"format": "pt"})
