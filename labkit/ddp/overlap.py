"""What a DDP step's all-reduces hid behind backward, read off a measured timeline (pure: no
torch).

The rank side (:class:`labkit.ddp.train.CommTimeline`) records, step by step, when backward
started, when it produced its last gradient, and when each bucket's all-reduce was launched
and completed. :func:`overlap_split` splits the communication of one step into the part that
ran while backward still computed (*hidden*, as far as time goes) and the part after it
(*exposed*: the step waits for it); :func:`summarize` takes the median over steps for a
result row.

Running beside backward is not the same as costing nothing: where the all-reduce shares a
core with backward (gloo on a CPU rank of one thread), backward gets longer and the
all-reduce itself runs slower than alone. :func:`hidden_for_free_s` counts what the step paid
for its all-reduces, the exposed part and backward's stretch against the same backward
without them (the ``no_sync`` step), against what they cost alone.
"""

from __future__ import annotations

import math
from statistics import median


def union(intervals) -> list[tuple[float, float]]:
    """The intervals ``(start, end)`` merged where they overlap or touch, sorted.

    >>> union([(3, 4), (0, 1), (0.5, 2)])
    [(0.0, 2.0), (3.0, 4.0)]
    """
    out: list[tuple[float, float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _inside(merged, lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged)


def overlap_split(backward_start: float, backward_end: float, comm_intervals) -> dict:
    """One step's communication against its backward pass (all times on one clock, seconds).

    ``comm_intervals``: one ``(launched, completed)`` per bucket's all-reduce. Buckets may
    overlap each other, so the communication is the union of the intervals (``total_s``);
    ``hidden_s`` is its part inside ``[backward_start, backward_end]``, ``exposed_s`` its part
    after ``backward_end`` (the step waits for it), ``hidden_share = hidden_s / total_s``
    (NaN without communication).

    Backward from 10 to 40 ms; bucket 0 all-reduced from 20 to 30 ms, bucket 1 from 28 to
    45 ms (launched while bucket 0 still ran), bucket 2 from 40 to 50 ms: the union runs
    20-50 ms, 30 ms of communication, of which 20 ms inside backward and 10 ms after it:

    >>> s = overlap_split(0.010, 0.040, [(0.020, 0.030), (0.028, 0.045), (0.040, 0.050)])
    >>> {k: round(v, 4) for k, v in s.items()}
    {'total_s': 0.03, 'hidden_s': 0.02, 'exposed_s': 0.01, 'hidden_share': 0.6667}
    """
    if backward_end < backward_start:
        raise ValueError(f"backward ends ({backward_end}) before it starts ({backward_start})")
    merged = union(comm_intervals)
    total = sum(b - a for a, b in merged)
    hidden = _inside(merged, backward_start, backward_end)
    exposed = _inside(merged, backward_end, math.inf)
    return {"total_s": total, "hidden_s": hidden, "exposed_s": exposed,
            "hidden_share": hidden / total if total > 0 else math.nan}


def hidden_for_free_s(*, exposed_s: float, backward_s: float, nosync_backward_s: float,
                      standalone_s: float) -> float:
    """The all-reduce time a step did not pay: what its buckets' all-reduces cost alone
    (``standalone_s``, timed standalone) less what the step paid for them, the part after
    backward (``exposed_s``) and how much longer backward took beside them than without
    (``no_sync``); at least 0.

    All-reduces of 16 ms alone; 6 ms exposed and backward 4 ms longer: 6 ms hidden. Sharing
    the core: 18 ms exposed and 2 ms of stretch, more than they cost alone: nothing hidden.

    >>> round(hidden_for_free_s(exposed_s=0.006, backward_s=0.040, nosync_backward_s=0.036,
    ...                         standalone_s=0.016), 4)
    0.006
    >>> hidden_for_free_s(exposed_s=0.018, backward_s=0.032, nosync_backward_s=0.030,
    ...                   standalone_s=0.016)
    0.0
    """
    stretch = max(0.0, float(backward_s) - float(nosync_backward_s))
    return max(0.0, float(standalone_s) - float(exposed_s) - stretch)


def summarize(steps, nosync_steps=()) -> dict:
    """A result row's overlap columns from timeline records (dicts with ``backward_start_s``,
    ``backward_end_s``, ``step_end_s`` and ``comm_intervals_s``, one ``[launched, completed]``
    per bucket), the median over steps of each; ``nosync_steps``: records of the same step
    under ``no_sync`` (no communication), for ``nosync_backward_s``. Empty: no columns.

    >>> step = {"backward_start_s": 0.01, "backward_end_s": 0.04, "step_end_s": 0.06,
    ...         "comm_intervals_s": [[0.02, 0.03], [0.04, 0.05]]}
    >>> out = summarize([step], [{**step, "backward_end_s": 0.035, "comm_intervals_s": []}])
    >>> {k: round(out[k], 4) for k in ("comm_hidden_share", "comm_exposed_s", "backward_s",
    ...                                "nosync_backward_s")}
    {'comm_hidden_share': 0.5, 'comm_exposed_s': 0.01, 'backward_s': 0.03, 'nosync_backward_s': 0.025}
    """
    steps = list(steps)
    if not steps:
        return {}
    splits = [overlap_split(s["backward_start_s"], s["backward_end_s"], s["comm_intervals_s"])
              for s in steps]
    shares = [x["hidden_share"] for x in splits if not math.isnan(x["hidden_share"])]
    out = {
        "comm_total_s": median(x["total_s"] for x in splits),
        "comm_hidden_s": median(x["hidden_s"] for x in splits),
        "comm_exposed_s": median(x["exposed_s"] for x in splits),
        "comm_hidden_share": median(shares) if shares else math.nan,
        "backward_s": median(s["backward_end_s"] - s["backward_start_s"] for s in steps),
        "timeline_backward_start_s": [s["backward_start_s"] for s in steps],
        "timeline_backward_end_s": [s["backward_end_s"] for s in steps],
        "timeline_step_end_s": [s["step_end_s"] for s in steps],
        "comm_intervals_s": [s["comm_intervals_s"] for s in steps],
    }
    nosync = list(nosync_steps)
    if nosync:
        out["nosync_backward_s"] = median(s["backward_end_s"] - s["backward_start_s"]
                                          for s in nosync)
    return out


def hid_some(row, *, standalone_s: float, threshold: float = 0.05) -> bool | None:
    """Whether a row's step hid more than ``threshold`` of its all-reduces' standalone time
    (:func:`hidden_for_free_s`), as its timeline measured; None where it was not measured (no
    timeline, no ``no_sync`` backward to measure the stretch by, no standalone time). The
    mechanism behind a law about overlap is observed only where this is not None.

    >>> row = {"comm_exposed_s": 0.006, "backward_s": 0.040, "nosync_backward_s": 0.036}
    >>> hid_some(row, standalone_s=0.016), hid_some({**row, "comm_exposed_s": 0.018},
    ...                                             standalone_s=0.016)
    (True, False)
    >>> hid_some({"comm_exposed_s": 0.006}, standalone_s=0.016) is None
    True
    """
    keys = ("comm_exposed_s", "backward_s", "nosync_backward_s")
    vals = [row.get(k) for k in keys] + [standalone_s]
    if any(not isinstance(v, (int, float)) or v != v for v in vals) or not standalone_s > 0:
        return None
    exposed, back, nosync, alone = (float(v) for v in vals)
    free = hidden_for_free_s(exposed_s=exposed, backward_s=back, nosync_backward_s=nosync,
                             standalone_s=alone)
    return free / alone > threshold
