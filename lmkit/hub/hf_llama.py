"""Hugging Face Llama, Qwen2 and Mistral checkpoints onto lmkit's ``llama`` model.

A folder as ``save_pretrained`` writes it: ``config.json`` (``model_type``
``llama``, ``qwen2`` or ``mistral``), the weights in ``model.safetensors`` or
in shards listed by ``model.safetensors.index.json``, and the tokenizer
(``tokenizer.json``). The weights are read with ``safetensors``
(TensorFlow tensors, so bfloat16 checkpoints load without PyTorch), one
shard at a time; every tensor is checked against the variable it fills,
shape by shape, before any is assigned.

Hugging Face keeps linear weights as [out, in]; lmkit's kernels are
[in, out], so they are transposed on the way in (:func:`parameter_map`
names each pair).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.hub.hf import _read_json, build_pretrained, read_config_json

__all__ = ["FAMILIES", "config_json", "export_llama", "export_llama_from_scratch", "llama_model_config", "load_llama", "load_llama_weights",
           "check_export_source", "parameter_map", "read_llama_config", "read_tensors", "training_config",
           "weight_files", "write_pretrained"]

HF_CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: model_type -> the transformers class whose checkpoints load here
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# Tensors some checkpoints carry that are not parameters.
_BUFFERS = ("rotary_emb.inv_freq",)


def read_llama_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json``, checked to be a model lmkit's ``llama`` computes exactly.

    Raises:
      UsageError: a missing file, another model type, a missing size, or a
        setting lmkit does not compute (naming the file, the key and the value).
    """
    path, config = read_config_json(folder)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise UsageError(f"{path}: model_type {model_type!r} is not one of {', '.join(FAMILIES)} "
                         f"({', '.join(FAMILIES.values())})")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    if config.get("hidden_act", "silu") != "silu":
        raise UsageError(f"{path}: hidden_act {config.get('hidden_act')!r} is not supported (lmkit's llama "
                         "gates its feed-forward with silu)")
    if config.get("mlp_bias"):
        raise UsageError(f"{path}: mlp_bias = true is not supported (no Llama, Qwen2 or Mistral release uses it)")
    rope = _rope(config, path)
    if rope[1] is not None and rope[1]["rope_type"] not in ("linear", "llama3"):
        raise UsageError(f"{path}: rope type {rope[1]['rope_type']!r} is not supported; lmkit computes "
                         "default, linear and llama3")
    return config


def _rope(config: Dict[str, Any], path: str) -> Tuple[float, Optional[Dict[str, Any]]]:
    """``(rope_theta, rope_scaling or None)`` from a config of any transformers version.

    transformers 5 writes ``rope_parameters`` (theta and type in one dict);
    earlier versions ``rope_theta`` and ``rope_scaling``.
    """
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = config.get("rope_theta", 10000.0)
        scaling = dict(config.get("rope_scaling") or {})
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UsageError(f"{path}: rope_theta = {theta!r} must be a number > 0")
    kind = scaling.pop("rope_type", scaling.pop("type", "default")) if scaling else "default"
    if kind == "default":
        return float(theta), None
    return float(theta), {"rope_type": kind, **scaling}


def llama_model_config(config: Dict[str, Any], path: str = HF_CONFIG) -> Dict[str, Any]:
    """``lmkit.models.build_model`` keys of the model ``config`` (a checked ``config.json``) describes."""
    theta, scaling = _rope(config, path)
    model_type = config["model_type"]
    heads = config["num_attention_heads"]
    window = 0
    layer_types = None
    if model_type == "mistral":
        window = config.get("sliding_window") or 0
    elif model_type == "qwen2" and config.get("use_sliding_window"):
        window = config.get("sliding_window") or 0
        layer_types = config.get("layer_types")
        if layer_types is None:  # transformers < 5: layers from max_window_layers on slide
            first = config.get("max_window_layers", config["num_hidden_layers"])
            layer_types = ["full_attention" if i < first else "sliding_attention"
                           for i in range(config["num_hidden_layers"])]
    attention_bias = bool(config.get("attention_bias", False))
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {
        "model": "llama", "vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"],
        "num_layers": config["num_hidden_layers"], "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": head_dim if head_dim != config["hidden_size"] // heads else 0,
        "ffn_dim": config["intermediate_size"],
        "max_positions": config.get("max_position_embeddings", 2048), "rope_theta": theta,
        "rope_scaling": scaling, "sliding_window": window, "layer_types": layer_types,
        "qkv_bias": model_type == "qwen2" or attention_bias, "attention_output_bias": attention_bias,
        "rms_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "tie_weights": bool(config.get("tie_word_embeddings", False)), "activation": "silu",
        "keep_prob": round(1.0 - float(config.get("attention_dropout", 0.0) or 0.0), 12),
        "init_scale": float(config.get("initializer_range", 0.02)),
    }


