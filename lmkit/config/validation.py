"""The checks of a whole config: value ranges and the combinations of settings that sections share.

Each check raises :class:`~lmkit.config.base.ConfigError` as ``<source>: <key>
= <value> <why and the fix>``, the key in its flat name (``batch_size``,
``lora_rank``), which every config accepts. The checks here know no model:
what a model's family needs of a config (heads that divide the model, a window
within its positions, ...) its family checks, called through the model
registry (:func:`lmkit.config.names.check_family_config`).
"""

from __future__ import annotations

from typing import Any, Callable

from lmkit.config import names
from lmkit.config.base import ConfigError
from lmkit.config.spelling import FLAT_KEYS
from lmkit.core.errors import UsageError
from lmkit.core.xla import use_xla

__all__ = ["DATA_KINDS", "LOSS_REDUCTIONS", "PAIR_FILE_KEYS", "validate"]

DATA_KINDS = ("ptb", "text", "pairs")
#: How a language model's window loss reduces its positions (``loss_reduction``): ``sum`` (the Zaremba et al.
#: loss) or ``mean`` (per token, as nanoGPT and Hugging Face train); :func:`lmkit.train.losses.window_loss`.
LOSS_REDUCTIONS = ("sum", "mean")
# data = "pairs": the line-aligned files of each split (training, validation, test).
PAIR_FILE_KEYS = (("source_file", "target_file"), ("valid_source_file", "valid_target_file"),
                  ("test_source_file", "test_target_file"))

Bad = Callable[[str, str], None]


def _value(cfg: Any, key: str) -> Any:
    """The value of the setting whose flat name is ``key`` (the model's name and the data's kind for
    ``model`` and ``data``), for a message."""
    section, name = FLAT_KEYS[key]
    if section == "model":
        return cfg.model.name if name == "name" else cfg.model[name]
    return getattr(getattr(cfg, section), name)


def validate(cfg: Any, source: str = "config") -> None:
    """Checks ``cfg`` (a :class:`~lmkit.config.TrainConfig`), in the order 0.x checked, then its model's family.

    Raises:
      ConfigError: the first bad value or combination.
    """
    def bad(key: str, why: str) -> None:
        raise ConfigError(f"{source}: {key} = {_value(cfg, key)!r} {why}")

    if cfg.model.name not in names.models() and not names.is_import_path(cfg.model.name):
        bad("model", f"is not one of {', '.join(names.models())} and not an import path 'package.module:Class'")
    if cfg.distribution.backend not in names.backends():
        bad("backend", f"is not one of {', '.join(names.backends())}")
    _validate_data(cfg, bad)
    _validate_ranges(cfg, bad, source)
    _validate_compute(cfg, bad, source)
    names.check_family_config(cfg, source)
    checkpoints = cfg.checkpoints
    if checkpoints.keep_checkpoints < 1:
        bad("keep_checkpoints", "must be >= 1")
    for key in ("checkpoint_every_epochs", "checkpoint_every_steps", "checkpoint_every_minutes",
                "preemption_grace_seconds"):
        if getattr(checkpoints, key) < 0:
            bad(key, "must be >= 0 (0 turns it off)")


