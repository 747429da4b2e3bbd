"""``lmkit export``: a trained run as a Hugging Face folder.

    lmkit export --model_dir runs/ft --format hf --output gpt2-finetuned

Writes ``config.json``, ``model.safetensors``, ``generation_config.json``
and the tokenizer files (``tokenizer.json``, ``vocab.json``, ``merges.txt``,
``tokenizer_config.json``) into --output, a new folder, so that
``transformers.GPT2LMHeadModel.from_pretrained(output)`` and
``AutoTokenizer.from_pretrained(output)`` load it. The run must hold a model
of GPT-2's shape with a Hugging Face tokenizer (a run started with ``lmkit
train --init_from``) or trained from scratch with lmkit's word, char, byte or
unigram sentencepiece tokenizer (written as a ``tokenizer.json`` giving lmkit's ids, docs/gpt2.md),
or a Llama/Qwen2/Mistral fine-tune, written with its
source folder's config, tokenizer and chat template
(``AutoModelForCausalLM.from_pretrained(output)``), or a ``llama`` model
trained from scratch with one of those tokenizers (the config of the family
that holds it, docs/llama.md), or a BART fine-tune
(``AutoModelForSeq2SeqLM.from_pretrained(output)``). A LoRA run
(``--lora_rank``) exports with its adapters merged into the weights.

    lmkit export --model_dir runs/lora --format peft --output adapters

writes a LoRA run's adapters alone as a PEFT adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``), for
``peft.PeftModel.from_pretrained(base_model, output)``. Either folder appears
whole or not at all.

Exit status: 0 done, 2 bad input (one ``error:`` line), 1 a crash.
"""

from __future__ import annotations

from typing import Optional, Sequence

from lmkit.cli.common import check_model_dir, model_dir_parser, user_modules_importable
from lmkit.core.layout import resolve_checkpoint

__all__ = ["FORMATS", "build_parser", "main"]

FORMATS = ("hf", "peft")


def build_parser(prog: str = "lmkit export"):
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--format", choices=FORMATS, default="hf",
                   help="hf: a Hugging Face folder (safetensors, config.json, tokenizer files; LoRA "
                        "adapters merged); peft: a LoRA run's adapters alone, as a PEFT adapter folder")
    p.add_argument("--output", required=True, help="the folder to write (new, or empty)")
    return p


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit export") -> int:
    """Exports as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    from lmkit.core.errors import UsageError
    from lmkit.hub.hf import check_new_folder

    args = build_parser(prog).parse_args(argv)
    check_model_dir(args.model_dir)
    check_new_folder(args.output)  # before TensorFlow loads
    checkpoint = resolve_checkpoint(args.model_dir, args.checkpoint)
    user_modules_importable()

    from lmkit import distributed as dist
    from lmkit.hub.hf import default_dropout, export_gpt2
    from lmkit.core.preemption import set_doing  # what a signal stopped, in its message
    from lmkit.train.checkpoint import load_model

    dist.init(backend="local")
    set_doing(f"exporting {args.model_dir} into {args.output}")
    if args.format == "peft":
        from lmkit.core.layout import read_config_dict
        saved = read_config_dict(args.model_dir)
        if saved.get("model") != "llama" or not saved.get("lora_rank"):
            raise UsageError(f"export --format peft writes the LoRA adapters of a Llama/Qwen2/Mistral run; "
                             f"{args.model_dir} is a {saved.get('model')!r} run with lora_rank = "
                             f"{saved.get('lora_rank', 0)}: train with --init_from FOLDER --lora_rank R, or "
                             "use --format hf")
        from lmkit.hub.hf_llama import export_llama_adapters
        model, _, config = load_model(args.model_dir, checkpoint, merge_adapters=False)
        files = export_llama_adapters(model, config.init_from, args.output)
        print(f"wrote {args.output}: {', '.join(files)}", flush=True)
        return 0
    model, tokenizer, config = load_model(args.model_dir, checkpoint)
    if config.model == "llama" and not config.init_from:  # trained from scratch: the family that holds it
        from lmkit.hub.hf_llama import export_llama_from_scratch
        files = export_llama_from_scratch(model, tokenizer, args.output)
    elif config.model == "llama":  # a Llama, Qwen2 or Mistral fine-tune: its source folder's family
        from lmkit.hub.hf_llama import export_llama
        files = export_llama(model, config.init_from, args.output)
    elif config.model == "transformer_seq2seq":  # a BART fine-tune
        from lmkit.hub.hf_bart import export_bart
        files = export_bart(model, config.init_from, args.output)
    else:
        files = export_gpt2(model, tokenizer, args.output, dropout=default_dropout(config))
    print(f"wrote {args.output}: {', '.join(files)}", flush=True)
    return 0
