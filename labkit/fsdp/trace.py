"""The sharded-data-parallel lab's step timelines (pure: no torch): :func:`step_slices` turns
every rank's marks of one step (:meth:`labkit.fsdp.record.StepRecorder.record`) into slices
on one clock, the rows' ``timeline_s``; :func:`trace_events` makes a Chrome trace of them.

Per rank and layer: its forward (``F L0``) and backward (``B L0``) compute, and before, between
and after them ``before forward`` (zeroing the gradients, the first gathers), ``loss`` (the
last layer's output to its gradient) and ``after backward`` (the last reduce-scatters, the
optimizer); every collective of the variant (``AG L1 (fwd)``: FSDP's all-gather of layer 1's
weights for its forward; ``RS L1``: the reduce-scatter of its gradients; ZeRO-1's ``RS all
layers`` and ``AG all layers``) from its entry to its exit, on threads of their own. Where a
collective held the rank's thread (a CPU: gloo, synchronous), the compute slices leave its
time out: what shows as compute is compute. On a GPU the collectives run on streams of their
own, beside the compute: there the trace shows what overlapped.
"""

from __future__ import annotations

from labkit import trace
from labkit.ddp.overlap import union
from labkit.tp.timeline import OP_CAT

#: stretches shorter than this are rounding, not work (a trace's times are whole nanoseconds)
RESOLUTION_S = 1e-9


def _minus(a: float, b: float, holes) -> list[tuple[float, float]]:
    """[a, b] less the intervals ``holes``, the pieces longer than :data:`RESOLUTION_S`."""
    pieces, cursor = [], a
    for h0, h1 in sorted(holes):
        if h1 <= cursor or h0 >= b:
            continue
        if h0 - cursor > RESOLUTION_S:
            pieces.append((cursor, h0))
        cursor = max(cursor, h1)
    if b - cursor > RESOLUTION_S:
        pieces.append((cursor, b))
    return pieces


def _blocks(marks: list, end_s: float) -> list[tuple[str, str, float, float]]:
    """(name, category, start, end) of one rank's compute from its layers' marks."""
    at = {}
    for m in marks:  # the first of each: a step runs each layer once each way
        at.setdefault((m["kind"], int(m["layer"])), float(m["at_s"]))
    layers = sorted({layer for _, layer in at})
    out = []
    for i in layers:
        if ("fwd_start", i) in at and ("fwd_end", i) in at:
            out.append((f"F L{i}", "forward", at["fwd_start", i], at["fwd_end", i]))
        if ("bwd_start", i) in at and ("bwd_end", i) in at:
            out.append((f"B L{i}", "backward", at["bwd_start", i], at["bwd_end", i]))
    if layers and ("fwd_start", layers[0]) in at:
        out.append(("before forward", "other", 0.0, at["fwd_start", layers[0]]))
    if layers and ("fwd_end", layers[-1]) in at and ("bwd_start", layers[-1]) in at:
        out.append(("loss", "other", at["fwd_end", layers[-1]], at["bwd_start", layers[-1]]))
    if layers and ("bwd_end", layers[0]) in at:
        out.append(("after backward", "other", at["bwd_end", layers[0]], end_s))
    return out


def step_slices(records, *, shared_clock: bool = True) -> list[dict]:
    """One step of every rank as slices on one clock (the first rank's start at 0): ``rank,
    name, cat, start_s, end_s``, compute first (categories ``forward``, ``backward``,
    ``other``), then the collectives (:data:`labkit.tp.timeline.OP_CAT`). ``records[r]``: rank r's step
    (``origin_s``, ``end_s``, ``marks``, ``collectives``, ``blocking``). Ranks on one host's
    clock (``shared_clock``) are shifted by their starts, others start together (the barrier
    before the step).

    One layer on one rank whose forward waits 1 ms for its all-gather (a CPU: it blocks):

    >>> rec = {"origin_s": 5.0, "end_s": 0.010, "blocking": True,
    ...        "marks": [dict(kind="fwd_start", layer=0, at_s=0.001),
    ...                  dict(kind="fwd_end", layer=0, at_s=0.004),
    ...                  dict(kind="bwd_start", layer=0, at_s=0.005),
    ...                  dict(kind="bwd_end", layer=0, at_s=0.008)],
    ...        "collectives": [dict(name="AG L0 (bwd)", op="all_gather", entry_s=0.005,
    ...                             exit_s=0.006)]}
    >>> [(s["name"], s["cat"], round(s["start_s"] * 1e3, 3), round(s["end_s"] * 1e3, 3))
    ...  for s in step_slices([rec])]
    [('before forward', 'other', 0.0, 1.0), ('F L0', 'forward', 1.0, 4.0), ('loss', 'other', 4.0, 5.0), ('B L0', 'backward', 6.0, 8.0), ('after backward', 'other', 8.0, 10.0), ('AG L0 (bwd)', 'all-gather', 5.0, 6.0)]
    """
    records = [dict(r) for r in records]
    shift = (trace.start_offsets([r["origin_s"] for r in records], [0] * len(records))
             if shared_clock else [0.0] * len(records))
    out = []
    for rank, rec in enumerate(records):
        coll = [(float(c["entry_s"]), float(c["exit_s"])) for c in rec["collectives"]]
        holes = coll if rec.get("blocking", True) else []
        for name, cat, a, b in sorted(_blocks(rec["marks"], float(rec["end_s"])),
                                      key=lambda x: x[2]):
            out += [{"rank": rank, "name": name, "cat": cat, "start_s": p0 + shift[rank],
                     "end_s": p1 + shift[rank]} for p0, p1 in _minus(a, b, holes)]
        out += [{"rank": rank, "name": c["name"], "cat": OP_CAT.get(c["op"], c["op"]),
                 "start_s": float(c["entry_s"]) + shift[rank],
                 "end_s": float(c["exit_s"]) + shift[rank]} for c in rec["collectives"]]
    return out


