"""The sections of a run's config, one concern each (the model's is :mod:`lmkit.config.model`).

In a config file each is a dict of its fields::

    data = dict(kind="text", train_file="train.txt", tokenizer="sentencepiece", batch_size=32, num_steps=64)
    optimization = dict(optimizer="adamw", learning_rate=6e-4, max_grad_norm=1.0, num_epochs=1)

and every field also keeps its flat spelling (``batch_size = 32``, ``--set
batch_size=32``), which :mod:`lmkit.config.spelling` maps to its section.
Values are checked when the run's :class:`~lmkit.config.TrainConfig` is
built (:mod:`lmkit.config.validation`), where settings of several sections
meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

from lmkit.config.base import Section

__all__ = ["AdapterConfig", "CheckpointConfig", "ComputeConfig", "DataConfig", "DistributionConfig",
           "OptimizationConfig", "RunConfig"]


@dataclass(frozen=True, eq=False)
class DataConfig(Section):
    """What a run reads and how it is cut into batches.

    ``cfg.data == "text"`` compares ``kind``, as the flat config's ``data``
    string did.
    """

    SECTION = "data"

    batch_size: int  # the GLOBAL batch, split across the workers
    num_steps: int  # a language model's window (BPTT length)
    kind: str = "ptb"  # ptb | text | pairs (line-aligned source/target files, for encoder-decoders)
    eval_batch_size: int = 0  # 0 = batch_size
    train_file: str = ""  # kind = "text": UTF-8 text, one sentence or paragraph a line; .jsonl, .parquet, a
    # datasets folder (save_to_disk), .gz/.bz2/.zst text: one document a record (lmkit.data.formats)
    valid_file: str = ""  # optional; evaluated by rank 0 after every epoch
    test_file: str = ""  # optional; evaluated by rank 0 at the end
    text_field: str = "text"  # .jsonl sources: the field of each record that holds its text
    text_column: str = "text"  # .parquet sources and datasets folders: the column that holds the text
    data_cache: str = ""  # text: token cache folder ("" = $LMKIT_DATA_CACHE or ~/.cache/lmkit/tokens; "none" = off)
    # Records as examples with loss weights (docs/chat.md): chat | completion | text; "" = found from the first
    # record (messages or prompt make examples; anything else is read as a text stream)
    data_format: str = ""
    chat_template: str = ""  # chat records: a Jinja file to render them with instead of the model folder's template
    train_on_prompt: bool = False  # chat and completion records: every token is a target, not only the answers
    packing: bool = False  # examples: several to a window, attending within each; False: one a row, padded
    pack_windows: int = 3  # packing: rows of num_steps, its half, its quarter, ... (this many lengths; docs/chat.md)
    skip_bad_records: bool = False  # examples: count and leave out bad records instead of stopping at the first
    source_file: str = ""  # kind = "pairs": line i is the source of line i of target_file
    target_file: str = ""
    valid_source_file: str = ""  # pairs: optional; evaluated by rank 0 after every epoch
    valid_target_file: str = ""
    test_source_file: str = ""  # pairs: optional; evaluated by rank 0 at the end
    test_target_file: str = ""
    share_vocab: bool = True  # pairs: one tokenizer for both sides; False: the source gets its own
    max_source_length: int = 0  # pairs: longer sources are skipped, counted (0 = max_source_positions)
    max_target_length: int = 0  # pairs: longer targets are skipped, counted (0 = max_positions - 1)
    sampling: str = "windows"  # non-recurrent models: windows (shuffled fixed windows) | random (random offsets)
    tokenizer: str = "word"  # text: word | sentencepiece | char | byte | hf (with init_from) | hf:<folder or Hub name>
    max_vocab: int = 0  # word tokenizer: largest vocabulary, specials included (0 = no limit)
    min_count: int = 1  # word tokenizer: drop words seen fewer times
    spm_model_type: str = "unigram"  # sentencepiece: unigram | bpe (size: the model's vocab_size)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.kind == other
        if isinstance(other, DataConfig):
            return self.to_dict() == other.to_dict()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.kind)

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class OptimizationConfig(Section):
    """The optimizer, its learning-rate schedule, clipping and the run's length (its plan).

    A run is planned in epochs (``num_epochs``), in optimizer steps
    (``max_steps``) or in global tokens (``max_tokens``): exactly one of the
    three. A decay (cosine, polynomial) ends at the plan's end, at ``min_lr``.
    """

    SECTION = "optimization"

    learning_rate: float
    max_grad_norm: float  # global-norm clipping after averaging; 0 = off
    num_epochs: int = 0  # the plan in epochs (passes over the training data)
    max_steps: int = 0  # ...or in optimizer steps (nanoGPT's max_iters)
    max_tokens: int = 0  # ...or in tokens of the global batch (steps = ceil(max_tokens / (batch_size * num_steps)))
    warmup_steps: int = 0  # linear warmup in steps, from peak / (warmup_steps + 1), as nanoGPT's get_lr
    min_lr: float = 0.0  # where a cosine or polynomial decay ends (at the plan's last step), then stays
    optimizer: str = "sgd"  # sgd | momentum | adam | adamw | novograd | lamb
    optimizer_params: Dict[str, Any] = field(default_factory=dict)
    # A language model's loss over a window's positions: sum (the Zaremba et al. loss) | mean (per
    # token, as nanoGPT and Hugging Face train: max_grad_norm then clips num_steps times less)
    loss_reduction: str = "sum"
    lr_decay: float = 1.0  # multiplier per epoch once decay starts
    lr_decay_start_epoch: int = 0  # first epoch index (0-based) with decay applied
    lr_scaling: str = "none"  # none | linear | sqrt (by number of workers)
    warmup_epochs: float = 0.0  # warmup in epochs (may be fractional); or warmup_steps, not both
    schedule: str = "exponential"  # exponential | piecewise | polynomial | cosine | constant
    schedule_params: Dict[str, Any] = field(default_factory=dict)
    larc_params: Optional[Dict[str, Any]] = None
    max_grad_norm_per_layer: float = 0.0  # per-variable clipping; 0 = off
    grad_accum_steps: int = 1  # micro-batches per optimizer step (batch_size stays the global batch)


@dataclass(frozen=True)
class ComputeConfig(Section):
    """How the step computes: precision and loss scaling, XLA, the attention kernel, the device feed."""

    SECTION = "compute"

    precision: str = "float32"  # float32 | mixed_bfloat16 | mixed_float16 (lmkit.layers.precision)
    loss_scale: float = 32768.0  # mixed_float16: the first step's loss scale (2**15)
    loss_scale_growth_interval: int = 2000  # mixed_float16: finite steps in a row before it doubles
    max_consecutive_skips: int = 20  # mixed_float16: skipped steps in a row before stopping (exit 3)
    jit_compile: Union[bool, str] = "auto"  # "auto": XLA on GPUs, plain on CPUs (lmkit.core.xla); True | False
    # Which kernel computes a window's causal attention (lmkit.layers.kernels): matmul (scores
    # through two matmuls, everywhere) | cudnn (cuDNN's fused attention: GPU, XLA, mixed precision) |
    # auto: cudnn where it runs and checks out, else matmul
    attention_kernel: str = "auto"
    # Windows copied to the device this many steps ahead, on a thread of their own, and the stop/save
    # flags kept there (lmkit.train.feed); several processes read their agreed flags on a thread too, two
    # steps late (lmkit.train.resume.Boundaries); 0: each step's window is sent as the step starts
    device_prefetch: int = 0


@dataclass(frozen=True)
class DistributionConfig(Section):
    """Which backend runs the workers and how gradients travel between them."""

    SECTION = "distribution"

    backend: str = "auto"  # auto | horovod | native | local (lmkit.distributed.BACKENDS)
    num_gpus: int = 0  # native backend: replicas on one host (0 = all GPUs, or 1 CPU)
    sparse_as_dense: bool = False
    compression: str = "none"  # none | fp16 (dense gradients only)


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """Where the weights start (``init_from``) and when and how many checkpoints are kept."""

    SECTION = "checkpoints"

    init_from: str = ""  # a Hugging Face folder of a family lmkit reads: its weights, sizes, tokenizer
    checkpoint_every_epochs: int = 1
    checkpoint_every_steps: int = 0  # also every this many global steps (0 = off)
    checkpoint_every_minutes: float = 0.0  # also this often, by rank 0's clock (0 = off)
    keep_checkpoints: int = 3
    preemption_grace_seconds: float = 60.0  # signal to exit, checkpoint or not (0 = no limit)


@dataclass(frozen=True)
class AdapterConfig(Section):
    """LoRA: low-rank adapters trained on a frozen pretrained model (with ``init_from``)."""

    SECTION = "adapters"

    lora_rank: int = 0  # train rank-r adapters only, the base frozen (0 = full fine-tuning)
    lora_alpha: float = 16.0  # the adapters' update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # on the adapters' inputs while training
    # comma-separated Linear layer names ("" = the model's own, its class's lora_targets)
    lora_targets: str = ""


@dataclass(frozen=True)
class RunConfig(Section):
    """The run's seed, its log lines and when a diverging run stops."""

    SECTION = "run"

    seed: int = 1234
    log_every_steps: int = 0  # 0 = about 10 lines per epoch (a plan in steps: about 50 step lines a run)
    eval_every_steps: int = 0  # rank 0 evaluates the validation data every this many global steps (0 = at epoch ends)
    eval_steps: int = 0  # batches of validation data those evaluations read: a fixed sample, its start (0 = all)
    divergence_factor: float = 3.0  # stop (exit 3) when the loss stays above this x ln(vocab_size)...
    divergence_steps: int = 10  # ...for this many steps in a row (a uniform guess scores ln(vocab_size))
    peak_tflops: float = 0.0  # one device's peak TFLOP/s for the logs' MFU; 0 = a known GPU's (lmkit.train.flops)
