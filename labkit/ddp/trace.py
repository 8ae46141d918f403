"""The DDP lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A DDP row with a timeline (``comm_intervals_s`` and the ``timeline_*_s`` columns,
:func:`labkit.ddp.overlap.summarize`) holds rank 0's timed steps, each on a clock from its own
start: where backward started, where it accumulated its last gradient, where the step ended,
and when each bucket's all-reduce was launched and completed. Each step becomes a thread of
process ``rank 0`` from its own start (the rows hold no time between steps: barriers and the
other timed parts ran there): ``before backward`` (forward and loss), ``backward``, ``after
backward`` (the wait for the last all-reduces, the optimizer), and on a thread beside it one
slice per bucket's all-reduce (a second all-reduce thread where buckets were in flight at once,
:func:`labkit.trace.lanes`). Only rank 0 records a timeline, so the other ranks have none;
rows without one (no DDP, one rank) are left out.
"""

from __future__ import annotations

from labkit import trace


def _label(row: dict) -> str:
    text = f"{row.get('variant', 'ddp')} N={int(row['world_size'])}"
    if row.get("batch_size") is not None:
        text += f" batch {int(row['batch_size'])}"
    if row.get("bucket_cap_mb") is not None:
        text += f" bucket {row['bucket_cap_mb']:g} MB"
    return text


def trace_events(rows) -> list[dict]:
    """Chrome trace events of DDP rows (dicts, or a DataFrame, as :func:`labkit.ddp.run.run`
    returns them): per timed step of each row with a timeline, a compute thread and its
    all-reduce thread(s) of rank 0, times those of the row in microseconds.

    >>> row = {"variant": "ddp", "world_size": 2, "batch_size": 8,
    ...        "timeline_backward_start_s": [0.010], "timeline_backward_end_s": [0.040],
    ...        "timeline_step_end_s": [0.055],
    ...        "comm_intervals_s": [[[0.020, 0.030], [0.028, 0.045], [0.040, 0.050]]]}
    >>> events = trace_events([row])
    >>> [(e["name"], e["tid"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [('before backward', 1, 0.0, 10000.0), ('backward', 1, 10000.0, 30000.0), ('after backward', 1, 40000.0, 15000.0), ('all-reduce bucket 0', 2, 20000.0, 10000.0), ('all-reduce bucket 1', 3, 28000.0, 17000.0), ('all-reduce bucket 2', 2, 40000.0, 10000.0)]
    >>> sorted(e["args"]["name"] for e in events if e["name"] == "thread_name")
    ['ddp N=2 batch 8, step 1', 'ddp N=2 batch 8, step 1: all-reduce', 'ddp N=2 batch 8, step 1: all-reduce (2)']
    >>> trace.overlaps(events)
    []
    """
    threads, events, tid = {}, [], 0
    for row in trace.timed_rows(rows, "comm_intervals_s"):
        steps = row["comm_intervals_s"]
        for k, intervals in enumerate(steps):
            start = row["timeline_backward_start_s"][k]
            end = row["timeline_backward_end_s"][k]
            stop = row["timeline_step_end_s"][k]
            tid += 1
            threads[tid] = f"{_label(row)}, step {k + 1}"
            for name, a, b in (("before backward", 0.0, start), ("backward", start, end),
                               ("after backward", end, stop)):
                events.append(trace.event(name, cat="backward" if name == "backward" else "step",
                                          start_s=a, end_s=b, pid=0, tid=tid,
                                          args={"start_s": a, "end_s": b}))
            lane_of = trace.lanes(intervals)
            first = tid + 1
            for lane in range(max(lane_of, default=-1) + 1):
                threads[first + lane] = (f"{_label(row)}, step {k + 1}: all-reduce"
                                         + (f" ({lane + 1})" if lane else ""))
            for j, ((a, b), lane) in enumerate(zip(intervals, lane_of)):
                events.append(trace.event(f"all-reduce bucket {j}", cat="all-reduce",
                                          start_s=a, end_s=b, pid=0, tid=first + lane,
                                          args={"bucket": j, "launched_s": a, "completed_s": b}))
            tid += max(lane_of, default=-1) + 1
    if not events:
        return []
    return trace.names([0], threads) + events