def parameter_map(model: Any) -> Dict[str, Tuple[Any, bool]]:
    """Hugging Face tensor name -> (lmkit variable, whether the tensor is transposed to fill it)."""
    names: Dict[str, Tuple[Any, bool]] = {"model.embed_tokens.weight": (model.embedder.embeddings, False),
                                          "model.norm.weight": (model.decoder.final_norm.scale, False)}
    if not model.tie_weights:
        names["lm_head.weight"] = (model.projection.kernel, True)
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"model.layers.{i}."
        attention, ffn = layer.attention, layer.ffn
        names[prefix + "input_layernorm.weight"] = (layer.attention_norm.scale, False)
        names[prefix + "post_attention_layernorm.weight"] = (layer.ffn_norm.scale, False)
        for hf, linear in (("q_proj", attention.query), ("k_proj", attention.key), ("v_proj", attention.value),
                           ("o_proj", attention.output)):
            names[f"{prefix}self_attn.{hf}.weight"] = (linear.kernel, True)
            if linear.use_bias:
                names[f"{prefix}self_attn.{hf}.bias"] = (linear.bias, False)
        for hf, linear in (("gate_proj", ffn.gate), ("up_proj", ffn.up), ("down_proj", ffn.down)):
            names[f"{prefix}mlp.{hf}.weight"] = (linear.kernel, True)
    return names


def weight_files(folder: str, auto_class: str = "AutoModelForCausalLM") -> List[str]:
    """The safetensors files of the folder: one, or the shards its index lists.

    Raises:
      UsageError: no weights, an index naming a missing shard, or only a
        PyTorch ``.bin`` checkpoint (with the command that converts it).
    """
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
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
    """(name, float32 NumPy array) of one safetensors file, one tensor at a time."""
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
            if name.endswith(_BUFFERS):
                continue
            yield name, tf.cast(f.get_tensor(name), tf.float32).numpy()


def _shapes(path: str) -> Dict[str, List[int]]:
    from safetensors import safe_open
    try:
        with safe_open(path, framework="tf") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys() if not name.endswith(_BUFFERS)}
    except Exception as exc:
        raise UsageError(f"{path} is not a readable safetensors file ({exc})") from None


def load_llama_weights(model: Any, folder: str) -> List[str]:
    """Fills ``model`` (a ``llama`` model of the folder's sizes) from the folder's checkpoint.

    Every tensor's name and shape is checked before any is assigned, so a
    mismatch leaves the model as it was.

    Returns:
      The files read.

    Raises:
      UsageError: a missing, unexpected or mis-shaped tensor (naming the file,
        the tensor and both shapes).
    """
    files = weight_files(folder)
    targets = parameter_map(model)
    where: Dict[str, str] = {}
    for path in files:
        for name, shape in _shapes(path).items():
            if name == "lm_head.weight" and model.tie_weights:
                continue  # some tied checkpoints store the shared table twice
            if name not in targets:
                raise UsageError(f"{path} holds {name}, which lmkit's llama has no use for; is "
                                 f"{os.path.join(folder, HF_CONFIG)} the config of these weights?")
            variable, transposed = targets[name]
            want = list(variable.shape)[::-1] if transposed else list(variable.shape)
            if shape != want:
                raise UsageError(f"{path}: {name} has shape {shape} but {os.path.join(folder, HF_CONFIG)} "
                                 f"gives {want}; the weights and the config come from different models")
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


def load_llama(folder: str, tokenizer: Any = None) -> Tuple[Any, Any, Dict[str, Any]]:
    """The model of a Llama/Qwen2/Mistral folder as an lmkit model, with its tokenizer and config.json.

    Raises:
      UsageError: any problem with the folder (one message naming the file).
    """
    config = read_llama_config(folder)
    return build_pretrained(folder, tokenizer, config, llama_model_config(config, os.path.join(folder, HF_CONFIG)),
                            load_llama_weights)


#: TrainConfig fields that the model keys of a llama fill; the rest go to model_params.
_TRAIN_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_positions", "ffn_dim",
                      "keep_prob", "init_scale", "tie_weights")


