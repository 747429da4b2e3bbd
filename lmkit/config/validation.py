"""The checks of a whole config: value ranges and the combinations of settings that sections share.

Each check raises :class:`~lmkit.config.base.ConfigError` as ``<source>: <key>
= <value> <why and the fix>``, the key in its flat name (``batch_size``,
``lora_rank``), which every config accepts.
"""

from __future__ import annotations

from typing import Any, Callable

from lmkit.config import names
from lmkit.config.base import ConfigError
from lmkit.core.checks import check_heads
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


def validate(cfg: Any, source: str = "config") -> None:
    """Checks ``cfg`` (a :class:`~lmkit.config.TrainConfig`), in the order 0.x checked.

    Raises:
      ConfigError: the first bad value or combination.
    """
    def bad(key: str, why: str) -> None:
        value = getattr(cfg, key)
        value = str(value) if key in ("model", "data") else value  # the name and the kind, as 0.x wrote them
        raise ConfigError(f"{source}: {key} = {value!r} {why}")

    if cfg.model.name not in names.models() and not names.is_import_path(cfg.model.name):
        bad("model", f"is not one of {', '.join(names.models())} and not an import path 'package.module:Class'")
    if cfg.backend not in names.backends():
        bad("backend", f"is not one of {', '.join(names.backends())}")
    _validate_data(cfg, bad)
    _validate_ranges(cfg, bad, source)
    _validate_model(cfg, bad, source)
    if cfg.keep_checkpoints < 1:
        bad("keep_checkpoints", "must be >= 1")
    for key in ("checkpoint_every_epochs", "checkpoint_every_steps", "checkpoint_every_minutes",
                "preemption_grace_seconds"):
        if getattr(cfg, key) < 0:
            bad(key, "must be >= 0 (0 turns it off)")


def _validate_ranges(cfg: Any, bad: Bad, source: str) -> None:
    """The sizes, the optimizer's settings, precision and the step's compilation."""
    for key in ("vocab_size", "hidden_size", "num_layers", "batch_size", "num_steps"):
        if getattr(cfg, key) < 1:
            bad(key, "must be a positive integer")
    _validate_plan(cfg, bad, source)
    if not 0.0 <= cfg.model.dropout < 1.0:
        bad("dropout", "must be in [0, 1) (dropout = 1 - keep_prob)")
    for key, why in (("init_scale", "must be > 0"), ("learning_rate", "must be > 0")):
        if getattr(cfg, key) <= 0:
            bad(key, why)
    if cfg.max_grad_norm < 0:
        bad("max_grad_norm", "must be >= 0 (0 turns clipping off)")
    if cfg.loss_reduction not in LOSS_REDUCTIONS:
        bad("loss_reduction", "is not one of sum, mean (a window's loss summed over its positions, or per token)")
    if cfg.lr_scaling not in ("none", "linear", "sqrt"):
        bad("lr_scaling", "is not one of none, linear, sqrt")
    if cfg.compression not in ("none", "fp16"):
        bad("compression", "is not one of none, fp16")
    if cfg.warmup_epochs < 0:
        bad("warmup_epochs", "must be >= 0")
    if cfg.precision not in names.precisions():
        bad("precision", f"is not one of {', '.join(names.precisions())}")
    try:
        use_xla(cfg.jit_compile, "CPU")
    except UsageError:
        bad("jit_compile", "is not one of True, False, 'auto' ('auto': XLA on GPUs, the plain step on CPUs)")
    if cfg.grad_accum_steps < 1:
        bad("grad_accum_steps", "must be >= 1 (1 = no accumulation)")
    problem = names.attention_kernel_problem(cfg.attention_kernel)
    if problem:
        raise ConfigError(f"{source}: {problem}")
    if cfg.device_prefetch < 0:  # (the type is checked with every key's)
        bad("device_prefetch", "must be an integer >= 0 (steps ahead; 0 = off, 2 = the usual)")
    if cfg.batch_size >= 1 and cfg.grad_accum_steps >= 1 and cfg.batch_size % cfg.grad_accum_steps:
        bad("grad_accum_steps", f"does not divide batch_size = {cfg.batch_size}; each micro-batch "
            f"has batch_size / (workers * grad_accum_steps) rows")
    _validate_guards(cfg, bad)


