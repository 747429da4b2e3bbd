"""Error types shared across lmkit.

:class:`UsageError` covers everything a user can fix by changing the input
(config, data, flags, model directory): the examples print its message once
(rank 0) and exit with status 2.  Other exceptions are bugs or failures of
the machine and exit with status 1.
"""


class LmkitError(Exception):
    """Base class of lmkit's own errors."""

    exit_code = 1

    # Exception's own constructor (one message) also for the ValueError
    # subclasses: TensorFlow's autograph then re-raises an lmkit error from
    # traced code as the same type, not as a StagingError.
    __init__ = Exception.__init__


class UsageError(LmkitError, ValueError):
    """Bad input: the message says what, which value, and how to fix it."""

    exit_code = 2


class CheckpointError(UsageError):
    """A checkpoint that does not fit the config, vocabulary or model."""


class NonFiniteError(LmkitError, FloatingPointError):
    """Training produced a NaN or Inf loss or gradient."""

    exit_code = 3
