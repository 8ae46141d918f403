"""Pipeline bubbles: the formulas (pure, no torch).

P stages (``num_stages``), M microbatches (``num_microbatches``), V virtual stages (model
chunks) per rank for the interleaved schedule. The ideal schedules these formulas describe are
simulated in :mod:`labkit.pipeline.schedules`.

GPipe and 1F1B idle every stage for the same P−1 microbatch slots (fill and drain), so over a
step of M + P − 1 slots the bubble is written two ways, both in use:

* share of the step, :func:`bubble_fraction`: (P − 1) / (P − 1 + M);
* time relative to the ideal (bubble-free) step, :func:`bubble_over_ideal`: (P − 1) / M, as the
  Ultra-Scale Playbook and the zero-bubble paper write it (P = 4, M = 4: 0.75 against 3/7).

Interleaving V chunks per rank makes the fill/drain slots V times shorter; the zero-bubble
schedule ZB-H1 fills them with weight gradients, leaving about a third of them (forward,
input-gradient and weight-gradient passes of equal length). 1F1B does not shrink the bubble;
it caps the activations a stage holds at P microbatches instead of M
(:mod:`labkit.pipeline.activations` counts them).

:func:`timeline_split` reads the bubble off a measured timeline instead: compute, the idle
spent waiting for another rank's compute (fill and drain), and the rest (messages, scheduling).
"""

from __future__ import annotations

from labkit.config import positive_int
from labkit.errors import UsageError

SCHEDULES = ("naive_gpipe", "gpipe", "1f1b", "interleaved", "zero_bubble")


def interleavable(*, num_stages: int, num_microbatches: int) -> bool:
    """Whether the interleaved schedule can run M microbatches on P stages: M a multiple of P
    (Megatron's order sends the microbatches through the chunks in groups of P).

    >>> [interleavable(num_stages=4, num_microbatches=m) for m in (8, 6)]
    [True, False]
    """
    return num_microbatches % num_stages == 0


def _slots(num_stages, num_microbatches, schedule, virtual_stages) -> tuple[int, float]:
    """(P − 1, the bubble-free step in fill/drain slots) for one schedule."""
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    p = positive_int("num_stages", num_stages)
    m = positive_int("num_microbatches", num_microbatches)
    if schedule == "interleaved":
        return p - 1, positive_int("virtual_stages", virtual_stages) * m
    return p - 1, (3 * m if schedule == "zero_bubble" else m)


def bubble_text(schedule: str, virtual_stages: int | None = None) -> str:
    """:func:`bubble_fraction`'s formula as tables, law rows and legends print it; V stays a
    letter unless ``virtual_stages`` is given.

    >>> bubble_text("1f1b"), bubble_text("interleaved"), bubble_text("interleaved", 2)
    ('(P−1)/(P−1+M)', '(P−1)/(V·M+P−1)', '(P−1)/(2M+P−1)')
    >>> bubble_text("zero_bubble")
    '(P−1)/(P−1+3M)'
    """
    if schedule == "interleaved":
        return "(P−1)/(V·M+P−1)" if virtual_stages is None else f"(P−1)/({virtual_stages}M+P−1)"
    return "(P−1)/(P−1+3M)" if schedule == "zero_bubble" else "(P−1)/(P−1+M)"


def over_ideal_text(schedule: str) -> str:
    """:func:`bubble_over_ideal`'s formula as law notes print it.

    >>> over_ideal_text("gpipe"), over_ideal_text("interleaved"), over_ideal_text("zero_bubble")
    ('(P−1)/M', '(P−1)/(V·M)', '(P−1)/(3M)')
    """
    return {"interleaved": "(P−1)/(V·M)", "zero_bubble": "(P−1)/(3M)"}.get(schedule, "(P−1)/M")


def bubble_fraction(*, num_stages: int, num_microbatches: int, schedule: str = "gpipe",
                    virtual_stages: int = 1) -> float:
    """The share of a step each stage idles, by schedule (P stages, M microbatches, V chunks):

    * naive_gpipe, gpipe, 1f1b: (P−1)/(P−1+M) (1F1B idles as long as GPipe, with less memory);
    * interleaved: (P−1)/(V·M+P−1) (the fill/drain slots are V times shorter);
    * zero_bubble (ZB-H1): (P−1)/(P−1+3M) (forward, input and weight gradient equally long).

    P = 8, M = 16: 7/23; P = 4, M = 8, V = 2 interleaved: 3/19.

    >>> round(bubble_fraction(num_stages=8, num_microbatches=16), 4)
    0.3043
    >>> bubble_fraction(num_stages=4, num_microbatches=4, schedule="1f1b")
    0.42857142857142855
    >>> round(bubble_fraction(num_stages=4, num_microbatches=8, schedule="interleaved",
    ...                       virtual_stages=2), 4)
    0.1579
    >>> bubble_fraction(num_stages=2, num_microbatches=3, schedule="zero_bubble")
    0.1
    """
    idle, ideal = _slots(num_stages, num_microbatches, schedule, virtual_stages)
    return idle / (ideal + idle)


