"""The solve lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A solve row's ``timeline_s`` holds the phases of a few iterations of its last timed solve
(:mod:`labkit.solve.timeline`: the first two and the last three), every rank's on one clock
from the solve's start. Each recorded iteration becomes a thread of every rank's process
(``strong 40,000 DOF simple cg, iteration 33 of 34``) holding one slice per phase at the times
the row holds: ``SpMV``, ``halo`` (the halo exchange: posting the messages, then the wait the
interior rows did not hide), ``all-reduce`` (starting it, then its exposed wait) and ``vector``
(updates and local dot products). The stretches of an iteration that no phase covers (the
Python loop, the scalar recurrences: the row's ``other_time_s``) are ``other`` slices, so an
iteration's slices tile it from its start to the next one's. Rows of one solve (weak and
throughput at the same grid) are one thread, named by all their modes; rows without a
timeline (torch-sla) are left out.
"""

from __future__ import annotations

from pathlib import Path

from labkit import trace

#: a stopwatch bucket -> the name of its slices (the bucket, as the rows' ``<bucket>_time_s``
#: name it, is the slice's category); short, to fit in a figure's bars
PHASES = {"spmv": "SpMV", "halo": "halo", "allreduce": "all-reduce", "vector": "vector"}

#: the category and name of an iteration's time outside every phase
OTHER = "other"

#: stretches shorter than this are rounding, not time (a trace's times are whole nanoseconds)
RESOLUTION_S = 1e-9


def _label(row: dict, modes: str | None = None) -> str:
    return (f"{row['mode'] if modes is None else modes} {int(row['dof_global']):,} DOF "
            f"{row['partitioner']} {row['method']}")


def thread_name(row: dict, iteration: int, *, modes: str | None = None) -> str:
    """The thread of one recorded iteration of ``row`` (``modes``: the modes of the rows
    that share its solve, default the row's own).

    >>> row = {"mode": "strong", "dof_global": 40000, "partitioner": "simple", "method": "cg",
    ...        "timeline_iterations": [1, 2, 32, 33, 34]}
    >>> thread_name(row, 33)
    'strong 40,000 DOF simple cg, iteration 33 of 34'
    """
    return f"{_label(row, modes)}, iteration {int(iteration)} of {max(row['timeline_iterations'])}"


def shown_iteration(row: dict) -> int:
    """The recorded iteration a figure shows: the one before the last (a whole iteration late
    in the solve, where the last one only tests the residual), the only one of a
    one-iteration solve.

    >>> shown_iteration({"timeline_iterations": [1, 2, 32, 33, 34]}), shown_iteration({"timeline_iterations": [1]})
    (33, 1)
    """
    its = sorted(row["timeline_iterations"])
    return its[-2] if len(its) > 1 else its[0]


def pick(paths, row) -> tuple[str, str]:
    """(the trace file of ``row``'s launch among ``paths``, the thread of its
    :func:`shown_iteration` there, named by every mode that shares its solve). UsageError
    when none of ``paths`` is of its world size, or that trace has no such thread."""
    from labkit.errors import UsageError

    row = dict(row)
    prefix = f"solve-{int(row['world_size'])}ranks-"
    found = [str(p) for p in paths if Path(p).name.startswith(prefix)]
    if not found:
        raise UsageError(f"no trace of the {int(row['world_size'])}-rank launch among {list(paths)}")
    tail = thread_name(row, shown_iteration(row), modes="")  # " 40,000 DOF ..., iteration n of N"
    for name in trace.threads(trace.load(found[0])):
        modes, _, rest = name.partition(" ")
        if " " + rest == tail and str(row["mode"]) in modes.split("/"):
            return found[0], name
    raise UsageError(f"{found[0]}: no thread of{tail} ({row['mode']})")


def trace_events(rows) -> list[dict]:
    """Chrome trace events of solve rows (dicts, or a DataFrame, as :func:`labkit.solve.run.run`
    returns them): per recorded iteration of each solve, a thread of every rank holding its
    phases and the ``other`` stretches between them, in microseconds from the solve's start.

    >>> row = {"mode": "strong", "dof_global": 100, "partitioner": "simple", "method": "cg",
    ...        "timeline_iterations": [1],
    ...        "timeline_iterations_s": [{"rank": 0, "iteration": 1, "start_s": 1e-5, "end_s": 5e-5}],
    ...        "timeline_s": [{"rank": 0, "iteration": 1, "phase": "spmv", "start_s": 1e-5, "end_s": 3e-5},
    ...                       {"rank": 0, "iteration": 1, "phase": "vector", "start_s": 3.5e-5, "end_s": 4.5e-5}]}
    >>> events = trace_events([row])
    >>> [(e["name"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [('SpMV', 10.0, 20.0), ('other', 30.0, 5.0), ('vector', 35.0, 10.0), ('other', 45.0, 5.0)]
    >>> trace.overlaps(events)
    []
    """
    solves: dict = {}  # one solve's spans -> the rows that hold it (weak and throughput share)
    for row in trace.timed_rows(rows, "timeline_iterations_s"):
        key = tuple((s["rank"], s["iteration"], s["start_s"], s["end_s"])
                    for s in row["timeline_iterations_s"])
        solves.setdefault(key, []).append(row)
    threads, ranks, events, tid = {}, set(), [], 0
    for same in solves.values():
        row = same[0]
        modes = "/".join(dict.fromkeys(str(r["mode"]) for r in same))
        for n in sorted(row["timeline_iterations"]):
            tid += 1
            threads[tid] = thread_name(row, n, modes=modes)
            for span in (s for s in row["timeline_iterations_s"] if s["iteration"] == n):
                rank = int(span["rank"])
                ranks.add(rank)
                pieces = sorted((p for p in row["timeline_s"]
                                 if p["rank"] == rank and p["iteration"] == n),
                                key=lambda p: p["start_s"])
                cursor = float(span["start_s"])
                for p in [*pieces, {"phase": None, "start_s": span["end_s"], "end_s": span["end_s"]}]:
                    if float(p["start_s"]) - cursor > RESOLUTION_S:  # no phase ran here
                        events.append(trace.event(OTHER, cat=OTHER, start_s=cursor,
                                                  end_s=p["start_s"], pid=rank, tid=tid,
                                                  args={"iteration": n}))
                    if p["phase"] is not None:
                        events.append(trace.event(
                            PHASES.get(p["phase"], p["phase"]), cat=p["phase"],
                            start_s=p["start_s"], end_s=p["end_s"], pid=rank, tid=tid,
                            args={"iteration": n, "start_s": float(p["start_s"]),
                                  "end_s": float(p["end_s"])}))
                    cursor = max(cursor, float(p["end_s"]))
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
