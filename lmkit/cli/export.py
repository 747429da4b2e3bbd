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
or a Llama/Qwen2/Mistral/Gemma fine-tune, written with its
source folder's config, tokenizer and chat template
(``AutoModelForCausalLM.from_pretrained(output)``), or a ``llama`` model
trained from scratch with one of those tokenizers (the config of the family
that holds it, docs/llama.md), or a BART fine-tune
(``AutoModelForSeq2SeqLM.from_pretrained(output)``). A LoRA run
(``--lora_rank``) exports with its adapters merged into the weights. The
converter of the run's model family writes the folder
(``lmkit/models/<family>/convert.py``).

    lmkit export --model_dir runs/lora --format peft --output adapters

writes a LoRA run's adapters alone as a PEFT adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``), for
``peft.PeftModel.from_pretrained(base_model, output)``. Either folder appears
whole or not at all.

    lmkit export --model_dir runs/plays --format saved_model --output plays_savedmodel

writes a TensorFlow SavedModel whose ``serving_default`` runs the whole
decode loop with its key/value cache (--model_dir may also be a Hugging Face
folder; docs/serving.md).

Exit status: 0 done, 2 bad input (one ``error:`` line), 1 a crash.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from lmkit.cli.common import check_model_dir, model_dir_parser, user_modules_importable
from lmkit.core.layout import resolve_checkpoint

__all__ = ["FORMATS", "build_parser", "main"]

FORMATS = ("hf", "peft", "saved_model")


def build_parser(prog: str = "lmkit export"):
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--format", choices=FORMATS, default="hf",
                   help="hf: a Hugging Face folder (safetensors, config.json, tokenizer files; LoRA "
                        "adapters merged); peft: a LoRA run's adapters alone, as a PEFT adapter folder; "
                        "saved_model: a TensorFlow SavedModel whose serving_default runs the whole decode loop "
                        "(--model_dir may be a Hugging Face folder too; docs/serving.md)")
    p.add_argument("--output", required=True, help="the folder to write (new, or empty)")
    return p


def _converter(model_dir: str, adapters: bool) -> Any:
    """The Hugging Face converter of the run's family (:func:`lmkit.models.registry.converter_of_model`).

    Raises:
      UsageError: a family without one, or ``adapters`` asked of a run without LoRA adapters or of a
        family that does not write them.
    """
    from lmkit.config import stored_setting
    from lmkit.core.errors import UsageError
    from lmkit.core.layout import read_config_dict
    from lmkit.models.registry import converter_of_model, family_converters, family_of_model, pretrained_models

    saved = read_config_dict(model_dir)  # flat (0.2) or by section
    model, lora_rank = stored_setting(saved, "model"), stored_setting(saved, "lora_rank", 0)
    converter = converter_of_model(model) if isinstance(model, str) else None
    if adapters and (converter is None or not converter.exports_adapters or not lora_rank):
        writers = [c.title for c in family_converters().values() if c.exports_adapters]
        raise UsageError(f"export --format peft writes the LoRA adapters of a {' or '.join(writers)} run; "
                         f"{model_dir} is a {model!r} run with lora_rank = {lora_rank}: train with "
                         "--init_from FOLDER --lora_rank R, or use --format hf")
    if converter is None:
        family = family_of_model(model) if isinstance(model, str) else None
        whose = f"the {family} family, which has none" if family else "no family of lmkit's"
        raise UsageError(f"export --format hf writes a model of a family with a Hugging Face converter "
                         f"({', '.join(pretrained_models())}); {model_dir} holds a {model!r} model, of {whose}")
    return converter


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit export") -> int:
    """Exports as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    from lmkit.hub.folders import check_new_folder

    args = build_parser(prog).parse_args(argv)
    if args.format == "saved_model":
        return _saved_model(args)
    check_model_dir(args.model_dir)
    check_new_folder(args.output)  # before TensorFlow loads
    checkpoint = resolve_checkpoint(args.model_dir, args.checkpoint)
    user_modules_importable()
    adapters = args.format == "peft"
    converter = _converter(args.model_dir, adapters)  # the run's family writes it

    from lmkit import distributed as dist
    from lmkit.core.preemption import set_doing  # what a signal stopped, in its message
    from lmkit.train.checkpoint import load_model

    dist.init(backend="local")
    set_doing(f"exporting {args.model_dir} into {args.output}")
    # A LoRA run: its adapters alone (peft), or merged into the base's kernels (hf).
    model, tokenizer, config = load_model(args.model_dir, checkpoint, merge_adapters=not adapters)
    if adapters:
        files = converter.export_adapters(model, config, args.output)
    else:
        files = converter.export(model, tokenizer, config, args.output)
    print(f"wrote {args.output}: {', '.join(files)}", flush=True)
    return 0


def _saved_model(args: Any) -> int:
    """``--format saved_model``: :func:`lmkit.serve.saved_model.export_saved_model` (a run or a Hugging Face folder)."""
    import os

    from lmkit.core.errors import UsageError
    from lmkit.hub.folders import check_new_folder
    if not os.path.isdir(args.model_dir):
        raise UsageError(f"--model_dir {args.model_dir} does not exist; pass an lmkit run or a Hugging Face folder")
    check_new_folder(args.output)
    user_modules_importable()
    from lmkit import distributed as dist
    from lmkit.serve.saved_model import export_saved_model
    dist.init(backend="local")
    info = export_saved_model(args.model_dir, args.output, args.checkpoint)
    print(f"wrote {args.output}: a SavedModel (serving_default: ids, lengths, max_new_tokens, temperature, seed -> "
          f"new_ids, new_lengths; context {info['context']}) and lmkit.json", flush=True)
    return 0
