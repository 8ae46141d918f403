"""The collectives lab's calls on one clock, and its rows as a Chrome trace (pure: no torch).

Per size the worker times ``iters`` calls back to back after one barrier, every rank reading
the clock at the barrier's exit and after each call (:mod:`labkit.collectives.worker`): call
k runs on that rank from reading k - 1 to reading k. :func:`one_clock` puts the ranks'
readings on one clock and :func:`call_timeline` makes them the row's ``timeline_s`` (and
``busy_timeline_s`` for the all-reduce timed while every core computes): per rank, each of the
first :data:`TRACED_CALLS` timed calls' start and end, in seconds from the sweep's start. The
warm-up calls before the barrier are not timed and are in no timeline.

:func:`trace_events` makes each row's timeline a thread of every rank's process (``rank R``),
one slice per call, so that Perfetto shows the sweep as a staircase of threads, one per
(op, size). An all-reduce (as every op whose ranks all need data from every rank) ends on a
rank only once the last rank has joined it, so a rank that starts a call earlier than another
waits inside it: its slice is the longer one, and the start of the last rank's slice is where
the exchange could begin.
"""

from __future__ import annotations

import math

import numpy as np

from labkit import trace
from labkit.collectives.config import BUSY_CALLS_PER_ITER
from labkit.collectives.verdicts import size_text

#: timed calls per size a row keeps in its timeline (the first ones): a bound on the rows and
#: on a trace file whatever ``iters`` is (every call of the default sweeps)
TRACED_CALLS = 32


def one_clock(stamps, *, same_host: bool) -> np.ndarray:
    """Every rank's clock readings ``stamps`` (one row per rank: its barrier exit, then the
    end of each call) on one clock. On one host they are one already (``time.perf_counter``
    is the machine's monotonic clock); across hosts each rank's readings are shifted so that
    its barrier exit is rank 0's, the one moment the ranks share (their gaps then are only
    those after the barrier).

    >>> one_clock([[10.0, 10.5], [9.0, 9.75]], same_host=True).tolist()
    [[10.0, 10.5], [9.0, 9.75]]
    >>> one_clock([[10.0, 10.5], [9.0, 9.75]], same_host=False).tolist()
    [[10.0, 10.5], [10.0, 10.75]]
    """
    stamps = np.asarray(stamps, dtype=np.float64)
    if stamps.ndim != 2 or stamps.shape[1] < 1:
        raise ValueError(f"stamps must be (ranks, readings), got shape {stamps.shape}")
    # one host: the offsets of :func:`labkit.trace.start_offsets` from the first barrier exit
    # put every reading back where it was; across hosts each exit lands on rank 0's
    hosts = [0] * len(stamps) if same_host else list(range(len(stamps)))
    offsets = np.asarray(trace.start_offsets(stamps[:, 0], hosts))
    base = stamps[0, 0] - offsets[0]
    return stamps - stamps[:, :1] + (offsets + base)[:, None]


def call_timeline(stamps, *, origin_s: float, limit: int = TRACED_CALLS) -> list[dict]:
    """The timed calls of one size, rank by rank: ``rank``, ``call`` (1, 2, ...), ``start_s``
    and ``end_s`` in seconds from ``origin_s``, for the first ``limit`` calls. ``stamps``: the
    ranks' readings on one clock (:func:`one_clock`); back to back, call k of rank r runs
    from ``stamps[r][k - 1]`` to ``stamps[r][k]``, so its duration is what the row's times
    are made of.

    >>> [(c["rank"], c["call"], c["start_s"], c["end_s"])
    ...  for c in call_timeline([[10.0, 10.5, 11.0], [10.25, 10.5, 11.0]], origin_s=10.0)]
    [(0, 1, 0.0, 0.5), (0, 2, 0.5, 1.0), (1, 1, 0.25, 0.5), (1, 2, 0.5, 1.0)]
    """
    stamps = np.asarray(stamps, dtype=np.float64) - float(origin_s)
    calls = min(stamps.shape[1] - 1, int(limit))
    return [{"rank": r, "call": k, "start_s": float(mine[k - 1]), "end_s": float(mine[k])}
            for r, mine in enumerate(stamps) for k in range(1, calls + 1)]