def _validate_plan(cfg: Any, bad: Bad, source: str) -> None:
    """The run's length in exactly one unit (epochs, steps or tokens), its warmup in one, the decay's end."""
    plan = ("num_epochs", "max_steps", "max_tokens")
    for key in (*plan, "warmup_steps", "eval_every_steps", "eval_steps"):
        if getattr(cfg, key) < 0:
            bad(key, "must be >= 0 (0 = not set)")
    stated = [key for key in plan if getattr(cfg, key) > 0]
    if not stated:
        raise ConfigError(f"{source}: the run has no length: set num_epochs (passes over the data), max_steps "
                          "(optimizer steps) or max_tokens (tokens of the global batch), e.g. --max_steps 2000")
    if len(stated) > 1:
        given = " and ".join(f"{key} = {getattr(cfg, key)!r}" for key in stated)
        raise ConfigError(f"{source}: {given} both plan the run's length; keep one of them (set the others to 0). "
                          "The --num_epochs, --max_steps and --max_tokens flags replace the config's plan")
    if cfg.warmup_epochs > 0 and cfg.warmup_steps > 0:
        bad("warmup_steps", f"and warmup_epochs = {cfg.warmup_epochs!r} both set the warmup; keep one (set the "
            "other to 0)")
    if cfg.min_lr < 0:
        bad("min_lr", "must be >= 0 (where the decay ends)")
    params = cfg.schedule_params or {}
    if cfg.min_lr > 0 and "end_lr" in params:
        bad("min_lr", f"and schedule_params end_lr = {params['end_lr']!r} both set the decay's end; keep min_lr")
    if stated[0] == "num_epochs":
        return
    if "total_epochs" in params:
        bad(stated[0], f"plans the run in {stated[0][4:]}, where the decay ends at the last step; drop "
            f"schedule_params total_epochs = {params['total_epochs']!r} (an epoch plan's)")
    if cfg.max_tokens and cfg.data == "pairs":
        bad("max_tokens", "plans a language model's run (batch_size x num_steps tokens a step); pairs vary in "
            "length: plan in max_steps or num_epochs")
    planned = cfg.planned_steps
    if cfg.schedule in ("cosine", "polynomial") and cfg.warmup_steps >= planned:
        bad("warmup_steps", f"must be less than the run's {planned} steps: the decay runs from the warmup's end "
            "to the last step")


def _validate_guards(cfg: Any, bad: Bad) -> None:
    """Loss scaling and the checks that stop a run whose loss goes bad."""
    if cfg.loss_scale <= 0:
        bad("loss_scale", "must be > 0 (2**15 = 32768 is the usual start)")
    if cfg.divergence_factor < 0:
        bad("divergence_factor", "must be >= 0 (0 turns the divergence check off)")
    if cfg.peak_tflops < 0:
        bad("peak_tflops", "must be >= 0 (a device's peak TFLOP/s; 0 = a known GPU's data sheet, none on CPUs)")
    for key in ("loss_scale_growth_interval", "max_consecutive_skips", "divergence_steps"):
        if getattr(cfg, key) < 1:
            bad(key, "must be a positive integer")


def _validate_model(cfg: Any, bad: Bad, source: str) -> None:
    """The model's sizes against each other and against the window."""
    if cfg.model.name in ("transformer", "gpt2"):
        try:
            check_heads("hidden_size", cfg.hidden_size, cfg.num_heads)
        except UsageError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if cfg.num_steps > cfg.max_positions:
            bad("num_steps", f"exceeds max_positions = {cfg.max_positions}; raise max_positions")
    if cfg.tie_weights and cfg.embedding_dim not in (0, cfg.hidden_size):
        bad("embedding_dim", f"must equal hidden_size = {cfg.hidden_size} when tie_weights = True")


