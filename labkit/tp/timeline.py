"""The time inside a rank's collectives, split from the ranks' timelines (pure: no torch).

A collective cannot finish on any rank before the last rank has entered it. So the time one
rank spends inside a call is two things: the **wait** for the ranks that enter after it (the
ranks arriving at different times: one computed longer, or lost its core for a moment) and the
**message** itself, from the last rank's entry to this rank's exit. Both are read from every
rank's entry and exit times of every call (:meth:`labkit.tp.models.Comm.timeline`)::

    wait_r    = max_q(entry_q) − entry_r        (at least 0, at most the time inside)
    message_r = exit_r − entry_r − wait_r

The two add up to the time inside, call by call. Ranks on one host read one clock; ranks on
several hosts (or CUDA events, each rank's from its own first event) do not, and are put on
rank 0's clock by the median offset of their exits: every rank leaves a collective at nearly
the same moment, one message latency apart.
"""

from __future__ import annotations

import statistics

from labkit import trace


def clock_offsets(timelines) -> list[float]:
    """Per rank, the median of (its exit − rank 0's exit) over the calls: what to subtract from
    its times to put them on rank 0's clock.

    >>> clock_offsets([[(0.0, 1.0), (2.0, 3.0)], [(10.5, 11.0), (12.0, 13.0)]])
    [0.0, 10.0]
    """
    first = [b for _, b in timelines[0]]
    return [statistics.median(b - b0 for (_, b), b0 in zip(tl, first)) if tl else 0.0
            for tl in timelines]


def split_waits(timelines, *, shared_clock: bool = True) -> list[dict]:
    """Per rank: seconds ``inside`` its collectives, of which ``wait`` for later ranks and
    ``message`` (the rest), summed over the calls. ``timelines[r]`` is rank r's list of
    (entry, exit), the same calls in the same order on every rank; ``shared_clock=False``
    aligns the ranks' clocks by their exits (:func:`clock_offsets`).

    Two calls on two ranks: rank 1 enters the first 3 ms late, rank 0 the second 1 ms late;
    each message takes 1 ms after the last entry.

    >>> r = split_waits([[(0.000, 0.004), (0.010, 0.012)], [(0.003, 0.004), (0.009, 0.012)]])
    >>> [{k: round(v * 1e3, 3) for k, v in x.items()} for x in r]
    [{'inside': 6.0, 'wait': 3.0, 'message': 3.0}, {'inside': 4.0, 'wait': 1.0, 'message': 3.0}]
    """
    timelines = [list(tl) for tl in timelines]
    if len({len(tl) for tl in timelines}) > 1:
        raise ValueError("every rank's timeline must hold the same calls: got "
                         f"{[len(tl) for tl in timelines]}")
    offsets = [0.0] * len(timelines) if shared_clock else clock_offsets(timelines)
    out = [{"inside": 0.0, "wait": 0.0, "message": 0.0} for _ in timelines]
    for calls in zip(*timelines):
        entries = [a - off for (a, _), off in zip(calls, offsets)]
        last = max(entries)
        for r, ((a, b), entry) in enumerate(zip(calls, entries)):
            inside = b - a
            wait = min(max(last - entry, 0.0), max(inside, 0.0))
            out[r]["inside"] += inside
            out[r]["wait"] += wait
            out[r]["message"] += inside - wait
    return out


def slowest(splits: list[dict]) -> dict:
    """The split of the rank that spent the longest inside its collectives (the one a step
    waits for in the end).

    >>> slowest([{"inside": 6.0, "wait": 3.0, "message": 3.0},
    ...          {"inside": 4.0, "wait": 1.0, "message": 3.0}])["wait"]
    3.0
    """
    return max(splits, key=lambda s: s["inside"])


#: a step's collectives by operation: the category of their message slices
OP_CAT = {"all_reduce": "all-reduce", "all_gather": "all-gather",
          "reduce_scatter": "reduce-scatter"}


