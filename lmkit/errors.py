"""Error types shared across lmkit.

:class:`UsageError` covers everything a user can fix by changing the input
(config, data, flags, model directory): the commands print its message once
(rank 0) and exit with status 2. :class:`NonFiniteError` exits with 3,
:class:`PreemptedError` (stopped by a signal, checkpoint written) with 75.
A rank that stops only because another rank failed exits with 4
(:data:`PEER_FAILED_EXIT_STATUS`), so that a launcher can tell the cause
from its consequences whatever order their exits reach it in.
Other exceptions are bugs or failures of the machine and exit with status 1.
"""


class LmkitError(Exception):
    """Base class of lmkit's own errors."""

    exit_code = 1
    label = "error"  # the word before the message on the command line

    # Exception's own constructor (one message) also for the ValueError
    # subclasses: TensorFlow's autograph then re-raises an lmkit error from
    # traced code as the same type, not as a StagingError.
    __init__ = Exception.__init__


class UsageError(LmkitError, ValueError):
    """Bad input: the message says what, which value, and how to fix it."""

    exit_code = 2


class CheckpointError(UsageError):
    """A checkpoint that does not fit the config, vocabulary or model, or one that cannot be read back
    (corrupt) or written (a full disk)."""


class NonFiniteError(LmkitError, FloatingPointError):
    """Training produced a NaN or Inf loss or gradient."""

    exit_code = 3


# A bystander: this rank's collective was cancelled because another rank failed, exited or stalled.
PEER_FAILED_EXIT_STATUS = 4


class PreemptedError(LmkitError):
    """Training stopped on a preemption signal after writing a checkpoint: rerun to continue.

    Exit status 75 (``EX_TEMPFAIL`` of ``sysexits.h``: a temporary failure, the
    user is invited to retry), distinct from 0 (done), 1 (a crash), 2 (bad
    input), 3 (a non-finite loss) and 4 (another rank failed).
    """

    exit_code = 75
    label = "preempted"
