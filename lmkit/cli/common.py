"""Command-line plumbing shared by the ``lmkit`` commands and the examples.

* :class:`Parser`: argparse that reports a bad flag once (rank 0), exit 2;
* :func:`run_main` quiets TensorFlow's start-up chatter (unless --verbose) and runs a ``main`` so
  that bad input prints one message
  (rank 0) and exits 2, a preemption signal at any point prints one line and
  exits 75 (:mod:`lmkit.core.preemption`), and a crash on any rank prints the rank and the cause
  and ends that process at once (``mpirun`` then stops the others) instead of
  leaving ranks waiting in a collective (a usage error on one rank becomes the same error on every
  rank through :func:`lmkit.distributed.agree`).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from lmkit.core.errors import PEER_FAILED_EXIT_STATUS, LmkitError, PreemptedError, UsageError
from lmkit.distributed.env import launcher_rank


class Parser(argparse.ArgumentParser):
    """argparse that reports bad flags once (rank 0) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if launcher_rank() == 0:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.stderr.flush()
        _hard_exit(2)


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """``["batch_size=40", "optimization.optimizer=adam"]`` -> ``{"batch_size": 40, "optimization.optimizer": "adam"}``.

    A value is a Python literal (``40``, ``0.5``, ``True``, ``{"attention_blocks": 4}``) or else a
    string; a key is flat (``batch_size``) or dotted with its section (``optimization.optimizer``),
    as :func:`lmkit.config.load_config` takes them.
    """
    out: Dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set {item!r} is not KEY=VALUE; e.g. --set batch_size=40")
        key, raw = item.split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare word is a string: --set optimizer=adam
        out[key.strip()] = value
    return out


# A process ended by SIGPIPE reports 128 + 13 in a shell: what `lmkit generate | head` leaves with.
OUTPUT_CLOSED_STATUS = 141


class OutputClosed(Exception):
    """The reader of this command's output left (``lmkit generate ... | head``): stop quietly."""


def _hard_exit(code: int) -> None:
    """Leaves at once: flushes output, skips atexit handlers that could wait on other ranks.

    A crash (1), a bystander's stop (4) or an interrupt (130) of a process that got a preemption
    signal on its way out leaves with 75: a rank blocked in a collective sees
    its peers' failure before its own signal's handler can run.
    """
    from lmkit.core import preemption
    if code in (1, PEER_FAILED_EXIT_STATUS, 130) and preemption.received():
        code = preemption.PREEMPTED_EXIT_STATUS
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _finalize_then_exit(code: int, grace: float = 10.0) -> None:
    """Shuts the distributed runtime down cleanly (all ranks leave together), then exits.

    Used for errors that every rank raises at the same point (bad input,
    non-finite loss) and for preemption: a rank still waiting for this one in a
    collective (Horovod) sees it fail and leaves too. Should the other ranks
    not follow within ``grace`` seconds, this rank leaves anyway and the
    launcher ends the job.
    """
    timer = threading.Timer(grace, _hard_exit, args=(code,))
    timer.daemon = True
    timer.start()
    try:
        from lmkit import distributed as dist
        dist.shutdown()
    except Exception:  # noqa: BLE001 - leaving anyway
        pass
    _hard_exit(code)


def run_main(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]] = None) -> None:
    """Runs ``main`` and turns its outcome into one message and an exit status.

    Exit status: 0 done, 2 bad input (:class:`UsageError`, printed by rank 0
    only), 3 non-finite loss, 75 preempted (SIGTERM, SIGINT or SIGUSR1 at any
    point of the command, :mod:`lmkit.core.preemption`: what was written before is
    kept, a checkpoint when training was stopped; rerun the same command to
    continue), 141 the reader of the output left
    (:class:`OutputClosed`, silent), 1 anything else (printed by the failing rank,
    naming it, with the traceback; that rank leaves at once, so the launcher
    stops the others rather than leaving them waiting in a collective).

    TensorFlow's start-up chatter is filtered out of stderr first, unless
    ``--verbose`` is among the flags or ``LMKIT_VERBOSE=1``
    (:mod:`lmkit.core.console`).
    """
    from lmkit.core import preemption
    from lmkit.core.console import quiet_console, verbose_requested

    try:
        # Before the console's filter process is forked: it inherits handlers that leave it running.
        preemption.install(launcher_rank())
        quiet_console(rank=launcher_rank(), verbose=verbose_requested(sys.argv[1:] if argv is None else argv))
        try:
            code = main(argv)
        finally:  # from here a first signal is only noted: it cannot break the way out (a second one still ends it)
            preemption.leaving()
    except BaseException as exc:  # noqa: BLE001 - every outcome is one exit status
        _leave(exc)
    sys.stdout.flush()
    sys.exit(code or 0)  # normal exit: Horovod and MPI finalise


