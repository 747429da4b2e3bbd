"""``lmkit train``: train a language model on PTB or on your own text, on 1 or N workers.

    lmkit train --config config_small                                  # PTB, one process
    mpirun -np 2 lmkit train --config config_small                     # PTB, Horovod
    lmkit train --config config_transformer --train_file train.txt \\
        --valid_file valid.txt --tokenizer sentencepiece --vocab_size 8000
    lmkit train --config config_transformer --model my_pkg.my_lm:MyLM --train_file train.txt
    mpirun -np 2 lmkit train --init_from gpt2_folder --train_file train.txt --model_dir runs/ft  # GPT-2
    mpirun -np 2 lmkit train --init_from llama_folder --lora_rank 8 --train_file train.txt  # LoRA
    mpirun -np 2 lmkit train --init_from qwen_folder --train_file chats.jsonl --packing  # chat: answers' loss only
    lmkit train --init_from bart_folder --source_file train.src --target_file train.tgt  # BART, on pairs
    python -m lmkit.launch --hosts h1,h2 --num_workers 2 -- lmkit train --backend native ...
    lmkit train --config config_seq2seq --source_file src.txt --target_file tgt.txt \
        --valid_source_file vsrc.txt --valid_target_file vtgt.txt     # an encoder-decoder
    lmkit train --config config_small --set optimization.learning_rate=0.5 --print_config  # the config, by section

The config names the model and the data (``data = dict(kind="ptb")``,
``"text"`` or ``"pairs"``); flags and ``--set`` (flat keys or
``section.key``) override it (``--train_file`` alone switches a PTB config
to text, ``--source_file`` to pairs, which an encoder-decoder trains on).
Rank 0 downloads PTB or trains the tokenizer into ``--model_dir``, splits
nothing but the global batch across the workers, evaluates, logs and writes
checkpoints (also when ``--max_steps`` stops training inside an epoch), the
config and the tokenizer, so ``lmkit generate`` and a resumed run need only
``--model_dir``. Every line specific to distributed training is marked
``# DIST``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional

from lmkit.cli.common import HelpFormatter, Parser, parse_overrides, user_modules_importable
from lmkit.core.layout import CHECKPOINT_DIR, RESULTS_FILE
from lmkit.data.sources import SEPARATOR
from lmkit.distributed import BACKEND_CHOICES
from lmkit.layers.precision import PRECISIONS
from lmkit.models.registry import CONVERTERS, MODELS, SEQ2SEQ_MODELS

__all__ = ["build_parser", "config_from_args", "main", "print_config"]


def build_parser(prog: str = "lmkit train", distributed: bool = True) -> argparse.ArgumentParser:
    """The flags of ``lmkit train`` (and of ``examples/lm_ptb*.py``), documented in the README."""
    p = Parser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--config", default=None,
                   help="config name in configs/ (config_small, config_medium, config_large, "
                        "config_transformer, config_gpt2_finetune, config_seq2seq, ...) or a path to a .py "
                        "file; default config_small, config_gpt2_finetune with --init_from, config_seq2seq "
                        "with --source_file")
    p.add_argument("--print_config", action="store_true",
                   help="print the resolved config (the config file, the flags and --set applied) as a config "
                        "file, by section, and exit without training; save it as a .py file to pass to --config")
    p.add_argument("--init_from", default=None,
                   help=f"fine-tune a pretrained model ({', '.join(CONVERTERS)}; a language model with --train_file, "
                        "an encoder-decoder with --source_file and --target_file): a Hugging Face folder (config.json, "
                        "model.safetensors, tokenizer.json or vocab.json + merges.txt) or hf:<name> to download "
                        "one; its sizes, weights and tokenizer replace the config's")
    _add_lora_flags(p)
    p.add_argument("--model", default=None,
                   help=f"the model: a registered name ({', '.join(MODELS)}) or your own class "
                        "as package.module:Class; default: the config's model")
    _add_data_flags(p)
    _add_run_flags(p)
    if distributed:  # DIST: which backend, and how gradients travel
        _add_distributed_flags(p)
    return p


def _add_lora_flags(p: argparse.ArgumentParser) -> None:
    lora = p.add_argument_group("LoRA (with --init_from: train low-rank adapters, the base frozen)")
    lora.add_argument("--lora_rank", type=int, default=None,
                      help="the adapters' rank r (0 = train every weight); default: the config's lora_rank (0)")
    lora.add_argument("--lora_alpha", type=float, default=None,
                      help="the update is scaled by alpha / r; default: the config's lora_alpha (16)")
    lora.add_argument("--lora_dropout", type=float, default=None,
                      help="dropout on the adapters' inputs; default: the config's lora_dropout (0)")
    lora.add_argument("--lora_targets", default=None,
                      help="comma-separated names of the model's linear layers to adapt (docs/llama.md#lora names "
                           "them); default: the model's own (its class's lora_targets)")


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    from lmkit.data.tokenizers import TOKENIZERS

    data = p.add_argument_group("data")
    data.add_argument("--data_path", default="data/ptb",
                      help="PTB: folder with ptb.{train,valid,test}.txt (or simple-examples/data below "
                           "it); PTB is downloaded there when missing")
    data.add_argument("--data_url", default=None,
                      help="PTB: mirror of simple-examples.tgz (http(s):// or file://); "
                           "default $LMKIT_PTB_URL or the canonical address, then a second source")
    data.add_argument("--no_verify_data", action="store_true",
                      help="PTB: accept files from --data_url without checking their SHA-1 (a mirror "
                           "serving other data)")
    data.add_argument("--train_file", default=None, nargs="+", metavar="PATH",
                      help="your own training text (UTF-8, one sentence or paragraph a line; or .jsonl, "
                           ".parquet, a datasets save_to_disk folder, .gz/.bz2/.zst text: one document a "
                           "record): files, folders or quoted glob patterns ('shards/*.parquet'), read in "
                           "sorted order; switches a PTB config to data = 'text'")
    data.add_argument("--valid_file", default=None, nargs="+", metavar="PATH",
                      help="validation text (rank 0 evaluates it), as --train_file")
    data.add_argument("--test_file", default=None, nargs="+", metavar="PATH",
                      help="test text (rank 0 evaluates it at the end), as --train_file")
    data.add_argument("--text_field", default=None, metavar="NAME",
                      help=".jsonl sources: the field of each record that holds its text (default: the "
                           "config's, 'text')")
    data.add_argument("--text_column", default=None, metavar="NAME",
                      help=".parquet sources and datasets folders: the column that holds the text (default: "
                           "the config's, 'text')")
    _add_pair_flags(p)
    _add_chat_flags(p)
    data.add_argument("--data_cache", default=None, metavar="DIR",
                      help="text: the folder where encoded text is kept and reused by later runs "
                           "(default: $LMKIT_DATA_CACHE, else ~/.cache/lmkit/tokens); 'none' encodes "
                           "into memory at every start")
    data.add_argument("--sampling", choices=["windows", "random"], default=None,
                      help="transformers: 'windows' (shuffled fixed windows, each token once an "
                           "epoch) or 'random' (windows at random offsets); default: the config's")
    data.add_argument("--tokenizer", type=_tokenizer_choice, default=None,
                      metavar="{" + ",".join(TOKENIZERS) + ",hf:FOLDER_OR_NAME}",
                      help="text data: word, sentencepiece, char or byte (trained on --train_file), or "
                           "hf:FOLDER_OR_NAME, a pretrained tokenizer for a model trained from scratch: a folder "
                           "with tokenizer.json (or vocab.json + merges.txt) or a Hugging Face Hub name to "
                           "download (hf:gpt2); default: the config's")
    data.add_argument("--vocab_size", type=int, default=None,
                      help="sentencepiece: number of pieces; hf:...: the model's ids, the tokenizer's or more "
                           "(padding: 50304 for GPT-2's 50257); default: the config's vocab_size")
    data.add_argument("--max_vocab", type=int, default=None,
                      help="word tokenizer: largest vocabulary (specials included); 0 = no limit")
    data.add_argument("--min_count", type=int, default=None, help="word tokenizer: drop rarer words")
    data.add_argument("--spm_model_type", choices=["unigram", "bpe"], default=None,
                      help="sentencepiece: the algorithm")


def _tokenizer_choice(value: str) -> str:
    """``--tokenizer``: a registered kind, or ``hf:<folder or Hub name>``.

    Raises:
      argparse.ArgumentTypeError: anything else (argparse prints it and exits with status 2).
    """
    from lmkit.data.tokenizers import TOKENIZERS, split_tokenizer
    if split_tokenizer(value)[0] in TOKENIZERS:
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(TOKENIZERS)}, or "
                                     "hf:FOLDER_OR_NAME: a tokenizer folder or Hugging Face Hub name, e.g. hf:gpt2)")


def _add_pair_flags(p: argparse.ArgumentParser) -> None:
    pairs = p.add_argument_group("pairs (encoder-decoders: config_seq2seq, config_seq2seq_rnn)")
    pairs.add_argument("--source_file", default=None, metavar="PATH",
                       help="the training sources, one a line (UTF-8); line i goes with line i of "
                            "--target_file; switches the config to data = 'pairs'")
    pairs.add_argument("--target_file", default=None, metavar="PATH", help="the training targets, one a line")
    for split, what in (("valid", "evaluated by rank 0 after every epoch"), ("test", "evaluated at the end")):
        pairs.add_argument(f"--{split}_source_file", default=None, metavar="PATH",
                           help=f"{split} sources ({what}), with --{split}_target_file")
        pairs.add_argument(f"--{split}_target_file", default=None, metavar="PATH", help=f"{split} targets")


def _add_chat_flags(p: argparse.ArgumentParser) -> None:
    chat = p.add_argument_group("conversations and completions (records with messages, or prompt and completion: "
                                "docs/chat.md)")
    chat.add_argument("--data_format", choices=["chat", "completion", "text"], default=None,
                      help="read each record of --train_file/--valid_file as a conversation (messages), a prompt and "
                           "completion, or a text, as an example with a loss weight per token; default: found from "
                           "the fields of the first record (messages or prompt; other records are a text stream)")
    chat.add_argument("--chat_template", default=None, metavar="FILE",
                      help="a Jinja chat template that renders the conversations instead of the model folder's")
    chat.add_argument("--train_on_prompt", action="store_true",
                      help="every token of a record is a target, not only the assistant's (or the completion's)")
    chat.add_argument("--packing", action="store_true",
                      help="lay several examples in one window, each attending only to itself (positions restart); "
                           "default: one example a row, padded to the batch's longest (length buckets)")
    chat.add_argument("--pack_windows", type=int, default=None, metavar="N",
                      help="with --packing, rows may come in N windows: num_steps, its half, its quarter, ..., "
                           "a shorter window's batch with as many more rows; lmkit keeps them when they cost the "
                           "model less per example than full rows (default 3; 1: every row num_steps long)")
    chat.add_argument("--skip_bad_records", action="store_true",
                      help="count and leave out bad records (no assistant turn, an unknown role, ...) instead of "
                           "stopping at the first (exit 2)")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    run = p.add_argument_group("run")
    run.add_argument("--model_dir", default=None,
                     help="checkpoints, config, tokenizer or vocabulary, TensorBoard logs and "
                          "results.json (default runs/<config>)")
    run.add_argument("--no_resume", action="store_true",
                     help="start afresh even when --model_dir holds a checkpoint "
                          "(refuses a folder that already has one)")
    _add_plan_flags(p)
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, by its section or flat, e.g. --set optimization.optimizer=adam "
                          "--set batch_size=40 --set model.dropout=0.1 (repeatable)")
    run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    run.add_argument("--precision", choices=list(PRECISIONS), default=None,
                     help="arithmetic precision: float32, mixed_bfloat16 (Ampere+ GPUs, TPUs, CPUs with "
                          "AVX512-BF16/AMX) or mixed_float16 (Volta+ GPUs; dynamic loss scaling); "
                          "variables, the loss and gradient averaging stay float32; default: the config's")
    run.add_argument("--grad_accum_steps", type=int, default=None,
                     help="micro-batches per optimizer step: each worker runs batch_size / (workers x "
                          "grad_accum_steps) rows at a time and gradients travel once per step; "
                          "default: the config's (1)")
    run.add_argument("--intra_op_threads", type=int, default=None,
                     help="CPU threads per op on each rank (default: cores / ranks on the host)")
    run.add_argument("--verbose", action="store_true",
                     help="keep TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    plan = p.add_argument_group(
        "the run's length and schedule (one of --num_epochs, --max_steps, --max_tokens: it replaces the config's "
        "plan; a decay ends at its last step)")
    plan.add_argument("--num_epochs", type=int, default=None, help="train this many epochs (passes over the data)")
    plan.add_argument("--max_steps", type=int, default=None,
                      help="train this many optimizer steps (global batches); a checkpoint is written at the end")
    plan.add_argument("--max_tokens", type=int, default=None,
                      help="train on this many tokens of the global batch: ceil(max_tokens / (batch_size x "
                           "num_steps)) steps, on any number of workers")
    plan.add_argument("--warmup_steps", type=int, default=None,
                      help="linear warmup over this many steps, from lr / (warmup_steps + 1) (nanoGPT's); "
                           "replaces the config's warmup_epochs")
    plan.add_argument("--min_lr", type=float, default=None,
                      help="where a cosine or polynomial decay ends, at the plan's last step")
    plan.add_argument("--eval_every_steps", type=int, default=None,
                      help="rank 0 evaluates the validation data every this many global steps (a 'val loss' line)")
    plan.add_argument("--eval_steps", type=int, default=None,
                      help="batches of validation data each of those evaluations reads (its start: a fixed "
                           "sample; 0 = all of it)")


def _plan_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The plan the flags state: one of num_epochs, max_steps, max_tokens replaces the config's (the others 0)."""
    overrides: Dict[str, Any] = {}
    stated = [key for key in ("num_epochs", "max_steps", "max_tokens") if getattr(args, key) is not None]
    if len(stated) > 1:
        from lmkit.core.errors import UsageError
        raise UsageError(f"{' and '.join('--' + key for key in stated)} both plan the run's length; pass one")
    if stated:
        overrides.update({"num_epochs": 0, "max_steps": 0, "max_tokens": 0, stated[0]: getattr(args, stated[0])})
    if args.warmup_steps is not None:
        overrides.update(warmup_steps=args.warmup_steps, warmup_epochs=0.0)
    overrides.update({key: getattr(args, key) for key in ("min_lr", "eval_every_steps", "eval_steps")
                      if getattr(args, key) is not None})
    return overrides