def thread_name(row: dict, *, busy: bool = False) -> str:
    """The thread of a row's timeline (``busy``: of its calls timed while every core
    computes) in :func:`trace_events`: op and size (``all_reduce 8 MiB``), ``, cores busy``
    for the busy calls, and which calls where the timeline holds fewer than the row timed.

    >>> calls = [{"rank": 0, "call": k, "start_s": k, "end_s": k + 1} for k in (1, 2)]
    >>> thread_name({"op": "all_reduce", "size_bytes": 8 << 20, "iters": 1, "busy_timeline_s": calls},
    ...             busy=True)
    'all_reduce 8 MiB, cores busy'
    >>> thread_name({"op": "broadcast", "size_bytes": 64, "iters": 100, "timeline_s": calls})
    'broadcast 64 B, calls 1-2 of 100'

    The busy all-reduce times :data:`~labkit.collectives.config.BUSY_CALLS_PER_ITER` times
    ``iters`` calls:

    >>> thread_name({"op": "all_reduce", "size_bytes": 64, "iters": 2, "busy_timeline_s": calls},
    ...             busy=True)
    'all_reduce 64 B, cores busy, calls 1-2 of 4'
    """
    text = f"{row['op']} {size_text(row['size_bytes'])}" + (", cores busy" if busy else "")
    calls = row.get("busy_timeline_s" if busy else "timeline_s")
    iters = row.get("iters")
    if isinstance(iters, (int, float)) and busy:  # the busy all-reduce times more calls
        iters = BUSY_CALLS_PER_ITER * iters
    if _timed(calls) and isinstance(iters, (int, float)):
        n = max(int(c["call"]) for c in calls)
        if n < iters:
            text += f", calls 1-{n} of {int(iters)}"
    return text


def _timed(value) -> bool:
    return isinstance(value, list) and bool(value)


def trace_events(rows) -> list[dict]:
    """Chrome trace events of collectives rows (dicts, or a DataFrame, as
    :func:`labkit.collectives.run.run` returns them): per row with a timeline, a thread of
    every rank with one slice per timed call (``#k``, its op as category, times those of the
    row in microseconds), and a second thread where the row also timed its calls while every
    core computes; rows without a timeline are left out.

    >>> row = {"op": "all_reduce", "size_bytes": 8, "world_size": 2, "iters": 2,
    ...        "timeline_s": [{"rank": 0, "call": 1, "start_s": 0.0, "end_s": 2e-3},
    ...                       {"rank": 0, "call": 2, "start_s": 2e-3, "end_s": 3e-3},
    ...                       {"rank": 1, "call": 1, "start_s": 1e-3, "end_s": 2e-3},
    ...                       {"rank": 1, "call": 2, "start_s": 2e-3, "end_s": 3e-3}]}
    >>> events = trace_events([row])
    >>> [(e["name"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [('#1', 0, 1, 0.0, 2000.0), ('#2', 0, 1, 2000.0, 1000.0), ('#1', 1, 1, 1000.0, 1000.0), ('#2', 1, 1, 2000.0, 1000.0)]
    >>> sorted({e["args"]["name"] for e in events if e["name"] == "thread_name"})
    ['all_reduce 8 B']
    >>> trace.overlaps(events)
    []
    """
    threads, ranks, events = {}, set(), []
    for row in trace.timed_rows(rows):
        for column, busy in (("timeline_s", False), ("busy_timeline_s", True)):
            calls = row.get(column)
            if not _timed(calls):
                continue
            tid = len(threads) + 1
            threads[tid] = thread_name(row, busy=busy)
            for c in calls:  # the thread says the op, size and busy; the args the exact size
                ranks.add(int(c["rank"]))
                events.append(trace.event(
                    f"#{int(c['call'])}", cat=str(row["op"]), start_s=c["start_s"],
                    end_s=c["end_s"], pid=int(c["rank"]), tid=tid,
                    args={"size_bytes": int(row["size_bytes"])}))
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events


def calls_of(row: dict, column: str = "timeline_s") -> dict:
    """A row's timeline as arrays (ranks x calls, on one clock): ``start_s``, ``end_s``;
    ``time_s``, each call's time as the row counts it (the slowest rank's); ``start_gap_s``
    and ``end_gap_s``, how far apart the ranks started and ended each call; ``last``, the rank
    that started each call last.

    >>> c = calls_of({"timeline_s": [{"rank": 0, "call": 1, "start_s": 0.0, "end_s": 2.0},
    ...                              {"rank": 1, "call": 1, "start_s": 1.5, "end_s": 2.25}]})
    >>> c["time_s"].tolist(), c["start_gap_s"].tolist(), c["end_gap_s"].tolist(), c["last"].tolist()
    ([2.0], [1.5], [0.25], [1])
    """
    calls = row.get(column)
    if not _timed(calls):
        raise ValueError(f"the row has no {column}")
    ranks = 1 + max(int(c["rank"]) for c in calls)
    n = max(int(c["call"]) for c in calls)
    start, end = np.full((ranks, n), np.nan), np.full((ranks, n), np.nan)
    for c in calls:
        start[int(c["rank"]), int(c["call"]) - 1] = c["start_s"]
        end[int(c["rank"]), int(c["call"]) - 1] = c["end_s"]
    return {"start_s": start, "end_s": end, "time_s": (end - start).max(axis=0),
            "start_gap_s": start.max(axis=0) - start.min(axis=0),
            "end_gap_s": end.max(axis=0) - end.min(axis=0), "last": start.argmax(axis=0)}