def _validate_ranges(cfg: Any, bad: Bad, source: str) -> None:
    """The sizes and the optimizer's settings."""
    for key in ("vocab_size", "hidden_size", "num_layers"):
        if cfg.model[key] < 1:
            bad(key, "must be a positive integer")
    for key in ("batch_size", "num_steps"):
        if getattr(cfg.data, key) < 1:
            bad(key, "must be a positive integer")
    if cfg.data.pack_windows < 1:
        bad("pack_windows", "must be a positive integer (the window lengths packed rows come in; 1: num_steps only)")
    _validate_plan(cfg, bad, source)
    if not 0.0 <= cfg.model["dropout"] < 1.0:
        bad("dropout", "must be in [0, 1) (dropout = 1 - keep_prob)")
    if cfg.model["init_scale"] <= 0:
        bad("init_scale", "must be > 0")
    opt = cfg.optimization
    if opt.learning_rate <= 0:
        bad("learning_rate", "must be > 0")
    if opt.max_grad_norm < 0:
        bad("max_grad_norm", "must be >= 0 (0 turns clipping off)")
    if opt.loss_reduction not in LOSS_REDUCTIONS:
        bad("loss_reduction", "is not one of sum, mean (a window's loss summed over its positions, or per token)")
    if opt.lr_scaling not in ("none", "linear", "sqrt"):
        bad("lr_scaling", "is not one of none, linear, sqrt")
    if cfg.distribution.compression not in ("none", "fp16"):
        bad("compression", "is not one of none, fp16")
    if opt.warmup_epochs < 0:
        bad("warmup_epochs", "must be >= 0")


def _validate_compute(cfg: Any, bad: Bad, source: str) -> None:
    """Precision, the step's compilation, micro-batches, the attention kernel, the device feed, the guards."""
    compute = cfg.compute
    if compute.precision not in names.precisions():
        bad("precision", f"is not one of {', '.join(names.precisions())}")
    try:
        use_xla(compute.jit_compile, "CPU")
    except UsageError:
        bad("jit_compile", "is not one of True, False, 'auto' ('auto': XLA on GPUs, the plain step on CPUs)")
    accum = cfg.optimization.grad_accum_steps
    if accum < 1:
        bad("grad_accum_steps", "must be >= 1 (1 = no accumulation)")
    problem = names.attention_kernel_problem(compute.attention_kernel)
    if problem:
        raise ConfigError(f"{source}: {problem}")
    if compute.device_prefetch < 0:  # (the type is checked with every key's)
        bad("device_prefetch", "must be an integer >= 0 (steps ahead; 0 = off, 2 = the usual)")
    batch = cfg.data.batch_size
    if batch >= 1 and accum >= 1 and batch % accum:
        bad("grad_accum_steps", f"does not divide batch_size = {batch}; each micro-batch "
            f"has batch_size / (workers * grad_accum_steps) rows")
    _validate_guards(cfg, bad)


def _validate_plan(cfg: Any, bad: Bad, source: str) -> None:
    """The run's length in exactly one unit (epochs, steps or tokens), its warmup in one, the decay's end.

    A warmup as long as a plan in steps, or longer, is no error: the run warms up over all of its steps
    (:func:`lmkit.optim.policy.warmup_note` says so when it starts).
    """
    opt, plan = cfg.optimization, ("num_epochs", "max_steps", "max_tokens")
    for key in plan + ("warmup_steps",):
        if getattr(opt, key) < 0:
            bad(key, "must be >= 0 (0 = not set)")
    for key in ("eval_every_steps", "eval_steps"):
        if getattr(cfg.run, key) < 0:
            bad(key, "must be >= 0 (0 = not set)")
    stated = [key for key in plan if getattr(opt, key) > 0]
    if not stated:
        raise ConfigError(f"{source}: the run has no length: set num_epochs (passes over the data), max_steps "
                          "(optimizer steps) or max_tokens (tokens of the global batch), e.g. --max_steps 2000")
    if len(stated) > 1:
        given = " and ".join(f"{key} = {getattr(opt, key)!r}" for key in stated)
        raise ConfigError(f"{source}: {given} both plan the run's length; keep one of them (set the others to 0). "
                          "The --num_epochs, --max_steps and --max_tokens flags replace the config's plan")
    if opt.warmup_epochs > 0 and opt.warmup_steps > 0:
        bad("warmup_steps", f"and warmup_epochs = {opt.warmup_epochs!r} both set the warmup; keep one (set the "
            "other to 0)")
    if opt.min_lr < 0:
        bad("min_lr", "must be >= 0 (where the decay ends)")
    params = opt.schedule_params or {}
    if opt.min_lr > 0 and "end_lr" in params:
        bad("min_lr", f"and schedule_params end_lr = {params['end_lr']!r} both set the decay's end; keep min_lr")
    if stated[0] != "num_epochs" and "total_epochs" in params:
        bad(stated[0], f"plans the run in {stated[0][4:]}, where the decay ends at the last step; drop "
            f"schedule_params total_epochs = {params['total_epochs']!r} (an epoch plan's)")
    if stated[0] == "max_tokens" and cfg.data.kind == "pairs":
        bad("max_tokens", "plans a language model's run (batch_size x num_steps tokens a step); pairs vary in "
            "length: plan in max_steps or num_epochs")


