"""The pipeline lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A row's ``blocks`` are the forward, backward (and weight-gradient) blocks of its last timed
step, every rank's on one clock from the step's start: each block becomes a slice of its
rank's process (``rank R``), on the thread of its row (``gpipe M=4``), at the time the row
holds. The stretches a rank idles between them (from the step's start to its first block,
between blocks, from its last block to the step's end, the last block of any rank) are slices
too, named by what most of the stretch was (:func:`idle_gaps`): ``bubble`` where the ideal
replay of the step idles there as well (fill and drain: the schedule makes the rank wait),
``wait`` where it mostly does not (messages in flight, the scheduler, a stall); both parts are
in the slice's args. An instant marks the step's end on every rank, with the row's bubble
beside its formula.
"""

from __future__ import annotations

from labkit import trace
from labkit.pipeline.formulas import ideal_replay, own_parts

#: stretches shorter than this are rounding, not idling (a trace's times are whole nanoseconds)
RESOLUTION_S = 1e-9

#: a block's kind -> the category of its slice
KIND_CAT = {"F": "forward", "B": "backward", "W": "weight"}


def idle_gaps(blocks, *, step_start_s: float = 0.0, step_end_s: float | None = None) -> list[dict]:
    """Each rank's idle stretches of a step, with ``rank, start_s, end_s`` and their split
    into ``bubble_s`` (what the ideal replay idles at the same place in the rank's order,
    at most the stretch) and ``other_s`` (the rest): the split of
    :func:`labkit.pipeline.formulas.timeline_split`, stretch by stretch, so that each rank's
    stretches add up to its ``per_rank`` seconds there. Stretches shorter than
    :data:`RESOLUTION_S` are left out.

    GPipe, P = 2, M = 1 (forward 1 s, backward 2 s), rank 0's backward 0.5 s late: rank 0
    waits 3.5 s for the gradient (3 s of bubble), rank 1 1 s for the forward and 0.5 s after
    its backward (the late block's end is the step's end).

    >>> blocks = [dict(rank=0, stage=0, kind="F", microbatch=0, start_s=0, end_s=1),
    ...           dict(rank=1, stage=1, kind="F", microbatch=0, start_s=1, end_s=2),
    ...           dict(rank=1, stage=1, kind="B", microbatch=0, start_s=2, end_s=4),
    ...           dict(rank=0, stage=0, kind="B", microbatch=0, start_s=4.5, end_s=6.5)]
    >>> [(g["rank"], g["start_s"], g["end_s"], g["bubble_s"], g["other_s"]) for g in idle_gaps(blocks)]
    [(0, 1.0, 4.5, 3.0, 0.5), (1, 0.0, 1.0, 1.0, 0.0), (1, 4.0, 6.5, 2.0, 0.5)]
    """
    blocks = [dict(b) for b in blocks]
    if not blocks:
        return []
    start = float(step_start_s)
    end = max(float(b["end_s"]) for b in blocks) if step_end_s is None else float(step_end_s)
    # a block inside the one before it counts only its own part
    mine_by_rank = own_parts(blocks, start_s=start)
    placed = ideal_replay(
        {rank: [(p["block"]["kind"], int(p["block"]["stage"]), int(p["block"]["microbatch"]),
                 p["duration_s"]) for p in mine] for rank, mine in mine_by_rank.items()},
        last_stage=max(int(b["stage"]) for b in blocks), start_s=start)
    ideal_end = max(z for _, z in placed.values())
    out = []
    for rank, mine in mine_by_rank.items():
        ideal = [placed[(rank, i)] for i in range(len(mine))]
        before = [start] + [z for _, z in ideal]
        stretches = [(p["idle_from_s"], p["idle_from_s"] + p["gap_s"], a - z)
                     for p, (a, _), z in zip(mine, ideal, before)]
        last = max([start] + [float(p["block"]["end_s"]) for p in mine])
        stretches.append((last, end, ideal_end - ideal[-1][1]))
        for s0, s1, want in stretches:
            if s1 - s0 > RESOLUTION_S:
                bubble = min(s1 - s0, want)
                out.append({"rank": rank, "start_s": s0, "end_s": s1, "bubble_s": bubble,
                            "other_s": (s1 - s0) - bubble})
    return out


