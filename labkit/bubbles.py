"""Pipeline bubbles: the formulas, an ideal-schedule simulator, and the pipeline lab's config.

Pure (no torch). P stages (``num_stages``), M microbatches (``num_microbatches``), V virtual
stages (model chunks) per rank for the interleaved schedule.

GPipe and 1F1B idle every stage for the same P−1 microbatch slots (fill and drain), so over a
step of M + P − 1 slots::

    bubble = (P − 1) / (P − 1 + M)              (fraction of the step a stage waits)
    interleaved: (P − 1) / (V·M + P − 1)        (the fill/drain slots are V times shorter)

1F1B does not shrink the bubble; it caps the activations a stage holds at P microbatches
instead of M. The Ultra-Scale Playbook writes the bubble as (P−1)/M: that is bubble time over
*ideal* time, not a fraction of the step (P=4, M=4: 0.75 vs 3/7 = 0.43).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError

SCHEDULES = ("naive_gpipe", "gpipe", "1f1b", "interleaved")


def _count(name: str, v: int) -> int:
    if isinstance(v, bool) or int(v) != v or v < 1:
        raise UsageError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """GPipe / 1F1B bubble (P−1)/(P−1+M). P = 8, M = 16: 7/23.

    >>> round(bubble_fraction(8, 16), 4), bubble_fraction(2, 1)
    (0.3043, 0.5)
    """
    p, m = _count("num_stages", num_stages), _count("num_microbatches", num_microbatches)
    return (p - 1) / (p - 1 + m)


def interleaved_bubble_fraction(num_stages: int, num_microbatches: int, virtual_stages: int) -> float:
    """Interleaved 1F1B bubble (P−1)/(V·M+P−1). P = 4, M = 8, V = 2: 3/19.

    >>> round(interleaved_bubble_fraction(4, 8, 2), 4)
    0.1579
    """
    v = _count("virtual_stages", virtual_stages)
    p, m = _count("num_stages", num_stages), _count("num_microbatches", num_microbatches)
    return (p - 1) / (v * m + p - 1)


def schedule_bubble(schedule: str, num_stages: int, num_microbatches: int,
                    virtual_stages: int = 1) -> float:
    """The formula for a schedule name (naive_gpipe, gpipe and 1f1b share one).

    >>> schedule_bubble("1f1b", 4, 4), schedule_bubble("interleaved", 4, 4, 2)
    (0.42857142857142855, 0.2727272727272727)
    """
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule == "interleaved":
        return interleaved_bubble_fraction(num_stages, num_microbatches, virtual_stages)
    return bubble_fraction(num_stages, num_microbatches)


def bubble_time(num_stages: int, num_microbatches: int, stage_compute_s: float) -> float:
    """Idle time per step of one stage: (P−1)/M · T, with T = that stage's compute for the
    whole batch (forward + backward of all M microbatches).

    >>> bubble_time(4, 8, 1.0)
    0.375
    """
    if stage_compute_s < 0:
        raise UsageError(f"stage compute time must be >= 0, got {stage_compute_s}")
    return (_count("num_stages", num_stages) - 1) / _count("num_microbatches", num_microbatches) \
        * stage_compute_s


def measured_bubble(busy_s_per_rank, step_time_s: float) -> float:
    """bubble = 1 − Σ busy / (P × step time), step time = the slowest rank's.

    >>> measured_bubble([0.5, 0.5], 1.0)
    0.5
    """
    busy = [float(b) for b in busy_s_per_rank]
    if not busy or step_time_s <= 0 or min(busy) < 0:
        raise UsageError("need busy times >= 0 for at least one rank and a step time > 0")
    return 1.0 - sum(busy) / (len(busy) * step_time_s)


def _order(schedule: str, p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, microbatch, chunk) order one rank runs, as the torch schedules do."""
    if schedule in ("naive_gpipe", "gpipe"):
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        warm = min(m, p - 1 - rank)
        out = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            out += [("F", warm + i, 0), ("B", i, 0)]
        return out + [("B", i, 0) for i in range(m - warm, m)]
    # interleaved (Megatron order): forwards sweep the chunks in groups of P microbatches
    fw = [(i // (p * v) * p + i % p, i // p % v) for i in range(m * v)]
    bw = [(mb, v - 1 - c) for mb, c in fw]
    warm = min(m * v, (v - 1) * p + 2 * (p - 1 - rank))
    out = [("F", mb, c) for mb, c in fw[:warm]]
    for i in range(m * v - warm):
        out += [("F", *fw[warm + i]), ("B", *bw[i])]
    return out + [("B", mb, c) for mb, c in bw[m * v - warm:]]


def simulate(schedule: str, num_stages: int, num_microbatches: int, *, virtual_stages: int = 1,
             forward_s: float = 1.0, backward_s: float = 2.0) -> list[dict]:
    """Blocks of an ideal run (no communication cost, equal stages): one dict per forward or
    backward of a microbatch on a rank, with ``rank, stage, kind, microbatch, start_s, end_s``.

    A chunk's forward waits for the previous stage's forward of that microbatch; its backward
    for the next stage's backward. With V chunks per rank each takes 1/V of the time.

    >>> b = simulate("gpipe", 2, 1)
    >>> max(x["end_s"] for x in b), round(measured_bubble([3.0, 3.0], 6.0), 2)
    (6.0, 0.5)
    """
    p, m = _count("num_stages", num_stages), _count("num_microbatches", num_microbatches)
    v = _count("virtual_stages", virtual_stages) if schedule == "interleaved" else 1
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule == "interleaved" and m % p:
        raise UsageError(f"the interleaved schedule needs M a multiple of P (M={m}, P={p})")
    n = p * v
    todo = {r: _order(schedule, p, m, v, r) for r in range(p)}
    free = dict.fromkeys(range(p), 0.0)
    done: dict[tuple, float] = {}
    blocks: list[dict] = []
    while any(todo.values()):
        progressed = False
        for r in range(p):
            while todo[r]:
                kind, mb, chunk = todo[r][0]
                stage = chunk * p + r
                if kind == "F":
                    dep = ("F", stage - 1, mb) if stage > 0 else None
                else:
                    dep = ("B", stage + 1, mb) if stage < n - 1 else ("F", stage, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done.get(dep, 0.0))
                end = start + (forward_s if kind == "F" else backward_s) / v
                done[(kind, stage, mb)] = free[r] = end
                blocks.append({"rank": r, "stage": stage, "kind": kind, "microbatch": mb,
                               "start_s": start, "end_s": end})
                todo[r].pop(0)
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} P={p} M={m} V={v} deadlocks")  # a bug here
    return blocks


@dataclass(frozen=True)
class PipelineConfig:
    """``labkit pipeline``: every (schedule, M) of a grid, one launch per P (= world size).

    The model is ``layers`` blocks of Linear(hidden, hidden)+tanh split evenly into P stages
    (P·V chunks for ``interleaved``); a step is forward + backward of ``batch`` samples cut into
    M microbatches. ``check`` compares output and gradients with one process running all layers.
    ``skip_invalid`` skips the (schedule, M) pairs that cannot run on P instead of refusing.
    """

    schedules: tuple = ("gpipe", "1f1b")
    microbatches: tuple = (2, 4, 8)
    layers: int = 8
    hidden: int = 512
    batch: int = 128
    steps: int = 5
    warmup: int = 2
    virtual_stages: int = 2
    seed: int = 0
    check: bool = True
    skip_invalid: bool = False

    def __post_init__(self):
        for name in ("schedules", "microbatches"):
            if isinstance(getattr(self, name), (str, int)):
                object.__setattr__(self, name, (getattr(self, name),))
        if not self.schedules or not self.microbatches:
            raise UsageError("need at least one schedule and one microbatch count")
        for s in self.schedules:
            if s not in SCHEDULES:
                raise UsageError(f"unknown schedule {s!r} (known: {', '.join(SCHEDULES)})")
        for m in self.microbatches:
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise UsageError(f"microbatches must be integers >= 1, got {m!r}")
        for name in ("layers", "hidden", "batch", "steps", "virtual_stages"):
            _count(name, getattr(self, name))
        if self.warmup < 0:
            raise UsageError(f"warmup must be >= 0, got {self.warmup}")
        for m in self.microbatches:
            if self.batch % m:
                raise UsageError(f"batch {self.batch} is not divisible by {m} microbatches")

    def validate_for(self, num_stages: int) -> None:
        """The checks that need P: layers per stage, 1F1B and interleaved with M < P. With
        ``skip_invalid`` a (schedule, M) that cannot run is skipped (see :meth:`runnable`)
        instead of refused, so one launch can sweep GPipe from M = 1 beside 1F1B from M = P."""
        p = _count("num_stages", num_stages)
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
        """The (schedule, M) pairs that run on P stages, in grid order."""
        return [(s, m) for s in self.schedules for m in self.microbatches
                if not combo_problem(s, num_stages, m)]


def combo_problem(schedule: str, num_stages: int, num_microbatches: int) -> str | None:
    """Why (schedule, P, M) cannot run, or None.

    >>> combo_problem("1f1b", 2, 1)[:40]
    '1f1b needs num_microbatches >= num_stage'
    """
    p, m = num_stages, num_microbatches
    if schedule in ("1f1b", "interleaved") and m < p:
        return (f"{schedule} needs num_microbatches >= num_stages (M={m} < P={p}): every stage "
                f"must have a microbatch in flight; use M >= {p} or the gpipe schedule")
    if schedule == "interleaved" and m % p:
        return f"interleaved needs M a multiple of P (M={m}, P={p})"
    return None


def stage_layers(num_layers: int, num_chunks: int) -> list[range]:
    """Split layers 0..L−1 into contiguous, near-equal stages (the first ones take the extra).

    >>> stage_layers(10, 4)
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    n, c = _count("layers", num_layers), _count("stages", num_chunks)
    if n < c:
        raise UsageError(f"{n} layers cannot fill {c} stages")
    bounds = [k * (n // c) + min(k, n % c) for k in range(c + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(c)]
