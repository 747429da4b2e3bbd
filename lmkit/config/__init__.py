"""Training configuration: a frozen dataclass loaded from a plain Python module.

A config is a Python file such as ``configs/config_small.py`` whose top-level
lowercase names are the settings (as in Texar's examples)::

    model = "lstm"
    hidden_size = 200
    ...

``load_config("config_small")`` finds it (in ``$LMKIT_CONFIG_PATH``, in
``./configs``, among the configs that come with lmkit in ``lmkit/configs/``,
as a file path or as an importable module), then
:meth:`TrainConfig.from_dict` checks it: a missing required key or an unknown
key is a :class:`ConfigError` naming the key; values are type-checked, never
silently coerced (``2.7`` is not an int, ``"False"`` is not a bool).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union, get_type_hints

from lmkit.core.checks import check_heads, did_you_mean
from lmkit.distributed import BACKEND_CHOICES
from lmkit.core.errors import UsageError
from lmkit.data.sentencepiece import MODEL_TYPES as SPM_MODEL_TYPES
from lmkit.data.tokenizers import TOKENIZERS
from lmkit.data.windows import SAMPLINGS
from lmkit.models import MODELS, is_import_path
from lmkit.layers.kernels import check_setting as check_attention_kernel
from lmkit.layers.precision import PRECISIONS
from lmkit.core.xla import use_xla


class ConfigError(UsageError):
    """A config that cannot be used; the message names the key and the fix."""


DATA_KINDS = ("ptb", "text", "pairs")
# The models --init_from fills from a Hugging Face folder (lmkit.hub.hf.FAMILIES maps the folders onto them).
PRETRAINED_MODELS = ("gpt2", "llama", "transformer_seq2seq")  # transformer_seq2seq: BART, on pairs
# OpenSeq2Seq's spelling of the backend, still accepted: True -> "horovod"
# (launch with mpirun/horovodrun), False -> "native".
LEGACY_BACKEND_KEY = "use_horovod"


# The TrainConfig keys that define the model's shape (stored with checkpoints;
# lmkit.models.build_model checks them against the model's constructor).
MODEL_CONFIG_KEYS = ("model", "vocab_size", "hidden_size", "num_layers", "init_scale", "keep_prob",
                     "forget_bias", "tie_weights", "embedding_dim", "num_heads", "ffn_dim",
                     "max_positions", "pre_layer_norm", "source_vocab_size", "max_source_positions",
                     "share_embeddings")
# data = "pairs": the line-aligned files of each split (training, validation, test).
PAIR_FILE_KEYS = (("source_file", "target_file"), ("valid_source_file", "valid_target_file"),
                  ("test_source_file", "test_target_file"))
# The keys that shape a LoRA run's adapters (what its checkpoints hold): fixed for the run, like the model's.
ADAPTER_KEYS = ("lora_rank", "lora_alpha", "lora_targets")


def _map_legacy_backend(values: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``use_horovod = True/False`` -> ``backend = "horovod"/"native"``; both given must agree."""
    if LEGACY_BACKEND_KEY not in values:
        return values
    values = dict(values)
    flag = values.pop(LEGACY_BACKEND_KEY)
    if not isinstance(flag, bool):
        raise ConfigError(f"{source}: {LEGACY_BACKEND_KEY} = {flag!r} must be True or False "
                          "(or set backend = 'horovod' | 'native' | 'local')")
    mapped = "horovod" if flag else "native"
    given = values.get("backend", "auto")
    if given not in ("auto", mapped):
        raise ConfigError(f"{source}: {LEGACY_BACKEND_KEY} = {flag} means backend = {mapped!r}, but "
                          f"backend = {given!r}; keep one of the two keys")
    values["backend"] = mapped
    return values


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a language-model training run.

    Required keys (no default) are the model and schedule basics that every
    config must state; the rest default to the Zaremba et al. (2014) small
    setting or to "off".
    """

    # --- model ---------------------------------------------------------------
    model: str  # a name of lmkit.models.MODELS, or "package.module:Class"
    vocab_size: int
    hidden_size: int
    num_layers: int
    init_scale: float  # uniform(-init_scale, init_scale) initialiser
    keep_prob: float  # 1 - dropout
    # --- schedule ----------------------------------------------------------
    batch_size: int  # GLOBAL batch, split across workers
    num_steps: int  # BPTT window length
    num_epochs: int
    # --- optimisation ------------------------------------------------------
    learning_rate: float
    max_grad_norm: float  # global-norm clipping after averaging; 0 = off
    lr_decay: float = 1.0  # multiplier per epoch once decay starts
    lr_decay_start_epoch: int = 0  # first epoch index (0-based) with decay applied
    optimizer: str = "sgd"  # sgd | momentum | adam | adamw | novograd | lamb
    optimizer_params: Dict[str, Any] = field(default_factory=dict)
    lr_scaling: str = "none"  # none | linear | sqrt (by number of workers)
    warmup_epochs: float = 0.0
    schedule: str = "exponential"  # exponential | piecewise | polynomial | cosine | constant
    schedule_params: Dict[str, Any] = field(default_factory=dict)
    larc_params: Optional[Dict[str, Any]] = None
    max_grad_norm_per_layer: float = 0.0  # per-variable clipping; 0 = off
    grad_accum_steps: int = 1  # micro-batches per optimizer step (batch_size stays the global batch)
    # --- precision (lmkit.layers.precision.PRECISIONS) ------------------------------
    precision: str = "float32"  # float32 | mixed_bfloat16 | mixed_float16
    loss_scale: float = 32768.0  # mixed_float16: the first step's loss scale (2**15)
    loss_scale_growth_interval: int = 2000  # mixed_float16: finite steps in a row before it doubles
    max_consecutive_skips: int = 20  # mixed_float16: skipped steps in a row before stopping (exit 3)
    divergence_factor: float = 3.0  # stop (exit 3) when the loss stays above this x ln(vocab_size)...
    divergence_steps: int = 10  # ...for this many steps in a row (a uniform guess scores ln(vocab_size))
    peak_tflops: float = 0.0  # one device's peak TFLOP/s for the logs' MFU; 0 = a known GPU's (lmkit.train.flops)
    # --- model details -----------------------------------------------------
    forget_bias: float = 0.0
    tie_weights: bool = False
    embedding_dim: int = 0  # 0 = hidden_size
    num_heads: int = 4  # transformer
    ffn_dim: int = 0  # transformer; 0 = 4 * hidden_size
    max_positions: int = 512  # transformer
    pre_layer_norm: bool = True  # transformer
    source_vocab_size: int = 0  # encoder-decoders: the source's ids (0: set from the source tokenizer)
    max_source_positions: int = 256  # transformer_seq2seq: the longest source
    share_embeddings: bool = False  # encoder-decoders: one embedding table for both sides (needs share_vocab)
    model_params: Dict[str, Any] = field(default_factory=dict)  # more constructor arguments
    # --- data ----------------------------------------------------------------
    data: str = "ptb"  # ptb | text | pairs (line-aligned source/target files, for encoder-decoders)
    train_file: str = ""  # data = "text": UTF-8 text, one sentence or paragraph a line
    valid_file: str = ""  # optional; evaluated by rank 0 after every epoch
    test_file: str = ""  # optional; evaluated by rank 0 at the end
    data_cache: str = ""  # text: token cache folder ("" = $LMKIT_DATA_CACHE or ~/.cache/lmkit/tokens; "none" = off)
    source_file: str = ""  # data = "pairs": line i is the source of line i of target_file
    target_file: str = ""
    valid_source_file: str = ""  # pairs: optional; evaluated by rank 0 after every epoch
    valid_target_file: str = ""
    test_source_file: str = ""  # pairs: optional; evaluated by rank 0 at the end
    test_target_file: str = ""
    share_vocab: bool = True  # pairs: one tokenizer for both sides; False: the source gets its own
    max_source_length: int = 0  # pairs: longer sources are skipped, counted (0 = max_source_positions)
    max_target_length: int = 0  # pairs: longer targets are skipped, counted (0 = max_positions - 1)
    sampling: str = "windows"  # transformers: windows (shuffled fixed windows) | random (random offsets)
    tokenizer: str = "word"  # data = "text": word | sentencepiece | char | byte | hf (with init_from)
    max_vocab: int = 0  # word tokenizer: largest vocabulary, specials included (0 = no limit)
    min_count: int = 1  # word tokenizer: drop words seen fewer times
    spm_model_type: str = "unigram"  # sentencepiece: unigram | bpe (size: vocab_size)
    init_from: str = ""  # a Hugging Face GPT-2/Llama/Qwen2/Mistral/BART folder: its weights, sizes, tokenizer
    lora_rank: int = 0  # with init_from: train rank-r adapters only, the base frozen (0 = full fine-tuning)
    lora_alpha: float = 16.0  # the adapters' update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # on the adapters' inputs while training
    lora_targets: str = ""  # comma-separated Linear layer names ("" = the model's: llama query,value; gpt2 qkv;
                           # transformer_seq2seq query,key_value,qkv)
    # --- distributed -------------------------------------------------------
    backend: str = "auto"  # auto | horovod | native | local (lmkit.distributed.BACKENDS)
    num_gpus: int = 0  # native backend: replicas on one host (0 = all GPUs, or 1 CPU)
    sparse_as_dense: bool = False
    compression: str = "none"  # none | fp16 (dense gradients only)
    # --- bookkeeping -------------------------------------------------------
    seed: int = 1234
    eval_batch_size: int = 0  # 0 = batch_size
    checkpoint_every_epochs: int = 1
    checkpoint_every_steps: int = 0  # also every this many global steps (0 = off)
    checkpoint_every_minutes: float = 0.0  # also this often, by rank 0's clock (0 = off)
    keep_checkpoints: int = 3
    preemption_grace_seconds: float = 60.0  # signal to exit, checkpoint or not (0 = no limit)
    log_every_steps: int = 0  # 0 = about 10 lines per epoch
    jit_compile: Union[bool, str] = "auto"  # "auto": XLA on GPUs, plain on CPUs (lmkit.core.xla); True | False
    # Windows copied to the device this many steps ahead, on a thread of their own, and the stop/save
    # flags kept there (lmkit.train.feed); several processes read their agreed flags on a thread too, two
    # steps late (lmkit.train.resume.Boundaries); 0: each step's window is sent as the step starts
    device_prefetch: int = 0
    # Which kernel computes a window's causal attention (lmkit.layers.kernels): matmul (scores
    # through two matmuls, everywhere) | cudnn (cuDNN's fused attention: GPU, XLA, mixed precision) |
    # auto: cudnn where it runs and checks out, else matmul (1.39x on the GPT-2-shaped bf16 step, H200)
    attention_kernel: str = "auto"

    # --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> "TrainConfig":
        """Builds a checked config; raises :class:`ConfigError` naming the bad key."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = get_type_hints(cls)
        values = _map_legacy_backend(values, source)
        unknown = sorted(set(values) - set(fields))
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{source}: unknown key {key!r}; "
                              f"{did_you_mean(key, sorted(fields), listing='known keys', full=False)}")
        required = [n for n, f in fields.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [k for k in required if k not in values]
        if missing:
            raise ConfigError(f"{source}: missing required key {missing[0]!r}; "
                              f"add `{missing[0]} = ...` (required keys: {', '.join(required)})")
        checked = {k: _check_type(source, k, v, hints[k]) for k, v in values.items()}
        cfg = cls(**checked)
        cfg.validate(source)
        return cfg

    def validate(self, source: str = "config") -> None:
        """Checks value ranges and combinations."""
        def bad(key: str, why: str) -> None:
            raise ConfigError(f"{source}: {key} = {getattr(self, key)!r} {why}")

        if self.model not in MODELS and not is_import_path(self.model):
            bad("model", f"is not one of {', '.join(MODELS)} and not an import path "
                "'package.module:Class'")
        if self.backend not in BACKEND_CHOICES:
            bad("backend", f"is not one of {', '.join(BACKEND_CHOICES)}")
        self._validate_data(bad)
        for key in ("vocab_size", "hidden_size", "num_layers", "batch_size", "num_steps", "num_epochs"):
            if getattr(self, key) < 1:
                bad(key, "must be a positive integer")
        if not 0.0 < self.keep_prob <= 1.0:
            bad("keep_prob", "must be in (0, 1]")
        if self.init_scale <= 0:
            bad("init_scale", "must be > 0")
        if self.learning_rate <= 0:
            bad("learning_rate", "must be > 0")
        if self.max_grad_norm < 0:
            bad("max_grad_norm", "must be >= 0 (0 turns clipping off)")
        if self.lr_scaling not in ("none", "linear", "sqrt"):
            bad("lr_scaling", "is not one of none, linear, sqrt")
        if self.compression not in ("none", "fp16"):
            bad("compression", "is not one of none, fp16")
        if self.warmup_epochs < 0:
            bad("warmup_epochs", "must be >= 0")
        if self.precision not in PRECISIONS:
            bad("precision", f"is not one of {', '.join(PRECISIONS)}")
        try:
            use_xla(self.jit_compile, "CPU")
        except UsageError:
            bad("jit_compile", "is not one of True, False, 'auto' ('auto': XLA on GPUs, the plain step on CPUs)")
        if self.grad_accum_steps < 1:
            bad("grad_accum_steps", "must be >= 1 (1 = no accumulation)")
        try:
            check_attention_kernel(self.attention_kernel)
        except UsageError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if self.device_prefetch < 0:  # (the type is checked with every key's)
            bad("device_prefetch", "must be an integer >= 0 (steps ahead; 0 = off, 2 = the usual)")
        if self.batch_size >= 1 and self.grad_accum_steps >= 1 and self.batch_size % self.grad_accum_steps:
            bad("grad_accum_steps", f"does not divide batch_size = {self.batch_size}; each micro-batch "
                f"has batch_size / (workers * grad_accum_steps) rows")
        if self.loss_scale <= 0:
            bad("loss_scale", "must be > 0 (2**15 = 32768 is the usual start)")
        if self.divergence_factor < 0:
            bad("divergence_factor", "must be >= 0 (0 turns the divergence check off)")
        if self.peak_tflops < 0:
            bad("peak_tflops", "must be >= 0 (a device's peak TFLOP/s; 0 = a known GPU's data sheet, none on CPUs)")
        for key in ("loss_scale_growth_interval", "max_consecutive_skips", "divergence_steps"):
            if getattr(self, key) < 1:
                bad(key, "must be a positive integer")
        if self.model in ("transformer", "gpt2"):
            try:
                check_heads("hidden_size", self.hidden_size, self.num_heads)
            except UsageError as exc:
                raise ConfigError(f"{source}: {exc}") from None
            if self.num_steps > self.max_positions:
                bad("num_steps", f"exceeds max_positions = {self.max_positions}; raise max_positions")
        if self.tie_weights and self.embedding_dim not in (0, self.hidden_size):
            bad("embedding_dim", f"must equal hidden_size = {self.hidden_size} when tie_weights = True")
        if self.keep_checkpoints < 1:
            bad("keep_checkpoints", "must be >= 1")
        for key in ("checkpoint_every_epochs", "checkpoint_every_steps", "checkpoint_every_minutes",
                    "preemption_grace_seconds"):
            if getattr(self, key) < 0:
                bad(key, "must be >= 0 (0 turns it off)")

    def _validate_data(self, bad) -> None:
        if self.data not in DATA_KINDS:
            bad("data", f"is not one of {', '.join(DATA_KINDS)}")
        if self.sampling not in SAMPLINGS:
            bad("sampling", f"is not one of {', '.join(SAMPLINGS)} (windows: shuffled fixed windows, "
                "exact epochs; random: random offsets)")
        if self.tokenizer not in TOKENIZERS:
            bad("tokenizer", f"is not one of {', '.join(TOKENIZERS)}")
        if self.data == "text" and not self.train_file:
            bad("train_file", "is empty but data = 'text' needs one; pass --train_file")
        pair_keys = [key for keys in PAIR_FILE_KEYS for key in keys]
        if self.data == "pairs":
            self._validate_pairs(bad)
        else:
            for key in pair_keys:
                if getattr(self, key):
                    bad(key, f"is set but data = {self.data!r}; source/target files train an encoder-decoder: "
                        "set data = 'pairs' (pass --source_file and --target_file)")
        if self.data == "ptb":
            for key in ("train_file", "valid_file", "test_file"):
                if getattr(self, key):
                    bad(key, "is set but data = 'ptb'; set data = 'text' (or pass --train_file)")
            if self.tokenizer != "word":
                bad("tokenizer", "applies to data = 'text' (PTB is word-level); pass --train_file")
        if self.max_vocab < 0 or self.min_count < 1:
            bad("max_vocab" if self.max_vocab < 0 else "min_count",
                "must be >= 0 (0 = no limit)" if self.max_vocab < 0 else "must be >= 1")
        if self.spm_model_type not in SPM_MODEL_TYPES:
            bad("spm_model_type", f"is not one of {', '.join(SPM_MODEL_TYPES)}")
        if self.tokenizer == "hf" and not self.init_from:
            bad("tokenizer", "comes with a pretrained model; pass --init_from <a Hugging Face model folder>")
        if self.lora_rank < 0:
            bad("lora_rank", "must be >= 0 (0 = full fine-tuning)")
        if self.lora_rank and not self.init_from:
            bad("lora_rank", "adapts a pretrained model; pass --init_from <a Hugging Face model folder> "
                "(or lora_rank = 0 to train every weight)")
        if self.lora_alpha <= 0:
            bad("lora_alpha", "must be > 0 (the update is scaled by lora_alpha / lora_rank)")
        if not 0.0 <= self.lora_dropout < 1.0:
            bad("lora_dropout", "must be in [0, 1)")
        data = "pairs" if self.model == "transformer_seq2seq" else "text"
        if self.init_from and (self.model not in PRETRAINED_MODELS or self.data != data):
            bad("init_from", "starts a pretrained model: gpt2 or llama on text data (pass --train_file), or "
                "BART's transformer_seq2seq on pairs (pass --source_file and --target_file); leave model to "
                "--init_from")

    def _validate_pairs(self, bad) -> None:
        for key in ("train_file", "valid_file", "test_file"):
            if getattr(self, key):
                bad(key, "is set but data = 'pairs' reads source_file and target_file; drop it")
        if not self.source_file or not self.target_file:
            bad("source_file" if not self.source_file else "target_file",
                "is empty but data = 'pairs' needs both sides; pass --source_file and --target_file")
        for source_key, target_key in PAIR_FILE_KEYS[1:]:
            if bool(getattr(self, source_key)) != bool(getattr(self, target_key)):
                key = source_key if not getattr(self, source_key) else target_key
                bad(key, f"is empty but {source_key if key == target_key else target_key} is set; "
                    "give both sides of the split")
        if self.share_embeddings and not self.share_vocab:
            bad("share_embeddings", "needs one vocabulary for both sides: set share_vocab = True")
        if self.tokenizer == "hf" and not self.init_from:
            bad("tokenizer", "comes with a pretrained model (--init_from <a BART folder> for pairs); pairs from "
                "scratch use word, sentencepiece, char or byte")
        for key, limit, room in (("max_source_length", self.max_source_positions, 0),
                                 ("max_target_length", self.max_positions, 1)):
            value = getattr(self, key)
            if value < 0:
                bad(key, "must be >= 0 (0 = what the model holds)")
            if value + room > limit:
                holds = "max_source_positions" if room == 0 else "max_positions - 1 (the start or end id)"
                bad(key, f"exceeds what the model holds: {holds} = {limit - room}; lower it or raise "
                    f"{'max_source_positions' if room == 0 else 'max_positions'}")

    @property
    def source_length_limit(self) -> int:
        """The most ids a source may have (``max_source_length``, 0 meaning ``max_source_positions``)."""
        return self.max_source_length or self.max_source_positions

    @property
    def target_length_limit(self) -> int:
        """The most ids a target may have, without its start/end id (0 meaning ``max_positions - 1``)."""
        return self.max_target_length or self.max_positions - 1

    @property
    def tokenizer_options(self) -> Dict[str, Any]:
        """The options of ``lmkit.data.train_tokenizer`` this config asks for."""
        return {"vocab_size": self.vocab_size, "max_vocab": self.max_vocab or None,
                "min_count": self.min_count, "model_type": self.spm_model_type, "source": self.init_from}

    def replace(self, **changes: Any) -> "TrainConfig":
        """A checked copy with some values changed (unknown keys are errors)."""
        merged = self.to_dict()
        merged.update(changes)
        return TrainConfig.from_dict(merged, source="config override")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def dropout(self) -> float:
        return 1.0 - self.keep_prob

    def model_config(self) -> Dict[str, Any]:
        """The settings that define the model's shape (stored with checkpoints)."""
        config = {k: getattr(self, k) for k in MODEL_CONFIG_KEYS}
        config.update(self.model_params)
        return config


def _check_type(source: str, key: str, value: Any, hint: Any) -> Any:
    """Checks ``value`` against a field's annotation without coercing it."""
    origin = getattr(hint, "__origin__", None)
    args = getattr(hint, "__args__", ())
    if origin is Union:  # Optional[...] or a choice of types
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) > 1:
            errors = []
            for member in members:
                try:
                    return _check_type(source, key, value, member)
                except ConfigError as exc:
                    errors.append(str(exc).rsplit(" must be ", 1)[-1])
            raise ConfigError(f"{source}: {key} = {value!r} must be {' or '.join(errors)}")
        hint = members[0]
        origin = getattr(hint, "__origin__", None)
    if hint is bool:
        ok = isinstance(value, bool)
        want = "True or False"
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        want = "an integer"
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        want = "a number"
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
        want = "a string"
    elif origin in (dict, Dict) or hint is dict:
        ok = isinstance(value, Mapping)
        want = "a dict"
        value = dict(value) if ok else value
    else:
        ok, want = True, str(hint)
    if not ok:
        raise ConfigError(f"{source}: {key} = {value!r} must be {want}")
    return value