def _validate_guards(cfg: Any, bad: Bad) -> None:
    """Loss scaling and the checks that stop a run whose loss goes bad."""
    compute, run = cfg.compute, cfg.run
    if compute.loss_scale <= 0:
        bad("loss_scale", "must be > 0 (2**15 = 32768 is the usual start)")
    if run.divergence_factor < 0:
        bad("divergence_factor", "must be >= 0 (0 turns the divergence check off)")
    if run.peak_tflops < 0:
        bad("peak_tflops", "must be >= 0 (a device's peak TFLOP/s; 0 = a known GPU's data sheet, none on CPUs)")
    for key, value in (("loss_scale_growth_interval", compute.loss_scale_growth_interval),
                       ("max_consecutive_skips", compute.max_consecutive_skips),
                       ("divergence_steps", run.divergence_steps)):
        if value < 1:
            bad(key, "must be a positive integer")


def _validate_data(cfg: Any, bad: Bad) -> None:
    """The data's kind, files and tokenizer; LoRA and ``init_from``, which need pretrained data."""
    data, init_from = cfg.data, cfg.checkpoints.init_from
    if data.kind not in DATA_KINDS:
        bad("data", f"is not one of {', '.join(DATA_KINDS)}")
    if data.sampling not in names.samplings():
        bad("sampling", f"is not one of {', '.join(names.samplings())} (windows: shuffled fixed windows, "
            "exact epochs; random: random offsets)")
    kind, source = names.split_tokenizer(data.tokenizer)
    if kind not in names.tokenizers():
        bad("tokenizer", f"is not one of {', '.join(names.tokenizers())}, nor hf:<a Hugging Face tokenizer folder "
            "or Hub name>")
    _validate_files(data, bad)
    for key in ("text_field", "text_column"):
        if not getattr(data, key).strip():
            bad(key, "is empty; name the field (.jsonl) or column (.parquet, datasets folders) that holds "
                "the text, e.g. text")
    if data.max_vocab < 0 or data.min_count < 1:
        bad("max_vocab" if data.max_vocab < 0 else "min_count",
            "must be >= 0 (0 = no limit)" if data.max_vocab < 0 else "must be >= 1")
    if data.spm_model_type not in names.spm_model_types():
        bad("spm_model_type", f"is not one of {', '.join(names.spm_model_types())}")
    if kind == "hf" and not source and not init_from:
        bad("tokenizer", "comes with a pretrained model; pass --init_from <a Hugging Face model folder>, or "
            "--tokenizer hf:<a tokenizer folder or Hub name> to train a model from scratch with that tokenizer")
    if source and init_from:
        bad("tokenizer", f"trains a model from scratch, but init_from = {init_from!r} brings the pretrained "
            "model's own tokenizer; drop one of them")
    if data.kind == "pairs":
        _validate_pairs(cfg, bad)
    _validate_pretrained(cfg, bad)


def _validate_files(data: Any, bad: Bad) -> None:
    """The files each kind of data reads, and no file of another kind."""
    if data.kind == "text" and not data.train_file:
        bad("train_file", "is empty but data = 'text' needs one; pass --train_file")
    if data.kind != "pairs":
        for key in [key for keys in PAIR_FILE_KEYS for key in keys]:
            if getattr(data, key):
                bad(key, f"is set but data = {data.kind!r}; source/target files train an encoder-decoder: "
                    "set data = 'pairs' (pass --source_file and --target_file)")
    if data.kind == "ptb":
        for key in ("train_file", "valid_file", "test_file"):
            if getattr(data, key):
                bad(key, "is set but data = 'ptb'; set data = 'text' (or pass --train_file)")
        if data.tokenizer != "word":
            bad("tokenizer", "applies to data = 'text' (PTB is word-level); pass --train_file")


