"""What a measured pipeline bubble is made of (pure): the schedule's own fill and drain, what
the stages' unequal blocks change in it, what the step's messages and waits change, and the other
steps.

The formulas (P−1)/(P−1+M) and (P−1)/M assume every stage's forward (and backward) takes the
same time. A measured step's stages do not: the last one also computes the loss (in one lab
run's median steps at M = 8 on the 2-vCPU VM, its forwards took 2.4-3.3 ms against the first
stage's 1.5-2.2), single blocks, such as stage 1's first forward of a step, ran up to 1.3x
their kind's mean, and the fill and drain wait on particular blocks, not on the mean. The
fill/drain bubble read off the timeline (:func:`labkit.pipeline.formulas.timeline_split`) holds
every idle stretch the schedule makes a rank wait through, so a faster stage waiting for a
slower one counts there too.
:func:`bubble_split` takes a measured bubble apart into five measured terms that sum to it:

* **the schedule, equal blocks**: the ideal replay of the median step's blocks in their
  measured order, messages free, each block at its kind's mean duration over the step (for
  GPipe and 1F1B, the formula);
* **the stages' unequal means**: the same replay with each block at its stage's (its model
  chunk's) mean for its kind, as the stages ran on average, less that;
* **unequal blocks within a stage**: the replay with each block at its measured duration, less
  that;
* **the step's messages and waits**: the median step's own bubble less its ideal replay's (as
  a share of the step: a step the messages and waits made longer holds the same fill and
  drain as a smaller share);
* **the other steps**: the measurement (a median over the steps) less the median step's.

:func:`bubble_laws` and :func:`over_ideal_laws` are the law rows of the two bubble
conventions, each miss with that split: the share against the step model's replayed step
(which carries the gaps, messages and waits that make a step longer), the time over the
compute against the schedule replayed with the stages' mean blocks (:func:`stage_bubble`: the
first two terms; the messages and waits lengthen the step, not the fill and drain).
"""

from __future__ import annotations

import math

from labkit.pipeline.formulas import (
    bubble_text,
    ideal_replay,
    over_ideal_text,
    own_parts,
    timeline_split,
)
from labkit.pipeline.verdicts import BUBBLE_TOLERANCE
from labkit.results import select_rows


def replayed_bubble(blocks, *, durations: str) -> dict:
    """The ideal replay of ``blocks`` (dicts with ``rank, stage, kind, microbatch, start_s,
    end_s``; a block recorded inside the one before it counts its own part,
    :func:`labkit.pipeline.formulas.own_parts`) in each rank's measured order, messages free,
    every block at its measured duration (``durations="measured"``), at its stage's mean for
    its kind over the step (``"stage"``), or at its kind's mean over the whole step
    (``"kind"``, every stage alike). ``idle_s`` and ``compute_s`` (summed over ranks) and
    ``span_s`` (the replayed step): all of its idle time is the schedule's.

    GPipe, P = 2, M = 2, forward 1 s and backward 2 s everywhere: each rank idles P − 1 = 1
    slot of 3 s, against M = 2 slots of compute (the bubble over ideal (P−1)/M = 0.5):

    >>> from labkit.pipeline.schedules import simulate
    >>> replayed_bubble(simulate("gpipe", 2, 2, forward_s=1.0, backward_s=2.0),
    ...                 durations="kind")
    {'idle_s': 6.0, 'compute_s': 12.0, 'span_s': 9.0}
    """
    if durations not in ("measured", "stage", "kind"):
        raise ValueError(f"durations must be 'measured', 'stage' or 'kind', got {durations!r}")
    parts = own_parts(blocks)

    def group(b) -> tuple:
        return (b["kind"],) if durations == "kind" else (b["kind"], int(b["stage"]))

    groups: dict[tuple, list[float]] = {}
    for mine in parts.values():
        for p in mine:
            groups.setdefault(group(p["block"]), []).append(p["duration_s"])
    mean = {k: math.fsum(v) / len(v) for k, v in groups.items()}
    orders = {r: [(p["block"]["kind"], int(p["block"]["stage"]), int(p["block"]["microbatch"]),
                   p["duration_s"] if durations == "measured" else mean[group(p["block"])])
                  for p in mine] for r, mine in parts.items()}
    placed = ideal_replay(orders, last_stage=max(int(b["stage"]) for b in blocks))
    span = max(z for _, z in placed.values()) - min(a for a, _ in placed.values())
    compute = math.fsum(d for order in orders.values() for *_, d in order)
    return {"idle_s": len(parts) * span - compute, "compute_s": compute, "span_s": span}


