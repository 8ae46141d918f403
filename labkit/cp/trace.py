"""The context-parallel lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A CP row's ``timeline_s`` holds one timed pass of every rank (the median one of the slowest
rank's, ``timeline_step``), on one clock from the first rank's start, as
:class:`labkit.cp.timeline.RingClock` recorded it. Each row gets two threads of every rank:

* the rank's own (``causal_balanced P=2, pass 3 of 5``): per ring step of the forward, the
  posting of its K/V exchange (``post K/V``), its score blocks (``F<t>``) and the wait for the
  next block (``wait K/V``, idle: the part of the message the blocks did not hide); in the
  backward each ring step's blocks (``B<t>``) and the exchanges of the blocks' gradients,
  which the rank waits through (``wait grad K/V <t>``, idle);
* the ring's (``...: ring``): each message in flight, from its posting to the moment the rank
  had it (``K/V block <t>``: sent to rank r+1, received from r-1; ``grad K/V block <t>``: the
  other way), so that a message beside compute on the rank's thread is one that hid.

Slices of one thread that overlap (autograd may interleave the blocks of two ring steps) go
on a thread of their own (:func:`labkit.trace.lanes`). Rows without a timeline are left out.
"""

from __future__ import annotations

from labkit import trace


def label(row) -> str:
    """A row's thread name: the variant, the ranks and which timed pass it shows.

    >>> label({"variant": "causal_balanced", "world_size": 2, "timeline_step": 3,
    ...        "measured_steps": 5})
    'causal_balanced P=2, pass 3 of 5'
    """
    return (f"{row['variant']} P={int(row['world_size'])}, pass {int(row['timeline_step'])} "
            f"of {int(row['measured_steps'])}")


def _args(s: dict, row: dict) -> dict:
    """A slice's args: its ring step and direction, its times, and for a message its peers and
    bytes (a K/V block goes to rank r+1, its gradient back to r-1)."""
    out = {"ring_step": s.get("ring_step"), "direction": s.get("direction"),
           "start_s": float(s["start_s"]), "end_s": float(s["end_s"])}
    if s["thread"] == "ring":
        p, r = int(row["world_size"]), int(s["rank"])
        ahead, behind = (r + 1) % p, (r - 1) % p
        forward = s.get("direction") == "forward"
        out.update(to_rank=ahead if forward else behind, from_rank=behind if forward else ahead,
                   bytes_each_way=row.get("kv_block_bytes"))
    return out


def trace_events(rows) -> list[dict]:
    """Chrome trace events of CP rows (dicts, or a DataFrame, as :func:`labkit.cp.run.run`
    returns them): per row with a timeline, the rank's thread and the ring's of every rank
    (and a thread more where slices of one overlap), slices at the row's times.

    >>> row = {"variant": "full", "world_size": 2, "timeline_step": 1, "measured_steps": 1,
    ...        "kv_block_bytes": 1024, "timeline_s": [
    ...     {"rank": 0, "thread": "compute", "name": "F0", "cat": "forward", "start_s": 0.0001,
    ...      "end_s": 0.002, "ring_step": 0, "direction": "forward"},
    ...     {"rank": 0, "thread": "compute", "name": "wait K/V", "cat": "idle",
    ...      "start_s": 0.002, "end_s": 0.0025, "ring_step": 0, "direction": "forward"},
    ...     {"rank": 0, "thread": "ring", "name": "K/V block 0", "cat": "ring",
    ...      "start_s": 0.0, "end_s": 0.0025, "ring_step": 0, "direction": "forward"}]}
    >>> events = trace_events([row])
    >>> [(e["name"], e["tid"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [('F0', 1, 100.0, 1900.0), ('wait K/V', 1, 2000.0, 500.0), ('K/V block 0', 2, 0.0, 2500.0)]
    >>> sorted(e["args"]["name"] for e in events if e["name"] == "thread_name")
    ['full P=2, pass 1 of 1', 'full P=2, pass 1 of 1: ring']
    >>> trace.slices(events)[-1]["args"]["to_rank"], trace.overlaps(events)
    (1, [])
    """
    rows = trace.timed_rows(rows, "timeline_s")
    threads, ranks, events, tid = {}, set(), [], 0
    for row in rows:
        for thread, suffix in (("compute", ""), ("ring", ": ring")):
            mine = sorted((s for s in row["timeline_s"] if s["thread"] == thread),
                          key=lambda s: (s["rank"], s["start_s"]))
            lane_of = [0] * len(mine)
            for rank in {int(s["rank"]) for s in mine}:  # lanes within each rank's slices
                at = [k for k, s in enumerate(mine) if int(s["rank"]) == rank]
                for k, lane in zip(at, trace.lanes([(mine[k]["start_s"], mine[k]["end_s"])
                                                    for k in at])):
                    lane_of[k] = lane
            for lane in range(max(lane_of, default=-1) + 1):
                threads[tid + 1 + lane] = (label(row) + suffix
                                           + (f" ({lane + 1})" if lane else ""))
            for s, lane in zip(mine, lane_of):
                events.append(trace.event(s["name"], cat=s["cat"], start_s=s["start_s"],
                                          end_s=s["end_s"], pid=s["rank"], tid=tid + 1 + lane,
                                          args=_args(s, row)))
                ranks.add(int(s["rank"]))
            tid += max(lane_of, default=-1) + 1
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
