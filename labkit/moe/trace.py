"""The expert-parallel lab's rows as a Chrome trace (pure: no torch): :func:`trace_events`.

A MoE row's ``timeline_s`` holds one timed step of every rank (the median one of the slowest
rank's, ``timeline_step``), on one clock from the first rank's start: the seven spans the
layer times (:data:`labkit.moe.layer.STEP_ORDER`): routing, the dispatch all-to-all (after the
exchange of split sizes) and the experts forward, the combine all-to-all forward and
backward, then the experts, the dispatch all-to-all and the routing backward. Each becomes a
slice of its rank's process (``rank R``) on the row's thread, its category its phase (the two
all-to-alls named so), so that the figure colours the four phases alike forward and backward;
its name is the phase's initial and F (forward) or B (backward), as the pipeline's blocks are
named, short enough to be written in a narrow bar: ``RF``, ``DF``, ``EF``, ``CF+B`` (the
combine's span holds its backward too), ``EB``, ``DB``, ``RB``. Its args spell them out and
say which all-to-alls ran inside. What runs between the spans (zeroing the gradients, the
step's own bookkeeping) is in none of them. Rows without a timeline are left out.
"""

from __future__ import annotations

from labkit import trace

#: a phase's category (what the figure's legend and the alt text say) and its initial
CATEGORIES = {"routing": "routing", "dispatch": "dispatch all-to-all", "experts": "experts",
              "combine": "combine all-to-all"}
INITIALS = {"routing": "R", "dispatch": "D", "experts": "E", "combine": "C"}
#: how a slice's name says its direction
DIRECTIONS = {"forward": "F", "backward": "B", "forward + backward": "F+B"}
#: the all-to-alls inside a span, by (phase, direction)
ALL_TO_ALLS = {
    ("dispatch", "forward"): "split sizes to every rank, then each token row to its expert's rank",
    ("dispatch", "backward"): "the rows' gradients back to their tokens' ranks",
    ("combine", "forward + backward"): "the experts' outputs back to their tokens' ranks, then "
                                       "their gradients back to the experts' ranks",
}


def slice_name(phase: str, direction: str) -> str:
    """A span's slice name.

    >>> slice_name("dispatch", "forward"), slice_name("combine", "forward + backward")
    ('DF', 'CF+B')
    """
    return INITIALS[phase] + DIRECTIONS[direction]


def label(row) -> str:
    """A row's thread name: the layer, the ranks and which timed step it shows.

    >>> label({"world_size": 2, "num_experts": 4, "top_k": 2, "tokens_per_rank": 256,
    ...        "timeline_step": 2, "measured_steps": 4})
    'EP P=2 E=4 top-2 T=256, step 2 of 4'
    """
    return (f"EP P={int(row['world_size'])} E={int(row['num_experts'])} top-{int(row['top_k'])} "
            f"T={int(row['tokens_per_rank'])}, step {int(row['timeline_step'])} of "
            f"{int(row['measured_steps'])}")


def trace_events(rows) -> list[dict]:
    """Chrome trace events of MoE rows (dicts, or a DataFrame, as :func:`labkit.moe.run.run`
    returns them): per row with a timeline, a thread of every rank holding its spans as slices
    at the times of the row (in microseconds).

    >>> row = {"world_size": 2, "num_experts": 4, "top_k": 2, "tokens_per_rank": 8,
    ...        "timeline_step": 1, "measured_steps": 1, "timeline_s": [
    ...     {"rank": 0, "phase": "routing", "direction": "forward", "start_s": 0.0, "end_s": 0.001},
    ...     {"rank": 0, "phase": "dispatch", "direction": "forward", "start_s": 0.001, "end_s": 0.003},
    ...     {"rank": 1, "phase": "routing", "direction": "forward", "start_s": 0.0005, "end_s": 0.002},
    ...     {"rank": 1, "phase": "dispatch", "direction": "forward", "start_s": 0.002, "end_s": 0.003}]}
    >>> events = trace_events([row])
    >>> [(e["pid"], e["name"], e["cat"], e["ts"], e["dur"]) for e in trace.slices(events)]
    [(0, 'RF', 'routing', 0.0, 1000.0), (0, 'DF', 'dispatch all-to-all', 1000.0, 2000.0), (1, 'RF', 'routing', 500.0, 1500.0), (1, 'DF', 'dispatch all-to-all', 2000.0, 1000.0)]
    >>> trace.overlaps(events)
    []
    """
    rows = trace.timed_rows(rows, "timeline_s")
    threads, ranks, events = {}, set(), []
    for tid, row in enumerate(rows, start=1):
        threads[tid] = label(row)
        for s in sorted(row["timeline_s"], key=lambda s: (s["rank"], s["start_s"])):
            key = (s["phase"], s["direction"])
            args = {"phase": s["phase"], "direction": s["direction"],
                    "start_s": float(s["start_s"]), "end_s": float(s["end_s"])}
            if key in ALL_TO_ALLS:
                args["all_to_all"] = ALL_TO_ALLS[key]
            events.append(trace.event(slice_name(*key), cat=CATEGORIES[s["phase"]],
                                      start_s=s["start_s"],
                                      end_s=s["end_s"], pid=s["rank"], tid=tid, args=args))
            ranks.add(int(s["rank"]))
    if not events:
        return []
    return trace.names(sorted(ranks), threads) + events
