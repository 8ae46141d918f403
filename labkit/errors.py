"""Errors a user can act on.

A ``UsageError`` is bad input caught before anything is launched or written: the CLI prints its
one-line message and exits 2. A ``LaunchError`` is a launch that ran and failed (a rank raised,
hung or was killed): the message names the rank, its exit code or signal and its last log lines.
"""


class LabkitError(Exception):
    """Base class: an error with a message meant for the user, not a traceback."""


class UsageError(LabkitError, ValueError):
    """Bad input, detected before anything was launched or written (CLI exit code 2)."""


class ResultsFileError(UsageError):
    """A results file that is unreadable, corrupt or not a labkit results file."""


class ResultsNotStored(LabkitError, OSError):
    """Measured rows that could not be written to the results file (disk full, permissions):
    the message says where they were saved instead (CLI exit code 1)."""


class RowsOnAnotherNode(LabkitError):
    """A multi-node sweep finished on this node, but global rank 0 (and so every row) ran on
    another node. Not a failure: the CLI prints one line naming that node and exits 0."""

    def __init__(self, message: str, *, node: str | None = None, host: str | None = None):
        super().__init__(message)
        self.node = node
        self.host = host


class LaunchError(LabkitError, RuntimeError):
    """A torchrun launch that failed after it started."""


class LaunchTimeout(LaunchError):
    """The launch ran past its timeout and every process of it was killed."""


class RankFailed(LaunchError):
    """A rank exited non-zero or was killed by a signal."""

    def __init__(self, message: str, *, rank: int | None, exitcode: int | None,
                 signal_name: str | None, log_tail: str):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.log_tail = log_tail
