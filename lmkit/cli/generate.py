"""``lmkit generate``: text from a model folder (a training run, or a Hugging Face folder).

    lmkit generate --model_dir runs/config_small --prompt "the company said" --num_samples 5 --seed 0

One prompt and one sample print the text alone, so it pipes; several print
each as ``[<prompt>.<sample>] text``. An encoder-decoder writes one line per
source (the lines of --source_file, or each --prompt), ``[source.sample]``
tagged with --num_samples above 1. Each flag is a field of
lmkit.GenerationConfig, and a flag left out is what the folder's
generation_config.json asks for, else lmkit's default (docs/generation.md).
Exit status: 0 done, 2 bad input (one ``error:`` line), 141 the reader of
the output left (``| head``), 1 a crash.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, List, Optional, Sequence

from lmkit.cli.common import OutputClosed, check_model_dir, model_dir_parser, user_modules_importable
from lmkit.cli.flags import add_beam_flags, add_sampling_flags, add_text_flags, config_of_flags, one_line
from lmkit.core.errors import UsageError
from lmkit.decoding.checks import flag_spelling
from lmkit.decoding.source import ModelFolder, open_folder

__all__ = ["build_parser", "main", "one_line", "plan_of_flags"]


def build_parser(prog: str = "lmkit generate") -> argparse.ArgumentParser:
    """The flags of ``lmkit generate``; a bad flag prints the usage and exits with status 2."""
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (repeatable; default: the start of a sentence); an encoder-decoder's "
                        "source")
    p.add_argument("--source_file", default=None, metavar="PATH",
                   help="encoder-decoders: the sources, one a line; one output line per source line")
    p.add_argument("--chat", action="store_true",
                   help="lay each --prompt out as a user turn with the chat template of the Hugging Face "
                        "folder (or of the folder a run was fine-tuned from), and stop at its end-of-turn token")
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system turn before each prompt")
    add_sampling_flags(p)
    add_beam_flags(p)
    add_text_flags(p)
    p.add_argument("--batch_size", type=int, default=32, help="encoder-decoders: sources decoded side by side")
    p.add_argument("--stream", dest="stream", action="store_const", const=True, default=None,
                   help="write the sample while it is generated (the default on a terminal when there "
                        "is one sample; runs the decode loop without XLA)")
    p.add_argument("--no_stream", dest="stream", action="store_const", const=False,
                   help="write the sample when it is done")
    p.add_argument("--one_line", action="store_true", help="write each sample on one line, its line breaks as \\n")
    p.add_argument("--verbose", action="store_true",
                   help="print the load time and the generation speed to stderr, and keep "
                        "TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")
    return p


def _inputs(args: argparse.Namespace, folder: ModelFolder) -> List[Any]:
    """The prompts (conversations with --chat), or an encoder-decoder's sources."""
    if args.system is not None and not args.chat:
        raise UsageError("--system gives a chat's system turn; add --chat (or drop --system)")
    if folder.conditional:
        if args.chat:
            raise UsageError(f"--chat applies to language models; {args.model_dir} holds an encoder-decoder")
        if args.source_file is not None and args.prompt:
            raise UsageError("give the sources as --source_file or as --prompt, not both")
        if args.source_file is None and not args.prompt:
            raise UsageError(f"{args.model_dir} holds an encoder-decoder: give --source_file (one source a line) "
                             "or --prompt TEXT (one source)")
        if args.source_file is None:
            return list(args.prompt)
        from lmkit.data.paired import read_lines
        return read_lines(args.source_file, "source")
    if args.source_file is not None:
        raise UsageError(f"--source_file is for an encoder-decoder's run, but {args.model_dir} holds a language "
                         "model; give its text as --prompt")
    if args.chat and not args.prompt:
        raise UsageError("--chat needs a --prompt (the user's message)")
    if args.chat:
        from lmkit.hub.chat import ChatTemplate
        return [ChatTemplate.messages(text, args.system) for text in args.prompt]
    return list(args.prompt or [None])


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit generate") -> int:
    """Generates as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    args = build_parser(prog).parse_args(argv)
    with flag_spelling():
        return _generate(args)


def plan_of_flags(args: argparse.Namespace) -> Any:
    """The checked :class:`~lmkit.decoding.plan.GenerationPlan` of the flags; no TensorFlow, no model built."""
    from lmkit.decoding.plan import plan_generation
    folder = open_folder(args.model_dir)
    if not folder.hugging_face:
        check_model_dir(args.model_dir)
    lm_default = not folder.conditional and args.max_new_tokens is None and args.max_length is None
    lengths = {"max_length": 50} if lm_default else {}  # the command's default: 50 tokens, the prompt included
    if args.stream and args.one_line:
        raise UsageError("--stream writes the sample as it comes, with its line breaks; drop --one_line")
    with flag_spelling():
        return plan_generation(folder, _inputs(args, folder), config_of_flags(args, **lengths),
                               checkpoint=args.checkpoint, stream=bool(args.stream))


def _generate(args: argparse.Namespace) -> int:
    from lmkit.core.preemption import set_doing  # what a signal stopped, in its message
    plan = plan_of_flags(args)
    for line in plan.warnings:
        sys.stderr.write(f"warning: {line}\n")
    note = plan.note()
    if note:
        sys.stderr.write(note + "\n")
    if args.seed is None and plan.settings.seed is not None:
        sys.stderr.write(f"seed {plan.settings.seed} (pass --seed {plan.settings.seed} to repeat)\n")
    stream = args.stream if args.stream is not None else sys.stdout.isatty() and plan.streams and not args.one_line
    user_modules_importable()
    from lmkit import distributed as dist
    dist.init(backend="local")  # one process: threads and devices set before TensorFlow starts
    set_doing(f"loading the model of {args.model_dir}")
    start = time.perf_counter()
    generator = plan.load()
    loaded = time.perf_counter() - start
    set_doing(f"decoding with {args.model_dir}" if plan.conditional else "generating")
    output = _Output(args, plan)
    start = time.perf_counter()
    samples = plan.run(stream=output.write if stream else None, on_batch=output.progress)
    first_call = time.perf_counter() - start
    output.finish(samples, streamed=stream)
    if args.verbose:
        _report_speed(plan, samples, generator.description, loaded, first_call)
    return 0


class _Output:
    """stdout: a streamed sample, or the samples when they are done (labelled when there are several)."""

    def __init__(self, args: argparse.Namespace, plan: Any) -> None:
        from lmkit.core.progress import rate_progress, stderr_line
        self.one_line, self.conditional, self.closed = args.one_line, plan.conditional, False
        # Labels only where there are several samples to tell apart (an encoder-decoder: several per source).
        self.labels = plan.settings.num_samples > 1 if plan.conditional else not plan.single
        # Many sources take a while: a progress line every 5 s on stderr (none for a few).
        self.update = rate_progress(stderr_line, f"decoding {args.source_file or '--prompt'}", len(plan.inputs),
                                    unit="sources", every=5.0) if plan.conditional else None

    def progress(self, done: int, _total: int) -> None:
        if self.update is not None:
            self.update(done)

    def write(self, piece: str) -> None:
        from lmkit.decoding.text import readable
        try:
            if not self.closed:
                sys.stdout.write(readable(piece))
                sys.stdout.flush()
        except BrokenPipeError:  # raised inside the decode loop's callback: noted, raised after it
            self.closed = True

    def finish(self, samples: List[Any], streamed: bool) -> None:
        from lmkit.decoding.text import readable
        if streamed:
            self.write("\n")
            if self.closed:
                raise OutputClosed()
            return
        flat = self.one_line or self.conditional
        blank = not flat and self.labels and any("\n" in s.text for s in samples)  # a blank line between them
        try:
            for n, sample in enumerate(samples):
                body = one_line(sample.text) if flat else readable(sample.text)
                print(f"[{sample.prompt_index}.{sample.sample_index}] {body}" if self.labels else body, flush=False)
                if blank and n < len(samples) - 1:
                    print()
            sys.stdout.flush()
        except BrokenPipeError:
            raise OutputClosed() from None


def _report_speed(plan: Any, samples: List[Any], model: str, loaded: float, first_call: float) -> None:
    """--verbose: the load time, the first call's (it compiles the decode loop) and a second call's speed."""
    if plan.conditional:
        sys.stderr.write(f"model {model} loaded in {loaded:.1f} s; {len(plan.inputs)} sources in {first_call:.2f} s "
                         f"(compiling the decode loop included), {plan.strategy}\n")
        return
    generated = sum(len(s.ids) - s.prompt_length for s in samples)
    start = time.perf_counter()
    plan.run()  # the compiled loop again (the same seed: the same work)
    seconds = time.perf_counter() - start
    sys.stderr.write(f"model {model} loaded in {loaded:.1f} s; first call (compiling the decode loop included) "
                     f"{first_call:.2f} s; compiled: {generated} tokens in {seconds:.2f} s, "
                     f"{generated / max(seconds, 1e-9):.0f} tokens/sec\n")
