"""The collectives of one measured step, and which of them waited for the scheduler (pure).

A row's ``timeline_s`` holds the timed step of median length of every rank on one clock: the
TP lab's (:func:`labkit.tp.timeline.step_slices`) each collective's **message**, from the last
rank's entry to this rank's exit, apart from the wait for the later rank; the FSDP lab's
(:func:`labkit.fsdp.trace.step_slices`) each collective from this rank's entry to its exit. No
collective ends before the last rank has entered it, so a call's message time is read the same
way from both: from the later rank's entry to the last rank's exit (:func:`call_messages`);
what a rank spent before that was the wait for the other (it computed longer).

A message moves at its transfer's pace, or it also waits for the scheduler to give one of
gloo's threads a core (about a scheduler tick on this machine, whose two cores the ranks keep
busy): :func:`count` tells the two apart against the transfers the machine profile predicts
(:func:`labkit.machine.formulas.counted_waits`), and the step models price each one counted at
the profile's :attr:`~labkit.machine.Profile.scheduler_wait_s`.
"""

from __future__ import annotations

from labkit.machine.formulas import WAIT_THRESHOLD_S, counted_waits
from labkit.tp.timeline import OP_CAT, clock_offsets

#: the categories of a collective's message in the labs' timelines
COLLECTIVE_CATS = tuple(OP_CAT.values())


def timeline(row) -> list | None:
    """The row's ``timeline_s`` (a list) where it holds a collective, or None (a row without
    one: a DataFrame's NaN, a variant not recorded, one rank).

    >>> timeline({"timeline_s": [{"cat": "all-reduce"}]}), timeline({"timeline_s": float("nan")})
    ([{'cat': 'all-reduce'}], None)
    """
    tl = row.get("timeline_s") if hasattr(row, "get") else None
    if not isinstance(tl, list) or not any(s.get("cat") in COLLECTIVE_CATS for s in tl):
        return None
    return tl


def message_s(spans) -> float:
    """One collective's message, from every rank's span of it (dicts of ``start_s, end_s`` on
    one clock): from the later rank's entry to the last rank's exit; before that, the rank
    that entered first was waiting for the other.

    >>> round(message_s([{"start_s": 0.001, "end_s": 0.0045}, {"start_s": 0.003, "end_s": 0.004}]), 6)
    0.0015
    """
    return max(0.0, max(float(s["end_s"]) for s in spans)
               - max(float(s["start_s"]) for s in spans))


def call_messages(slices) -> list[dict]:
    """Each collective of one step, in call order: ``name``, ``cat`` (its operation) and
    ``message_s``, from the later rank's entry to the last rank's exit. ``slices``: dicts of
    ``rank, name, cat, start_s, end_s`` on one clock; a collective's are those of a category
    in :data:`COLLECTIVE_CATS`, the same calls in the same order on every rank.

    Rank 0 enters an all-gather at 1 ms, rank 1 at 3 ms; rank 1 leaves at 4 ms, rank 0 at
    4.5 ms: the message took 1.5 ms.

    >>> tl = [{"rank": 0, "name": "AG L0", "cat": "all-gather", "start_s": 0.001, "end_s": 0.0045},
    ...       {"rank": 1, "name": "AG L0", "cat": "all-gather", "start_s": 0.003, "end_s": 0.004},
    ...       {"rank": 1, "name": "F L0", "cat": "forward", "start_s": 0.004, "end_s": 0.009}]
    >>> [(c["name"], round(c["message_s"] * 1e3, 3)) for c in call_messages(tl)]
    [('AG L0', 1.5)]
    """
    by_rank: dict = {}
    for s in slices or []:
        if s["cat"] in COLLECTIVE_CATS:
            by_rank.setdefault(int(s["rank"]), []).append(s)
    ranks = [sorted(v, key=lambda s: float(s["start_s"])) for _, v in sorted(by_rank.items())]
    if len({len(calls) for calls in ranks}) > 1:
        raise ValueError("every rank's step must hold the same collectives: got "
                         f"{[len(calls) for calls in ranks]}")
    out = []
    for calls in zip(*ranks):
        cats = {c["cat"] for c in calls}
        if len(cats) != 1:
            raise ValueError(f"collective {calls[0]['name']!r} is of different operations on "
                             f"different ranks: {sorted(cats)}")
        out.append({"name": calls[0]["name"], "cat": calls[0]["cat"],
                    "message_s": message_s(calls)})
    return out