def widest_spread(rows, op: str) -> dict:
    """The row of ``op`` with a timeline whose calls varied most: the largest p90 / p10 of
    the call times, the smaller size on a tie. ValueError where no row of ``op`` has one.

    >>> rows = [{"op": "all_reduce", "size_bytes": s, "time_p10_s": a, "time_p90_s": b,
    ...          "timeline_s": [{}]} for s, a, b in ((8, 1e-4, 2e-3), (1 << 20, 1e-3, 1.2e-3))]
    >>> widest_spread(rows, "all_reduce")["size_bytes"]
    8
    """
    mine = [r for r in trace.timed_rows(rows, "timeline_s") if r.get("op") == op]
    if not mine:
        raise ValueError(f"no {op} row with a timeline")
    return max(mine, key=lambda r: (r["time_p90_s"] / r["time_p10_s"], -r["size_bytes"]))


def _ms(t: float) -> str:
    return f"{t * 1e3:.3g} ms"


def calls_sentence(row: dict) -> str:
    """What a row's timeline shows, computed from it: the spread of its calls' times, how far
    apart the ranks started and ended them and whether a late rank explains the spread (a
    start gap of at least half of it: then which rank started last) or the ranks spent it
    inside the same calls.

    >>> def calls(rank, spans):
    ...     return [{"rank": rank, "call": k, "start_s": a, "end_s": b}
    ...             for k, (a, b) in enumerate(spans, 1)]
    >>> row = {"op": "all_reduce", "size_bytes": 512, "world_size": 2, "iters": 3, "nnodes": 1,
    ...        "timeline_s": calls(0, ((0, 2e-3), (2e-3, 2.1e-3), (2.1e-3, 3e-3)))
    ...                      + calls(1, ((1.5e-3, 2e-3), (2e-3, 2.5e-3), (2.5e-3, 3e-3)))}
    >>> print(calls_sentence(row))
    all_reduce 512 B on 2 ranks, 3 timed calls back to back: each took 0.5 ms to 2 ms (the slowest rank's time, as the row counts it). The ranks started a call up to 1.5 ms apart (median 0.4 ms) and ended it up to 0.4 ms apart. A late rank explains up to 1.5 ms of the 1.5 ms between the shortest and the longest call: the rank that starts first waits inside the call for the last one, so its bar is the longer. Rank 1 started last in 2 of the 3 calls.
    >>> row["timeline_s"] = calls(0, ((0, 1e-3), (1e-3, 5e-3))) + calls(1, ((1e-4, 1e-3), (1e-3, 5e-3)))
    >>> print(calls_sentence(row).split(". ", 2)[2])
    That is under half of the 3 ms between the shortest and the longest call: the spread is not a late rank (its wait would show as the other rank's bar starting earlier) but time both ranks spent inside the same calls.
    """
    c = calls_of(row)
    ranks, n = c["start_s"].shape
    iters = int(row.get("iters") or n)
    which = f"{n} timed calls" if n == iters else f"the first {n} of {iters} timed calls"
    shortest, longest = float(np.min(c["time_s"])), float(np.max(c["time_s"]))
    head = (f"{row['op']} {size_text(row['size_bytes'])} on {ranks} rank{'s' if ranks > 1 else ''}"
            f", {which} back to back: each took {_ms(shortest)} to {_ms(longest)} (the slowest "
            "rank's time, as the row counts it).")
    if ranks == 1:
        return head + " One rank: no other rank to wait for."
    gap = float(np.max(c["start_gap_s"]))
    text = (f" The ranks started a call up to {_ms(gap)} apart (median "
            f"{_ms(float(np.median(c['start_gap_s'])))}) and ended it up to "
            f"{_ms(float(np.max(c['end_gap_s'])))} apart.")
    spread = longest - shortest
    if gap >= 0.5 * spread:
        apart = c["start_gap_s"] > 0  # a call all ranks started at once has no last rank
        counts = np.bincount(c["last"][apart], minlength=ranks)
        last = int(np.argmax(counts))
        text += (f" A late rank explains up to {_ms(gap)} of the {_ms(spread)} between the "
                 "shortest and the longest call: the rank that starts first waits inside the "
                 f"call for the last one, so its bar is the longer. Rank {last} started last in "
                 f"{int(counts[last])} of the {n} calls.")
    else:
        text += (f" That is under half of the {_ms(spread)} between the shortest and the "
                 "longest call: the spread is not a late rank (its wait would show as the other "
                 "rank's bar starting earlier) but time both ranks spent inside the same calls.")
    nodes = row.get("nnodes")
    if isinstance(nodes, (int, float)) and not math.isnan(nodes) and nodes > 1:
        text += (" (The ranks ran on several hosts: each rank's clock is aligned at the "
                 "barrier before the calls, so these gaps are those that grew after it.)")
    return head + text
