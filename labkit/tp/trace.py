"""The tensor-parallel lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A row of a hand-written version at P > 1 (``naive``, ``sp``) holds in ``timeline_s`` its timed
step of median length, every rank's on one clock (:func:`labkit.tp.timeline.step_slices`): the
compute between two collectives (named by the work that ran there: ``L0 attn fwd``), each
collective's wait for the last rank to enter (``wait``, drawn as idle) and its message, from
the last rank's entry to this rank's exit (``g L0 attn``: g after layer 0's attention; ``f``,
``AG``, ``RS``, ``AR`` for f, all-gather, reduce-scatter, all-reduce). Each row is one thread
of every rank's process; an instant marks the step's end with the row's step time. Rows
without a timeline (the library's, one rank) are left out.
"""

from __future__ import annotations

from labkit import trace


def _label(row: dict) -> str:
    text = {"naive": "TP by hand", "sp": "TP + SP by hand"}.get(row["variant"], row["variant"])
    return f"{text} P={int(row['world_size'])}, step {int(row.get('timeline_step') or 1)}"


def trace_events(rows) -> list[dict]:
    """Chrome trace events of TP rows (dicts, or a DataFrame, as :func:`labkit.tp.run.run`
    returns them): per row with ``timeline_s``, a thread of every rank holding its slices at
    the row's times (microseconds) and the step's end as an instant.

    >>> row = {"variant": "naive", "world_size": 2, "timeline_step": 2,
    ...        "step_time_p50_s": 0.008, "timeline_s": [
    ...     dict(rank=0, name="L0 attn fwd", cat="compute", start_s=0.0, end_s=0.002),
    ...     dict(rank=0, name="wait", cat="idle", start_s=0.002, end_s=0.003),
    ...     dict(rank=0, name="g L0 attn", cat="all-reduce", start_s=0.003, end_s=0.004),
    ...     dict(rank=1, name="L0 attn fwd", cat="compute", start_s=0.0, end_s=0.003),
    ...     dict(rank=1, name="g L0 attn", cat="all-reduce", start_s=0.003, end_s=0.004)]}
    >>> events = trace_events([row, {"variant": "library", "world_size": 2}])
    >>> [(e["pid"], e["name"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [(0, 'L0 attn fwd', 0.0, 2000.0), (0, 'wait', 2000.0, 1000.0), (0, 'g L0 attn', 3000.0, 1000.0), (1, 'L0 attn fwd', 0.0, 3000.0), (1, 'g L0 attn', 3000.0, 1000.0)]
    >>> sorted({e["args"]["name"] for e in events if e["name"] == "thread_name"})
    ['TP by hand P=2, step 2']
    >>> trace.overlaps(events)
    []
    """
    threads, ranks, events = {}, set(), []
    for row in trace.timed_rows(rows, "timeline_s"):
        slices = row["timeline_s"]
        tid = len(threads) + 1
        threads[tid] = _label(row)
        for s in sorted(slices, key=lambda s: (s["rank"], s["start_s"])):
            cat = trace.IDLE if s["cat"] == "idle" else s["cat"]
            events.append(trace.event(s["name"], cat=cat, start_s=s["start_s"],
                                      end_s=s["end_s"], pid=int(s["rank"]), tid=tid,
                                      args={"start_s": s["start_s"], "end_s": s["end_s"]}))
        mine = sorted({int(s["rank"]) for s in slices})
        ranks.update(mine)
        end = max(s["end_s"] for s in slices)
        summary = {k: row.get(k) for k in ("timeline_step_time_s", "step_time_p50_s",
                                            "allreduce_time_in_step_s") if row.get(k) is not None}
        events += [trace.instant("end of step", at_s=end, pid=r, tid=tid,
                                 args={"step_end_s": end, **summary}) for r in mine]
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
