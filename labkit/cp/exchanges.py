"""The K/V exchanges of a measured ring pass, and which of them waited for the scheduler (pure).

A row's ``timeline_s`` holds the median timed pass of every rank on one clock
(:class:`labkit.cp.timeline.RingClock`): per forward ring step the posting of the K/V exchange
(``post K/V``), the step's blocks (``F<t>``) and the wait for the next block (``wait K/V``);
per backward exchange of the blocks' gradients its span from posting to arrival (``wait grad
K/V <t>``: the rank waits through it). An exchange cannot move before every rank it involves
has posted it (this rank, the next one it sends to, the previous one it receives from), and in
the forward it moves while the rank computes its blocks. So what an exchange cost a rank
(:func:`exchange_times`) is its posting plus its arrival past the later of the end of the
rank's blocks and the last neighbour's posting (forward), or its arrival past the last
posting (backward); a pass's exchange is the most it cost any rank. A message moves at its
transfer's pace, or also waits for the scheduler to give one of gloo's threads a core (about a
scheduler tick on this machine): :func:`count` tells the two apart against the transfer the
machine profile predicts (:func:`labkit.machine.formulas.counted_waits`).
"""

from __future__ import annotations

from labkit.machine.formulas import counted_waits


def _spans(timeline, name: str, direction: str) -> dict:
    """{(rank, ring_step): (start_s, end_s)} of the slices called ``name`` (a prefix for the
    numbered ones) in ``direction``, on the rank's own thread."""
    out = {}
    for s in timeline or []:
        if s.get("thread", "compute") != "compute" or s.get("direction") != direction:
            continue
        if s["name"] == name or (name.endswith(" ") and s["name"].startswith(name)):
            out[(int(s["rank"]), int(s["ring_step"]))] = (float(s["start_s"]), float(s["end_s"]))
    return out


def exchange_times(timeline, world_size: int) -> list[dict]:
    """Each exchange of a pass (``timeline``: the row's slices, on one clock), forward ring
    steps first: its ``direction``, ``ring_step`` and ``message_s``, the most it cost a rank.

    Two ranks post their K/V blocks at 0 and 0.1 ms; rank 0 computes until 1 ms and receives at
    1.2 ms, rank 1 until 1.5 ms and receives at once; in the backward rank 0 posts the
    gradients at 3 ms, rank 1 at 3.5 ms, both have them at 3.8 ms:

    >>> tl = [{"rank": 0, "name": "post K/V", "direction": "forward", "ring_step": 0,
    ...        "start_s": 0.0, "end_s": 1e-4},
    ...       {"rank": 0, "name": "wait K/V", "direction": "forward", "ring_step": 0,
    ...        "start_s": 1e-3, "end_s": 1.2e-3},
    ...       {"rank": 1, "name": "post K/V", "direction": "forward", "ring_step": 0,
    ...        "start_s": 1e-4, "end_s": 2e-4},
    ...       {"rank": 1, "name": "wait K/V", "direction": "forward", "ring_step": 0,
    ...        "start_s": 1.5e-3, "end_s": 1.5e-3}]
    >>> tl += [{"rank": r, "name": "wait grad K/V 0", "direction": "backward", "ring_step": 0,
    ...         "start_s": a, "end_s": 3.8e-3} for r, a in ((0, 3e-3), (1, 3.5e-3))]
    >>> [(x["direction"], round(x["message_s"] * 1e3, 3)) for x in exchange_times(tl, 2)]
    [('forward', 0.3), ('backward', 0.3)]
    """
    p = int(world_size)

    def parties(r):
        return {r, (r + 1) % p, (r - 1) % p}

    out = []
    posts, waits = _spans(timeline, "post K/V", "forward"), _spans(timeline, "wait K/V", "forward")
    for t in sorted({step for _, step in waits}):
        cost = []
        for r in range(p):
            if (r, t) not in waits or (r, t) not in posts:
                continue
            begun = max(posts[(q, t)][0] for q in parties(r) if (q, t) in posts)
            (a, b), (c, d) = posts[(r, t)], waits[(r, t)]
            cost.append((b - a) + max(0.0, d - max(c, begun)))
        if cost:
            out.append({"direction": "forward", "ring_step": t, "message_s": max(cost)})
    grads = _spans(timeline, "wait grad K/V ", "backward")
    for t in sorted({step for _, step in grads}, reverse=True):  # the backward's order
        begun = {r: max(grads[(q, t)][0] for q in parties(r) if (q, t) in grads)
                 for r in range(p) if (r, t) in grads}
        cost = [max(0.0, grads[(r, t)][1] - begun[r]) for r in begun]
        out.append({"direction": "backward", "ring_step": t, "message_s": max(cost)})
    return out


def count(timeline, *, world_size: int, transfer_s: float) -> dict | None:
    """Which exchanges of a pass (:func:`exchange_times`) waited for the scheduler, each
    against ``transfer_s`` (the profile's transfer of one K/V block): ``exchanges`` (how many),
    ``count``, ``share`` and ``excess_s`` (what those took beyond their transfers, summed,
    measured). None without a timeline.

    >>> tl = [{"rank": r, "name": "wait grad K/V 0", "direction": "backward", "ring_step": 0,
    ...        "start_s": 0.0, "end_s": d} for r, d in ((0, 4e-3), (1, 3.9e-3))]
    >>> got = count(tl, world_size=2, transfer_s=2e-4)
    >>> got["exchanges"], got["count"], round(got["excess_s"] * 1e3, 1)
    (1, 1, 3.8)
    """
    times = exchange_times(timeline, world_size)
    if not times:
        return None
    got = counted_waits([x["message_s"] for x in times], [transfer_s] * len(times))
    return {"exchanges": len(times), "count": got["count"], "share": got["share"],
            "excess_s": sum(got["excess_s"])}


def late_start(timeline) -> dict | None:
    """How the ranks arrived at a pass (``timeline``: the row's slices, on one clock):
    ``late_s``, how much later the last rank's first slice started than the first rank's, and
    ``waited``, whether that passed the wait rule with nothing to transfer
    (:func:`labkit.machine.formulas.counted_waits`): every timed pass starts at a barrier's
    exit, a rank the scheduler keeps off its core leaves it late, and the others wait for it
    at their first exchange. None without a timeline.

    Rank 1 starts 2.8 ms after rank 0 (past the rule's 1.5 ms): a scheduler wait.

    >>> tl = [{"rank": r, "name": "post K/V", "direction": "forward", "ring_step": 0,
    ...        "start_s": a, "end_s": a + 2e-4} for r, a in ((0, 0.0), (1, 2.8e-3))]
    >>> got = late_start(tl)
    >>> round(got["late_s"] * 1e3, 2), got["waited"]
    (2.8, True)
    """
    firsts: dict[int, float] = {}
    for s in timeline or []:
        if s.get("thread", "compute") == "compute":
            r = int(s["rank"])
            firsts[r] = min(firsts.get(r, float("inf")), float(s["start_s"]))
    if len(firsts) < 2:
        return None
    late = max(firsts.values()) - min(firsts.values())
    return {"late_s": late, "waited": bool(counted_waits([late], [0.0])["count"])}