def _add_distributed_flags(p: argparse.ArgumentParser) -> None:
    dist_group = p.add_argument_group("distributed")
    dist_group.add_argument(
        "--backend", choices=list(BACKEND_CHOICES), default=None,
        help="horovod: start with mpirun/horovodrun; native: TensorFlow's own distribution "
             "(start with python, or python -m lmkit.launch for several hosts); auto: Horovod "
             "when installed, else one local process; default: the config's backend")
    dist_group.add_argument("--use_horovod", type=str.lower, choices=["true", "false"], default=None,
                            help="OpenSeq2Seq's spelling: true = --backend horovod, false = native")
    dist_group.add_argument("--num_gpus", type=int, default=None,
                            help="backend native: replicas in this process, one per GPU (logical "
                                 "CPU devices on a host without GPUs); 0 = all GPUs; default: the "
                                 "config's num_gpus")
    dist_group.add_argument("--sparse_as_dense", action="store_true",
                            help="allreduce embedding gradients as dense tensors instead of "
                                 "allgathering them")
    dist_group.add_argument("--fp16_allreduce", action="store_true",
                            help="compress dense gradients to float16 for the allreduce")


def _flag_overrides(args: argparse.Namespace, distributed: bool) -> Dict[str, Any]:
    """Config keys set by flags (``--set`` first; named flags win)."""
    overrides = parse_overrides(args.overrides)
    joined = {key: None if value is None else SEPARATOR.join(value)
              for key, value in (("train_file", args.train_file), ("valid_file", args.valid_file),
                                 ("test_file", args.test_file))}
    named = {"seed": args.seed, "model": args.model, **joined, "text_field": args.text_field,
             "text_column": args.text_column, "data_cache": args.data_cache,
             "sampling": args.sampling, "tokenizer": args.tokenizer,
             "vocab_size": args.vocab_size, "max_vocab": args.max_vocab, "min_count": args.min_count,
             "spm_model_type": args.spm_model_type, "precision": args.precision,
             "grad_accum_steps": args.grad_accum_steps, "lora_rank": args.lora_rank,
             "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout, "lora_targets": args.lora_targets,
             "data_format": args.data_format, "pack_windows": args.pack_windows,
             "chat_template": os.path.abspath(args.chat_template) if args.chat_template else None}
    named.update({key: True for key in ("train_on_prompt", "packing", "skip_bad_records") if getattr(args, key)})
    from lmkit.config import PAIR_FILE_KEYS
    named.update({key: getattr(args, key) for keys in PAIR_FILE_KEYS for key in keys})
    overrides.update({k: v for k, v in named.items() if v is not None})
    overrides.update(_plan_overrides(args))
    if args.train_file is not None:
        overrides["data"] = "text"
    if args.source_file is not None or args.target_file is not None:
        overrides["data"] = "pairs"
    if distributed:
        if args.sparse_as_dense:
            overrides["sparse_as_dense"] = True  # DIST
        if args.fp16_allreduce:
            overrides["compression"] = "fp16"  # DIST
        if args.use_horovod is not None:
            overrides["backend"] = "horovod" if args.use_horovod == "true" else "native"  # DIST
        if args.backend is not None:
            overrides["backend"] = args.backend  # DIST
        if args.num_gpus is not None:
            overrides["num_gpus"] = args.num_gpus  # DIST
    return overrides