def _label(row: dict, twins: bool) -> str:
    """A row's thread name: schedule and M (V where interleaved; the receive placement where
    the launch measured both)."""
    text = f"{row['schedule']} M={int(row['num_microbatches'])}"
    if int(row.get("virtual_stages") or 1) > 1:
        text += f" V={int(row['virtual_stages'])}"
    if twins and row.get("recv_ahead") is not None:
        text += ", receives ahead" if row["recv_ahead"] else ", receives at use"
    return text


def trace_events(rows) -> list[dict]:
    """Chrome trace events of pipeline rows (dicts, or a DataFrame, as
    :func:`labkit.pipeline.run.run` returns them): per row with ``blocks``, a thread of every
    rank holding its blocks and idle stretches as slices (times those of the row, in
    microseconds) and the step's end as an instant; rows without blocks are left out.

    >>> from labkit.pipeline.schedules import simulate
    >>> row = {"schedule": "gpipe", "num_microbatches": 2, "virtual_stages": 1,
    ...        "blocks": simulate("gpipe", 2, 2, forward_s=1e-3, backward_s=2e-3)}
    >>> events = trace_events([row])
    >>> [(e["name"], e["ts"], e["dur"]) for e in trace.slices(events) if e["pid"] == 1]
    [('bubble', 0.0, 1000.0), ('F0', 1000.0, 1000.0), ('F1', 2000.0, 1000.0), ('B0', 3000.0, 2000.0), ('B1', 5000.0, 2000.0), ('bubble', 7000.0, 2000.0)]
    >>> trace.overlaps(events)
    []
    """
    rows = trace.timed_rows(rows, "blocks")
    seen: dict = {}
    for r in rows:
        key = (r["schedule"], r["num_microbatches"], r.get("virtual_stages"))
        seen[key] = seen.get(key, 0) + 1
    threads, ranks, events = {}, set(), []  # events: each row's slices by rank and time
    for tid, row in enumerate(rows, start=1):
        key = (row["schedule"], row["num_microbatches"], row.get("virtual_stages"))
        threads[tid] = _label(row, seen[key] > 1)
        v = int(row.get("virtual_stages") or 1)
        blocks, start = row["blocks"], len(events)
        for b in blocks:
            name = f"{b['kind']}{int(b['microbatch'])}" + (f" s{int(b['stage'])}" if v > 1 else "")
            events.append(trace.event(
                name, cat=KIND_CAT[b["kind"]], start_s=b["start_s"], end_s=b["end_s"],
                pid=b["rank"], tid=tid,
                args={"stage": int(b["stage"]), "microbatch": int(b["microbatch"]),
                      "start_s": float(b["start_s"]), "end_s": float(b["end_s"])}))
        for g in idle_gaps(blocks):
            events.append(trace.event(
                "bubble" if g["bubble_s"] >= g["other_s"] else "wait", cat=trace.IDLE,
                start_s=g["start_s"], end_s=g["end_s"], pid=g["rank"], tid=tid,
                args={"fill_drain_bubble_s": g["bubble_s"], "other_wait_s": g["other_s"]}))
        events[start:] = sorted(events[start:], key=lambda e: (e["pid"], e["ts"]))
        end = max(float(b["end_s"]) for b in blocks)
        mine = sorted({int(b["rank"]) for b in blocks})
        ranks.update(mine)
        summary = {k: row.get(k) for k in ("step_time_s", "bubble_fill_drain", "bubble_formula",
                                            "idle_other") if row.get(k) is not None}
        events += [trace.instant("end of step", at_s=end, pid=r, tid=tid,
                                 args={"step_end_s": end, **summary}) for r in mine]
    return trace.names(sorted(ranks), threads) + events