def training_config(config: Any, folder: str) -> Any:
    """``config`` (a :class:`lmkit.config.TrainConfig`) for fine-tuning the model in ``folder``.

    The model keys come from the checkpoint; the tokenizer is the folder's;
    the optimizer, schedule, batch and window stay the config's.
    """
    path = os.path.join(folder, HF_CONFIG)
    keys = llama_model_config(read_llama_config(folder), path)
    if config.num_steps > keys["max_positions"]:
        raise UsageError(f"num_steps = {config.num_steps} (the training window) exceeds "
                         f"max_position_embeddings = {keys['max_positions']} of {path}; pass --set "
                         f"num_steps={keys['max_positions']} or less")
    keys.pop("model")
    extra = {k: v for k, v in keys.items() if k not in _TRAIN_CONFIG_KEYS}
    return config.replace(model="llama", init_from=os.path.abspath(folder), tokenizer="hf", data="text",
                          embedding_dim=0, model_params={**config.model_params, **extra},
                          **{k: keys[k] for k in _TRAIN_CONFIG_KEYS})


# Files of the source folder an export carries over unchanged (the architecture and the tokenizer
# do not change in fine-tuning).
_CARRIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "tokenizer.model")


def export_llama(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a fine-tuned ``llama`` run as a folder ``transformers`` loads (``AutoModelForCausalLM``).

    The config, tokenizer and chat template are the ``source`` folder's (the
    run's ``init_from``: fine-tuning keeps the architecture); the weights
    are the model's, in ``model.safetensors`` (float32, Hugging Face names
    and layouts). Written aside and renamed into place.

    Raises:
      UsageError: a run not started from a Hugging Face folder, a source
        folder that is gone or does not fit the model, or an ``output``
        that exists and is not empty.
    """
    check_export_source(source, "llama", output)
    if llama_model_config(read_llama_config(source))["num_layers"] != model.decoder.num_layers:
        raise UsageError(f"{source} does not describe this run's model (another number of layers)")
    return write_pretrained({name: v.numpy().T if transposed else v.numpy()
                             for name, (v, transposed) in parameter_map(model).items()}, source, output)


def config_json(model_config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``config.json`` of a ``llama`` model trained from scratch (``model.get_config()``), in the family
    that holds it: the inverse of :func:`llama_model_config`.

    Llama without a sliding window (``attention_bias`` when any attention projection has a bias: the
    others get zero biases, see :func:`export_llama_from_scratch`), Mistral when every layer slides and
    no projection has a bias. Qwen2's per-layer windows (``layer_types``) are not written:
    ``transformers`` reads a Qwen2 folder with its own tokenizer class, whatever ``tokenizer.json`` says.

    Raises:
      UsageError: a model no family holds here (naming the keys).
    """
    c = model_config
    heads, hidden = c["num_heads"], c["hidden_size"]
    window, types = c.get("sliding_window") or 0, c.get("layer_types")
    bias = bool(c.get("qkv_bias")) or bool(c.get("attention_output_bias"))
    if c.get("activation", "silu") != "silu":
        raise UsageError(f"activation = {c['activation']!r}: Llama and Mistral compute SwiGLU with silu")
    if not window:
        family = "llama"
    elif types is None and not bias:
        family = "mistral"
    else:
        raise UsageError(f"this model cannot be written as a Hugging Face folder (sliding_window {window}, "
                         f"layer_types {types}, attention biases {bias}): Llama has no window, Mistral's every "
                         "layer slides and it has no biases, and transformers reads a Qwen2 folder (per-layer "
                         "windows) with its own tokenizer; train with sliding_window = 0, or on every layer "
                         "without biases")
    config: Dict[str, Any] = {
        "model_type": family, "architectures": [FAMILIES[family]], "vocab_size": c["vocab_size"],
        "hidden_size": hidden, "intermediate_size": c["ffn_dim"], "num_hidden_layers": c["num_layers"],
        "num_attention_heads": heads, "num_key_value_heads": c.get("num_kv_heads") or heads,
        "head_dim": c.get("head_dim") or hidden // heads, "max_position_embeddings": c["max_positions"],
        "rms_norm_eps": c["rms_norm_epsilon"], "rope_theta": c["rope_theta"], "rope_scaling": c.get("rope_scaling"),
        "tie_word_embeddings": bool(c["tie_weights"]), "hidden_act": "silu",
        "attention_dropout": round(1.0 - c.get("keep_prob", 1.0), 12), "initializer_range": c.get("init_scale", 0.02),
        "torch_dtype": "float32", "dtype": "float32"}
    if family == "llama":
        config.update(attention_bias=bias, mlp_bias=False)
    else:
        config["sliding_window"] = window
    return config