def bubble_over_ideal(*, num_stages: int, num_microbatches: int, schedule: str = "gpipe",
                      virtual_stages: int = 1) -> float:
    """Bubble time over the ideal step's time (the other convention): (P−1)/M for GPipe and
    1F1B, (P−1)/(V·M) interleaved, (P−1)/(3M) for zero_bubble (ZB-H1). It is
    b / (1 − b) of :func:`bubble_fraction`'s b, and exceeds 1 when M < P − 1.

    >>> bubble_over_ideal(num_stages=4, num_microbatches=4)
    0.75
    >>> bubble_over_ideal(num_stages=2, num_microbatches=4, schedule="zero_bubble")
    0.08333333333333333
    """
    idle, ideal = _slots(num_stages, num_microbatches, schedule, virtual_stages)
    return idle / ideal


def bubble_time(*, num_stages: int, num_microbatches: int, stage_compute_s: float) -> float:
    """Idle time per step of one stage: (P−1)/M · T, with T = that stage's compute for the
    whole batch (forward + backward of all M microbatches).

    >>> bubble_time(num_stages=4, num_microbatches=8, stage_compute_s=1.0)
    0.375
    """
    if stage_compute_s < 0:
        raise UsageError(f"stage compute time must be >= 0, got {stage_compute_s}")
    p = positive_int("num_stages", num_stages)
    m = positive_int("num_microbatches", num_microbatches)
    return (p - 1) / m * stage_compute_s


def predicted_step_time(*, num_stages: int, num_microbatches: int, slot_s: float,
                        schedule: str = "gpipe", virtual_stages: int = 1) -> float:
    """The step a schedule takes when one microbatch's forward + backward on one stage takes
    ``slot_s`` (t_slot, measured at this M) and messages cost nothing: M · t_slot / (1 − bubble),
    that is (M + P − 1) · t_slot for GPipe and 1F1B.

    >>> predicted_step_time(num_stages=2, num_microbatches=4, slot_s=0.01)
    0.05
    >>> round(predicted_step_time(num_stages=2, num_microbatches=4, slot_s=0.03,
    ...                           schedule="zero_bubble"), 4)
    0.13
    """
    if not slot_s >= 0:
        raise UsageError(f"slot time must be >= 0, got {slot_s}")
    idle, ideal = _slots(num_stages, num_microbatches, schedule, virtual_stages)
    return num_microbatches * slot_s * (ideal + idle) / ideal


def measured_bubble(busy_s_per_rank, step_time_s: float) -> float:
    """bubble = 1 − Σ busy / (P × step time), step time = the slowest rank's.

    >>> measured_bubble([0.5, 0.5], 1.0)
    0.5
    """
    busy = [float(b) for b in busy_s_per_rank]
    if not busy or step_time_s <= 0 or min(busy) < 0:
        raise UsageError("need busy times >= 0 for at least one rank and a step time > 0")
    return 1.0 - sum(busy) / (len(busy) * step_time_s)


def needs(kind: str, stage: int, microbatch: int, last_stage: int):
    """The block whose result this block waits for: a forward the previous stage's forward, a
    backward (input gradient) the next stage's, the last stage's backward its own forward, a
    weight gradient its own input gradient (None: the first stage's forward, which reads data).

    >>> needs("F", 1, 3, 1), needs("B", 0, 3, 1), needs("B", 1, 3, 1), needs("F", 0, 3, 1)
    (('F', 0, 3), ('B', 1, 3), ('F', 1, 3), None)
    """
    if kind == "F":
        return ("F", stage - 1, microbatch) if stage > 0 else None
    if kind == "B":
        return ("B", stage + 1, microbatch) if stage < last_stage else ("F", stage, microbatch)
    return ("B", stage, microbatch)


