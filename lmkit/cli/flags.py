"""The generation flags of ``lmkit generate`` and ``lmkit evaluate``, mapped onto a ``GenerationConfig``.

A flag left out is None ("not given"), so that a model folder's
``generation_config.json`` may fill it (:meth:`GenerationConfig.resolve`);
each flag is the config's field of the same name, and its range is the
config's (errors name the flag: :func:`lmkit.decoding.config.flag_spelling`).
"""

from __future__ import annotations

import argparse
from typing import Any

from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.registry import SAMPLER_NAMES

__all__ = ["add_beam_flags", "add_sampling_flags", "add_text_flags", "config_of_flags", "early_stopping",
           "one_line", "unescape"]


def early_stopping(text: str) -> Any:
    """``--early_stopping``'s value: true, false or never (as in a generation_config.json)."""
    value = {"true": True, "false": False, "never": "never"}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of true, false, never")
    return value


def add_beam_flags(group: Any) -> None:
    """``--beam_width``, ``--length_penalty``, ``--beam_scoring`` (:func:`lmkit.cli.common.add_beam_flags`) and
    ``--early_stopping``."""
    from lmkit.cli.common import add_beam_flags as add_search_flags
    add_search_flags(group)
    group.add_argument("--early_stopping", type=early_stopping, default=None, metavar="{true,false,never}",
                       help="beam search: never (gnmt's default) stops when no hypothesis can improve; false "
                            "(transformers' default) when the best one, at its length, cannot; true once "
                            "beam_width have ended")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """The strategy, its settings, the rules on tokens, the samples and the seed."""
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
    p.add_argument("--repetition_penalty", type=float, default=None,
                   help="> 1 makes tokens already in a sample less likely (CTRL's penalty; 1 = off, the "
                        "default; not with beam)")
    p.add_argument("--no_repeat_ngram_size", type=int, default=None, metavar="N",
                   help="no n-gram of N tokens twice in an output, its prompt included (default 0: off)")
    p.add_argument("--num_samples", type=int, default=1,
                   help="samples per prompt (encoder-decoders: per source, as [source.sample] lines)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random strategies (default: drawn, and printed to stderr)")


def add_text_flags(p: argparse.ArgumentParser) -> None:
    """A language model's lengths, window, ends and start token, and the new tokens' bounds of both kinds."""
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sample, prompt included (default 50; not for encoder-decoders: "
                        "--max_new_tokens)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="tokens to generate after the prompt (wins over --max_length; an encoder-decoder's "
                        "default: its max_positions - 1)")
    p.add_argument("--min_new_tokens", type=int, default=None,
                   help="new tokens before a sample may end at an end token (a Hugging Face model's "
                        "eos_token_id, or with --stop_at_eos a line break; an encoder-decoder's end id; "
                        "default 0, or an encoder-decoder folder's min_length - 1)")
    p.add_argument("--context", type=int, default=None,
                   help="transformers: tokens the model reads before its window slides on (default: "
                        "the num_steps it was trained on, whose positions it learned; a pretrained "
                        "model's max_positions; beam search, which cannot slide: max_positions)")
    p.add_argument("--stop", action="append", type=unescape, default=None, metavar="STRING",
                   help="end a sample where this text first appears, not included (repeatable; "
                        "backslash escapes such as '\\n\\n' are read)")
    p.add_argument("--stop_at_eos", action="store_const", const=True, default=None,
                   help="end each sample at its first line break too (one line per sample)")
    p.add_argument("--start_token", dest="start_token", action="store_const", const=True, default=None,
                   help="put the start token before each prompt (default for lmkit's models, and for a "
                        "Hugging Face folder whose tokenizer puts one first (<s>); else <|endoftext|>)")
    p.add_argument("--no_start_token", dest="start_token", action="store_const", const=False,
                   help="feed the prompt with nothing before it")


def config_of_flags(args: argparse.Namespace, **changes: Any) -> GenerationConfig:
    """The :class:`GenerationConfig` of the flags the command has (a flag left out is None), with ``changes``."""
    flags = {key: getattr(args, key) for key in GenerationConfig.keys() if hasattr(args, key)}
    return GenerationConfig.from_dict({**flags, **changes}, "flags")


def unescape(text: str) -> str:
    """``--stop '\\n\\n'`` as two line breaks: backslash escapes of the shell-typed flag read."""
    if "\\" not in text:
        return text
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} has a broken backslash escape; write e.g. '\\n\\n'") from None


# Characters that end a line for str.splitlines; a sample stays on its line.
_LINE_BREAKS = {c: repr(c)[1:-1] for c in "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """``text`` on one line: a line break inside it shows as ``\\n``, other breaks escaped too."""
    return text.replace("\n", "\\n").translate(str.maketrans(_LINE_BREAKS))