def config_from_args(args: argparse.Namespace, distributed: bool = True):
    """The run's config: ``--config`` with the flags applied (no TensorFlow needed).

    Raises:
      ConfigError: an unknown config or key, or a bad value.
    """
    from lmkit.config import load_config
    if args.config is None:
        args.config = ("config_gpt2_finetune" if args.init_from else
                       "config_seq2seq" if args.source_file or args.target_file else "config_small")
    overrides = _flag_overrides(args, distributed)
    if not args.init_from:
        return load_config(args.config, overrides)
    from lmkit.hub.converters import converter_of as family_of
    from lmkit.hub.converters import pretrained_training_config
    from lmkit.hub.download import resolve_source
    folder = resolve_source(args.init_from)  # a download only for hf:<name>
    overrides["init_from"] = os.path.abspath(folder)  # checked with the keys that need it (lora_rank)
    if getattr(family_of(folder), "conditional", False):  # an encoder-decoder (BART): fine-tuned on pairs
        from lmkit.hub.folders import model_type_of
        from lmkit.models.registry import model_of_hf_type
        overrides.setdefault("model", model_of_hf_type(model_type_of(folder)[1]))
    # --train_file: data = "text"; --source_file/--target_file: data = "pairs"
    config = pretrained_training_config(load_config(args.config, overrides), folder)
    # Dropout is the recipe's, not the architecture's: a --set wins over the folder's.
    recipe = {k: v for k, v in overrides.items() if k in ("keep_prob", "dropout", "model.dropout", "model.keep_prob")}
    return config.replace(**recipe) if recipe else config


