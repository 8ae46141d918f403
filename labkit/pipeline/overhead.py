"""The schedule's own work, read off the timelines (pure: no torch).

Between two blocks of a rank whose input was already there, the rank does no arithmetic, yet
the next block does not start at once: ``torch.distributed.pipelining``'s schedule posts the
sends and receives, checks shapes and keeps its books in between (:func:`free_gaps`). A step
also starts before its first block and ends after its last (:func:`step_edges_s`: zeroing,
the loss, the last waits). :func:`launch_overhead` pools both over one launch's rows, so the
step model (:func:`labkit.pipeline.report.add_model`) prices every row with the same two
numbers rather than with each row's own.

Why: on this machine the gaps are 0.4-0.9 ms a block and the edges about 2 ms a step; at
M = 8 a rank runs 16-24 blocks, so the step model without them read 10-30 % fast. The same
work lies on a message's way (the step model prices a message at its transfer and a gap):
over 15 lab runs the median message delay beyond its transfer read 0.32-0.50 ms a launch, the
launch's median gap 0.39-0.49 ms.
"""

from __future__ import annotations

import statistics

from labkit.pipeline.messages import arrivals


def free_gaps(blocks) -> list[float]:
    """The gaps (s) between a rank's consecutive blocks where the block it waited for had
    already ended when the rank's previous block ended
    (:func:`labkit.pipeline.messages.arrivals`): time the rank spent on the schedule's own
    work, not waiting for a message.

    Rank 0 runs F0, F1 with a 1 ms gap (F1 reads data: free); rank 1's F1 starts 2 ms after
    rank 0's F1 ended, which it waited for (not free):

    >>> b = [dict(rank=0, stage=0, kind="F", microbatch=0, start_s=0.000, end_s=0.010),
    ...      dict(rank=0, stage=0, kind="F", microbatch=1, start_s=0.011, end_s=0.021),
    ...      dict(rank=1, stage=1, kind="F", microbatch=0, start_s=0.012, end_s=0.018),
    ...      dict(rank=1, stage=1, kind="F", microbatch=1, start_s=0.023, end_s=0.030)]
    >>> [round(g * 1e3, 3) for g in free_gaps(b)]
    [1.0]
    """
    return [float(b["start_s"]) - busy for b, busy, src in arrivals(blocks)
            if busy is not None and (src is None or float(src["end_s"]) <= busy)]


def step_edges_s(blocks, step_time_s: float) -> float:
    """What a step spends outside its blocks' span: before the first block starts and after
    the last one ends.

    >>> step_edges_s([dict(start_s=0.001, end_s=0.05), dict(start_s=0.05, end_s=0.098)], 0.1)
    0.003
    """
    span = max(b["end_s"] for b in blocks) - min(b["start_s"] for b in blocks)
    return round(float(step_time_s) - span, 12)


def launch_overhead(rows) -> dict:
    """``{"gap_s", "edges_s"}``: the median free gap over all the rows' median steps
    (``median_step_blocks``) and the median of their steps' edges; zeros where no row holds a
    timeline (a row measured before the lab kept one), so the model is then what it was.

    >>> b = [dict(rank=0, stage=0, kind="F", microbatch=i, start_s=0.011 * i,
    ...           end_s=0.011 * i + 0.010) for i in range(3)]
    >>> got = launch_overhead([{"median_step_blocks": b, "step_time_s": 0.035}])
    >>> {k: round(v * 1e3, 3) for k, v in got.items()}
    {'gap_s': 1.0, 'edges_s': 3.0}
    """
    gaps, edges = [], []
    for r in rows:
        blocks = r.get("median_step_blocks")
        if isinstance(blocks, list) and blocks:
            gaps += free_gaps(blocks)
            edges.append(step_edges_s(blocks, r["step_time_s"]))
    return {"gap_s": statistics.median(gaps) if gaps else 0.0,
            "edges_s": max(0.0, statistics.median(edges)) if edges else 0.0}