def ideal_replay(orders, *, last_stage: int, start_s: float = 0.0,
                 delay_s: dict | None = None) -> dict:
    """The ideal run of a pipeline step: each rank runs its blocks in the order given, with the
    durations given, and a block starts as soon as its rank is free and the block it waits for
    (:func:`needs`) has ended. Messages cost nothing and nothing else delays a block; a block
    waited for that is not in ``orders`` at all (a timeline that lost it) holds nothing up.

    ``orders``: {rank: [(kind, stage, microbatch, duration_s), ...]} in each rank's order;
    ``last_stage``: the pipeline's last stage (P·V − 1). Returns {(rank, position in its
    order): (start_s, end_s)} in the order the blocks were placed. Both the ideal schedules
    (:func:`labkit.pipeline.schedules.simulate`) and the ideal replay of a measured step
    (:func:`timeline_split`) are this run. ``delay_s``: {(kind, stage, microbatch): seconds}
    a block starts later than its rank and its input allow (a message that waited).

    GPipe, P = 2, M = 1 (forward 1 s, backward 2 s): rank 1's forward waits for rank 0's, rank
    0's backward for rank 1's; delaying rank 1's forward 0.5 s delays all that follows.

    >>> o = {0: [("F", 0, 0, 1.0), ("B", 0, 0, 2.0)], 1: [("F", 1, 0, 1.0), ("B", 1, 0, 2.0)]}
    >>> ideal_replay(o, last_stage=1)
    {(0, 0): (0.0, 1.0), (1, 0): (1.0, 2.0), (1, 1): (2.0, 4.0), (0, 1): (4.0, 6.0)}
    >>> ideal_replay(o, last_stage=1, delay_s={("F", 1, 0): 0.5})[(0, 1)]
    (4.5, 6.5)
    """
    keys = {(kind, stage, mb) for blocks in orders.values() for kind, stage, mb, _ in blocks}
    ended, placed = {}, {}
    free, pos = dict.fromkeys(orders, start_s), dict.fromkeys(orders, 0)
    total = sum(len(blocks) for blocks in orders.values())
    while len(placed) < total:
        progress = False
        for rank, blocks in orders.items():
            while pos[rank] < len(blocks):
                kind, stage, mb, duration = blocks[pos[rank]]
                need = needs(kind, stage, mb, last_stage)
                if need in keys and need not in ended:
                    break  # its input is not placed yet: another rank first
                t0 = max(free[rank], ended.get(need, start_s)) + (delay_s or {}).get(
                    (kind, stage, mb), 0.0)
                placed[(rank, pos[rank])] = (t0, t0 + duration)
                ended[(kind, stage, mb)] = free[rank] = t0 + duration
                pos[rank] += 1
                progress = True
        if not progress:
            raise UsageError("the blocks wait for each other in a circle: not one schedule's step")
    return placed