def check_model_data(cls: type, config: Any) -> None:
    """An encoder-decoder trains on pairs, a language model on a stream: the config must fit the model.

    Raises:
      UsageError: naming the model, the data and the fix.
    """
    from lmkit.core.errors import UsageError
    conditional = bool(getattr(cls, "conditional", False))
    if conditional and config.data.kind != "pairs":
        raise UsageError(f"model {config.model.name!r} is an encoder-decoder: it trains on source/target pairs, "
                         f"not data = {config.data.kind!r}; pass --source_file and --target_file (config_seq2seq)")
    if not conditional and config.data.kind == "pairs":
        raise UsageError(f"model {config.model.name!r} is a language model, but data = 'pairs' is for "
                         f"encoder-decoders; use model = {' or '.join(repr(m) for m in SEQ2SEQ_MODELS)} (--config "
                         "config_seq2seq), or --train_file for a language model")


def print_config(config: Any, args: argparse.Namespace, prog: str = "lmkit train") -> int:
    """Prints ``config`` as a config file (rank 0; :func:`lmkit.config.format_config`); returns 0.

    Nothing is trained, read or written: the model's class is imported to name its arguments.
    """
    from lmkit.config import format_config
    from lmkit.distributed.env import launcher_rank
    text = format_config(config, header=f"The config of `{prog} --config {args.config}` with its flags and --set "
                                        f"applied (--print_config).\n\nTrain with it: {prog} --config <this file>.py")
    if launcher_rank() == 0:
        print(text, end="", flush=True)
    return 0


