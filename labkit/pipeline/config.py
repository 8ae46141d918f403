"""What a pipeline sweep asks for, validated on the host before anything launches (pure).

A config is checked on its own when it is built; :meth:`PipelineConfig.check_world_size` adds
the checks that need P (the world size is the number of stages), and
:func:`combo_problem` says why one (schedule, P, M) cannot run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.config import as_tuple, one_of, option, positive_int
from labkit.errors import UsageError
from labkit.pipeline.formulas import SCHEDULES, interleavable

#: the schedules whose receives are posted at the step's start (:mod:`labkit.pipeline.ahead`:
#: one stage per rank, one kind of message each way between neighbours). Zero bubble would
#: allow it too, but its runtime already exchanges messages step by step in lockstep: measured
#: both ways in turns, its other idle time did not change (0.06, 0.09, 0.08 at M = 2, 4, 8)
SCHEDULES_AHEAD = ("gpipe", "1f1b")

#: timed steps at ``fixed_width``: a few milliseconds each, spread by the scheduler's turns, so
#: more of them than the lab's few steps give a steadier median
FIXED_STEPS = 9


@dataclass(frozen=True)
class PipelineConfig:
    """Every (schedule, M) of a grid, one launch per P (= world size).

    The model is ``layers`` blocks of Linear(hidden, hidden)+tanh split evenly into P stages
    (P·V chunks for ``interleaved``); a step is forward + backward of ``batch`` samples cut into
    M microbatches. ``check`` compares output and gradients with one process running all layers.
    ``recv_ahead``: GPipe and 1F1B post all receives of a step at its start
    (:mod:`labkit.pipeline.ahead`), so a message moves while its receiver still computes;
    ``compare_placement_at``: the M at which GPipe and 1F1B are measured both ways, a step of
    each in turn (the extra rows carry ``compared_placement``).
    ``fixed_width``: each (schedule, M) is also timed at this width, right after it, where the
    arithmetic is almost nothing: what its step costs besides the arithmetic and the bytes (each
    block's overhead, each hop, the scheduler's turns), measured in the same launch, over
    :data:`FIXED_STEPS` steps (0: not timed).
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
    warmup: int = option(2, "untimed steps (the check's step, when it runs, is the first)")
    virtual_stages: int = option(2, "V for interleaved")
    seed: int = option(0, "seed of the weights and the batch", cli=False)
    check: bool = option(True, "skip the single-process comparison", flag="--no-check")
    recv_ahead: bool = option(True, "gpipe, 1f1b: post each receive right before the block that "
                                    "needs it (torch's placement), not all of a step's receives "
                                    "at its start", flag="--no-recv-ahead")
    compare_placement_at: tuple[int, ...] = option(
        (), "microbatch counts M at which gpipe and 1f1b are also measured with the other "
            "receive placement, a step of each in turn", metavar="M")
    fixed_width: int = option(0, "also time every (schedule, M) at this width, where the "
                                 "arithmetic is almost nothing: the schedule's fixed costs "
                                 "(0: not)", metavar="W")
    skip_invalid: bool = option(False, "leave out the (schedule, M) that cannot run on P",
                                cli=False)

    def __post_init__(self):
        for name in ("schedules", "microbatches", "compare_placement_at"):
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
        positive_int("fixed_width", self.fixed_width, minimum=0)
        if self.fixed_width >= self.hidden:
            raise UsageError(f"fixed_width {self.fixed_width} must be below hidden {self.hidden}:"
                             " it times the step where the arithmetic is almost nothing")
        for m in self.compare_placement_at:
            if m not in self.microbatches:
                raise UsageError(f"compare_placement_at: M = {m} is not one of the microbatch "
                                 f"counts {list(self.microbatches)}")
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

    def fixed_config(self) -> PipelineConfig:
        """The same grid at ``fixed_width``, as the worker times it right after each point:
        :data:`FIXED_STEPS` timed steps, no check, one receive placement.

        >>> PipelineConfig(fixed_width=16).fixed_config().hidden
        16
        """
        return dataclasses.replace(self, hidden=self.fixed_width, steps=FIXED_STEPS,
                                   check=False, compare_placement_at=(), fixed_width=0)

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
    if schedule == "interleaved" and not interleavable(num_stages=p, num_microbatches=m):
        return f"interleaved needs M a multiple of P (M={m}, P={p})"
    if schedule == "zero_bubble" and m % (m // p):
        # torch's zero-bubble schedule runs M in rounds of about P microbatches
        return f"zero_bubble needs M a multiple of M // P = {m // p} (M={m}, P={p})"
    return None


#: notebook 07's share of the lab's 4 minutes on a 2-core machine (wall time at its defaults)
NOTEBOOK_BUDGET_S = 32.0
#: what a run costs besides its steps, on a 2-core machine: one launch (torchrun, importing
#: torch, the process group, the model and the single-process reference) and the notebook's
#: own work (kernel, imports, figures)
LAUNCH_S, NOTEBOOK_S = 8.0, 10.0
#: the scheduler's and a message's share of one block (one microbatch's F or B on a chunk)
BLOCK_S = 1.5e-3
#: a training step's products run below the square product's rate (tanh, autograd's copies,
#: thin microbatch products): the share of the profile's rate a stage's compute gets
STEP_EFFICIENCY = 0.7


def estimate_seconds(config: PipelineConfig, world_sizes, *, flop_per_s: float,
                     cores: int) -> float:
    """Wall seconds a notebook run of ``config`` at each P in ``world_sizes`` should take on a
    machine whose rank multiplies matrices at ``flop_per_s`` alone, with ``cores`` cores: per
    (schedule, M, receive placement) the checked, warm-up and timed steps, each the model's
    6·layers·batch·hidden² flops shared by P ranks at :data:`STEP_EFFICIENCY` of that rate
    (slowed by P/cores beyond the cores),
    stretched by the bubble ((M + P − 1)/M) plus :data:`BLOCK_S` per block (the steps at
    ``fixed_width``: that alone); plus :data:`LAUNCH_S` a launch and :data:`NOTEBOOK_S`.

    >>> cfg = PipelineConfig(schedules=("gpipe",), microbatches=(1, 2), hidden=1024, batch=128,
    ...                      steps=3, skip_invalid=True)
    >>> round(estimate_seconds(cfg, [2], flop_per_s=30e9, cores=2), 1)
    20.7
    """
    total = NOTEBOOK_S
    for p in world_sizes:
        config.check_world_size(p)
        total += LAUNCH_S
        compute = (6 * config.layers * config.batch * config.hidden ** 2 / p
                   / (STEP_EFFICIENCY * flop_per_s) * max(1.0, p / cores))
        untimed = max(config.warmup, 1 if config.check else 0)  # the check is a warm-up step
        for s, m in config.runnable(p):
            v = config.virtual_stages if s == "interleaved" else 1
            step = compute * (m + p - 1) / m + BLOCK_S * 2 * m * v
            total += len(placements(s, m, config)) * (config.steps + untimed) * step
            if config.fixed_width:
                total += fixed_steps_seconds(m, virtual_stages=v, warmup=config.warmup)
    return total


def fixed_steps_seconds(num_microbatches: int, *, virtual_stages: int = 1,
                        warmup: int) -> float:
    """What the steps at ``fixed_width`` of one (schedule, M) cost, estimated: the warm-up and
    :data:`FIXED_STEPS` timed steps, each :data:`BLOCK_S` per block (their arithmetic is almost
    nothing).

    >>> round(fixed_steps_seconds(4, warmup=1), 3)
    0.12
    """
    return (FIXED_STEPS + warmup) * BLOCK_S * 2 * num_microbatches * virtual_stages


def best_matmul_flop_per_s(machine) -> float:
    """The fastest matrix-product rate one rank reached alone in the machine profile's sweep
    (``machine``: a :class:`labkit.machine.Profile`, or anything with its ``rows``): other
    programs on the cores only ever lower a measured rate, so the best one is this machine's,
    and a grid is not refused for a noisy profile.

    >>> class Machine:
    ...     rows = ({"measurement": "matmul", "context": "alone", "flop_per_s": 3e10},
    ...             {"measurement": "matmul", "context": "alone", "flop_per_s": 2e10},
    ...             {"measurement": "matmul", "context": "together", "flop_per_s": 4e10})
    >>> best_matmul_flop_per_s(Machine())
    30000000000.0
    """
    rates = [float(r["flop_per_s"]) for r in machine.rows
             if r.get("measurement") == "matmul" and r.get("context") == "alone"]
    if not rates:
        raise UsageError("the machine profile has no matrix-product rate (measure it again: "
                         "labkit calibrate)")
    return max(rates)


def check_budget(config: PipelineConfig, world_sizes, *, flop_per_s: float, cores: int,
                 budget_s: float = NOTEBOOK_BUDGET_S) -> float:
    """:func:`estimate_seconds`, or a one-line :class:`UsageError` before anything launches
    when it exceeds ``budget_s``.

    >>> cfg = PipelineConfig(schedules=("gpipe",), microbatches=(1, 2), hidden=4096, batch=512,
    ...                      skip_invalid=True)
    >>> check_budget(cfg, [2], flop_per_s=30e9, cores=2)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: this grid is estimated at 259 s on this machine, over the 32 s budget: use fewer schedules, microbatch counts, world sizes or steps, or a smaller hidden or batch
    """
    est = estimate_seconds(config, world_sizes, flop_per_s=flop_per_s, cores=cores)
    if est > budget_s:
        raise UsageError(f"this grid is estimated at {est:.0f} s on this machine, over the "
                         f"{budget_s:g} s budget: use fewer schedules, microbatch counts, world "
                         f"sizes or steps, or a smaller hidden or batch")
    return est


def placements(schedule: str, m: int, cfg: PipelineConfig) -> list[bool]:
    """The receive placements one (schedule, M) is measured with: ``cfg.recv_ahead``, and the
    other one too at the M of ``cfg.compare_placement_at`` for the schedules that can post
    ahead.

    >>> cfg = PipelineConfig(microbatches=(2, 4), compare_placement_at=(4,))
    >>> placements("gpipe", 4, cfg), placements("gpipe", 2, cfg)
    ([True, False], [True])
    """
    if m in cfg.compare_placement_at and schedule in SCHEDULES_AHEAD:
        return [cfg.recv_ahead, not cfg.recv_ahead]
    return [cfg.recv_ahead]