def timeline_split(blocks, *, step_start_s: float = 0.0, step_end_s: float | None = None,
                   delay_s: dict | None = None) -> dict:
    """Split a step of P ranks into compute, fill/drain bubble and the rest, from its blocks.

    ``blocks``: dicts with ``rank, stage, kind ("F", "B" or "W"), microbatch, start_s, end_s``
    on one clock (the worker's, or :func:`labkit.pipeline.schedules.simulate`'s). The step is
    replayed ideally (:func:`ideal_replay`): the same blocks, in each rank's measured order, with
    their measured durations, but messages that cost nothing. Each idle stretch of a rank (step
    start to its first block, between blocks, its last block to the step end) is split in two:

    * **bubble** (fill and drain): as much of it as the rank idles at the same place in the
      ideal replay, waiting for a result the schedule makes it wait for (the first microbatch,
      the last gradient). With equal blocks this is (P−1)/(P−1+M) of the ideal step;
    * **other**: the rest: messages on their way, the scheduler's own work, a stall of the whole
      pipeline, and every delay these cause further down the schedule.

    Returns totals over ranks (``compute_s``, ``bubble_s``, ``other_s``), their shares of
    P × the measured step (``compute_share``, ``bubble_share``, ``other_share``; they sum to
    1), the step (``step_s``) and ``per_rank``: the same seconds for each rank. ``step_end_s``:
    the last block's end when not given. ``delay_s`` (:func:`ideal_replay`'s) puts delays the
    replay should count as known into it: what they explain leaves ``other``.

    GPipe, P = 2, M = 1 (forward 1 s, backward 2 s): rank 1 waits 1 s for the forward and 2 s
    for rank 0's backward, rank 0 3 s for the gradient. With a 0.5 s message before rank 0's
    backward, each rank idles 0.5 s more, and that is 'other':

    >>> ideal = [dict(rank=0, stage=0, kind="F", microbatch=0, start_s=0, end_s=1),
    ...          dict(rank=1, stage=1, kind="F", microbatch=0, start_s=1, end_s=2),
    ...          dict(rank=1, stage=1, kind="B", microbatch=0, start_s=2, end_s=4),
    ...          dict(rank=0, stage=0, kind="B", microbatch=0, start_s=4, end_s=6)]
    >>> s = timeline_split(ideal)
    >>> s["compute_s"], s["bubble_s"], s["other_s"], s["bubble_share"]
    (6.0, 6.0, 0.0, 0.5)
    >>> late = ideal[:3] + [dict(ideal[3], start_s=4.5, end_s=6.5)]
    >>> s = timeline_split(late)
    >>> s["bubble_s"], s["other_s"], [r["other_s"] for r in s["per_rank"]]
    (6.0, 1.0, [0.5, 0.5])
    """
    blocks = [dict(b) for b in blocks]
    if not blocks:
        raise UsageError("timeline_split needs at least one block")
    for b in blocks:
        if b["kind"] not in ("F", "B", "W") or not b["end_s"] >= b["start_s"]:
            raise UsageError(f"a block needs kind F, B or W and end_s >= start_s, got {b}")
    start = float(step_start_s)
    first = min(float(b["start_s"]) for b in blocks)
    last = max(float(b["end_s"]) for b in blocks)
    end = last if step_end_s is None else float(step_end_s)
    if end < last or start > first:
        raise UsageError(f"the step [{start}, {end}] must hold every block (they span "
                         f"[{first}, {last}])")
    last_stage = max(int(b["stage"]) for b in blocks)
    ranks = sorted({int(b["rank"]) for b in blocks})
    mine_by_rank = own_parts(blocks, start_s=start)
    placed = ideal_replay(
        {rank: [(m["block"]["kind"], int(m["block"]["stage"]), int(m["block"]["microbatch"]),
                 m["duration_s"]) for m in mine] for rank, mine in mine_by_rank.items()},
        last_stage=last_stage, start_s=start, delay_s=delay_s)
    ideal_step_end = max(z for _, z in placed.values())
    per_rank = []
    for rank in ranks:
        mine = mine_by_rank[rank]
        ideal = [placed[(rank, i)] for i in range(len(mine))]
        # (measured, ideal) idle before each block, then after the last one to the step's end
        gaps = [(m["gap_s"], a - z_before) for m, (a, _), z_before
                in zip(mine, ideal, [start] + [z for _, z in ideal])]
        gaps.append((end - max(float(m["block"]["end_s"]) for m in mine),
                     ideal_step_end - ideal[-1][1]))
        bubble = sum(min(measured, want) for measured, want in gaps)
        per_rank.append({"rank": rank, "compute_s": sum(m["duration_s"] for m in mine),
                         "bubble_s": bubble, "other_s": sum(g for g, _ in gaps) - bubble})
    total = len(per_rank) * (end - start)
    out = {k: sum(r[k] for r in per_rank) for k in ("compute_s", "bubble_s", "other_s")}
    shares = {k.replace("_s", "_share"): (v / total if total > 0 else 0.0) for k, v in out.items()}
    return {**out, **shares, "step_s": end - start, "per_rank": per_rank}


def own_parts(blocks, *, start_s: float | None = None) -> dict[int, list[dict]]:
    """Each rank's blocks in their measured order, ``{rank: [{"block", "idle_from_s",
    "gap_s", "duration_s"}, ...]}``: where the rank's idle time before each block starts
    (``start_s``, default the rank's first block's start, or the end of what the rank ran
    before), how long it lasts and the block's own duration. A block recorded inside the one
    before it (zero bubble's W inside its B) counts only its own part.

    >>> b = [dict(rank=0, kind="B", start_s=0.0, end_s=2.0),
    ...      dict(rank=0, kind="W", start_s=1.5, end_s=3.0),
    ...      dict(rank=0, kind="F", start_s=3.5, end_s=4.0)]
    >>> [(p["block"]["kind"], p["idle_from_s"], p["gap_s"], p["duration_s"])
    ...  for p in own_parts(b)[0]]
    [('B', 0.0, 0.0, 2.0), ('W', 2.0, 0.0, 1.0), ('F', 3.0, 0.5, 0.5)]
    """
    out = {}
    for rank in sorted({int(b["rank"]) for b in blocks}):
        mine = sorted((b for b in blocks if int(b["rank"]) == rank),
                      key=lambda b: float(b["start_s"]))
        cursor, parts = float(mine[0]["start_s"]) if start_s is None else float(start_s), []
        for b in mine:
            s0, s1 = float(b["start_s"]), float(b["end_s"])
            parts.append({"block": b, "idle_from_s": cursor, "gap_s": max(0.0, s0 - cursor),
                          "duration_s": max(0.0, s1 - max(s0, cursor))})
            cursor = max(cursor, s1)
        out[rank] = parts
    return out


