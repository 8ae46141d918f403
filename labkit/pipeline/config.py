"""What a pipeline sweep asks for, validated on the host before anything launches (pure).

A config is checked on its own when it is built; :meth:`PipelineConfig.check_world_size` adds
the checks that need P (the world size is the number of stages), and
:func:`combo_problem` says why one (schedule, P, M) cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import as_tuple, one_of, option, positive_int
from labkit.errors import UsageError
from labkit.pipeline.formulas import SCHEDULES


@dataclass(frozen=True)
class PipelineConfig:
    """Every (schedule, M) of a grid, one launch per P (= world size).

    The model is ``layers`` blocks of Linear(hidden, hidden)+tanh split evenly into P stages
    (P·V chunks for ``interleaved``); a step is forward + backward of ``batch`` samples cut into
    M microbatches. ``check`` compares output and gradients with one process running all layers.
    ``skip_invalid`` skips the (schedule, M) pairs that cannot run on P instead of refusing.

    >>> PipelineConfig(schedules="gpipe", microbatches=4).microbatches
    (4,)
    """

    schedules: tuple = option(("gpipe", "1f1b"), "naive_gpipe gpipe 1f1b interleaved zero_bubble",
                              flag="--schedule", metavar="S")
    microbatches: tuple[int, ...] = option((2, 4, 8), "microbatch counts M", metavar="M")
    layers: int = option(8, "Linear+tanh blocks")
    hidden: int = option(512, "width")
    batch: int = option(128, "samples per step")
    steps: int = option(5, "timed steps")
    warmup: int = option(2, "untimed steps")
    virtual_stages: int = option(2, "V for interleaved")
    seed: int = option(0, "seed of the weights and the batch", cli=False)
    check: bool = option(True, "skip the single-process comparison", flag="--no-check")
    skip_invalid: bool = option(False, "leave out the (schedule, M) that cannot run on P",
                                cli=False)

    def __post_init__(self):
        for name in ("schedules", "microbatches"):
            object.__setattr__(self, name, as_tuple(getattr(self, name)))
        if not self.schedules or not self.microbatches:
            raise UsageError("need at least one schedule and one microbatch count")
        for s in self.schedules:
            one_of("schedule", s, SCHEDULES)
        for m in self.microbatches:
            positive_int("microbatches", m)
        for name in ("layers", "hidden", "batch", "steps", "virtual_stages"):
            positive_int(name, getattr(self, name))
        positive_int("warmup", self.warmup, minimum=0)
        for m in self.microbatches:
            if self.batch % m:
                raise UsageError(f"batch {self.batch} is not divisible by {m} microbatches")

    def check_world_size(self, num_stages: int) -> None:
        """The checks that need P: layers per stage, 1F1B and interleaved with M < P. With
        ``skip_invalid`` a (schedule, M) that cannot run is skipped (see :meth:`runnable`)
        instead of refused, so one launch can sweep GPipe from M = 1 beside 1F1B from M = P."""
        p = positive_int("num_stages", num_stages)
        for s in self.schedules:
            chunks = p * (self.virtual_stages if s == "interleaved" else 1)
            if self.layers < chunks:
                raise UsageError(f"{s}: {self.layers} layers cannot fill {chunks} stages "
                                 f"(P={p}, V={chunks // p})")
            for m in self.microbatches:
                problem = combo_problem(s, p, m)
                if problem and not self.skip_invalid:
                    raise UsageError(problem)
        if not self.runnable(p):
            raise UsageError(f"no (schedule, M) of this grid can run on P={p}")

    def runnable(self, num_stages: int) -> list[tuple[str, int]]:
        """The (schedule, M) pairs that run on P stages, in grid order.

        >>> PipelineConfig(microbatches=(1, 2), skip_invalid=True).runnable(2)
        [('gpipe', 1), ('gpipe', 2), ('1f1b', 2)]
        """
        return [(s, m) for s in self.schedules for m in self.microbatches
                if not combo_problem(s, num_stages, m)]


def combo_problem(schedule: str, num_stages: int, num_microbatches: int) -> str | None:
    """Why (schedule, P, M) cannot run, or None.

    >>> combo_problem("1f1b", 2, 1)[:40]
    '1f1b needs num_microbatches >= num_stage'
    >>> combo_problem("gpipe", 2, 1) is None
    True
    """
    p, m = num_stages, num_microbatches
    if schedule in ("1f1b", "interleaved", "zero_bubble") and m < p:
        return (f"{schedule} needs num_microbatches >= num_stages (M={m} < P={p}): every stage "
                f"must have a microbatch in flight; use M >= {p} or the gpipe schedule")
    if schedule == "interleaved" and m % p:
        return f"interleaved needs M a multiple of P (M={m}, P={p})"
    if schedule == "zero_bubble" and m % (m // p):
        # torch's zero-bubble schedule runs M in rounds of about P microbatches
        return f"zero_bubble needs M a multiple of M // P = {m // p} (M={m}, P={p})"
    return None
