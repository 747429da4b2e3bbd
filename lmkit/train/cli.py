"""Command-line plumbing shared by the example scripts.

* :func:`ptb_arg_parser` builds the flags of ``examples/lm_ptb*.py``;
* :func:`run_main` runs a ``main`` so that bad input prints one message
  (rank 0) and exits 2, and a crash on any rank prints the rank and the cause
  and ends that process at once (``mpirun`` then stops the others) instead of
  leaving ranks waiting in a collective;
* :func:`same_outcome_everywhere` turns a usage error on one rank into the
  same error on every rank;
* :func:`load_ptb_everywhere` lets rank 0 download PTB while the others wait,
  then gives every rank the data (read locally, or sent by rank 0 when a
  host has no shared file system).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from lmkit.dist.env import launcher_rank
from lmkit.errors import LmkitError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags once (rank 0) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if launcher_rank() == 0:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.stderr.flush()
        _hard_exit(2)


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """``["batch_size=40", "optimizer='adam'"]`` -> ``{"batch_size": 40, "optimizer": "adam"}``."""
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


def ptb_arg_parser(prog: str, description: str, distributed: bool) -> argparse.ArgumentParser:
    """Flags of the PTB examples (documented in the README)."""
    p = _Parser(prog=prog, description=description,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default="config_small",
                   help="config name in configs/ (config_small, config_medium, config_large, "
                        "config_transformer, ...) or a path to a .py file")
    p.add_argument("--data_path", default="data/ptb",
                   help="folder with ptb.{train,valid,test}.txt (or simple-examples/data below it); "
                        "PTB is downloaded there when missing")
    p.add_argument("--data_url", default=None,
                   help="mirror of simple-examples.tgz (http(s):// or file://); "
                        "default $LMKIT_PTB_URL or the canonical address")
    p.add_argument("--no_verify_data", action="store_true",
                   help="accept PTB files from --data_url without checking their SHA-1 (for a mirror "
                        "serving other data)")
    p.add_argument("--model_dir", default=None,
                   help="checkpoints, config, vocabulary, TensorBoard logs and results.json "
                        "(default runs/<config>)")
    p.add_argument("--no_resume", action="store_true",
                   help="start afresh even when --model_dir holds a checkpoint "
                        "(refuses a folder that already has one)")
    p.add_argument("--num_epochs", type=int, default=None, help="override the config's num_epochs")
    p.add_argument("--max_steps", type=int, default=None,
                   help="stop after this many global steps (smoke tests)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set batch_size=40 --set optimizer=adam "
                        "(repeatable)")
    p.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p.add_argument("--intra_op_threads", type=int, default=None,
                   help="CPU threads per op on each rank (default: cores / ranks on the host)")
    if distributed:
        p.add_argument("--sparse_as_dense", action="store_true",
                       help="allreduce embedding gradients as dense tensors instead of allgathering them")
        p.add_argument("--fp16_allreduce", action="store_true",
                       help="compress dense gradients to float16 for the allreduce")
    return p


def _hard_exit(code: int) -> None:
    """Leaves at once: flushes output, skips atexit handlers that could wait on other ranks."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _finalize_then_exit(code: int, grace: float = 10.0) -> None:
    """Shuts the distributed runtime down cleanly (all ranks leave together), then exits.

    Used for errors that every rank raises at the same point (bad input,
    non-finite loss). Should the other ranks not follow within ``grace``
    seconds, this rank leaves anyway and the launcher ends the job.
    """
    timer = threading.Timer(grace, _hard_exit, args=(code,))
    timer.daemon = True
    timer.start()
    try:
        from lmkit import dist
        dist.shutdown()
    except Exception:  # noqa: BLE001 - leaving anyway
        pass
    _hard_exit(code)


