"""A quiet console: TensorFlow's start-up chatter is off unless asked for.

TensorFlow, XLA and absl print lines nobody asked for on every start, once
per rank (``I0000 00:00:... service.cc:148] XLA service ... initialized``,
``Compiled cluster using XLA!``, ``cpu_feature_guard ... rebuild TensorFlow
with the appropriate compiler flags``), some of them from C++ through absl,
which ``TF_CPP_MIN_LOG_LEVEL`` does not reach. :func:`quiet_console` puts a
filter on file descriptor 2: a small child process reads what C++ writes
there and passes on every line except that chatter, so real errors (a
failed check, Horovod's or MPI's messages) still show. Python's own
``sys.stderr`` keeps writing straight to the terminal, so lmkit's messages
are never held back or reordered, even when a rank leaves with
``os._exit``; the child drains the pipe to its end before it exits.

On ranks other than 0, every line that passes the filter and every Python
warning is prefixed with ``rank N:``. ``--verbose`` or ``LMKIT_VERBOSE=1``
turns the filter off (and TensorFlow's own log level back to its default).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import IO, Optional

__all__ = ["CHATTER", "VERBOSE_ENV", "is_chatter", "quiet_console", "verbose_requested"]

VERBOSE_ENV = "LMKIT_VERBOSE"

# Lines of TensorFlow/XLA/absl start-up chatter (matched at the start of a line).
CHATTER = re.compile(
    r"(?:[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"  # absl INFO/WARNING: I0000 00:00:1795.. 123 f.cc:1]
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] \S*tensorflow/\S+\]"  # tsl INFO/WARNING lines
    r"|\S*cpu_feature_guard\.cc"
    r"|To enable the following instructions:"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|\s+StreamExecutor device \(\d+\):)")

_installed = False


def is_chatter(line: str) -> bool:
    """True for a line of TensorFlow/XLA/absl start-up chatter."""
    return CHATTER.match(line) is not None


def verbose_requested(argv: Optional[list] = None) -> bool:
    """``--verbose`` among the flags, or ``LMKIT_VERBOSE`` set to something other than 0."""
    if argv is not None and "--verbose" in argv:
        return True
    return os.environ.get(VERBOSE_ENV, "0").strip() not in ("", "0", "false", "no")


def _filter(source: int, sink: int, prefix: bytes) -> None:
    """The child: copies ``source`` to ``sink`` line by line, without chatter, until EOF."""
    pending = b""
    while True:
        try:
            chunk = os.read(source, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            if not is_chatter(raw.decode("utf-8", "replace")):
                os.write(sink, prefix + raw + b"\n")
    if pending and not is_chatter(pending.decode("utf-8", "replace")):
        os.write(sink, prefix + pending + b"\n")


def quiet_console(rank: int = 0, verbose: bool = False) -> None:
    """Filters TensorFlow's chatter out of this process's stderr (once; before TensorFlow loads).

    Args:
      rank: this process's rank (the launcher's); ranks > 0 prefix their lines.
      verbose: keep everything (TensorFlow's log level as the user set it);
        ``LMKIT_VERBOSE=1`` does the same.
    """
    global _installed
    if _installed or verbose or verbose_requested() or not hasattr(os, "fork"):
        return
    _installed = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's own INFO and WARNING lines
    prefix = f"rank {rank}: ".encode() if rank > 0 else b""
    if rank > 0:
        _prefix_python_warnings(f"rank {rank}: ")
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter process: it holds no write end, so it sees EOF when the writers are gone
        try:
            os.close(write_end)
            _filter(read_end, terminal, prefix)
        finally:
            os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 2)  # C++ libraries write to fd 2: through the filter
    os.close(write_end)
    # Python's stderr goes straight to the terminal: never held back, never reordered.
    sys.stderr = os.fdopen(terminal, "w", buffering=1, encoding="utf-8", errors="replace",
                           closefd=False)


def _prefix_python_warnings(prefix: str) -> None:
    def showwarning(message, category, filename, lineno, file: Optional[IO] = None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        (file or sys.stderr).write("".join(prefix + part for part in text.splitlines(True)))

    warnings.showwarning = showwarning