def _leave(exc: BaseException) -> None:
    """Ends the process for ``exc``, raised by a command's ``main`` (call it where it is caught), with its
    message and exit status."""
    from lmkit.core.preemption import PREEMPTED_EXIT_STATUS, PreemptionSignal, received, stop_message

    if isinstance(exc, (PreemptionSignal, PreemptedError)) or received():
        # Whatever failed after a preemption signal (a peer that left first, a pool whose worker died of it,
        # a collective cancelled) ends with 75: one line from rank 0, and the job can be requeued.
        if launcher_rank() == 0:
            text = str(exc) if isinstance(exc, (PreemptionSignal, PreemptedError)) else stop_message()
            sys.stderr.write(f"{PreemptedError.label}: {text}\n")
        _finalize_then_exit(PREEMPTED_EXIT_STATUS)
    if isinstance(exc, LmkitError):  # UsageError (2), NonFiniteError (3): on every rank
        if launcher_rank() == 0:
            sys.stderr.write(f"{exc.label}: {exc}\n")
        _finalize_then_exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write(f"rank {launcher_rank()}: interrupted\n")
        _hard_exit(130)
    if isinstance(exc, OutputClosed):  # as Unix tools do: no message, the status of a SIGPIPE
        _hard_exit(OUTPUT_CLOSED_STATUS)
    if isinstance(exc, SystemExit):
        if not _has_peers():  # --help, or sys.exit in a single process: nobody waits for us
            raise exc
        sys.stderr.write(f"{traceback.format_exc()}\nrank {launcher_rank()} failed: sys.exit({exc.code!r}) "
                         "was called during the run; the other ranks would wait for this one\n")
        _hard_exit(1)
    if _is_peer_failure(exc):  # a bystander: the failing rank (or the launcher) names the cause
        sys.stderr.write(f"rank {launcher_rank()} stopped: a collective operation was cancelled "
                         "because another rank failed, exited or stalled; see that rank's "
                         "message or the launcher's\n")
        _hard_exit(PEER_FAILED_EXIT_STATUS)
    sys.stderr.write(f"{traceback.format_exc()}\nrank {launcher_rank()} failed: {type(exc).__name__}: {exc}\n")
    _hard_exit(1)


def _has_peers() -> bool:
    dist = sys.modules.get("lmkit.distributed")
    return dist is not None and dist.initialized() and dist.size() > 1


def _is_peer_failure(exc: BaseException) -> bool:
    dist = sys.modules.get("lmkit.distributed")  # only a job that got that far can have peers
    return dist is not None and dist.is_peer_failure(exc)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each flag's default, except where there is none to show (None, off): those flags'
    help says what happens when they are left out."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


def model_dir_parser(prog: str, doc: str) -> Parser:
    """A parser with the flags of every command that reads a training run's folder."""
    p = Parser(prog=prog, description=doc.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--model_dir", required=True, help="the --model_dir of a training run")
    p.add_argument("--checkpoint", default=None,
                   help="a ckpt-<step> folder, as a path or a name in <model_dir>/checkpoints "
                        "(default: the latest)")
    return p


def add_beam_flags(group: Any) -> None:
    """``--beam_width``, ``--length_penalty`` and ``--beam_scoring`` (lmkit generate and lmkit evaluate), each
    None when left out: a Hugging Face folder's generation_config.json may fill it
    (:func:`lmkit.decoding.registry.resolve_settings`)."""
    group.add_argument("--beam_width", type=int, default=None, help="default 4")
    group.add_argument("--length_penalty", type=float, default=None,
                       help="beam search: GNMT's alpha (default 0.6), or with --beam_scoring transformers the "
                            "power of the length a score is divided by (default 1.0)")
    group.add_argument("--beam_scoring", choices=("gnmt", "transformers"), default=None,
                       help="beam search: lmkit's (gnmt, the default) or transformers' (a Hugging Face folder "
                            "whose generation_config.json asks for beams)")


def check_model_dir(model_dir: str) -> None:
    """Raises a :class:`UsageError` unless ``model_dir`` is a training run's folder."""
    from lmkit.core.layout import CONFIG_FILE
    if not os.path.isdir(model_dir):
        raise UsageError(f"--model_dir {model_dir} does not exist; pass the --model_dir of a "
                         "training run (lmkit train)")
    if not os.path.isfile(os.path.join(model_dir, CONFIG_FILE)):
        raise UsageError(f"--model_dir {model_dir} holds no {CONFIG_FILE}, so no training run "
                         "wrote it; pass the --model_dir of a training run")


def user_modules_importable() -> None:
    """Lets a config's ``package.module:Class`` model be found in the current folder, as ``python -m`` does."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