def block_overlaps(blocks) -> list[float]:
    """For each block (dicts with ``rank, start_s, end_s``), the share of its time during which
    another rank was computing too (0: it ran alone; 1: another rank computed throughout). What
    the co-run slowdown acts on: two ranks computing at once share caches, memory bandwidth and,
    on a busy host, cores.

    >>> b = [dict(rank=0, start_s=0, end_s=2), dict(rank=1, start_s=1, end_s=3)]
    >>> block_overlaps(b)
    [0.5, 0.5]
    """
    spans = {}
    for b in blocks:
        spans.setdefault(int(b["rank"]), []).append((float(b["start_s"]), float(b["end_s"])))
    out = []
    for b in blocks:
        s0, s1 = float(b["start_s"]), float(b["end_s"])
        others = sorted(s for r, mine in spans.items() if r != int(b["rank"]) for s in mine)
        covered, cursor = 0.0, s0
        for a, z in others:  # union of the other ranks' blocks inside [s0, s1]
            a, z = max(a, cursor), min(z, s1)
            if z > a:
                covered += z - a
                cursor = z
        out.append(covered / (s1 - s0) if s1 > s0 else 0.0)
    return out


#: a block that shared at most this share of its time with another rank's compute ran "alone"
ALONE_OVERLAP = 0.1


def block_times(steps) -> list[dict]:
    """Per (rank, kind) of a pipeline's timed steps (each a list of blocks on one clock): the
    median duration of the blocks that ran alone (another rank computing for at most
    :data:`ALONE_OVERLAP` of their time; None when none did), the median of all of them and
    their median overlap (:func:`block_overlaps`). The alone times are what the step model
    (:func:`model_step`) starts from; the fill and drain are where a pipeline runs blocks alone.

    >>> s = [dict(rank=0, kind="F", start_s=0, end_s=1), dict(rank=1, kind="F", start_s=1,
    ...                                                   end_s=2.5)]
    >>> [(t["rank"], t["kind"], t["alone_s"]) for t in block_times([s])]
    [(0, 'F', 1.0), (1, 'F', 1.5)]
    """
    import statistics

    seen = {}
    for blocks in steps:
        for b, f in zip(blocks, block_overlaps(blocks)):
            d = float(b["end_s"]) - float(b["start_s"])
            seen.setdefault((int(b["rank"]), b["kind"]), []).append((d, f))
    out = []
    for (rank, kind), got in sorted(seen.items()):
        alone = [d for d, f in got if f <= ALONE_OVERLAP]
        out.append({"rank": rank, "kind": kind,
                    "alone_s": statistics.median(alone) if alone else None,
                    "median_s": statistics.median(d for d, _ in got),
                    "overlap": statistics.median(f for _, f in got)})
    return out


def alone_seconds(times, *, slowdown: float) -> dict:
    """{(rank, kind): seconds one block takes alone} from :func:`block_times`: the blocks that
    ran alone where there were any; else the median block taken back to alone through the
    co-run ``slowdown`` over its median overlap f (d / (1 + (slowdown − 1) f)).

    >>> alone_seconds([{"rank": 0, "kind": "W", "alone_s": None, "median_s": 1.25,
    ...                 "overlap": 1.0}], slowdown=1.25)
    {(0, 'W'): 1.0}
    """
    out = {}
    for t in times:
        if t["alone_s"] is not None:
            out[(int(t["rank"]), t["kind"])] = float(t["alone_s"])
        else:
            out[(int(t["rank"]), t["kind"])] = float(t["median_s"]) / (
                1 + (slowdown - 1) * float(t["overlap"]))
    return out