def _module_values(module: types.ModuleType) -> Dict[str, Any]:
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and k == k.lower()
            and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def _search_dirs() -> Tuple[str, ...]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [d for d in os.environ.get("LMKIT_CONFIG_PATH", "").split(os.pathsep) if d]
    dirs += [os.path.join(os.getcwd(), "configs"), os.path.join(here, "configs")]  # yours, then lmkit's
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs))


def _builtin_dir() -> str:
    return os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))


def _note_shadowing(name: str, path: Optional[str]) -> None:
    """One line (rank 0) when a config file found first hides the built-in config of that name.

    A config file is Python that runs as the user: ``--config config_small``
    inside someone else's checkout would run its ``configs/config_small.py``.
    """
    builtin = os.path.join(_builtin_dir(), name + ".py")
    if path is None or not os.path.isfile(builtin) or os.path.realpath(path) == builtin:
        return
    from lmkit.distributed.env import launcher_rank
    if launcher_rank() == 0:
        import sys
        sys.stderr.write(f"note: --config {name} is {os.path.realpath(path)}, which shadows lmkit's built-in "
                         f"{name}; a config file is Python code that runs as you, so check it (lmkit's own: "
                         f"--config {builtin})\n")


def available_configs() -> Tuple[str, ...]:
    """Names of the configs found in the search folders."""
    names = set()
    for d in _search_dirs():
        if os.path.isdir(d):
            names.update(f[:-3] for f in os.listdir(d) if f.endswith(".py") and not f.startswith("_"))
    return tuple(sorted(names))


def load_config(name: str, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Loads a config by name (``config_small``), file path or module path.

    Raises:
      ConfigError: the config cannot be found, fails to import, or has an
        unknown, missing or ill-typed key.
    """
    path = None
    if name.endswith(".py") or os.sep in name:
        path = name if os.path.isfile(name) else None
        if path is None:
            raise ConfigError(f"config file {name!r} does not exist")
    else:
        for d in _search_dirs():
            candidate = os.path.join(d, name + ".py")
            if os.path.isfile(candidate):
                path = candidate
                break
        _note_shadowing(name, path)
    try:
        if path is not None:
            spec = importlib.util.spec_from_file_location(f"lmkit_config_{abs(hash(path))}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError:
                known = available_configs()
                hint = did_you_mean(name, known, listing="available")
                raise ConfigError(f"unknown config {name!r}; {hint} (or pass a path to a .py file)") from None
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"config {name!r} failed to load: {type(exc).__name__}: {exc}") from exc
    values = _module_values(module)
    if overrides:
        values.update(overrides)
    return TrainConfig.from_dict(values, source=f"config {name!r}")
