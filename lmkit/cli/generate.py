"""``lmkit generate``: text from a trained model folder.

    lmkit generate --model_dir runs/config_small --prompt "the company said" \\
        --strategy top_p --top_p 0.9 --num_samples 5 --max_length 50 --seed 0

The model, its tokenizer (or PTB vocabulary) and its config are read from
--model_dir, as the training run left them; a model of your own class is
rebuilt from the import path stored in its config (its module must be
importable: installed, on PYTHONPATH or in the current folder). --model_dir
may also be a Hugging Face GPT-2 folder (config.json with model_type gpt2,
model.safetensors, tokenizer.json or vocab.json + merges.txt): its weights
and tokenizer are read directly (docs/gpt2.md); so are Llama, Qwen2 and
Mistral folders (docs/llama.md), and BART folders, which decode
--source_file as an encoder-decoder run does (docs/seq2seq.md).

Output on stdout: each sample as ``[<prompt>.<sample>] text``, the prompt
then the continuation, detokenized (sentencepiece pieces joined, bytes
decoded as UTF-8, control characters shown escaped), with its line breaks
(a blank line between multi-line samples; --one_line writes each sample on
one line with ``\n`` for its breaks). Warnings (prompt words missing from a
word vocabulary) and the seed of a sampled run go to stderr; with --verbose
also the time to build and load the model, the first call's time (it
compiles the decode loop with XLA, once per batch size, length and
strategy) and the tokens/sec of a second call of the compiled loop.

Line breaks are text: a sample runs to --max_length tokens (prompt
included) or --max_new_tokens new ones, to a --stop string, or to an
end-of-document token where the model has one (a Hugging Face folder's
``eos_token_id``, every id its ``generation_config.json`` lists: GPT-2's
``<|endoftext|>``, Llama 3's ``<|end_of_text|>`` and ``<|eot_id|>``);
--stop_at_eos also ends it at its first line break.
Tokens are chosen by --strategy top_p (--top_p 0.9, --temperature 1.0), unless
a Hugging Face folder's ``generation_config.json`` (or, for a run fine-tuned
from one, that folder's while it is there) asks for sampling
(``do_sample``: its temperature, top_k and top_p together, as ``transformers``
samples, top_k 50 and top_p 1.0 where it gives none) or for beam search
(``num_beams``); each flag overrides its own value, and a line on stderr says
what the folder chose.
A transformer writes past its context by sliding its window (the last half
of it kept). lmkit's own models start after a line break, as every line of
their training text does; a Hugging Face folder reads the prompt as
``transformers`` encodes it (after the start token its tokenizer puts
first, Llama's ``<s>``; as given for GPT-2; --start_token puts
``<|endoftext|>`` first where the tokenizer puts nothing). With --strategy beam the
samples of a prompt are the best --num_samples hypotheses of one beam
search (within the model's context).

An encoder-decoder's run (trained on pairs) writes one output line per
source: the lines of --source_file (or each --prompt, read as a source), in
their order, with --strategy greedy (its default there), sample, top_k, top_p
or beam (--beam_width, --length_penalty); --max_new_tokens bounds an output
(default: the model's max_positions - 1), --min_new_tokens holds its end
back. A Hugging Face folder's generation_config.json (BART's summarizers)
decodes as transformers' generate does: num_beams gives transformers' beam
search (--beam_scoring transformers: its length_penalty and early_stopping),
its no_repeat_ngram_size (--no_repeat_ngram_size) and forced first and last
tokens apply to every strategy, min_length and max_length are the new
tokens' bounds; each flag overrides its value; --batch_size sources are decoded
side by side (docs/seq2seq.md). With --num_samples N above 1 (a sampling
strategy, or beam: its N best) each source gets N lines, "[source.sample]
text", sources counted from 0.

Exit status: 0 done, 2 bad input (one ``error:`` line on stderr), 141 the
reader of the output left (``| head``; no message), 1 a crash.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from lmkit.cli.common import OutputClosed, add_beam_flags, check_model_dir, model_dir_parser, user_modules_importable
from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.registry import DEFAULTS, RULE_KEYS, SAMPLER_NAMES
from lmkit.decoding.source import ModelFolder, open_folder

__all__ = ["build_parser", "check_args", "main"]


def _early_stopping(text: str) -> Any:
    """``--early_stopping``'s value: true, false or never (as in a generation_config.json)."""
    value = {"true": True, "false": False, "never": "never"}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of true, false, never")
    return value


