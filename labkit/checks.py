"""Configs of the two diagnostic workers (pure: validated on the host before a launch)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class PlacementConfig:
    """``labkit placement``: where each rank runs, and one timed all-reduce."""

    allreduce_bytes: int = 1 << 20
    warmup: int = 3
    repeat: int = 10

    def __post_init__(self):
        if self.allreduce_bytes < 4:
            raise UsageError(f"allreduce_bytes must be >= 4, got {self.allreduce_bytes}")
        if self.warmup < 0 or self.repeat < 1:
            raise UsageError(f"need warmup >= 0 and repeat >= 1, got {self.warmup}, {self.repeat}")


@dataclass(frozen=True)
class SelftestConfig:
    """``labkit.workers.selftest``: a launch that succeeds or fails on purpose.

    ``fault`` is what ``fault_rank`` does: ``none``, ``raise`` (a Python exception), ``exit``
    (exit code 3), ``kill`` (SIGKILL itself) or ``hang`` (wait forever in an all-reduce its peers
    never join). Used by the tests of the launcher, and by a reader who wants to see what a
    failing launch looks like.
    """

    fault: str = "none"
    fault_rank: int = 1
    sleep_s: float = 0.0
    # per-rank seconds each timed step sleeps (rank r sleeps step_sleep_s[r]): shows that a
    # step's time is the slowest rank's, not the mean
    step_sleep_s: tuple = ()
    steps: int = 5

    def __post_init__(self):
        if self.fault not in ("none", "raise", "exit", "kill", "hang"):
            raise UsageError(f"unknown fault {self.fault!r} (none, raise, exit, kill, hang)")
        if self.fault_rank < 0 or self.sleep_s < 0 or any(t < 0 for t in self.step_sleep_s):
            raise UsageError("fault_rank, sleep_s and step_sleep_s must be >= 0")
        if self.steps < 1:
            raise UsageError(f"steps must be >= 1, got {self.steps}")


@dataclass(frozen=True)
class TransportCheckConfig:
    """``labkit.workers.transport``: the solve operator's two transports, checked and timed.

    ``rounds`` rounds of a ring exchange (each rank sends ``values`` doubles to the next rank
    and receives from the previous one) followed by an all-reduce, every message's contents
    checked; with ``jitter_us`` each rank waits a random time up to that before each round, so
    that ranks run out of step and the mailboxes' flow control is exercised. Then ``repeat``
    timed rounds without jitter: the latency of one exchange and of one small all-reduce.
    """

    transports: tuple = ("shm", "torch")
    rounds: int = 300
    values: int = 700
    jitter_us: float = 200.0
    repeat: int = 300
    seed: int = 0

    def __post_init__(self):
        if not self.transports or any(t not in ("shm", "torch") for t in self.transports):
            raise UsageError(f"transports must be some of shm, torch; got {self.transports!r}")
        for name in ("rounds", "values", "repeat"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.jitter_us < 0:
            raise UsageError(f"jitter_us must be >= 0, got {self.jitter_us}")
