"""The ideal pipeline schedule (pure, no torch): who runs which forward and backward when.

:func:`simulate` plays the order each rank runs (``_order``, the order of
``torch.distributed.pipelining``'s schedules) with equal stages and no communication cost; its
idle fraction is the formula's (:func:`labkit.pipeline.formulas.bubble_fraction`), and
:func:`labkit.pipeline.plots.schedule_diagram` draws it beside a measured step.
:func:`stage_layers` is how the lab splits the layers into stages.
"""

from __future__ import annotations

from labkit.config import positive_int
from labkit.errors import UsageError
from labkit.pipeline.formulas import SCHEDULES, corun_replay, ideal_replay, interleavable


def _order(schedule: str, p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, microbatch, chunk) order one rank runs, as the torch schedules do."""
    if schedule in ("naive_gpipe", "gpipe"):
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "zero_bubble":
        return _zero_bubble_order(p, m, rank)
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


def _zero_bubble_order(p: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """ZB-H1 (torch's ScheduleInterleavedZeroBubble with one stage per rank): 1F1B whose
    backward is split into B (input gradient, sent on at once) and W (weight gradient); rank r
    holds back r weight gradients and runs them in the drain, where 1F1B would idle."""
    warm = min(p - 1 - rank, m)
    out = [("F", i, 0) for i in range(warm)]
    w = 0
    for k in range(m):  # k-th input gradient, with the next forward while there is one
        if warm + k < m:
            out.append(("F", warm + k, 0))
        out.append(("B", k, 0))
        if k >= rank:
            out.append(("W", w, 0))
            w += 1
    return out + [("W", i, 0) for i in range(w, m)]


def simulate(schedule: str, num_stages: int, num_microbatches: int, *, virtual_stages: int = 1,
             forward_s: float = 1.0, backward_s: float = 2.0) -> list[dict]:
    """Blocks of an ideal run (no communication cost, equal stages): one dict per forward or
    backward of a microbatch on a rank, with ``rank, stage, kind, microbatch, start_s, end_s``.

    Each rank runs the order torch's schedule gives it (``_order``), played by
    :func:`labkit.pipeline.formulas.ideal_replay`: a chunk's forward waits for the previous
    stage's forward of that microbatch; its backward for the next stage's backward. With V
    chunks per rank each takes 1/V of the time.
    ``zero_bubble`` splits each backward into B (input gradient) and W (weight gradient), each
    half of ``backward_s``; W waits for its own B only.

    GPipe on 2 stages with 1 microbatch: each rank works 3 of 6 slots, the bubble is 1/2.

    >>> from labkit.pipeline.formulas import measured_bubble
    >>> b = simulate("gpipe", 2, 1)
    >>> step = max(x["end_s"] for x in b)
    >>> busy = [sum(x["end_s"] - x["start_s"] for x in b if x["rank"] == r) for r in (0, 1)]
    >>> step, measured_bubble(busy, step)
    (6.0, 0.5)

    Zero bubble on 2 stages with 4 microbatches: 13 slots instead of 1F1B's 15.

    >>> max(x["end_s"] for x in simulate("zero_bubble", 2, 4))
    13.0
    """
    p = positive_int("num_stages", num_stages)
    m = positive_int("num_microbatches", num_microbatches)
    v = positive_int("virtual_stages", virtual_stages) if schedule == "interleaved" else 1
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule == "interleaved" and not interleavable(num_stages=p, num_microbatches=m):
        raise UsageError(f"the interleaved schedule needs M a multiple of P (M={m}, P={p})")
    split = schedule == "zero_bubble"
    duration = {"F": forward_s, "B": backward_s / 2 if split else backward_s, "W": backward_s / 2}
    orders = {r: [(kind, chunk * p + r, mb, duration[kind] / v)
                  for kind, mb, chunk in _order(schedule, p, m, v, r)] for r in range(p)}
    try:
        placed = ideal_replay(orders, last_stage=p * v - 1)
    except UsageError as e:  # an order of ours that deadlocks: a bug here, not bad input
        raise RuntimeError(f"schedule {schedule} P={p} M={m} V={v} deadlocks") from e
    return _as_blocks(orders, placed)


def _as_blocks(orders, placed) -> list[dict]:
    """A replay's {(rank, position): (start_s, end_s)} as block dicts (rank, stage, kind,
    microbatch, start_s, end_s), in the replay's order."""
    return [{"rank": r, "stage": orders[r][i][1], "kind": orders[r][i][0],
             "microbatch": orders[r][i][2], "start_s": start, "end_s": end}
            for (r, i), (start, end) in placed.items()]


