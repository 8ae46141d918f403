"""The messages of a measured pipeline step, and which of them waited for the scheduler (pure).

A block that needs another rank's block (a forward the previous stage's activation, a backward
the next stage's gradient: :func:`labkit.pipeline.formulas.needs`) waits for a message. On the
step's timeline the message shows as a **delay**: from the later of the producing block's end
and the end of what the receiving rank was busy with before, to the consuming block's start
(:func:`step_messages`, from :func:`arrivals`). A message moves at its transfer's pace, or
it also waits for the scheduler to give one of gloo's threads a core (on a machine whose cores
all compute, about a scheduler tick): :func:`labkit.machine.formulas.counted_waits` tells the
two apart against the transfer the machine profile predicts. :func:`count` counts a step's waits, :func:`wait_share_s`
says how much of the measured step they took (from its timeline), :func:`row_waits` both for a
row of the lab.
"""

from __future__ import annotations

from labkit.machine.formulas import counted_waits
from labkit.pipeline.formulas import needs, own_parts, timeline_split


def _key(b) -> tuple:
    return (b["kind"], int(b["stage"]), int(b["microbatch"]))


def step_messages(blocks) -> list[dict]:
    """Every activation or gradient that crossed to another rank in one step (``blocks``: dicts
    with rank, stage, kind, microbatch, start_s, end_s on one clock), in the order the blocks
    that needed them started: that block's ``kind``, ``stage`` and ``microbatch``,
    ``from_rank``, ``to_rank`` and ``delay_s``: its start minus the later of the producing
    block's end and the end of the blocks its rank ran before (what the rank was busy with).

    GPipe, P = 2, M = 1, ideal: each message arrives the moment it is sent. Rank 0's backward
    starting 4 ms late: its gradient's message took 4 ms.

    >>> from labkit.pipeline.schedules import simulate
    >>> blocks = simulate("gpipe", 2, 1, forward_s=0.01, backward_s=0.02)
    >>> [(m["kind"], m["from_rank"], m["to_rank"], m["delay_s"]) for m in step_messages(blocks)]
    [('F', 0, 1, 0.0), ('B', 1, 0, 0.0)]
    >>> late = [dict(b, start_s=b["start_s"] + 0.004, end_s=b["end_s"] + 0.004)
    ...         if (b["rank"], b["kind"]) == (0, "B") else b for b in blocks]
    >>> [round(m["delay_s"], 6) for m in step_messages(late)]
    [0.0, 0.004]
    """
    out = []
    for b, busy_until, src in arrivals(blocks):
        if src is None or int(src["rank"]) == int(b["rank"]):
            continue
        ready = float(src["end_s"])
        if busy_until is not None:
            ready = max(ready, busy_until)
        out.append({"kind": b["kind"], "stage": int(b["stage"]),
                    "microbatch": int(b["microbatch"]), "from_rank": int(src["rank"]),
                    "to_rank": int(b["rank"]), "delay_s": max(0.0, float(b["start_s"]) - ready)})
    return out


def arrivals(blocks) -> list[tuple[dict, float | None, dict | None]]:
    """Each block of a step in the order the blocks started, with the end of the blocks its
    rank ran before it (None: its rank's first) and the block it waited for
    (:func:`labkit.pipeline.formulas.needs`; None: none, or one the timeline lacks): what
    :func:`step_messages` and :func:`labkit.pipeline.overhead.free_gaps` read a block's wait
    from.

    >>> b = [dict(rank=0, stage=0, kind="F", microbatch=m, start_s=0.011 * m,
    ...           end_s=0.011 * m + 0.01) for m in (0, 1)]
    >>> [(x["microbatch"], busy, src) for x, busy, src in arrivals(b)]
    [(0, None, None), (1, 0.01, None)]
    """
    if not blocks:
        return []
    by_key = {_key(b): b for b in blocks}
    last_stage = max(int(b["stage"]) for b in blocks)
    # per block: the end of the blocks its rank ran before it (None: its rank's first)
    busy_until = {id(p["block"]): p["idle_from_s"] if i else None
                  for mine in own_parts(blocks).values() for i, p in enumerate(mine)}
    return [(b, busy_until[id(b)],
             by_key.get(needs(b["kind"], int(b["stage"]), int(b["microbatch"]), last_stage)))
            for b in sorted(blocks, key=lambda b: float(b["start_s"]))]


def count(messages, *, transfer_s: float) -> dict:
    """Which of a step's messages (:func:`step_messages`) waited for the scheduler, each
    judged against ``transfer_s`` (the profile's transfer of one of them) by
    :func:`labkit.machine.formulas.counted_waits`: ``messages`` (how many), ``count``,
    ``share``, ``excess_s`` (each wait beyond its transfer) and ``waited``: {(kind, stage,
    microbatch) of the block that waited: its excess}.

    >>> got = count([{"kind": "F", "stage": 1, "microbatch": 0, "delay_s": 3e-4},
    ...              {"kind": "B", "stage": 0, "microbatch": 0, "delay_s": 4.1e-3}],
    ...             transfer_s=3e-4)
    >>> got["messages"], got["count"], {k: round(v, 4) for k, v in got["waited"].items()}
    (2, 1, {('B', 0, 0): 0.0038})
    """
    delays = [float(m["delay_s"]) for m in messages]
    got = counted_waits(delays, [transfer_s] * len(delays))
    waited = {_key(m): d - transfer_s for m, d, w in zip(messages, delays, got["flags"]) if w}
    return {"messages": len(delays), **got, "waited": waited}


def wait_share_s(blocks, waited: dict, *, step_end_s: float | None = None) -> float:
    """How much of a measured step (per rank, as the step's split counts it) the messages that
    waited took: the idle time outside the fill and drain (:func:`timeline_split`'s ``other``)
    less what remains of it once the ideal replay knows of the waits (``waited``: {block key:
    the wait beyond its transfer}, :func:`count`), between 0 and all of it. A wait on the
    pipeline's critical path counts whole: every rank's step is that much longer.

    GPipe, P = 2, M = 1, rank 1's forward 4 ms late (its message waited): 4 ms of each rank's
    step.

    >>> from labkit.pipeline.schedules import simulate
    >>> late = [dict(b, start_s=b["start_s"] + 0.004 * (b["rank"] == 1 or b["kind"] == "B"),
    ...              end_s=b["end_s"] + 0.004 * (b["rank"] == 1 or b["kind"] == "B"))
    ...         for b in simulate("gpipe", 2, 1, forward_s=0.01, backward_s=0.02)]
    >>> round(wait_share_s(late, {("F", 1, 0): 0.004}) * 1e3, 6)
    4.0
    """
    if not blocks:
        return 0.0
    p = len({int(b["rank"]) for b in blocks})
    plain = timeline_split(blocks, step_end_s=step_end_s)
    known = timeline_split(blocks, step_end_s=step_end_s, delay_s=waited) if waited else plain
    return max(0.0, min(plain["other_s"] - known["other_s"], plain["other_s"])) / p


def row_waits(row, *, transfer_s: float) -> dict | None:
    """:func:`count` of a lab row's median step (``step_messages``) with the measured share of
    its waits (:func:`wait_share_s` on ``median_step_blocks``, ``measured_s``); None for a
    row that holds no per-message timeline (measured before the lab kept one)."""
    msgs, blocks = row.get("step_messages"), row.get("median_step_blocks")
    if not isinstance(msgs, list):
        return None
    got = count(msgs, transfer_s=transfer_s)
    got["measured_s"] = (wait_share_s(blocks, got["waited"], step_end_s=row.get("step_time_s"))
                         if isinstance(blocks, list) and blocks else 0.0)
    return got