def export_llama_from_scratch(model: Any, tokenizer: Any, output: str) -> List[str]:
    """Writes a ``llama`` model trained from scratch, with lmkit's own tokenizer, as a folder ``transformers``
    loads (``AutoModelForCausalLM``, ``AutoTokenizer``): its :func:`config_json`, its weights (float32; a
    projection without a bias gets zeros where Llama's ``attention_bias`` gives all four one) and the
    tokenizer's Hugging Face form (:mod:`lmkit.data.hf_form`). As with a GPT-2 trained from scratch, a text
    starts after a line break (``bos_token_id``) and none ends a document (``eos_token_id`` null).

    Raises:
      UsageError: a model no family holds, a tokenizer without a form, or an ``output`` that exists and is
        not empty; nothing is written then.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from lmkit.data.hf_form import model_token_ids
    from lmkit.hub.hf import check_new_folder, write_folder
    config = config_json(model.get_config())
    ids = model_token_ids(tokenizer)  # a tokenizer without a form stops here
    check_new_folder(output)
    config.update(ids)
    tensors = {name: np.ascontiguousarray(v.numpy().T if transposed else v.numpy(), dtype=np.float32)
               for name, (v, transposed) in parameter_map(model).items()}
    if config.get("attention_bias"):
        for weight in [name for name in tensors if name.endswith(("_proj.weight",)) and ".self_attn." in name]:
            tensors.setdefault(weight[:-len("weight")] + "bias", np.zeros(tensors[weight].shape[0], np.float32))

    def fill(tmp: str) -> None:
        save_file(tensors, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        for name, content in ((HF_CONFIG, config), ("generation_config.json", ids)):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
        tokenizer.save_hf(tmp, model.max_positions)

    return write_folder(output, fill)


def check_export_source(source: Optional[str], model: str, output: str) -> None:
    """Raises unless ``source`` (a run's ``init_from``) is a folder an export can take its config and
    tokenizer from, and ``output`` is missing or empty."""
    from lmkit.hub.hf import check_new_folder
    if not source:
        raise UsageError(f"export --format hf of a {model} run needs the Hugging Face folder it was fine-tuned "
                         "from (its init_from), for the config and the tokenizer; this run started from scratch")
    if not os.path.isdir(source):
        raise UsageError(f"the run was fine-tuned from {source}, which is gone; export needs its config and "
                         "tokenizer files")
    check_new_folder(output)


def write_pretrained(tensors: Dict[str, Any], source: str, output: str) -> List[str]:
    """The folder ``output`` as ``transformers`` reads it: ``tensors`` (Hugging Face names and layouts) in
    ``model.safetensors`` as float32, and the config and tokenizer files of ``source`` (the folder a run
    was fine-tuned from: fine-tuning keeps the architecture). Written aside and renamed into place."""
    import shutil

    import numpy as np
    from safetensors.numpy import save_file

    from lmkit.hub.hf import write_folder
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}

    def fill(tmp: str) -> None:
        save_file(tensors, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        for name in _CARRIED:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(tmp, name))
        config = _read_json(os.path.join(tmp, HF_CONFIG))
        config["torch_dtype"] = config["dtype"] = "float32"  # the weights as written
        with open(os.path.join(tmp, HF_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)

    return write_folder(output, fill)


ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def export_llama_adapters(model: Any, source: Optional[str], output: str) -> List[str]:
    """Writes a LoRA run's adapters alone as a PEFT adapter folder (``adapter_config.json``,
    ``adapter_model.safetensors``): ``peft.PeftModel.from_pretrained(base, output)`` on the
    ``source`` model computes what the run computes.

    Raises:
      UsageError: a model without adapters (a run trained without ``lora_rank``),
        or an ``output`` that exists and is not empty.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from lmkit.hub.hf import check_new_folder, write_folder
    from lmkit.layers.lora import linear_layers, lora_of
    lora = lora_of(model)
    if lora is None:
        raise UsageError("export --format peft writes LoRA adapters, and this run has none (it trained every "
                         "weight); train with --lora_rank, or export --format hf")
    check_new_folder(output)
    owners = {id(layer.kernel): layer for _, layer in linear_layers(model)}
    tensors: Dict[str, Any] = {}
    targets = set()
    for name, (variable, _) in parameter_map(model).items():
        layer = owners.get(id(variable))
        if layer is None or layer.adapter is None or not name.endswith(".weight"):
            continue
        module = name[:-len(".weight")]
        targets.add(module.rsplit(".", 1)[1])
        # PEFT's nn.Linear layouts: lora_A [rank, in], lora_B [out, rank]; lmkit's a [in, rank], b [rank, out].
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(layer.adapter.a.numpy().T)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(layer.adapter.b.numpy().T)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": source or None,
              "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
              "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "use_rslora": False, "init_lora_weights": True, "modules_to_save": None}

    def fill(tmp: str) -> None:
        save_file(tensors, os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)

    return write_folder(output, fill)


# The llama, qwen2 and mistral entries of lmkit.hub.hf.FAMILIES.
read_config = read_llama_config
load = load_llama
load_weights = load_llama_weights
