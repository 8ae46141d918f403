"""The workshare job's rows (the speedup lab's live part) as a Chrome trace (pure: no torch):
:func:`trace_events`.

A workshare row's ``timeline_s`` holds every rank's timed runs segment by segment, each run on
one clock from its first rank's start (:func:`labkit.speedup.worker.timeline`). Each run becomes
a thread (``2 ranks, serial fraction 0.1, run 1 of 3``) of every rank's process, one slice per
segment at the times the row holds: rank 0's ``serial`` products, the ``wait for the serial
part`` (the barrier after them: on the other ranks, the whole serial part), each rank's
``parallel`` share and its ``wait for the last rank`` (both waits idle). Rows without a
timeline are left out.
"""

from __future__ import annotations

from pathlib import Path

from labkit import trace


def thread_name(row: dict, run: int) -> str:
    """The thread of one timed run of ``row``.

    >>> thread_name({"world_size": 2, "serial_fraction": 0.1, "repeat": 3}, 2)
    '2 ranks, serial fraction 0.1, run 2 of 3'
    """
    p = int(row["world_size"])
    return (f"{p} rank{'s' if p > 1 else ''}, serial fraction {row['serial_fraction']:g}, "
            f"run {int(run)} of {int(row['repeat'])}")


def median_run(row: dict) -> int:
    """The timed run whose span (its first rank's start to its last rank's end) is the median
    of the row's runs (the shorter middle one of an even count): the run a figure shows.

    >>> seg = lambda run, end: {"run": run, "rank": 0, "start_s": 0.0, "end_s": end}
    >>> median_run({"timeline_s": [seg(1, 0.3), seg(2, 0.1), seg(3, 0.2)]})
    3
    """
    spans: dict = {}
    for s in row["timeline_s"]:
        spans[s["run"]] = max(spans.get(s["run"], 0.0), float(s["end_s"]))
    order = sorted(spans, key=lambda k: (spans[k], k))
    return order[(len(order) - 1) // 2]


def pick(paths, row) -> tuple[str, str]:
    """(the trace file of ``row``'s launch among ``paths``, the thread of its
    :func:`median_run`). UsageError when none of ``paths`` is of its world size."""
    from labkit.errors import UsageError

    row = dict(row)
    prefix = f"workshare-{int(row['world_size'])}ranks-"
    found = [str(p) for p in paths if Path(p).name.startswith(prefix)]
    if not found:
        raise UsageError(f"no trace of the {int(row['world_size'])}-rank launch among {list(paths)}")
    return found[0], thread_name(row, median_run(row))


def trace_events(rows) -> list[dict]:
    """Chrome trace events of workshare rows (dicts, or a DataFrame, as
    :func:`labkit.speedup.run.run` returns them): per timed run of each row, a thread of every
    rank holding its segments, in microseconds from the run's start.

    >>> row = {"world_size": 2, "serial_fraction": 0.5, "repeat": 1, "timeline_s": [
    ...     {"run": 1, "rank": 0, "name": "serial", "cat": "serial", "start_s": 0.0, "end_s": 0.002},
    ...     {"run": 1, "rank": 0, "name": "parallel", "cat": "parallel", "start_s": 0.002, "end_s": 0.003},
    ...     {"run": 1, "rank": 1, "name": "wait for the serial part", "cat": "idle", "start_s": 0.0, "end_s": 0.002},
    ...     {"run": 1, "rank": 1, "name": "parallel", "cat": "parallel", "start_s": 0.002, "end_s": 0.003}]}
    >>> [(e["pid"], e["name"], e["ts"], e["dur"]) for e in trace.slices(trace_events([row]))]
    [(0, 'serial', 0.0, 2000.0), (0, 'parallel', 2000.0, 1000.0), (1, 'wait for the serial part', 0.0, 2000.0), (1, 'parallel', 2000.0, 1000.0)]
    """
    threads, ranks, events, tid = {}, set(), [], 0
    for row in trace.timed_rows(rows, "timeline_s"):
        for run in sorted({int(s["run"]) for s in row["timeline_s"]}):
            tid += 1
            threads[tid] = thread_name(row, run)
            for s in sorted((s for s in row["timeline_s"] if int(s["run"]) == run),
                            key=lambda s: (int(s["rank"]), s["start_s"])):
                ranks.add(int(s["rank"]))
                events.append(trace.event(
                    s["name"], cat=s["cat"], start_s=s["start_s"], end_s=s["end_s"],
                    pid=int(s["rank"]), tid=tid,
                    args={"run": run, "start_s": float(s["start_s"]), "end_s": float(s["end_s"])}))
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