def _bubble(got: dict, *, over: str, ranks: int) -> float:
    whole = got["compute_s"] if over == "compute" else ranks * got["span_s"]
    return got["idle_s"] / whole if whole > 0 else math.nan


def stage_bubble(blocks, *, over: str = "compute") -> float:
    """The schedule's bubble with the stages as they ran: the median step's blocks (``blocks``)
    replayed in their order, messages free, each at its stage's mean for its kind
    (:func:`replayed_bubble`), over its compute (``over="compute"``, as (P−1)/M) or as a share
    of P × its span (``"step"``, as (P−1)/(P−1+M)). With equal stages it is the formula; a
    slower stage makes the others wait through its longer blocks. NaN for blocks of no
    duration.

    GPipe, P = 2, M = 2: stage 1's forward takes 2 s where stage 0's takes 1 s (backward 2 s
    on both): (P−1)/M says 0.5, the stages as they ran 8 s idle over 14 s of compute:

    >>> b = [dict(rank=s, stage=s, kind=k, microbatch=m, start_s=a, end_s=z)
    ...      for s, k, m, a, z in [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (1, "F", 0, 1, 3),
    ...                            (1, "F", 1, 3, 5), (1, "B", 0, 5, 7), (1, "B", 1, 7, 9),
    ...                            (0, "B", 0, 7, 9), (0, "B", 1, 9, 11)]]
    >>> round(stage_bubble(b), 3), round(stage_bubble(b, over="step"), 3)
    (0.571, 0.364)
    """
    if over not in ("compute", "step"):
        raise ValueError(f"over must be 'compute' or 'step', got {over!r}")
    if not blocks:
        raise ValueError("stage_bubble needs the step's blocks")
    ranks = len({int(b["rank"]) for b in blocks})
    return _bubble(replayed_bubble(blocks, durations="stage"), over=over, ranks=ranks)


def bubble_split(blocks, *, step_s: float, measured: float, over: str) -> dict | None:
    """A measured bubble taken apart (see the module docstring): ``over="compute"`` for the
    bubble over ideal (fill/drain time over compute time, as (P−1)/M), ``over="step"`` for
    its share of P × the step (as (P−1)/(P−1+M)). ``blocks``, ``step_s``: the median step's
    blocks on one clock from its start, and its span; ``measured``: the row's bubble (a median
    over its steps). Five terms: the ideal replay with equal blocks; what the stages' mean
    blocks change in it; what the blocks' measured durations change beyond their stage's mean;
    what the measured step changes (its messages and waits: a longer step holds the same fill
    and drain as a smaller share); the other steps. None without blocks.

    Rank 1's forward takes 2 s where rank 0's takes 1 s: rank 0 waits through rank 1's longer
    blocks, and the bubble over ideal rises from 0.5 to 8 s / 14 s = 0.57:

    >>> b = [dict(rank=0, stage=0, kind="F", microbatch=0, start_s=0, end_s=1),
    ...      dict(rank=0, stage=0, kind="F", microbatch=1, start_s=1, end_s=2),
    ...      dict(rank=1, stage=1, kind="F", microbatch=0, start_s=1, end_s=3),
    ...      dict(rank=1, stage=1, kind="F", microbatch=1, start_s=3, end_s=5),
    ...      dict(rank=1, stage=1, kind="B", microbatch=0, start_s=5, end_s=7),
    ...      dict(rank=1, stage=1, kind="B", microbatch=1, start_s=7, end_s=9),
    ...      dict(rank=0, stage=0, kind="B", microbatch=0, start_s=7, end_s=9),
    ...      dict(rank=0, stage=0, kind="B", microbatch=1, start_s=9, end_s=11)]
    >>> {k: round(v, 3) for k, v in bubble_split(b, step_s=11, measured=0.6,
    ...                                          over="compute").items()}
    ... # doctest: +NORMALIZE_WHITESPACE
    {'the schedule, equal blocks': 0.5, "the stages' unequal means": 0.071,
     'unequal blocks within a stage': 0.0, "the step's messages and waits": 0.0,
     'the other steps': 0.029}
    """
    if over not in ("compute", "step"):
        raise ValueError(f"over must be 'compute' or 'step', got {over!r}")
    if not isinstance(blocks, list) or not blocks or not math.isfinite(float(measured)):
        return None
    ranks = len({int(b["rank"]) for b in blocks})
    equal, stages, unequal = (_bubble(replayed_bubble(blocks, durations=d), over=over,
                                      ranks=ranks) for d in ("kind", "stage", "measured"))
    mid = timeline_split(blocks, step_start_s=0.0, step_end_s=max(
        float(step_s), max(float(b["end_s"]) for b in blocks)))
    median_step = mid["bubble_s"] / mid["compute_s"] if over == "compute" else mid["bubble_share"]
    return {"the schedule, equal blocks": equal, "the stages' unequal means": stages - equal,
            "unequal blocks within a stage": unequal - stages,
            "the step's messages and waits": median_step - unequal,
            "the other steps": float(measured) - median_step}