def _model_dir(args: argparse.Namespace) -> str:
    model_dir = args.model_dir or os.path.join("runs", os.path.basename(args.config).replace(".py", ""))
    checkpoints = os.path.join(model_dir, CHECKPOINT_DIR)
    if args.no_resume and os.path.isdir(checkpoints) and os.listdir(checkpoints):
        from lmkit.core.errors import UsageError
        raise UsageError(f"--no_resume, but {model_dir} already holds checkpoints; "
                         "pass a new --model_dir or drop --no_resume to continue that run")
    return model_dir


def main(argv: Optional[List[str]] = None, prog: str = "lmkit train", distributed: bool = True) -> int:
    """Trains as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    from lmkit.core.preemption import set_doing  # what a signal stopped, for its message

    args = build_parser(prog, distributed).parse_args(argv)
    set_doing("reading the config" + (f" and --init_from {args.init_from}" if args.init_from else ""))
    config = config_from_args(args, distributed)  # plain Python: no TensorFlow op yet
    user_modules_importable()
    if args.print_config:
        return print_config(config, args, prog)
    set_doing("starting TensorFlow")
    replicas = _start(config, args, distributed)
    model_dir = _model_dir(args)

    from lmkit import distributed as dist
    from lmkit.optim import warmup_note
    from lmkit.train import Trainer
    from lmkit.train.run_data import load_run_data

    def log(text: str) -> None:
        if dist.is_chief():
            print(text, flush=True)

    set_doing("preparing the data")
    data = load_run_data(config, model_dir, args.data_path, args.data_url,  # DIST: rank 0 prepares
                         verify=not args.no_verify_data, log=log)
    config = data.config
    model = _build_model(config, log)
    if warmup_note(config):
        log(warmup_note(config))
    trainer = Trainer(model, config, model_dir=model_dir, vocab=data.vocab)
    set_doing(f"starting training (restoring the last checkpoint in {model_dir}, if any)")
    result = trainer.fit(data.train, data.valid, data.test, words=data.words)  # the config's plan
    if dist.is_chief() and result.epochs:  # DIST: rank 0 reports
        log(_summary(result, replicas, model_dir))
    return 0


def _start(config: Any, args: argparse.Namespace, distributed: bool) -> int:
    """Checks what needs no data (the model against the data's kind, the batch against the workers, the
    attention kernel against the device) and starts the backend; returns the number of replicas."""
    from lmkit import distributed as dist
    from lmkit.core.checks import check_divisible
    from lmkit.core.preemption import reclaim
    from lmkit.core.xla import use_xla
    from lmkit.layers import kernels as attention_kernels
    from lmkit.models import model_class
    from lmkit.train.accumulation import micro_batch_rows

    check_model_data(model_class(config.model.name)[0], config)  # before anything is written
    # Initialise before any TensorFlow op: pins GPUs (or makes the replicas) and sets CPU threads.
    dist.init(backend=config.distribution.backend if distributed else "local",  # DIST
              intra_op_threads=args.intra_op_threads, num_gpus=config.distribution.num_gpus)
    reclaim()  # the native backend's start-up took SIGTERM (TensorFlow's coordination service): ours again
    replicas = dist.num_replicas()  # DIST: the global batch is split across the replicas
    check_divisible("batch_size", config.data.batch_size, replicas, "workers")
    micro_batch_rows(config.data.batch_size, replicas, config.optimization.grad_accum_steps)  # before writing
    device = dist.device_type()  # a fused attention kernel that cannot run here stops the run now
    compute = config.compute
    attention_kernels.resolve(compute.attention_kernel, device_type=device,
                              xla=use_xla(compute.jit_compile, device), precision=compute.precision)
    return replicas


def _build_model(config: Any, log: Any) -> Any:
    """The run's model on every replica: the same initial values everywhere, ``init_from``'s weights, the
    adapters (a checkpoint in the model folder wins when the trainer resumes)."""
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.core.preemption import set_doing
    from lmkit.models.build import build_run_model, describe_lora

    tf.random.set_seed(config.run.seed)  # same initial values everywhere; rank 0's win anyway
    init_from = config.checkpoints.init_from
    set_doing("building the model" + (f" from {init_from}" if init_from else ""))
    with dist.scope():  # DIST: native backend: one copy of each variable per replica
        model = build_run_model(config)
    if config.adapters.lora_rank:
        log(describe_lora(model))
    return model


def _summary(result: Any, replicas: int, model_dir: str) -> str:
    def fmt(value: Optional[float], per_word: Optional[float]) -> str:
        text = "-" if value is None else f"{value:.2f}"
        return text if per_word is None else f"{text} (per word {per_word:.2f})"

    last = result.epochs[-1]
    return (f"done: {len(result.epochs)} epoch(s), final valid perplexity "
            f"{fmt(last.valid_perplexity, last.valid_word_perplexity)}, test perplexity "
            f"{fmt(result.test_perplexity, result.test_word_perplexity)}, {last.tokens_per_sec:.0f} "
            f"tokens/sec on {replicas} worker(s)"
            + ("" if result.loss_scale is None else
               f"; {result.skipped_steps} step(s) skipped by loss scaling (scale now {result.loss_scale:g})")
            + f"; checkpoint {result.checkpoint}; results in {os.path.join(model_dir, RESULTS_FILE)}")