def stage_layers(num_layers: int, num_chunks: int) -> list[range]:
    """Split layers 0..L−1 into contiguous, near-equal stages (the first ones take the extra).

    >>> stage_layers(10, 4)
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    n, c = positive_int("layers", num_layers), positive_int("stages", num_chunks)
    if n < c:
        raise UsageError(f"{n} layers cannot fill {c} stages")
    bounds = [k * (n // c) + min(k, n % c) for k in range(c + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(c)]


def model_step(schedule: str, num_stages: int, num_microbatches: int, *, alone: dict,
               slowdown: dict, message_s: float, virtual_stages: int = 1,
               wait_s: dict | None = None, gap_s: float = 0.0) -> float:
    """The step this machine should take: the end of the last block of :func:`model_blocks`.

    With no slowdown and free messages it is the ideal schedule: (M + P − 1)(F + B) for GPipe.

    >>> alone = {(r, k): d for r in (0, 1) for k, d in (("F", 1.0), ("B", 2.0))}
    >>> model_step("gpipe", 2, 4, alone=alone, slowdown={1: 1.0, 2: 1.0}, message_s=0.0)
    15.0
    >>> model_step("gpipe", 2, 4, alone=alone, slowdown={1: 1.0, 2: 1.25}, message_s=0.0) > 15
    True
    >>> model_step("gpipe", 2, 4, alone=alone, slowdown={1: 1.0, 2: 1.0}, message_s=0.0,
    ...            wait_s={("B", 0, 3): 0.5})  # the last gradient: on the critical path
    15.5
    """
    return max(b["end_s"] for b in model_blocks(
        schedule, num_stages, num_microbatches, alone=alone, slowdown=slowdown,
        message_s=message_s, virtual_stages=virtual_stages, wait_s=wait_s, gap_s=gap_s))


def model_blocks(schedule: str, num_stages: int, num_microbatches: int, *, alone: dict,
                 slowdown: dict, message_s: float, virtual_stages: int = 1,
                 wait_s: dict | None = None, gap_s: float = 0.0) -> list[dict]:
    """The step this machine should take, block by block (dicts as :func:`simulate`'s): each
    rank runs torch's order for the schedule (``_order``), every block its measured alone time
    (``alone``: {(rank, kind): seconds}, :func:`labkit.pipeline.formulas.alone_seconds`),
    slowed down by ``slowdown[k]`` while k ranks compute at once (the machine profile's co-run
    slowdown), every activation or gradient that crosses to another rank ``message_s`` on its
    way, the schedule's own work ``gap_s`` between two blocks of a rank and beside each such
    message (:func:`labkit.pipeline.formulas.corun_replay`), and the blocks named in ``wait_s``
    ({(kind, stage, microbatch): seconds}: messages that waited for the scheduler) that much
    longer once their rank is free and their message has arrived. Read by the same
    :func:`labkit.pipeline.formulas.timeline_split` as a measured step, it is the model's
    fill/drain share.

    GPipe, P = 2, M = 1, F 1 s and B 2 s: rank 1's forward starts when rank 0's has ended and
    its message (0.5 s) arrived.

    >>> alone = {(r, k): d for r in (0, 1) for k, d in (("F", 1.0), ("B", 2.0))}
    >>> [(b["rank"], b["kind"], b["start_s"], b["end_s"]) for b in model_blocks(
    ...     "gpipe", 2, 1, alone=alone, slowdown={1: 1.0, 2: 1.0}, message_s=0.5)]
    [(0, 'F', 0.0, 1.0), (1, 'F', 1.5, 2.5), (1, 'B', 2.5, 4.5), (0, 'B', 5.0, 7.0)]
    """
    p = positive_int("num_stages", num_stages)
    m = positive_int("num_microbatches", num_microbatches)
    v = positive_int("virtual_stages", virtual_stages) if schedule == "interleaved" else 1
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    orders = {r: [(kind, chunk * p + r, mb, alone.get((r, kind), 0.0))
                  for kind, mb, chunk in _order(schedule, p, m, v, r)] for r in range(p)}
    placed = corun_replay(orders, last_stage=p * v - 1,
                          rank_of_stage={s: s % p for s in range(p * v)}, slowdown=slowdown,
                          message_s=message_s, wait_s=wait_s, gap_s=gap_s)
    return _as_blocks(orders, placed)