def overlap(slices) -> dict:
    """Per rank, seconds of collectives (their union), of compute (forward, backward and the
    step's other work) and of collectives while the rank computed: ``{rank: (collectives_s,
    compute_s, overlap_s)}``.

    >>> overlap([dict(rank=0, cat="forward", start_s=0, end_s=3),
    ...          dict(rank=0, cat="all-gather", start_s=2, end_s=5)])
    {0: (3.0, 3.0, 1.0)}
    """
    out = {}
    for rank in sorted({int(s["rank"]) for s in slices}):
        mine = [s for s in slices if int(s["rank"]) == rank]
        comm = union((s["start_s"], s["end_s"]) for s in mine if s["cat"] in OP_CAT.values())
        work = union((s["start_s"], s["end_s"]) for s in mine if s["cat"] not in OP_CAT.values())
        both = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in work)
        out[rank] = (float(sum(b - a for a, b in comm)), float(sum(b - a for a, b in work)),
                     float(both))
    return out


def _label(row: dict) -> str:
    return (f"{row['variant']} N={int(row['world_size'])}, step "
            f"{int(row.get('timeline_step') or 1)}")


def trace_events(rows) -> list[dict]:
    """Chrome trace events of FSDP-lab rows (dicts, or a DataFrame, as
    :func:`labkit.fsdp.run.run` returns them): per row with ``timeline_s``, a compute thread
    of every rank and its collectives' thread(s) (more than one where collectives overlapped:
    :func:`labkit.trace.lanes`), times those of the row in microseconds; rows without one
    (DDP, one rank) are left out.

    >>> row = {"variant": "fsdp", "world_size": 2, "timeline_step": 1, "timeline_s": [
    ...     dict(rank=0, name="F L0", cat="forward", start_s=0.001, end_s=0.004),
    ...     dict(rank=0, name="AG L0 (fwd)", cat="all-gather", start_s=0.0, end_s=0.001),
    ...     dict(rank=1, name="F L0", cat="forward", start_s=0.001, end_s=0.003),
    ...     dict(rank=1, name="AG L0 (fwd)", cat="all-gather", start_s=0.0, end_s=0.001)]}
    >>> events = trace_events([row, {"variant": "ddp", "world_size": 2}])
    >>> [(e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [(0, 1, 'F L0', 1000.0, 3000.0), (0, 2, 'AG L0 (fwd)', 0.0, 1000.0), (1, 1, 'F L0', 1000.0, 2000.0), (1, 2, 'AG L0 (fwd)', 0.0, 1000.0)]
    >>> sorted({e["args"]["name"] for e in events if e["name"] == "thread_name"})
    ['fsdp N=2, step 1', 'fsdp N=2, step 1: collectives']
    """
    threads, ranks, events, tid = {}, set(), [], 0
    comm_cats = set(OP_CAT.values())
    for row in trace.timed_rows(rows, "timeline_s"):
        slices = row["timeline_s"]
        tid += 1
        threads[tid] = _label(row)
        mine = sorted({int(s["rank"]) for s in slices})
        ranks.update(mine)
        lanes = 0
        for rank in mine:
            work = [s for s in slices if int(s["rank"]) == rank and s["cat"] not in comm_cats]
            comm = sorted((s for s in slices if int(s["rank"]) == rank and s["cat"] in comm_cats),
                          key=lambda s: s["start_s"])
            lane_of = trace.lanes([(s["start_s"], s["end_s"]) for s in comm])
            lanes = max(lanes, max(lane_of, default=-1) + 1)
            for s in sorted(work, key=lambda s: s["start_s"]):
                events.append(trace.event(s["name"], cat=s["cat"], start_s=s["start_s"],
                                          end_s=s["end_s"], pid=rank, tid=tid))
            for s, lane in zip(comm, lane_of):
                events.append(trace.event(s["name"], cat=s["cat"], start_s=s["start_s"],
                                          end_s=s["end_s"], pid=rank, tid=tid + 1 + lane,
                                          args={"entry_s": s["start_s"], "exit_s": s["end_s"]}))
        for lane in range(lanes):
            threads[tid + 1 + lane] = f"{_label(row)}: collectives" + (f" ({lane + 1})"
                                                                       if lane else "")
        tid += lanes
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