def corun_replay(orders, *, last_stage: int, rank_of_stage: dict, slowdown: dict,
                 message_s: float = 0.0, wait_s: dict | None = None,
                 gap_s: float = 0.0) -> dict:
    """A pipeline step on a machine whose ranks slow each other down: like
    :func:`ideal_replay` (each rank runs its blocks in its order, a block starts once its rank
    is free and the block it waits for has ended), but a block that waits for another rank's
    block starts ``message_s`` (and ``gap_s``, below) after that block ended, and while k
    ranks compute at once each advances at 1 / ``slowdown[k]`` of its alone speed
    (``slowdown[1]`` = 1).
    ``wait_s``: {(kind, stage, microbatch): seconds} a block waits beyond its rank being free
    and its message arrived (a message that waited for the scheduler). ``gap_s``: the
    schedule's own work between two blocks of a rank (:mod:`labkit.pipeline.overhead`): a
    block after a rank's first starts no sooner than ``gap_s`` after the rank's last one ended,
    and a block that waits for another rank's starts ``message_s + gap_s`` after that block
    ended (the work does not overlap the wait: the send is posted and the received tensor taken
    in around the message).

    ``orders``: {rank: [(kind, stage, microbatch, alone_seconds), ...]}. Returns the same map
    as :func:`ideal_replay`: {(rank, position): (start_s, end_s)}.

    GPipe, P = 2, M = 2, F 1 s and B 2 s alone, a 1.5x co-run slowdown, messages 0.1 s: rank
    0's second forward runs beside rank 1's first, rank 1's second backward beside rank 0's
    first, each slowed down, and four messages lie on the way.

    >>> o = {r: [("F", r, 0, 1.0), ("F", r, 1, 1.0), ("B", r, 0, 2.0), ("B", r, 1, 2.0)]
    ...      for r in (0, 1)}
    >>> p = corun_replay(o, last_stage=1, rank_of_stage={0: 0, 1: 1},
    ...                  slowdown={1: 1.0, 2: 1.5}, message_s=0.1)
    >>> round(max(z for _, z in p.values()), 3)
    10.6
    >>> p = corun_replay(o, last_stage=1, rank_of_stage={0: 0, 1: 1}, slowdown={1: 1.0, 2: 1.0})
    >>> max(z for _, z in p.values())  # no slowdown, free messages: (M + P − 1)(F + B)
    9.0
    >>> p = corun_replay(o, last_stage=1, rank_of_stage={0: 0, 1: 1}, slowdown={1: 1.0, 2: 1.0},
    ...                  wait_s={("F", 1, 0): 0.25})  # on the critical path: all of it
    >>> max(z for _, z in p.values())
    9.25
    >>> p = corun_replay(o, last_stage=1, rank_of_stage={0: 0, 1: 1}, slowdown={1: 1.0, 2: 1.0},
    ...                  gap_s=0.5)  # five gaps on the way, two of them beside a message
    >>> max(z for _, z in p.values())
    11.5
    """
    keys = {(kind, stage, mb) for blocks in orders.values() for kind, stage, mb, _ in blocks}
    ended, placed, running = {}, {}, {}
    pos, free = dict.fromkeys(orders, 0), dict.fromkeys(orders, 0.0)
    total = sum(len(blocks) for blocks in orders.values())
    t = 0.0
    while len(placed) < total:
        pending = []
        for rank, blocks in orders.items():
            if rank in running or pos[rank] >= len(blocks):
                continue
            kind, stage, mb, work = blocks[pos[rank]]
            need = needs(kind, stage, mb, last_stage)
            if need in keys and need not in ended:
                continue
            ready = 0.0
            if need in ended:
                far = rank_of_stage[need[1]] != rank
                ready = ended[need] + (message_s + gap_s if far else 0.0)
            if pos[rank]:  # the schedule's own work between two blocks of a rank
                ready = max(ready, free[rank] + gap_s)
            if (kind, stage, mb) in (wait_s or {}):
                ready = max(ready, free[rank]) + wait_s[(kind, stage, mb)]
            if ready <= t + 1e-15:
                running[rank] = [pos[rank], t, float(work)]
            else:
                pending.append(ready)
        if not running:
            if not pending:
                raise UsageError("the blocks wait for each other in a circle: not one "
                                 "schedule's step")
            t = min(pending)
            continue
        rate = 1.0 / slowdown.get(len(running), max(slowdown.values()))
        dt = min(work for _, _, work in running.values()) / rate
        if pending:
            dt = min(dt, min(pending) - t)
        t += dt
        for rank in list(running):
            i, t0, work = running[rank]
            work -= dt * rate
            if work <= 1e-12:
                kind, stage, mb, _ = orders[rank][i]
                placed[(rank, i)] = (t0, t)
                ended[(kind, stage, mb)] = free[rank] = t
                pos[rank] += 1
                del running[rank]
            else:
                running[rank][2] = work
    return placed