def build_parser(prog: str = "lmkit generate") -> argparse.ArgumentParser:
    """The flags of ``lmkit generate``; a bad flag prints the usage and exits with status 2."""
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (repeatable; default: the start of a sentence); an encoder-decoder's "
                        "source")
    p.add_argument("--source_file", default=None, metavar="PATH",
                   help="encoder-decoders: the sources, one a line; one output line per source line")
    p.add_argument("--batch_size", type=int, default=32, help="encoder-decoders: sources decoded side by side")
    p.add_argument("--strategy", choices=SAMPLER_NAMES, default=None,
                   help="top_p for language models (a Hugging Face folder: what its generation_config.json "
                        "asks for), greedy for encoder-decoders")
    p.add_argument("--temperature", type=float, default=None, help="sample, top_k, top_p (default 1.0)")
    p.add_argument("--top_k", type=int, default=None,
                   help="top_k's k (default 40); with top_p, the nucleus is taken among the top_k tokens "
                        "(default: no limit)")
    p.add_argument("--top_p", type=float, default=None, help="top_p's p (default 0.9)")
    p.add_argument("--min_p", type=float, default=None,
                   help="top_p: keep a token only if its probability is at least this share of the most likely "
                        "token's (transformers' min_p; default: off); with --top_p 1.0, min-p sampling alone")
    add_beam_flags(p)
    p.add_argument("--early_stopping", type=_early_stopping, default=None, metavar="{true,false,never}",
                   help="beam search with --beam_scoring transformers: transformers' early_stopping "
                        "(default false)")
    p.add_argument("--no_repeat_ngram_size", type=int, default=None, metavar="N",
                   help="no n-gram of N tokens twice in an output, its prompt included (default 0: off)")
    p.set_defaults(forced_first_id=None, forced_last_id=None)  # a folder's generation_config.json only
    p.add_argument("--num_samples", type=int, default=1,
                   help="samples per prompt (encoder-decoders: per source, as [source.sample] lines)")
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sample, prompt included (default 50; not for encoder-decoders: "
                        "--max_new_tokens)")
    p.add_argument("--context", type=int, default=None,
                   help="transformers: tokens the model reads before its window slides on (default: "
                        "the num_steps it was trained on, whose positions it learned; a pretrained "
                        "model's max_positions; beam search, which cannot slide: max_positions)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="tokens to generate after the prompt (wins over --max_length)")
    p.add_argument("--stop", action="append", default=None, metavar="STRING",
                   help="end a sample where this text first appears, not included (repeatable; "
                        "backslash escapes such as '\\n\\n' are read)")
    p.add_argument("--stop_at_eos", action="store_true",
                   help="end each sample at its first line break too (one line per sample)")
    p.add_argument("--start_token", dest="start_token", action="store_const", const=True, default=None,
                   help="put the start token before each prompt (default for lmkit's models, and for a "
                        "Hugging Face folder whose tokenizer puts one first, as Llama's <s>; else <|endoftext|>)")
    p.add_argument("--no_start_token", dest="start_token", action="store_const", const=False,
                   help="feed the prompt with nothing before it")
    p.add_argument("--repetition_penalty", type=float, default=None,
                   help="> 1 makes tokens already in a sample less likely (CTRL's penalty; 1 = off, the "
                        "default; not with beam)")
    p.add_argument("--min_new_tokens", type=int, default=None,
                   help="new tokens before a sample may end at an end token (a Hugging Face model's "
                        "eos_token_id, or with --stop_at_eos a line break; an encoder-decoder's end id; "
                        "default 0, or an encoder-decoder folder's min_length - 1)")
    p.add_argument("--stream", dest="stream", action="store_const", const=True, default=None,
                   help="write the sample while it is generated (the default on a terminal when there "
                        "is one sample; runs the decode loop without XLA)")
    p.add_argument("--no_stream", dest="stream", action="store_const", const=False,
                   help="write the sample when it is done")
    p.add_argument("--one_line", action="store_true",
                   help="write each sample on one line, its line breaks as \\n")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random strategies (default: drawn, and printed to stderr)")
    p.add_argument("--chat", action="store_true",
                   help="lay each --prompt out as a user turn with the chat template of the Hugging Face "
                        "folder (or of the folder a run was fine-tuned from), and stop at its end-of-turn token")
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system turn before each prompt")
    p.add_argument("--verbose", action="store_true",
                   help="print the load time and the generation speed to stderr, and keep "
                        "TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")
    return p


def _chat_template(args: argparse.Namespace) -> Any:
    """The chat template --chat uses: the Hugging Face folder's, or that of the folder a run started from."""
    from lmkit.hub.chat import read_chat_template
    if open_folder(args.model_dir).hugging_face:
        return read_chat_template(args.model_dir)
    from lmkit.config import stored_setting
    from lmkit.core.layout import read_config_dict
    source = stored_setting(read_config_dict(args.model_dir), "init_from")
    if not source:
        raise UsageError(f"--chat: {args.model_dir} is a run trained from scratch, which has no chat template; "
                         "--chat needs a Hugging Face chat model's folder or a run fine-tuned from one")
    return read_chat_template(source)


def check_args(args: argparse.Namespace) -> Tuple[Any, List[List[int]], List[List[str]]]:
    """Checks the flags, the model folder and the prompts; needs no TensorFlow, so it answers at once.

    Returns:
      ``(tokenizer, prompt ids, unknown words of each prompt)``; a run
      without --prompt has one empty prompt (start at a sentence boundary).

    Raises:
      UsageError: a flag out of range, a missing model folder or tokenizer,
        a prompt that is empty after tokenization or too long, naming the
        flag and the fix.
    """
    if args.source_file is not None:
        raise UsageError(f"--source_file is for an encoder-decoder's run, but {args.model_dir} holds a language "
                         "model; give its text as --prompt")
    if args.max_length is None:
        args.max_length = 50
    folder = open_folder(args.model_dir)
    preset, args.preset_source = folder.generation_config()
    resolve_flags(args, preset, "top_p")
    check_limits(args, [
        ("--max_length", args.max_length, args.max_length >= 1, "must be >= 1"),
        ("--context", args.context, args.context is None or args.context >= 2,
         "must be >= 2 (tokens the model reads before its window slides)"),
        ("--repetition_penalty", args.repetition_penalty, args.repetition_penalty > 0, "must be > 0 (1 = off)")])
    if args.strategy == "beam" and args.repetition_penalty != 1.0:
        chosen = (f" (chosen by {args.preset_source}/generation_config.json's num_beams; give --strategy to "
                  "choose another)") if "strategy" in args.preset_used else ""
        raise UsageError("--repetition_penalty applies to the per-token strategies "
                         f"(greedy, sample, top_k, top_p), not to --strategy beam{chosen}")
    single = len(args.prompt or [None]) == 1 and (args.num_samples == 1 or args.strategy == "beam")
    if args.stream and (args.strategy == "beam" or not single or args.one_line):
        raise UsageError("--stream writes one sample as it comes: give one --prompt, --num_samples 1, a "
                         "per-token --strategy and no --one_line (or drop --stream)")
    if args.stream is None:  # on a terminal, one sample streams
        args.stream = sys.stdout.isatty() and single and args.strategy != "beam" and not args.one_line
    check_beam_samples(args)
    if not folder.hugging_face:  # a Hugging Face folder (GPT-2, Llama, Qwen2, Mistral, Gemma) is read as it is
        check_model_dir(args.model_dir)
    tokenizer = folder.tokenizer(args.checkpoint)
    vocab = getattr(tokenizer, "vocab", None) if tokenizer.name == "word" else None
    if args.system is not None and not args.chat:
        raise UsageError("--system gives a chat's system turn; add --chat (or drop --system)")
    chat = _chat_template(args) if args.chat else None
    if chat is not None:
        if not args.prompt:
            raise UsageError("--chat needs a --prompt (the user's message)")
        if chat.eos_token and chat.eos_token not in (args.stop or []):
            args.stop = [*(args.stop or []), chat.eos_token]  # the end of the assistant's turn
        if args.start_token is None:
            args.start_token = False  # the template writes the start token itself
    prompts, unknown = [], []
    for text in args.prompt or [None]:
        if text is None:
            prompts.append([])
            unknown.append([])
            continue
        if chat is not None:  # the whole laid-out text at once: the template's special tokens are tokens
            text = chat.render(chat.messages(text, args.system))
            ids = list(tokenizer.hf.encode(text, add_special_tokens=False).ids)
        else:
            ids = tokenizer.encode(text) if text.strip() else []  # its line breaks are text
        if not ids:
            raise UsageError(f"--prompt {text!r} is empty after tokenization; give at least one "
                             "word, or leave --prompt out to start at the beginning of a line")
        if args.max_new_tokens is None and len(ids) >= args.max_length:
            raise UsageError(f"--prompt {text!r} has {len(ids)} tokens, leaving none to generate "
                             f"within --max_length {args.max_length} (the prompt counts); "
                             f"use --max_length {len(ids) + 1} or more, or --max_new_tokens")
        prompts.append(ids)
        unknown.append([w for w in text.split() if w not in vocab] if vocab is not None else [])
    args.stop = [_unescape(s) for s in args.stop or []]
    if args.stop:
        from lmkit.decoding.text import check_stop_strings
        check_stop_strings(args.stop, tokenizer)
    return tokenizer, prompts, unknown


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The :class:`GenerationConfig` of the flags (those the command has; a flag left out is None)."""
    flags = {key: getattr(args, key) for key in GenerationConfig.keys() if hasattr(args, key)}
    return GenerationConfig.from_dict(flags)


def resolve_flags(args: argparse.Namespace, preset: GenerationConfig, default_strategy: str) -> None:
    """Fills in the strategy and the sampling flags left out: the model folder's ``preset``, else lmkit's defaults
    (:meth:`GenerationConfig.resolve`).

    ``args.preset_used`` keeps the preset's values that were taken (no flag gave them), for the note
    :func:`preset_note` writes. A flag the command does not have (``lmkit evaluate`` has fewer) counts as
    left out.
    """
    resolved, args.preset_used = generation_config(args).resolve(preset, default_strategy)
    for key in (*DEFAULTS, "strategy", "min_new_tokens", "max_new_tokens"):
        setattr(args, key, getattr(resolved, key))


def preset_note(args: argparse.Namespace, sampler: Any) -> Optional[str]:
    """``<folder>/generation_config.json: strategy top_p, temperature 0.6, ...``: the preset's values the
    decode uses (no flag gave them), or None when it uses none."""
    config = sampler.get_config()
    beam = "beam_width" in config
    uses = {"top_k": "k" in config, "top_p": "p" in config, "min_p": config.get("min_p") is not None,
            "temperature": "temperature" in config,
            "beam_width": beam, "strategy": True, "repetition_penalty": args.strategy != "beam",
            "beam_scoring": beam, "length_penalty": beam, "early_stopping": beam,
            "min_new_tokens": True, "max_new_tokens": True, **{key: True for key in RULE_KEYS}}
    used = [f"{key} {value}" for key, value in args.preset_used.items() if uses.get(key)]
    if not used:
        return None
    return (f"{args.preset_source}/generation_config.json: {', '.join(used)} (as transformers' generate; "
            "a flag overrides each)")


def _unescape(text: str) -> str:
    """``--stop '\\n\\n'`` as two line breaks: backslash escapes of the shell-typed flag read."""
    if "\\" not in text:
        return text
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        raise UsageError(f"--stop {text!r}: a broken backslash escape; write e.g. '\\n\\n'") from None


# Characters that end a line for str.splitlines; a sample stays on its line.
_LINE_BREAKS = {c: repr(c)[1:-1] for c in "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """``text`` on one line: a line break inside it shows as ``\\n``, other breaks escaped too."""
    return text.replace("\n", "\\n").translate(str.maketrans(_LINE_BREAKS))


def _describe_unknown(unknown: Sequence[str], vocab: Any) -> str:
    """``'The' (try 'the'), 'zzz'``: the unknown words, with a lower-case hint when it helps."""
    parts = []
    for w in dict.fromkeys(unknown):  # unique, in order
        hint = f" (try {w.lower()!r})" if w.lower() != w and w.lower() in vocab else ""
        parts.append(f"{w!r}{hint}")
    return ", ".join(parts)


def build_sampler(args: argparse.Namespace):
    """The --strategy sampler, from the registry, with the (resolved) flags its constructor takes."""
    return generation_config(args).sampler()


def build_rules(args: argparse.Namespace):
    """The rules on tokens of the (resolved) flags: ``decode(..., rules=)``."""
    return generation_config(args).rules()


def _sources(args: argparse.Namespace) -> List[str]:
    """An encoder-decoder's sources: the lines of --source_file, or the --prompt texts (not both)."""
    from lmkit.data.paired import read_lines
    if args.source_file is not None and args.prompt:
        raise UsageError("give the sources as --source_file or as --prompt, not both")
    if args.source_file is None and not args.prompt:
        raise UsageError(f"{args.model_dir} holds an encoder-decoder: give --source_file (one source a line) "
                         "or --prompt TEXT (one source)")
    return read_lines(args.source_file, "source") if args.source_file is not None else list(args.prompt)


def check_limits(args: argparse.Namespace, own: Sequence[Tuple[str, Any, bool, str]] = ()) -> None:
    """The ranges of the flags every ``lmkit generate`` run has (after :func:`resolve_flags`), after the
    command's ``own`` ``(flag, value, ok, need)``; the first one out of range is the error.

    Raises:
      UsageError: ``--flag value need``.
    """
    limits = [
        *own,
        ("--num_samples", args.num_samples, args.num_samples >= 1, "must be >= 1"),
        ("--max_new_tokens", args.max_new_tokens, args.max_new_tokens is None or args.max_new_tokens >= 1,
         "must be >= 1"),
        ("--beam_width", args.beam_width, args.beam_width >= 1, "must be >= 1"),
        ("--temperature", args.temperature, args.temperature > 0, "must be > 0 (use 1e-3 for near-greedy)"),
        ("--top_k", args.top_k, args.top_k is None or args.top_k >= 1, "must be >= 1"),
        ("--top_p", args.top_p, 0 < args.top_p <= 1, "must be in (0, 1]"),
        ("--min_p", args.min_p, args.min_p is None or 0 <= args.min_p <= 1, "must be in [0, 1] (0: off)"),
        ("--seed", args.seed, args.seed is None or args.seed >= 0, "must be >= 0"),
        ("--min_new_tokens", args.min_new_tokens, args.min_new_tokens >= 0, "must be >= 0"),
        ("--no_repeat_ngram_size", args.no_repeat_ngram_size, args.no_repeat_ngram_size >= 0, "must be >= 0 (0 = off)"),
    ]
    for flag, value, ok, need in limits:
        if not ok:
            raise UsageError(f"{flag} {value} {need}")
    check_min_p(args)


def check_min_p(args: argparse.Namespace) -> None:
    """``--min_p`` filters top_p's candidates: another strategy would ignore it, so it is refused there."""
    if args.min_p and args.strategy != "top_p" and "min_p" not in args.preset_used:
        raise UsageError(f"--min_p applies to --strategy top_p (with --top_p 1.0 for min-p sampling alone), not "
                         f"to --strategy {args.strategy}")


def check_beam_samples(args: argparse.Namespace) -> None:
    """Beam search returns at most ``--beam_width`` hypotheses: ``--num_samples`` above it is refused."""
    if args.strategy == "beam" and args.num_samples > args.beam_width:
        raise UsageError(f"--num_samples {args.num_samples} exceeds --beam_width {args.beam_width}: "
                         f"beam search keeps beam_width hypotheses; use --beam_width {args.num_samples}")


def check_transduction_args(args: argparse.Namespace) -> None:
    """The flags of an encoder-decoder's run: the per-token and language-model-only ones are refused.

    Raises:
      UsageError: naming the flag.
    """
    only_lm = [("--max_length", args.max_length is not None), ("--context", args.context is not None),
               ("--stop", bool(args.stop)), ("--stop_at_eos", args.stop_at_eos), ("--chat", args.chat),
               ("--system", args.system is not None), ("--stream", bool(args.stream)),
               ("--start_token/--no_start_token", args.start_token is not None),
               ("--repetition_penalty", args.repetition_penalty is not None), ("--one_line", args.one_line)]
    for flag, given in only_lm:
        if given:
            raise UsageError(f"{flag} applies to language models; {args.model_dir} holds an encoder-decoder, which "
                             "writes one line per source (--max_new_tokens bounds it)")
    preset, args.preset_source = open_folder(args.model_dir).generation_config()
    resolve_flags(args, preset, "greedy")
    check_limits(args, [("--batch_size", args.batch_size, args.batch_size >= 1, "must be >= 1")])
    if args.num_samples > 1 and args.strategy == "greedy":
        raise UsageError(f"--num_samples {args.num_samples}: greedy decoding writes one output per source; "
                         "add --strategy sample, top_k, top_p or beam")
    check_beam_samples(args)


def fit_lengths(args: argparse.Namespace, max_positions: int) -> None:
    """An encoder-decoder's output bounds, fitted to its decoder (``max_positions``, the start id included).

    A folder's ``max_length`` past what the decoder holds becomes that; its ``min_length`` at or past the
    bound lets the end come only last (as in ``transformers``; :meth:`GenerationConfig.fit_decoder`). A
    flag past the decoder is an error.
    """
    limit = max_positions - 1
    config, args.preset_used = generation_config(args).fit_decoder(max_positions, args.preset_used)
    args.max_new_tokens, args.min_new_tokens = config.max_new_tokens, config.min_new_tokens
    if args.max_new_tokens is not None and args.max_new_tokens > limit:
        raise UsageError(f"--max_new_tokens {args.max_new_tokens} exceeds what the decoder holds: {limit} "
                         f"(max_positions {max_positions}, the start id included)")


def _transduce_main(args: argparse.Namespace, folder: ModelFolder) -> int:
    """``lmkit generate`` for an encoder-decoder: one output line per source."""
    check_transduction_args(args)
    sources = _sources(args)
    user_modules_importable()
    from lmkit import distributed as dist
    from lmkit.core.progress import rate_progress, stderr_line
    from lmkit.decoding.generation import generate

    dist.init(backend="local")
    start = time.perf_counter()
    generator = folder.load(args.checkpoint)
    loaded = time.perf_counter() - start
    if args.seed is None and args.strategy not in ("greedy", "beam"):
        from lmkit.decoding.prompts import check_seed
        args.seed = check_seed(None)
        sys.stderr.write(f"seed {args.seed} (pass --seed {args.seed} to repeat)\n")
    fit_lengths(args, generator.model.max_positions)
    start = time.perf_counter()
    # Many sources take a while: a progress line every 5 s on stderr (none for a few).
    update = rate_progress(stderr_line, f"decoding {args.source_file or '--prompt'}", len(sources), unit="sources",
                           every=5.0)
    note = preset_note(args, build_sampler(args))
    if note:
        sys.stderr.write(note + "\n")
    samples = generate(generator, sources, generation_config(args), on_batch=lambda done, _: update(done),
                       return_samples=True)
    seconds = time.perf_counter() - start
    try:
        for sample in samples:
            if args.num_samples == 1:  # one line per source, nothing else: a file to score
                print(one_line(sample.text), flush=False)
            else:
                print(f"[{sample.prompt_index}.{sample.sample_index}] {one_line(sample.text)}", flush=False)
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
    if args.verbose:
        sys.stderr.write(f"model {generator.description} loaded in {loaded:.1f} s; {len(sources)} sources in "
                         f"{seconds:.2f} s (compiling the decode loop included), {args.strategy}\n")
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit generate") -> int:
    """Generates as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    args = build_parser(prog).parse_args(argv)
    from lmkit.core.preemption import set_doing  # what a signal stopped, in its message
    folder = open_folder(args.model_dir)
    if folder.conditional:
        set_doing(f"decoding with {args.model_dir}")
        return _transduce_main(args, folder)
    tokenizer, prompts, unknown = check_args(args)
    user_modules_importable()

    from lmkit import distributed as dist
    from lmkit.decoding.generation import generate
    from lmkit.decoding.text import readable

    dist.init(backend="local")  # one process: threads and devices set before TensorFlow starts
    set_doing(f"loading the model of {args.model_dir}")
    start = time.perf_counter()
    # A Hugging Face folder's tokenizer, read by check_args, is not read again.
    generator = folder.load(args.checkpoint, tokenizer if folder.hugging_face else None)
    loaded = time.perf_counter() - start
    _warn_unknown(args, tokenizer, unknown)
    note = preset_note(args, build_sampler(args))
    if note:
        sys.stderr.write(note + "\n")
    closed: List[bool] = []  # the reader of stdout left while the sample streamed

    def write(piece: str) -> None:
        if closed:
            return
        try:
            sys.stdout.write(readable(piece))
            sys.stdout.flush()
        except BrokenPipeError:  # raised inside the decode loop's callback: noted, raised after it
            closed.append(True)

    def run(stream: bool = False) -> Any:
        return generate(generator, prompts, generation_config(args), stream=write if stream else None,
                        return_samples=True)

    set_doing("generating")
    start = time.perf_counter()
    if args.stream:
        write("[0.0] ")
    samples = run(stream=args.stream)
    first_call = time.perf_counter() - start
    if args.stream:
        write("\n")
    if closed:
        raise OutputClosed()
    seed = samples[0].seed if samples else None
    if args.seed is None and seed is not None and args.strategy != "greedy":
        sys.stderr.write(f"seed {seed} (pass --seed {seed} to repeat)\n")
        args.seed = seed  # --verbose's second call repeats the same work
    _print_samples(args, [] if args.stream else samples)
    if args.verbose:
        generated = sum(len(s.ids) - s.prompt_length for s in samples)
        start = time.perf_counter()
        run()  # the compiled loop again (the same seed: the same work)
        seconds = time.perf_counter() - start
        sys.stderr.write(f"model {generator.description} loaded in {loaded:.1f} s; first call (compiling the decode "
                         f"loop included) {first_call:.2f} s; compiled: {generated} tokens in {seconds:.2f} s, "
                         f"{generated / max(seconds, 1e-9):.0f} tokens/sec\n")
    return 0


def _warn_unknown(args: argparse.Namespace, tokenizer: Any, unknown: List[List[str]]) -> None:
    """A line on stderr for each prompt with words a word vocabulary lacks."""
    vocab = getattr(tokenizer, "vocab", None)
    for i, words in enumerate(unknown):
        if words:
            sys.stderr.write(f"warning: prompt {i}: {_describe_unknown(words, vocab)} not in the "
                             f"vocabulary of {args.model_dir} ({len(vocab)} words); read as "
                             f"{vocab.id_to_token(vocab.unk_id)}\n")


def _print_samples(args: argparse.Namespace, samples: List[Any]) -> None:
    """Each sample as ``[<prompt>.<sample>] text``, a blank line between multi-line ones."""
    from lmkit.decoding.text import readable
    multi_line = not args.one_line and len(samples) > 1 and any("\n" in s.text for s in samples)
    try:
        for n, sample in enumerate(samples):
            body = one_line(sample.text) if args.one_line else readable(sample.text)
            print(f"[{sample.prompt_index}.{sample.sample_index}] {body}", flush=True)
            if multi_line and n < len(samples) - 1:
                print(flush=True)
    except BrokenPipeError:
        raise OutputClosed() from None