def step_slices(records, *, shared_clock: bool = True) -> list[dict]:
    """One timed step of every rank as slices on one clock (rank 0's step start at 0):
    ``rank, name, cat, start_s, end_s``. ``records[r]`` is rank r's step
    (:meth:`labkit.tp.comm.Comm.step_record`: ``origin_s``, ``end_s``, ``calls`` with ``op,
    name, before, entry_s, exit_s`` from its step start, and ``tail``). Ranks on one clock
    (``shared_clock``) are shifted by their starts; otherwise by the median offset of their
    exits (:func:`clock_offsets`). Each call becomes its **wait** for the last rank to enter
    (category ``idle``, name ``wait``) and its **message** (named by the call, its category
    the operation's, :data:`OP_CAT`), as :func:`split_waits` splits it; the time between two
    calls is a **compute** slice named by the call's ``before``, the time after the last
    ``tail``.

    Two ranks, one all-reduce: rank 1 starts 1 ms later and enters 3 ms after rank 0.

    >>> rec = [{"origin_s": 10.000, "end_s": 0.008, "tail": "rest", "calls": [dict(op="all_reduce",
    ...         name="g L0", before="fwd", entry_s=0.002, exit_s=0.006)]},
    ...        {"origin_s": 10.001, "end_s": 0.007, "tail": "rest", "calls": [dict(op="all_reduce",
    ...         name="g L0", before="fwd", entry_s=0.004, exit_s=0.005)]}]
    >>> [(s["rank"], s["name"], s["cat"], round(s["start_s"] * 1e3, 3), round(s["end_s"] * 1e3, 3))
    ...  for s in step_slices(rec)]
    [(0, 'fwd', 'compute', 0.0, 2.0), (0, 'wait', 'idle', 2.0, 5.0), (0, 'g L0', 'all-reduce', 5.0, 6.0), (0, 'rest', 'compute', 6.0, 8.0), (1, 'fwd', 'compute', 1.0, 5.0), (1, 'g L0', 'all-reduce', 5.0, 6.0), (1, 'rest', 'compute', 6.0, 8.0)]
    """
    records = [dict(r) for r in records]
    if len({len(r["calls"]) for r in records}) > 1:
        raise ValueError("every rank's step must hold the same calls: got "
                         f"{[len(r['calls']) for r in records]}")
    if shared_clock:
        shift = trace.start_offsets([r["origin_s"] for r in records], [0] * len(records))
    else:  # rank 0's clock: each rank's exits, median over the calls, onto rank 0's
        exits = [[(c["entry_s"], c["exit_s"]) for c in r["calls"]] for r in records]
        shift = [-off for off in clock_offsets(exits)] if records[0]["calls"] else [0.0] * len(
            records)
        shift = [x - min(shift) for x in shift]  # the earliest start at 0: no time before it
    entries = [[c["entry_s"] + shift[r] for c in rec["calls"]] for r, rec in enumerate(records)]
    last = [max(column) for column in zip(*entries)]
    out = []
    for r, rec in enumerate(records):
        cursor = shift[r]
        for k, c in enumerate(rec["calls"]):
            a, b = entries[r][k], c["exit_s"] + shift[r]
            mid = min(max(last[k], a), b)
            out.append({"rank": r, "name": c["before"], "cat": "compute", "start_s": cursor,
                        "end_s": max(cursor, a)})
            if mid > a:
                out.append({"rank": r, "name": "wait", "cat": "idle", "start_s": a, "end_s": mid})
            out.append({"rank": r, "name": c["name"], "cat": OP_CAT.get(c["op"], c["op"]),
                        "start_s": mid, "end_s": b})
            cursor = b
        out.append({"rank": r, "name": rec["tail"], "cat": "compute", "start_s": cursor,
                    "end_s": max(cursor, rec["end_s"] + shift[r])})
    return out