def call_messages_s(timelines, ops, *, shared_clock: bool = True) -> list[dict]:
    """Every collective of every rank's ``timelines`` (lists of (entry, exit), the same calls
    in the same order, as :func:`labkit.tp.timeline.split_waits` reads them; ``ops``: each
    call's operation, :meth:`labkit.tp.comm.Comm.ops`): its category (:data:`OP_CAT`) and
    :func:`message_s`, read as :func:`call_messages` reads one step's slices.
    ``shared_clock=False`` aligns the ranks' clocks by their exits
    (:func:`labkit.tp.timeline.clock_offsets`).

    >>> call_messages_s([[(0.000, 0.004)], [(0.003, 0.0045)]], ["all_reduce"])
    [{'cat': 'all-reduce', 'message_s': 0.0015}]
    """
    timelines = [list(tl) for tl in timelines]
    offsets = [0.0] * len(timelines) if shared_clock else clock_offsets(timelines)
    return [{"cat": OP_CAT.get(op, op),
             "message_s": round(message_s([{"start_s": a - off, "end_s": b - off}
                                           for (a, b), off in zip(calls, offsets)]), 9)}
            for op, calls in zip(ops, zip(*timelines))]


def count(slices, *, transfers: dict) -> dict | None:
    """Which collectives of a step (``slices``, :func:`call_messages`) waited for the
    scheduler, each against the transfer the profile predicts for its operation
    (``transfers``: seconds per category, :data:`COLLECTIVE_CATS`):
    :func:`labkit.machine.formulas.counted_waits`'s ``count``, ``share`` and ``excess_s`` (what
    each that waited took beyond its transfer), with ``calls`` (how many), ``transfer_s``
    (their transfers, summed) and ``waited`` (the names of those that waited). None without
    a timeline.

    Four all-reduces of 0.3 ms transfers; the second took 3.9 ms: one waited, 3.6 ms beyond.

    >>> tl = [{"rank": r, "name": f"g {i}", "cat": "all-reduce", "start_s": 0.01 * i,
    ...        "end_s": 0.01 * i + d} for r in (0, 1)
    ...       for i, d in enumerate([3e-4, 3.9e-3, 3.2e-4, 3e-4])]
    >>> got = count(tl, transfers={"all-reduce": 3e-4})
    >>> got["calls"], got["count"], got["waited"], [round(x * 1e3, 1) for x in got["excess_s"]]
    (4, 1, ['g 1'], [3.6])
    """
    calls = call_messages(slices)
    if not calls:
        return None
    predicted = [float(transfers[c["cat"]]) for c in calls]
    got = counted_waits([c["message_s"] for c in calls], predicted)
    waited = [c["name"] for c, w in zip(calls, got["flags"]) if w]
    return {**got, "calls": len(calls), "transfer_s": sum(predicted), "waited": waited}


def count_steps(calls, *, transfers: dict, steps: int) -> dict | None:
    """Which of every timed step's collectives (``calls``: dicts of ``cat, message_s``,
    :func:`call_messages_s`) waited for the scheduler, each against its
    operation's transfer as :func:`count` judges one step's: ``calls``, ``count``, ``steps``,
    ``per_step`` (the count over the steps) and ``excess_per_step_s`` (what those took beyond
    their transfers, over the steps): what a law on the mean time a step spends in them
    compares with. None without the calls.

    Two steps of four 0.3 ms all-reduces; three calls took 3.9, 2.8 and 3.3 ms: 1.5 a step.

    >>> calls = [{"cat": "all-reduce", "message_s": d}
    ...          for d in (3e-4, 3.9e-3, 3e-4, 3e-4, 2.8e-3, 3e-4, 3.3e-3, 3e-4)]
    >>> got = count_steps(calls, transfers={"all-reduce": 3e-4}, steps=2)
    >>> got["count"], got["per_step"], round(got["excess_per_step_s"] * 1e3, 2)
    (3, 1.5, 4.55)
    """
    if not isinstance(calls, list) or not calls or int(steps) < 1:
        return None
    got = counted_waits([float(c["message_s"]) for c in calls],
                        [float(transfers[c["cat"]]) for c in calls])
    return {"calls": len(calls), "count": got["count"], "steps": int(steps),
            "per_step": got["count"] / int(steps),
            "excess_per_step_s": sum(got["excess_s"]) / int(steps)}