def _validate_data(cfg: Any, bad: Bad) -> None:
    """The data's kind, files and tokenizer; LoRA and ``init_from``, which need pretrained data."""
    if cfg.data.kind not in DATA_KINDS:
        bad("data", f"is not one of {', '.join(DATA_KINDS)}")
    if cfg.sampling not in names.samplings():
        bad("sampling", f"is not one of {', '.join(names.samplings())} (windows: shuffled fixed windows, "
            "exact epochs; random: random offsets)")
    kind, source = names.split_tokenizer(cfg.tokenizer)
    if kind not in names.tokenizers():
        bad("tokenizer", f"is not one of {', '.join(names.tokenizers())}, nor hf:<a Hugging Face tokenizer folder "
            "or Hub name> (e.g. hf:gpt2)")
    if cfg.data == "text" and not cfg.train_file:
        bad("train_file", "is empty but data = 'text' needs one; pass --train_file")
    if cfg.data == "pairs":
        _validate_pairs(cfg, bad)
    else:
        for key in [key for keys in PAIR_FILE_KEYS for key in keys]:
            if getattr(cfg, key):
                bad(key, f"is set but data = {cfg.data.kind!r}; source/target files train an encoder-decoder: "
                    "set data = 'pairs' (pass --source_file and --target_file)")
    if cfg.data == "ptb":
        for key in ("train_file", "valid_file", "test_file"):
            if getattr(cfg, key):
                bad(key, "is set but data = 'ptb'; set data = 'text' (or pass --train_file)")
        if cfg.tokenizer != "word":
            bad("tokenizer", "applies to data = 'text' (PTB is word-level); pass --train_file")
    for key in ("text_field", "text_column"):
        if not getattr(cfg, key).strip():
            bad(key, "is empty; name the field (.jsonl) or column (.parquet, datasets folders) that holds "
                "the text, e.g. text")
    if cfg.max_vocab < 0 or cfg.min_count < 1:
        bad("max_vocab" if cfg.max_vocab < 0 else "min_count",
            "must be >= 0 (0 = no limit)" if cfg.max_vocab < 0 else "must be >= 1")
    if cfg.spm_model_type not in names.spm_model_types():
        bad("spm_model_type", f"is not one of {', '.join(names.spm_model_types())}")
    if kind == "hf" and not source and not cfg.init_from:
        bad("tokenizer", "comes with a pretrained model; pass --init_from <a Hugging Face model folder>, or "
            "--tokenizer hf:<a tokenizer folder or Hub name> to train a model from scratch with that tokenizer")
    if source and cfg.init_from:
        bad("tokenizer", f"trains a model from scratch, but init_from = {cfg.init_from!r} brings the pretrained "
            "model's own tokenizer; drop one of them")
    _validate_pretrained(cfg, bad)


def _validate_pretrained(cfg: Any, bad: Bad) -> None:
    """LoRA's settings, and ``init_from`` against the model and the data."""
    if cfg.lora_rank < 0:
        bad("lora_rank", "must be >= 0 (0 = full fine-tuning)")
    if cfg.lora_rank and not cfg.init_from:
        bad("lora_rank", "adapts a pretrained model; pass --init_from <a Hugging Face model folder> "
            "(or lora_rank = 0 to train every weight)")
    if cfg.lora_alpha <= 0:
        bad("lora_alpha", "must be > 0 (the update is scaled by lora_alpha / lora_rank)")
    if not 0.0 <= cfg.lora_dropout < 1.0:
        bad("lora_dropout", "must be in [0, 1)")
    data = "pairs" if cfg.model == "transformer_seq2seq" else "text"
    if cfg.init_from and (cfg.model.name not in names.pretrained_models() or cfg.data != data):
        bad("init_from", "starts a pretrained model: gpt2 or llama on text data (pass --train_file), or "
            "BART's transformer_seq2seq on pairs (pass --source_file and --target_file); leave model to "
            "--init_from")


def _validate_pairs(cfg: Any, bad: Bad) -> None:
    """data = "pairs": both sides of each split, one vocabulary where embeddings are shared, lengths."""
    for key in ("train_file", "valid_file", "test_file"):
        if getattr(cfg, key):
            bad(key, "is set but data = 'pairs' reads source_file and target_file; drop it")
    if not cfg.source_file or not cfg.target_file:
        bad("source_file" if not cfg.source_file else "target_file",
            "is empty but data = 'pairs' needs both sides; pass --source_file and --target_file")
    for source_key, target_key in PAIR_FILE_KEYS[1:]:
        if bool(getattr(cfg, source_key)) != bool(getattr(cfg, target_key)):
            key = source_key if not getattr(cfg, source_key) else target_key
            bad(key, f"is empty but {source_key if key == target_key else target_key} is set; "
                "give both sides of the split")
    if cfg.share_embeddings and not cfg.share_vocab:
        bad("share_embeddings", "needs one vocabulary for both sides: set share_vocab = True")
    if names.split_tokenizer(cfg.tokenizer)[0] == "hf" and not cfg.init_from:
        bad("tokenizer", "is for language models; pairs take a pretrained tokenizer with its model (--init_from "
            "<a BART folder>), and pairs from scratch use word, sentencepiece, char or byte")
    for key, limit, room in (("max_source_length", cfg.max_source_positions, 0),
                             ("max_target_length", cfg.max_positions, 1)):
        value = getattr(cfg, key)
        if value < 0:
            bad(key, "must be >= 0 (0 = what the model holds)")
        if value + room > limit:
            holds = "max_source_positions" if room == 0 else "max_positions - 1 (the start or end id)"
            bad(key, f"exceeds what the model holds: {holds} = {limit - room}; lower it or raise "
                f"{'max_source_positions' if room == 0 else 'max_positions'}")
