"""The all-to-alls of a measured MoE step, and which of them waited for the scheduler (pure).

A row's ``a2a_timeline_s`` holds every all-to-all of the median timed step on every rank, on
one clock: the exchange of split sizes (tag ``counts``), then the four of token rows
(``dispatch``, ``combine``, ``combine_grad``, ``dispatch_grad``), each from its start to its
end on each rank. An all-to-all ends on no rank before the last rank has entered it: a rank
that enters first waits there for the others (the busier rank's experts, not the message), so
a call's **message** time is read from the later rank's entry to the last rank's exit
(:func:`call_times`). A message moves at its transfer's pace, or it also waits for the
scheduler to give one of gloo's threads a core (about a scheduler tick on this machine):
:func:`count` tells the two apart against the transfers the machine profile predicts
(:func:`labkit.machine.formulas.counted_waits`) and says which phase's calls waited.
"""

from __future__ import annotations

from labkit.machine.formulas import counted_waits
from labkit.tp.waits import message_s

#: the phase of the step each all-to-all runs in (the layer's spans: the split sizes and the
#: dispatch forward in the dispatch's, its gradients in the dispatch's backward; the combine's
#: forward and backward in the combine's one span)
PHASE_OF = {"counts": "dispatch", "dispatch": "dispatch", "dispatch_grad": "dispatch",
            "combine": "combine", "combine_grad": "combine"}


def call_times(timeline) -> list[dict]:
    """Each all-to-all of a step (``timeline``: dicts of ``rank, call, tag, start_s, end_s`` on
    one clock), in call order: its ``call``, ``tag`` and ``message_s``, from the later rank's
    entry to the last rank's exit.

    Rank 0 enters the dispatch at 1 ms, rank 1 (busier) at 3 ms; both leave at 3.4 ms: the
    message took 0.4 ms, rank 0's 2 ms before it were the wait for rank 1.

    >>> tl = [{"rank": 0, "call": 0, "tag": "dispatch", "start_s": 0.001, "end_s": 0.0034},
    ...       {"rank": 1, "call": 0, "tag": "dispatch", "start_s": 0.003, "end_s": 0.0034}]
    >>> [(c["tag"], round(c["message_s"] * 1e3, 3)) for c in call_times(tl)]
    [('dispatch', 0.4)]
    """
    by_call: dict = {}
    for s in timeline or []:
        by_call.setdefault(int(s["call"]), []).append(s)
    out = []
    for call in sorted(by_call):
        spans = by_call[call]
        tags = {s["tag"] for s in spans}
        if len(tags) != 1:
            raise ValueError(f"all-to-all {call} has different tags on different ranks: {tags}")
        out.append({"call": call, "tag": tags.pop(), "message_s": message_s(spans)})
    return out


def count(timeline, *, transfers: dict) -> dict | None:
    """Which all-to-alls of a step's ``timeline`` (:func:`call_times`) waited for the
    scheduler, each against the profile's transfer of its kind (``transfers``: seconds for
    ``counts``, the split sizes, and ``rows``, any all-to-all of token rows): ``calls`` (how
    many), ``count``, ``share``, ``waited`` (by phase: how many), ``excess_s`` (by phase: what
    those took beyond their transfers, measured). None without a timeline (a row of one rank,
    or written before the all-to-alls were stamped).

    Five all-to-alls of transfers 0.1 ms (split sizes) and 0.5 ms (rows); the combine's
    backward took 4.3 ms: it waited, 3.8 ms beyond its transfer.

    >>> tl = [{"rank": r, "call": i, "tag": tag, "start_s": 0.01 * i, "end_s": 0.01 * i + d}
    ...       for r in (0, 1) for i, (tag, d) in enumerate(
    ...           [("counts", 1e-4), ("dispatch", 5e-4), ("combine", 5e-4),
    ...            ("combine_grad", 4.3e-3), ("dispatch_grad", 6e-4)])]
    >>> got = count(tl, transfers={"counts": 1e-4, "rows": 5e-4})
    >>> got["calls"], got["count"], got["waited"], round(got["excess_s"]["combine"] * 1e3, 1)
    (5, 1, {'dispatch': 0, 'combine': 1}, 3.8)
    """
    calls = call_times(timeline)
    if not calls:
        return None
    predicted = [float(transfers["counts" if c["tag"] == "counts" else "rows"]) for c in calls]
    got = counted_waits([c["message_s"] for c in calls], predicted)
    waited, excess = {"dispatch": 0, "combine": 0}, {"dispatch": 0.0, "combine": 0.0}
    for c, t, w in zip(calls, predicted, got["flags"]):  # which phases waited
        if w:
            phase = PHASE_OF[c["tag"]]
            waited[phase] += 1
            excess[phase] += float(c["message_s"]) - t
    return {"calls": len(calls), "count": got["count"], "share": got["share"],
            "waited": waited, "excess_s": excess}