def note(got: dict | None, *, wait_s: float, what: str = "collectives",
         transfers: str = "the profile's, peers idle", fallback: str = "") -> str:
    """What a step model counted and priced for its messages, in one sentence (``got``:
    :func:`count`, or None where the row holds no timeline: ``fallback`` says why and what
    the model used instead).

    >>> print(note({"calls": 8, "count": 3}, wait_s=3.6e-3, what="all-reduces"))
    3 of 8 all-reduces waited for the scheduler in the median step (counted from its timeline), priced at the profile's 3.6 ms each; transfers the profile's, peers idle
    >>> print(note(None, wait_s=3.6e-3, fallback="no timeline"))
    no timeline
    """
    if not got:
        return fallback
    return (f"{got['count']} of {got['calls']} {what} waited for the scheduler in the median "
            f"step (counted from its timeline), priced at the profile's {wait_s * 1e3:.1f} ms "
            f"each; transfers {transfers}")


def sentence(got: dict | None, *, wait_s: float, what: str = "collectives", step=None) -> str:
    """How many of a step's collectives waited for the scheduler (``got``: :func:`count`), by
    how much, and why; what the step model does with them.

    >>> print(sentence({"calls": 8, "count": 2, "excess_s": [2.1e-3, 2.7e-3],
    ...                 "waited": ["g L0 attn", "f L1 mlp"]}, wait_s=3.4e-3, step=2))
    2 of the 8 collectives of the median timed step (step 2) waited for the scheduler (g L0 attn, f L1 mlp), 2.1 to 2.7 ms each beyond its transfer. A message moves at its transfer's pace unless the gloo thread that handles it must first wait for a core: where the receiver's core is busy (its rank computing, or another process), it waits for the scheduler's next turn, which the profile's calls put at 3.4 ms on this machine; the model adds that for each one counted.
    >>> print(sentence({"calls": 8, "count": 0, "excess_s": [], "waited": []}, wait_s=3.4e-3))
    none of the 8 collectives of the median timed step waited for the scheduler: none took 1.5 ms (or a quarter of its transfer, if longer) beyond its transfer, so the model prices transfers alone.
    """
    if not got:
        return f"no timeline of the {what}: their waits for the scheduler were not counted."
    which = f"of the {got['calls']} {what} of the median timed step" + (
        f" (step {int(step)})" if step is not None and step == step else "")
    if not got["count"]:
        return (f"none {which} waited for the scheduler: none took "
                f"{WAIT_THRESHOLD_S * 1e3:g} ms (or a quarter of its transfer, if longer) beyond "
                "its transfer, so the model prices transfers alone.")
    ex = sorted(got["excess_s"])
    by = (f"{ex[0] * 1e3:.1f} ms beyond its transfer" if len(ex) == 1 else
          f"{ex[0] * 1e3:.1f} to {ex[-1] * 1e3:.1f} ms each beyond its transfer")
    return (f"{got['count']} {which} waited for the scheduler ({', '.join(got['waited'])}), "
            f"{by}. A message moves at its transfer's pace unless the gloo thread that handles "
            "it must first wait for a core: where the receiver's core is busy (its rank "
            "computing, or another process), it waits for the scheduler's next turn, which the "
            f"profile's calls put at {wait_s * 1e3:.1f} ms on this machine; the "
            "model adds that for each one counted.")