def _split(r, *, measured: float, over: str) -> dict | None:
    blocks = getattr(r, "median_step_blocks", None)
    step = getattr(r, "step_time_s", None)
    if not isinstance(blocks, list) or step is None:
        return None
    return bubble_split(blocks, step_s=step, measured=measured, over=over)


def modelled(r) -> bool:
    """Whether a row carries the step model's fill/drain share (``bubble_model``, from
    :func:`labkit.pipeline.report.add_model`; NaN in a frame that mixes rows)."""
    v = getattr(r, "bubble_model", None)
    return v is not None and v == v


def bubble_laws(df, schedules=None, tolerance: float = BUBBLE_TOLERANCE) -> list[dict]:
    """One law-table row per (schedule, M): the fill/drain share of the step read off the
    measured timeline against the same share read off the step model's replayed step
    (``bubble_model``: :func:`labkit.pipeline.report.add_model`), held to an absolute
    ``tolerance``, with its measured split (:func:`bubble_split`, ``over="step"``) and the
    formula's share in its note. A row without the step model is judged against the formula.

    Why the model's share: (P−1)/(P−1+M) is that replay with every block equal, messages,
    waits and the schedule's own work free. On this machine a block also pays a gap of
    0.4-0.9 ms and its messages: where blocks last 0.1-0.5 ms (hidden 256) the step grows
    more than the fill and drain, and the measured share was 0.48-0.72 of the formula's."""
    from labkit.book import laws

    out = []
    for r in select_rows(df, schedule=schedules).itertuples():
        text = bubble_text(r.schedule)
        at = f"{r.schedule} P={r.num_stages} M={r.num_microbatches}"
        if modelled(r):
            name, predicted = f"fill/drain share, the step model's timeline, {at}", r.bubble_model
            note = (f"read off the replayed and the measured timeline alike; the formula {text} "
                    f"says {r.bubble_formula:.3f} ({r.bubble_formula - r.bubble_fill_drain:+.3f} "
                    "from the measured share), the replay with equal blocks and free messages")
        else:
            name, predicted = f"bubble {text}, {at}", r.bubble_formula
            note = "fill/drain share of the step, read off the timeline"
        out.append(laws.check(name, predicted=predicted, measured=r.bubble_fill_drain,
                              kind="model", tolerance_abs=tolerance, note=note,
                              split=_split(r, measured=r.bubble_fill_drain, over="step")))
    return out


def over_ideal_laws(df, schedules=None, tolerance: float = BUBBLE_TOLERANCE) -> list[dict]:
    """The (P−1)/M convention per (schedule, M): fill/drain time over compute time, the same
    idle time as the share, held to the same absolute ``tolerance``, with its measured split
    (:func:`bubble_split`, ``over="compute"``), against the schedule replayed with the stages
    as they ran (:func:`stage_bubble`) and the formula in its note; a row without its median
    step's blocks, against the formula.

    Why the stages' means: on this machine the last stage's blocks, which also compute the
    loss, ran longer than the first's, and the first stage waited through them; against
    (P−1)/M the over-ideal law held 113 of 126 times in 18 lab runs and 41 of 70 in five
    sweeps at hidden 256 and 512, against the stages' means 121 and 63."""
    from labkit.book import laws

    out = []
    for r in select_rows(df, schedule=schedules).itertuples():
        at = f"{r.schedule} P={r.num_stages} M={r.num_microbatches}"
        blocks = getattr(r, "median_step_blocks", None)
        formula, measured = r.bubble_over_ideal_formula, r.bubble_over_ideal_measured
        if isinstance(blocks, list) and blocks:
            name, predicted = f"bubble over ideal, the stages as they ran, {at}", stage_bubble(
                blocks)
            away = f" ({formula - measured:+.3f} from the measured)" if laws.given(
                measured) else ""
            note = ("fill/drain time over compute time; predicted: the median step's order "
                    "replayed, messages free, each stage's blocks at their kind's mean over that "
                    f"step; the formula {over_ideal_text(r.schedule)} says {formula:.3f}{away}")
        else:
            name, predicted = f"bubble over ideal, {at}", formula
            note = "fill/drain time over compute time"
        out.append(laws.check(name, predicted=predicted, measured=measured, kind="model",
                              tolerance_abs=tolerance, note=note,
                              split=_split(r, measured=measured, over="compute")))
    return out
