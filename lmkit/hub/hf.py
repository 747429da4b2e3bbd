"""Hugging Face GPT-2 checkpoints in and out: lmkit's ``gpt2`` model from a folder, and back.

A Hugging Face GPT-2 folder holds ``config.json`` (``model_type: gpt2``),
the weights (``model.safetensors``, or ``pytorch_model.bin``) and the
tokenizer (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``), as
``save_pretrained`` writes them. lmkit reads the weights with the
``safetensors`` package's NumPy API (no PyTorch; a folder with only
``pytorch_model.bin`` needs PyTorch installed) and the tokenizer with the
``tokenizers`` package (:class:`lmkit.hub.tokenizer.HFTokenizer`).

The model is lmkit's transformer in GPT-2's shape (``MODELS["gpt2"]``): the
sizes come from the folder's ``config.json`` (``n_layer``, ``n_head``,
``n_embd``, ``n_positions``, ``n_inner``, ``vocab_size``,
``layer_norm_epsilon``), so distilgpt2 through gpt2-xl load alike. The
parameters map one to one (:func:`parameter_map`; ``docs/gpt2.md`` has the
table): GPT-2's ``Conv1D`` weights are stored [in, out], as lmkit's kernels.

Nothing is downloaded unless asked: ``hf:<name>`` (``--init_from hf:gpt2``)
fetches the files with ``huggingface_hub`` into its cache.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from lmkit.core.checks import is_token_id
from lmkit.core.errors import UsageError
from lmkit.core.fileio import TempFolder, sweep_temp_folders

__all__ = ["FAMILIES", "build_pretrained", "check_new_folder", "check_pretrained", "end_token_ids", "export_gpt2",
           "family_of", "gpt2_model_config", "is_hf_folder", "load_gpt2", "load_gpt2_weights", "load_pretrained",
           "load_pretrained_weights", "pair_framing", "parameter_map", "pretrained_training_config",
           "read_config_json", "read_gpt2_config", "read_tokenizer", "read_weights", "resolve_source",
           "training_config", "write_folder"]

#: Hugging Face ``model_type`` -> the module that reads that family's folders. Each has
#: ``read_config(folder)`` (checked config.json), ``training_config(config, folder)``
#: (a TrainConfig for fine-tuning), ``load(folder, tokenizer)`` -> (model, tokenizer, config.json)
#: and ``load_weights(model, folder)``. A new family is one module and one line here.
FAMILIES = {"gpt2": "lmkit.hub.hf", "llama": "lmkit.hub.hf_llama", "qwen2": "lmkit.hub.hf_llama",
            "mistral": "lmkit.hub.hf_llama", "bart": "lmkit.hub.hf_bart"}

HF_CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
PYTORCH_BIN = "pytorch_model.bin"
_HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
              "tokenizer.json", "vocab.json", "merges.txt",
              "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
# GPT-2 activations that are the tanh approximation of GELU (lmkit's "gelu").
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Buffers some checkpoints carry that are not parameters (the causal mask).
_BUFFERS = (".attn.bias", ".attn.masked_bias")


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def read_config_json(folder: str) -> Tuple[str, Dict[str, Any]]:
    """``(path, contents)`` of the folder's ``config.json``; a missing or unreadable one is a UsageError."""
    path = os.path.join(folder, HF_CONFIG)
    if not os.path.isfile(path):
        raise UsageError(f"{folder} is not a Hugging Face model folder: {path} is missing")
    return path, _read_json(path)