def _validate_pretrained(cfg: Any, bad: Bad) -> None:
    """LoRA's settings, and ``init_from`` against the model and the data."""
    adapters, init_from = cfg.adapters, cfg.checkpoints.init_from
    if adapters.lora_rank < 0:
        bad("lora_rank", "must be >= 0 (0 = full fine-tuning)")
    if adapters.lora_rank and not init_from:
        bad("lora_rank", "adapts a pretrained model; pass --init_from <a Hugging Face model folder> "
            "(or lora_rank = 0 to train every weight)")
    if adapters.lora_alpha <= 0:
        bad("lora_alpha", "must be > 0 (the update is scaled by lora_alpha / lora_rank)")
    if not 0.0 <= adapters.lora_dropout < 1.0:
        bad("lora_dropout", "must be in [0, 1)")
    if not init_from:
        return
    pretrained, seq2seq = names.pretrained_models(), names.seq2seq_models()
    data = "pairs" if cfg.model.name in seq2seq else "text"
    if cfg.model.name not in pretrained or cfg.data.kind != data:
        language = [name for name in pretrained if name not in seq2seq]
        conditional = [name for name in pretrained if name in seq2seq]
        bad("init_from", f"starts a pretrained model: {' or '.join(language)} on text data (pass --train_file), "
            f"or the encoder-decoder {' or '.join(conditional)} on pairs (pass --source_file and --target_file); "
            "leave model to --init_from")


def _validate_pairs(cfg: Any, bad: Bad) -> None:
    """data = "pairs": both sides of each split, one vocabulary where embeddings are shared, lengths."""
    data = cfg.data
    for key in ("train_file", "valid_file", "test_file"):
        if getattr(data, key):
            bad(key, "is set but data = 'pairs' reads source_file and target_file; drop it")
    if not data.source_file or not data.target_file:
        bad("source_file" if not data.source_file else "target_file",
            "is empty but data = 'pairs' needs both sides; pass --source_file and --target_file")
    for source_key, target_key in PAIR_FILE_KEYS[1:]:
        if bool(getattr(data, source_key)) != bool(getattr(data, target_key)):
            key = source_key if not getattr(data, source_key) else target_key
            bad(key, f"is empty but {source_key if key == target_key else target_key} is set; "
                "give both sides of the split")
    if not data.share_vocab and cfg.model.get("share_embeddings"):
        bad("share_embeddings", "needs one vocabulary for both sides: set share_vocab = True")
    if names.split_tokenizer(data.tokenizer)[0] == "hf" and not cfg.checkpoints.init_from:
        bad("tokenizer", "is for language models; pairs take a pretrained tokenizer with its model (--init_from "
            "<a pretrained encoder-decoder's folder>), and pairs from scratch use word, sentencepiece, char or byte")
    _validate_lengths(cfg, bad)


def _validate_lengths(cfg: Any, bad: Bad) -> None:
    """The longest source and target a run keeps, within what the model holds (0: all it holds)."""
    for key, limit_key, room in (("max_source_length", "max_source_positions", 0),
                                 ("max_target_length", "max_positions", 1)):
        value = getattr(cfg.data, key)
        if value < 0:
            bad(key, "must be >= 0 (0 = what the model holds)")
        limit = cfg.model.get(limit_key) if value else None  # a model without the key holds any length
        if limit is not None and value + room > limit:
            holds = "max_source_positions" if room == 0 else "max_positions - 1 (the start or end id)"
            bad(key, f"exceeds what the model holds: {holds} = {limit - room}; lower it or raise {limit_key}")
