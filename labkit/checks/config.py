"""Configs of the three diagnostic workers (pure: validated on the host before a launch)."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import distinct_choices, one_of, option, positive_int
from labkit.errors import UsageError
from labkit.solve.config import transport_refused

FAULTS = ("none", "raise", "exit", "kill", "hang", "stop")
#: the solve operator's transports the check can run (labkit.solve.transport)
TRANSPORTS = ("shm", "torch")


@dataclass(frozen=True)
class PlacementConfig:
    """``labkit placement``: where each rank runs, and one timed all-reduce."""

    allreduce_bytes: int = option(1 << 20, "bytes of the all-reduce timed in every launch")
    warmup: int = option(3, "untimed all-reduces", cli=False)
    # 40, not 10: on the 2-vCPU VM the transfer (the median of the calls that waited for
    # nothing) of 10 calls of 1 MiB read 0.43-1.32 ms from one launch to the next, of 40 calls
    # 0.43-0.72 ms (docs/measurements.md); 30 more calls cost about 20 ms
    repeat: int = option(40, "timed all-reduces (percentiles over the slowest rank)", cli=False)

    def __post_init__(self):
        # a float32 buffer: 4 bytes at least
        positive_int("allreduce_bytes", self.allreduce_bytes, minimum=4)
        positive_int("warmup", self.warmup, minimum=0)
        positive_int("repeat", self.repeat)


@dataclass(frozen=True)
class SelftestConfig:
    """``labkit.checks.selftest_worker``: a launch that succeeds or fails on purpose.

    ``fault`` is what ``fault_rank`` does: ``none``, ``raise`` (a Python exception), ``exit``
    (exit code 3), ``kill`` (SIGKILL itself) or ``hang`` (wait forever in an all-reduce its peers
    never join). Used by the tests of the launcher, and by a reader who wants to see what a
    failing launch looks like.
    """

    fault: str = option("none", "none, raise, exit, kill, hang or stop (SIGSTOP)", cli=False)
    fault_rank: int = option(1, "the rank that fails", cli=False)
    sleep_s: float = option(0.0, "seconds every rank sleeps first", cli=False)
    # rank r sleeps step_sleep_s[r] per timed step: shows that a step's time is the slowest
    # rank's, not the mean
    step_sleep_s: tuple = option((), "per-rank seconds each timed step sleeps", cli=False)
    steps: int = option(5, "timed steps (with step_sleep_s)", cli=False)

    def __post_init__(self):
        object.__setattr__(self, "step_sleep_s", tuple(self.step_sleep_s))
        one_of("fault", self.fault, FAULTS)
        positive_int("fault_rank", self.fault_rank, minimum=0)
        if self.sleep_s < 0 or any(t < 0 for t in self.step_sleep_s):
            raise UsageError("sleep_s and step_sleep_s must be >= 0")
        positive_int("steps", self.steps)


@dataclass(frozen=True)
class TransportCheckConfig:
    """``labkit.checks.transport_worker``: the solve operator's two transports, checked and timed.

    ``transports``: which to check; None (the default): every one the ranks' device
    supports (torch always; shm where the tensors are on the CPU and all ranks on one host).
    ``rounds`` rounds of a ring exchange (each rank sends ``values`` doubles to the next rank
    and receives from the previous one) followed by an all-reduce, every message's contents
    checked; with ``jitter_us`` each rank waits a random time up to that before each round, so
    that ranks run out of step and the mailboxes' flow control is exercised. Then ``repeat``
    timed rounds without jitter: the latency of one exchange and of one small all-reduce.
    """

    transports: tuple | None = option(
        None, "shm and/or torch (default: every one the ranks' device supports)", cli=False)
    rounds: int = option(300, "checked rounds (ring exchange + all-reduce)", cli=False)
    values: int = option(700, "doubles each rank sends per exchange", cli=False)
    jitter_us: float = option(200.0, "longest random wait before a checked round (us)",
                              cli=False)
    repeat: int = option(300, "timed rounds, without jitter", cli=False)
    seed: int = option(0, "seed of the random waits", cli=False)

    def __post_init__(self):
        if self.transports is not None:
            object.__setattr__(self, "transports",
                               distinct_choices("transport", self.transports, TRANSPORTS))
        for name in ("rounds", "values", "repeat"):
            positive_int(name, getattr(self, name))
        if self.jitter_us < 0:
            raise UsageError(f"jitter_us must be >= 0, got {self.jitter_us}")

    def check_world_size(self, world_size: int) -> None:
        """A ring of one rank sends to itself: nothing travels, nothing is checked."""
        positive_int("world size of a transport check", world_size, minimum=2)

    def check_backend(self, backend: str) -> None:
        """Refuse, before any launch, a transport asked for that ranks on ``backend`` cannot
        use (unset transports are chosen by the ranks, so nothing is refused)."""
        for kind in self.transports or ():
            why = transport_refused(kind, backend)
            if why is not None:
                raise UsageError(why)