def build_pretrained(folder: str, tokenizer: Any, config: Dict[str, Any], model_config: Dict[str, Any],
                     load_weights: Any) -> Tuple[Any, Any, Dict[str, Any]]:
    """What every family's ``load`` does once its config is checked: the tokenizer (read when None) checked
    against the vocabulary, the model built from ``model_config`` and filled by ``load_weights(model, folder)``.

    Returns:
      ``(model, tokenizer, config)``.
    """
    from lmkit.models import build_model

    tokenizer = tokenizer if tokenizer is not None else read_tokenizer(folder)
    check_vocabulary(tokenizer, config["vocab_size"], folder)
    model = build_model(model_config)
    load_weights(model, folder)
    return model, tokenizer, config


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model folder (its ``config.json`` has ``model_type``)."""
    config = os.path.join(path, HF_CONFIG)
    if not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            return "model_type" in json.load(f)
    except (OSError, ValueError):
        return False


def family_of(folder: str) -> Any:
    """The module of :data:`FAMILIES` that reads ``folder`` (by its config.json's ``model_type``).

    Raises:
      UsageError: no config.json, or a model type lmkit does not read (listing those it does).
    """
    import importlib
    path = os.path.join(folder, HF_CONFIG)
    if not os.path.isfile(path):
        raise UsageError(f"{folder} is not a Hugging Face model folder: {path} is missing")
    model_type = _read_json(path).get("model_type")
    if model_type not in FAMILIES:
        raise UsageError(f"{path}: model_type {model_type!r} is not one lmkit reads; it reads "
                         f"{', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[model_type])


def check_pretrained(folder: str) -> Dict[str, Any]:
    """The folder's config.json, checked by its family (one message naming the file)."""
    return family_of(folder).read_config(folder)


def load_pretrained(folder: str, tokenizer: Any = None) -> Tuple[Any, Any, Dict[str, Any]]:
    """``(model, tokenizer, config.json)`` of a Hugging Face folder of any family lmkit reads."""
    return family_of(folder).load(folder, tokenizer)


def load_pretrained_weights(model: Any, folder: str) -> Any:
    """Fills ``model`` (built from the folder's config) with the folder's weights."""
    return family_of(folder).load_weights(model, folder)


def pair_framing(folder: str) -> Optional[Dict[str, Any]]:
    """How an encoder-decoder family frames its texts (:class:`lmkit.hub.tokenizer.HFTokenizer`'s
    ``framing``), or None for a language model's folder (or a folder that is not a model's)."""
    if not is_hf_folder(folder):
        return None
    try:
        family = family_of(folder)
    except UsageError:
        return None
    framing = getattr(family, "framing", None)
    return None if framing is None else framing(family.read_config(folder))


def end_token_ids(folder: str) -> Optional[List[int]]:
    """The ids that end a text of the folder's model, as ``transformers``' ``generate`` stops at them.

    ``generation_config.json``'s ``eos_token_id`` (one id, or a list: Llama 3's instruct models end a
    text with ``<|end_of_text|>`` and a turn with ``<|eot_id|>``), else ``config.json``'s; None when
    neither names one.

    Raises:
      UsageError: an ``eos_token_id`` that is not a token id or a list of them (naming the file).
    """
    for name in ("generation_config.json", HF_CONFIG):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        value = _read_json(path).get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(is_token_id(i) for i in ids):
            raise UsageError(f"{path}: eos_token_id = {value!r} must be a token id or a list of them")
        return list(dict.fromkeys(ids))
    return None


def generation_preset(folder: str) -> Dict[str, Any]:
    """How the folder's ``generation_config.json`` asks ``transformers``' ``generate`` to choose tokens.

    ``do_sample: true`` gives ``{"strategy": "top_p"}`` with its ``temperature``,
    ``top_k`` and ``top_p``, each at ``transformers``' default where the file has
    none (1.0, 50, 1.0; a ``top_k`` of 0 is no limit), its ``min_p`` (where set
    above 0) and its ``repetition_penalty``. ``num_beams`` above 1 without sampling gives
    ``transformers``' beam search (``{"strategy": "beam", "beam_width":
    num_beams, "beam_scoring": "transformers"}``) with the file's
    ``length_penalty`` (default 1.0) and ``early_stopping`` (default false).
    Whatever the strategy, the rules on tokens it sets come too
    (``no_repeat_ngram_size``, ``forced_bos_token_id`` as ``forced_first_id``,
    ``forced_eos_token_id`` as ``forced_last_id``; :func:`lmkit.decoding.registry.rules_of_settings`),
    and an encoder-decoder's folder (BART's) also gives its
    ``min_length`` and ``max_length`` as ``min_new_tokens`` and
    ``max_new_tokens`` (its decoder starts from one token, which
    ``transformers`` counts). A folder that asks for neither sampling nor beams
    (GPT-2's, or none at all) gives no strategy: ``transformers`` would decode
    greedily there, and lmkit keeps its own default.

    Raises:
      UsageError: a value out of range, naming the file and the key.
    """
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    config = _read_json(path)

    def number(key: str, default: Any, ok: Any, need: str) -> Any:
        value = config.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise UsageError(f"{path}: {key} = {value!r} {need}")
        return value

    def count(key: str) -> int:
        return number(key, 0, lambda v: isinstance(v, int) and v >= 0, "must be an integer >= 0")

    def token(key: str) -> Optional[int]:
        value = config.get(key)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if value is not None and not is_token_id(value):
            raise UsageError(f"{path}: {key} = {value!r} must be a token id")
        return value

    lengths: Dict[str, Any] = {}  # and rules: what every strategy takes
    if _is_encoder_decoder(folder):  # transformers counts the decoder's start token in these lengths
        min_length = count("min_length")
        max_length = number("max_length", None, lambda v: isinstance(v, int) and v >= 2, "must be an integer >= 2")
        max_new = number("max_new_tokens", None, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
        if min_length > 1:
            lengths["min_new_tokens"] = min_length - 1
        if max_new is not None or max_length is not None:
            lengths["max_new_tokens"] = max_new if max_new is not None else max_length - 1
    # Rules on tokens, for every strategy (as transformers applies its logits processors).
    no_repeat = count("no_repeat_ngram_size")
    if no_repeat:
        lengths["no_repeat_ngram_size"] = no_repeat
    for key, name in (("forced_first_id", "forced_bos_token_id"), ("forced_last_id", "forced_eos_token_id")):
        forced = token(name)
        if forced is not None:
            lengths[key] = forced
    sample = config.get("do_sample")
    if sample not in (None, True, False):
        raise UsageError(f"{path}: do_sample = {sample!r} must be true or false")
    beams = number("num_beams", 1, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
    if sample:  # transformers' sampling (beam sampling, which lmkit lacks, samples too)
        top_k = number("top_k", 50, lambda v: isinstance(v, int) and v >= 0, "must be an integer >= 0 (0: no limit)")
        preset = {"strategy": "top_p",
                  "temperature": float(number("temperature", 1.0, lambda v: v > 0, "must be > 0 when do_sample")),
                  "top_k": top_k or None,
                  "top_p": float(number("top_p", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]"))}
        min_p = number("min_p", None, lambda v: 0 <= v <= 1, "must be in [0, 1] (0 or null: off)")
        if min_p:
            preset["min_p"] = float(min_p)
        penalty = float(number("repetition_penalty", 1.0, lambda v: v > 0, "must be > 0 (1 = off)"))
        if penalty != 1.0:
            preset["repetition_penalty"] = penalty
        return {**preset, **lengths}
    if beams == 1:
        return lengths
    stopping = config.get("early_stopping", False)
    if stopping not in (True, False, "never"):
        raise UsageError(f"{path}: early_stopping = {stopping!r} must be true, false or \"never\"")
    preset = {"strategy": "beam", "beam_width": beams, "beam_scoring": "transformers",
              "length_penalty": float(number("length_penalty", 1.0, lambda v: True, "must be a number")),
              "early_stopping": stopping}
    return {**preset, **lengths}


def _is_encoder_decoder(folder: str) -> bool:
    try:
        return bool(getattr(family_of(folder), "conditional", False))
    except UsageError:
        return False


def model_generation_preset(model_dir: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """``(preset, folder)``: the :func:`generation_preset` a model folder samples with, and the folder whose
    ``generation_config.json`` gave it.

    A Hugging Face folder's own; a run fine-tuned from one (``init_from``), that folder's, while it is
    there (``--chat`` reads its template from it too); else ``({}, None)``: lmkit's defaults.
    """
    if is_hf_folder(model_dir):
        return generation_preset(model_dir), model_dir
    from lmkit.core.layout import read_config_dict
    try:
        source = read_config_dict(model_dir).get("init_from")
    except (UsageError, OSError, ValueError):
        return {}, None
    if isinstance(source, str) and is_hf_folder(source):
        return generation_preset(source), source
    return {}, None


def pretrained_training_config(config: Any, folder: str) -> Any:
    """``config`` (a TrainConfig) for fine-tuning the model in ``folder``: its family's model keys."""
    return family_of(folder).training_config(config, folder)


def read_gpt2_config(folder: str) -> Dict[str, Any]:
    """The folder's ``config.json``, checked to be a GPT-2 that lmkit's ``gpt2`` model can hold.

    Raises:
      UsageError: no config, another model type, a missing size or an
        activation other than GELU's tanh approximation (naming the file).
    """
    path, config = read_config_json(folder)
    model_type = config.get("model_type")
    if model_type != "gpt2":
        raise UsageError(f"{path}: model_type {model_type!r} is not 'gpt2'; lmkit loads GPT-2 checkpoints "
                         "(gpt2, distilgpt2, gpt2-medium/large/xl and fine-tunes of them)")
    for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise UsageError(f"{path}: {key} = {config.get(key)!r} must be a positive integer")
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GELU_TANH:
        raise UsageError(f"{path}: activation_function {activation!r} is not GPT-2's gelu_new; lmkit's gpt2 "
                         f"computes {', '.join(_GELU_TANH)}")
    if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
        raise UsageError(f"{path}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not "
                         "supported (GPT-2 checkpoints leave them off)")
    return config


def gpt2_model_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """``lmkit.models.build_model`` keys of the GPT-2 that ``config`` (a ``config.json``) describes."""
    dropout = float(config.get("resid_pdrop", 0.1))
    return {"model": "gpt2", "vocab_size": config["vocab_size"], "hidden_size": config["n_embd"],
            "num_layers": config["n_layer"], "num_heads": config["n_head"],
            "max_positions": config["n_positions"], "ffn_dim": config.get("n_inner") or 0,
            "keep_prob": round(1.0 - dropout, 12), "init_scale": float(config.get("initializer_range", 0.02)),
            "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-5))}


def training_config(config: Any, folder: str) -> Any:
    """``config`` (a :class:`lmkit.config.TrainConfig`) for fine-tuning the GPT-2 in ``folder``.

    The model keys come from the checkpoint (they must fit its weights);
    the tokenizer is the checkpoint's; the rest (optimizer, schedule, batch,
    window) stays the config's.
    """
    hf = gpt2_model_config(read_gpt2_config(folder))
    if config.num_steps > hf["max_positions"]:  # the checkpoint fixes max_positions: the window must fit it
        raise UsageError(f"num_steps = {config.num_steps} (the training window) exceeds n_positions = "
                         f"{hf['max_positions']} of {os.path.join(folder, HF_CONFIG)}; pass --set "
                         f"num_steps={hf['max_positions']} or less")
    epsilon = hf.pop("layer_norm_epsilon")
    return config.replace(
        model="gpt2", init_from=os.path.abspath(folder), tokenizer="hf", data="text", tie_weights=True,
        pre_layer_norm=True, embedding_dim=0, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_layers"], num_heads=hf["num_heads"], max_positions=hf["max_positions"],
        ffn_dim=hf["ffn_dim"], keep_prob=hf["keep_prob"], init_scale=hf["init_scale"],
        model_params={**config.model_params, "layer_norm_epsilon": epsilon})


def resolve_source(spec: str) -> str:
    """A local folder for ``spec``: a folder path, or ``hf:<name>`` fetched from the Hugging Face Hub.

    Raises:
      UsageError: a missing folder, or a download that fails (no network,
        unknown name, no huggingface_hub), with what to do instead.
    """
    if not spec.startswith("hf:"):
        if not os.path.isdir(spec):
            raise UsageError(f"--init_from {spec} is not a folder; pass a Hugging Face model folder (model_type "
                             f"{', '.join(FAMILIES)}: config.json, model.safetensors, tokenizer files) or "
                             "hf:<name> to download one")
        return spec
    name = spec[3:]
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(f"--init_from {spec} downloads with huggingface_hub, which is not installed; "
                         "pip install 'lmkit[hf]', or pass a folder") from None
    try:
        return snapshot_download(repo_id=name, allow_patterns=_HUB_FILES)
    except Exception as exc:  # network, unknown repository, offline mode: all mean "cannot get it"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--init_from {spec}: could not download {name!r} from the Hugging Face Hub "
                         f"({type(exc).__name__}: {first}); without a network, download the folder "
                         "elsewhere (huggingface-cli download NAME --local-dir DIR), copy it here and "
                         "pass --init_from DIR") from None


def read_weights(folder: str) -> Tuple[Dict[str, Any], str]:
    """The folder's tensors as NumPy arrays (names without a ``transformer.`` prefix), and the file read.

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
    else:
        path = os.path.join(folder, PYTORCH_BIN)
        if not os.path.isfile(path):
            raise UsageError(f"{folder} holds no weights: {SAFETENSORS} (or {PYTORCH_BIN}) is missing; save "
                             "the model there with model.save_pretrained(folder)")
        try:
            import torch
        except ImportError:
            raise UsageError(f"{folder} holds only {PYTORCH_BIN}, which needs PyTorch to read, and PyTorch is "
                             "not installed; convert it once where PyTorch is: python -c \"from transformers "
                             f"import GPT2LMHeadModel as M; M.from_pretrained('{folder}').save_pretrained("
                             f"'{folder}')\" (writes {SAFETENSORS}), or pip install torch") from None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UsageError(f"{path} is not a readable PyTorch state dict ({exc})") from None
        tensors = {k: v.detach().float().numpy() for k, v in state.items()}
    out = {}
    for name, value in tensors.items():
        if name.endswith(_BUFFERS) or name == "lm_head.weight":  # a mask buffer; the tied softmax
            continue
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        out[key] = np.asarray(value, dtype=np.float32)
    return out, path


def parameter_map(model: Any) -> Dict[str, Any]:
    """Hugging Face parameter name -> lmkit variable, for a ``gpt2`` model."""
    decoder = model.decoder
    names: Dict[str, Any] = {"wte.weight": model.embedder.embeddings,
                             "wpe.weight": model.position_embedder.embeddings,
                             "ln_f.weight": decoder.final_norm.scale, "ln_f.bias": decoder.final_norm.offset}
    for i, layer in enumerate(decoder.layers):
        pairs = {"ln_1": (layer.attention_norm.scale, layer.attention_norm.offset),
                 "attn.c_attn": (layer.attention.qkv.kernel, layer.attention.qkv.bias),
                 "attn.c_proj": (layer.attention.output.kernel, layer.attention.output.bias),
                 "ln_2": (layer.ffn_norm.scale, layer.ffn_norm.offset),
                 "mlp.c_fc": (layer.ffn_inner.kernel, layer.ffn_inner.bias),
                 "mlp.c_proj": (layer.ffn_outer.kernel, layer.ffn_outer.bias)}
        for hf_name, (weight, bias) in pairs.items():
            names[f"h.{i}.{hf_name}.weight"] = weight
            names[f"h.{i}.{hf_name}.bias"] = bias
    return names


def _check_gpt2(model: Any, what: str) -> None:
    if not getattr(model, "is_gpt2", False):
        raise UsageError(f"{what} needs a model of GPT-2's shape (model = 'gpt2': tied softmax without bias, "
                         f"learned positions, pre-layer-norm, GELU); this one is {type(model).__name__} with "
                         f"model = {model.get_config().get('model')!r}")


def load_gpt2_weights(model: Any, folder: str) -> str:
    """Assigns the folder's weights to ``model`` (a ``gpt2`` model of the same sizes).

    Returns:
      The weights file read.

    Raises:
      UsageError: a missing or unexpected tensor, or a shape that differs
        from the model's (naming the file, the tensor and both shapes).
    """
    _check_gpt2(model, "loading a GPT-2 checkpoint")
    weights, path = read_weights(folder)
    targets = parameter_map(model)
    missing = [name for name in targets if name not in weights]
    if missing:
        raise UsageError(f"{path} lacks {missing[0]} ({len(missing)} of GPT-2's tensors missing); it is not "
                         f"the checkpoint of the GPT-2 that {os.path.join(folder, HF_CONFIG)} describes")
    unexpected = sorted(set(weights) - set(targets))
    if unexpected:
        raise UsageError(f"{path} holds {unexpected[0]}, which GPT-2 has no use for ({len(unexpected)} "
                         "unexpected tensors); is it the checkpoint of another architecture?")
    for name, variable in targets.items():
        if tuple(weights[name].shape) != tuple(variable.shape):
            raise UsageError(f"{path}: {name} has shape {list(weights[name].shape)} but "
                             f"{os.path.join(folder, HF_CONFIG)} gives {list(variable.shape)}; the weights "
                             "and the config come from different models")
    for name, variable in targets.items():
        variable.assign(weights[name])
    return path


def read_tokenizer(folder: str) -> Any:
    """The folder's tokenizer (:meth:`HFTokenizer.from_hf_folder`), a problem as a :class:`UsageError`."""
    from lmkit.data.errors import DataError
    from lmkit.hub.tokenizer import HFTokenizer
    try:
        return HFTokenizer.from_hf_folder(folder)
    except DataError as exc:
        raise UsageError(str(exc)) from None


def load_gpt2(folder: str, tokenizer: Any = None) -> Tuple[Any, Any, Dict[str, Any]]:
    """The GPT-2 of a Hugging Face folder as an lmkit model, with its tokenizer and config.json.

    Args:
      folder: the Hugging Face folder.
      tokenizer: its tokenizer when already read (:func:`read_tokenizer`); read here otherwise.

    Raises:
      UsageError: any problem with the folder (one message naming the file).
    """
    config = read_gpt2_config(folder)
    return build_pretrained(folder, tokenizer, config, gpt2_model_config(config), load_gpt2_weights)


def check_vocabulary(tokenizer: Any, vocab_size: int, folder: str) -> None:
    """A tokenizer with ids beyond the model's vocabulary is refused (naming the tokenizer file)."""
    if tokenizer.vocab_size > vocab_size:
        name = "tokenizer.json" if os.path.isfile(os.path.join(folder, "tokenizer.json")) else "vocab.json"
        raise UsageError(f"{os.path.join(folder, name)} has ids up to {tokenizer.vocab_size - 1} but the model's "
                         f"vocab_size is {vocab_size} ({os.path.join(folder, HF_CONFIG)}); the tokenizer "
                         "belongs to another model")


def check_new_folder(output: str) -> None:
    """Raises unless ``output`` is missing or an empty folder (an export never overwrites)."""
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise UsageError(f"--output {output} exists and is not an empty folder; pass a new folder")


def export_gpt2(model: Any, tokenizer: Any, output: str, dropout: float = 0.1) -> List[str]:
    """Writes ``model`` and ``tokenizer`` as a folder ``transformers.GPT2LMHeadModel.from_pretrained`` loads.

    Files: ``config.json``, ``model.safetensors`` (float32, ``transformer.``
    names; the softmax is tied to ``wte``), ``generation_config.json`` and
    the tokenizer's files. Written into a temporary folder next to
    ``output`` and renamed into place, so a failed export leaves nothing.

    The tokenizer is a Hugging Face GPT-2's (a fine-tune), or lmkit's own
    word, char, byte or unigram sentencepiece tokenizer (a model trained from scratch), written as
    a ``tokenizer.json`` that encodes every text to lmkit's ids
    (:mod:`lmkit.data.hf_form`); such a model starts a text after a line
    break (``bos_token_id`` is the line break's id, which ``tokenizer(text)``
    puts first) and has no end of document (``eos_token_id`` null).

    Returns:
      The names of the files written.

    Raises:
      UsageError: not a GPT-2-shaped model, a tokenizer without a Hugging
        Face form (BPE SentencePiece), or an ``output`` that exists and is not empty.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from lmkit.hub.tokenizer import END_OF_TEXT, HFTokenizer

    _check_gpt2(model, "export --format hf")
    if isinstance(tokenizer, HFTokenizer):  # GPT-2's: a document starts and ends at <|endoftext|>
        end = tokenizer.hf.token_to_id(END_OF_TEXT)
        ids = {"bos_token_id": end, "eos_token_id": end}
    else:  # lmkit's own: a line starts after a line break; no end of document (a kind without a form stops here)
        from lmkit.data.hf_form import model_token_ids
        ids = model_token_ids(tokenizer)
    check_new_folder(output)
    layer = model.decoder.layers[0]
    config = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": model.vocab_size,
        "n_positions": model.max_positions, "n_embd": model.hidden_size, "n_layer": model.decoder.num_layers,
        "n_head": model.decoder.num_heads,
        "n_inner": None if model.decoder.ffn_dim == 4 * model.hidden_size else model.decoder.ffn_dim,
        "activation_function": "gelu_new", "resid_pdrop": dropout, "embd_pdrop": dropout,
        "attn_pdrop": dropout if getattr(model, "attention_dropout", None) is None else model.attention_dropout,
        "layer_norm_epsilon": layer.attention_norm.epsilon, "initializer_range": model.init_scale,
        "tie_word_embeddings": True, "use_cache": True, **ids}
    tensors = {f"transformer.{name}": np.ascontiguousarray(v.numpy(), dtype=np.float32)
               for name, v in parameter_map(model).items()}

    def fill(tmp: str) -> None:
        save_file(tensors, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        with open(os.path.join(tmp, HF_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump(ids, f, indent=2)
        tokenizer.save_hf(tmp, model.max_positions)

    return write_folder(output, fill)


def write_folder(output: str, fill: Any) -> List[str]:
    """Makes the folder ``output`` whole or not at all: ``fill(tmp)`` writes into a temporary folder
    next to it, which is then renamed into place (``output`` must be missing or empty).

    Returns:
      The names of the files written.
    """
    parent = os.path.dirname(os.path.abspath(output)) or "."
    # The folders of exports killed midway are swept; a live export's folder is locked.
    sweep_temp_folders(parent, ".export-")
    with TempFolder(parent, ".export-") as tmp:
        fill(tmp.path)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked by the caller)
        tmp.publish(output)
    return sorted(os.listdir(output))


def default_dropout(config: Optional[Any]) -> float:
    """The dropout an exported config.json states: the run's, or GPT-2's 0.1."""
    return 0.1 if config is None else round(1.0 - float(config.keep_prob), 12)


# This module is also the gpt2 entry of FAMILIES.
read_config = read_gpt2_config
load = load_gpt2
load_weights = load_gpt2_weights