def run_main(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]] = None) -> None:
    """Runs ``main`` and turns its outcome into one message and an exit status.

    Exit status: 0 done, 2 bad input (:class:`UsageError`, printed by rank 0
    only), 3 non-finite loss, 1 anything else (printed by the failing rank,
    naming it, with the traceback; that rank leaves at once, so the launcher
    stops the others rather than leaving them waiting in a collective).
    """
    try:
        code = main(argv)
    except LmkitError as exc:  # UsageError (2), NonFiniteError (3): raised on every rank
        if launcher_rank() == 0:
            sys.stderr.write(f"error: {exc}\n")
        _finalize_then_exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write(f"rank {launcher_rank()}: interrupted\n")
        _hard_exit(130)
    except SystemExit as exc:
        if not _has_peers():  # --help, or sys.exit in a single process: nobody waits for us
            raise
        sys.stderr.write(f"{traceback.format_exc()}\nrank {launcher_rank()} failed: sys.exit({exc.code!r}) "
                         "was called during the run; the other ranks would wait for this one\n")
        _hard_exit(1)
    except BaseException as exc:  # noqa: BLE001 - a crash must end this rank now
        if _is_peer_failure(exc):  # a bystander: the failing rank (or the launcher) names the cause
            sys.stderr.write(f"rank {launcher_rank()} stopped: a collective operation was cancelled "
                             "because another rank failed, exited or stalled; see that rank's "
                             "message or the launcher's\n")
            _hard_exit(1)
        tb = traceback.format_exc()
        sys.stderr.write(f"{tb}\nrank {launcher_rank()} failed: {type(exc).__name__}: {exc}\n")
        _hard_exit(1)
    sys.stdout.flush()
    sys.exit(code or 0)  # normal exit: Horovod and MPI finalise


def _has_peers() -> bool:
    dist = sys.modules.get("lmkit.dist")
    return dist is not None and dist.initialized() and dist.size() > 1


def _is_peer_failure(exc: BaseException) -> bool:
    dist = sys.modules.get("lmkit.dist")  # only a job that got that far can have peers
    return dist is not None and dist.is_peer_failure(exc)


def same_outcome_everywhere(fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` on every rank; a :class:`UsageError` on any rank is raised on all.

    Per-rank work (reading local files) can fail on one rank only; that rank
    alone would leave while the others wait in the next collective, and its
    message would be lost (only rank 0 prints usage errors). Every rank must
    call this, in the same order.
    """
    from lmkit import dist
    try:
        result, error = fn(), None
    except UsageError as exc:
        result, error = None, str(exc)
    failed = [(r, e) for r, e in enumerate(dist.allgather_object(error)) if e is not None]
    if failed:
        r, message = failed[0]
        raise UsageError(message if r == 0 else f"on rank {r}: {message}")
    return result


def _ensure_ptb(data_path: str, url: Optional[str], expected_vocab_size: Optional[int],
                verify: bool = True) -> str:
    """``ensure_ptb`` whose failure names the missing folder or files and leaves no empty folder."""
    from lmkit.data import ptb
    from lmkit.data.errors import DataError

    existed = os.path.isdir(data_path)
    try:
        return ptb.ensure_ptb(data_path, url=url, expected_vocab_size=expected_vocab_size, verify=verify)
    except DataError as exc:
        if not existed:
            if os.path.isdir(data_path) and not os.listdir(data_path):
                os.rmdir(data_path)  # made for the download that failed
            raise DataError(f"data folder {data_path} does not exist, and downloading PTB failed: "
                            f"{exc}") from None
        have = [n for n in ptb.PTB_FILES if os.path.isfile(os.path.join(data_path, n))]
        if have:
            missing = [n for n in ptb.PTB_FILES if n not in have]
            raise DataError(f"data folder {data_path} lacks {', '.join(missing)} (it has "
                            f"{', '.join(have)}), and downloading PTB failed: {exc}") from None
        raise


def load_ptb_everywhere(data_path: str, url: Optional[str], expected_vocab_size: Optional[int],
                        verify: bool = True):
    """Rank 0 finds or downloads PTB; every rank then gets the same data.

    Returns:
      ``lmkit.data.ptb.PTBData`` on every rank.
    """
    from lmkit import dist
    from lmkit.data import ptb

    data_dir = dist.run_on_chief(lambda: _ensure_ptb(data_path, url, expected_vocab_size, verify))
    # Hosts without a shared file system get the data from rank 0.
    local = ptb.find_ptb(data_path)
    everyone_has_it = all(dist.allgather_object(local is not None))
    if everyone_has_it:
        return same_outcome_everywhere(lambda: ptb.load_ptb(local))
    return dist.run_on_chief(lambda: ptb.load_ptb(data_dir))
