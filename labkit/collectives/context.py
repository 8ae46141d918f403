"""The collectives lab's all-reduce in context (pure: no torch): this sweep's all-reduce beside
the machine profile's, with the cores idle and while every core computes, as notebook 06 prints
it: :func:`in_context` (the numbers), :func:`busy_sentence`, :func:`context_laws` (the law
rows, each miss taken apart into its fastest call or p10 and the rest) and :func:`busy_law`.
"""

from __future__ import annotations

import math

from labkit.book import laws
from labkit.collectives.regimes import p10_split
from labkit.collectives.verdicts import _ms
from labkit.collectives.waits import call_times, profile_allreduces, row_transfer
from labkit.machine import formulas as machine_formulas
from labkit.tables import size_text

#: where more than this share of the profile's busy calls waited, its busy transfer stands on
#: a lucky call or two, and the busy law compares p50s (on the 2-vCPU VM a busy 8 MiB
#: all-reduce: 10 of 11 calls waited, the transfer 10.2 ms against a p50 of 27.8 ms; the
#: notebook's calls, p10 to p90, 25.6 to 33.1 ms)
BUSY_MEDIAN_SHARE = 0.5


def in_context(rows, prof, *, ranks: int) -> dict:
    """This sweep's all-reduce beside the machine profile's, at the largest size both measured
    (else the largest this sweep measured inside the profile's range, so the profile is read,
    not extrapolated): ``size_bytes``, ``idle_s``, ``busy_s`` (the p50s; nan: not measured),
    ``idle_transfer_s``, ``busy_transfer_s`` (the transfers: the calls that waited for
    nothing),
    ``matmuls`` (the busy thread's products), ``predicted_idle_s``, ``predicted_busy_s`` (the
    profile's transfers, ``transfer_s``), ``ratio`` = busy / idle (p50s), and what a miss is
    taken apart by: ``idle_fastest_s``, ``busy_fastest_s`` (the fastest calls; nan: no
    timeline) and ``busy_p10_s``.

    ``rows``: one all-reduce sweep (dicts or a DataFrame with ``size_bytes, time_p50_s,
    transfer_s`` and the ``busy_*`` columns); ``prof``: a :class:`labkit.machine.Profile` (or
    anything with its ``rows`` and ``transfer_s``).
    """
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    rows = sorted(rows, key=lambda r: r["size_bytes"])
    measured = {r["size_bytes"] for r in prof.rows if r.get("measurement") == "allreduce"}
    top = max(measured, default=math.inf)
    both = [r for r in rows if r["size_bytes"] in measured]
    inside = [r for r in rows if r["size_bytes"] <= top]
    r = (both or inside or rows[:1])[-1]
    def known(key):
        v = r.get(key)
        return math.nan if v is None or v != v else float(v)

    busy = known("busy_time_p50_s")
    idle_t, busy_t = row_transfer(r), row_transfer(r, "busy_")
    s = float(r["size_bytes"])

    def fastest(key):
        calls = call_times([{"timeline_s": r.get(key)}])
        return min(calls) if calls else math.nan

    return {"size_bytes": s, "idle_s": float(r["time_p50_s"]), "busy_s": busy,
            "idle_fastest_s": fastest("timeline_s"), "busy_fastest_s": fastest("busy_timeline_s"),
            "busy_p10_s": known("busy_time_p10_s"),
            "idle_transfer_s": math.nan if idle_t is None else idle_t,
            "busy_transfer_s": math.nan if busy_t is None else busy_t,
            "matmuls": r.get("busy_matmuls"),
            # the profile's calls back to back, as this lab's were timed
            "predicted_idle_s": prof.transfer_s(s, ranks=ranks, steady=True),
            "predicted_busy_s": prof.transfer_s(s, ranks=ranks, busy=True, steady=True),
            **_profile_busy(prof, s),
            "ratio": busy / float(r["time_p50_s"])}


def _profile_busy(prof, size_bytes: float) -> dict:
    """The profile's busy all-reduce at the measured size nearest ``size_bytes``: its p50
    (``predicted_busy_p50_s``, read at ``size_bytes`` off the busy sweep's p50s) and the share
    of its calls that waited (``profile_busy_wait_share``; NaN where not kept)."""
    got = sorted((r["size_bytes"], r["time_p50_s"], r.get("wait_share"))
                 for r in profile_allreduces(prof, "busy"))
    if not got:
        return {"predicted_busy_p50_s": math.nan, "profile_busy_wait_share": math.nan}
    near = min(got, key=lambda g: abs(math.log(g[0] / size_bytes)))
    return {"predicted_busy_p50_s": machine_formulas.sweep_time(
                size_bytes, [g[0] for g in got], [g[1] for g in got]),
            "profile_busy_wait_share": math.nan if near[2] is None else float(near[2])}


def busy_sentence(ctx: dict) -> str:
    """An all-reduce while every rank's core computes, against the same all-reduce idle
    (``ctx`` from :func:`in_context`).

    >>> busy_sentence({"size_bytes": 2 << 20, "idle_s": 2.2e-3, "busy_s": 3.4e-3})
    'At 2 MiB an all-reduce took 3.4 ms while every core also computed, against 2.2 ms idle: 1.55x, slower.'
    >>> busy_sentence({"size_bytes": 2 << 20, "idle_s": 2.2e-3, "busy_s": 2.1e-3})
    'At 2 MiB an all-reduce took 2.1 ms while every core also computed, against 2.2 ms idle: 0.95x, no slower.'
    >>> busy_sentence({"size_bytes": 2 << 20, "idle_s": 2.2e-3, "busy_s": math.nan})
    'At 2 MiB the all-reduce was not timed while the cores computed (busy = False).'
    """
    size, idle, busy = ctx["size_bytes"], ctx["idle_s"], ctx["busy_s"]
    if math.isnan(busy):
        return (f"At {size_text(size)} the all-reduce was not timed while the cores computed "
                "(busy = False).")
    ratio = busy / idle
    return (f"At {size_text(size)} an all-reduce took {_ms(busy)} while every core also "
            f"computed, against {_ms(idle)} idle: {ratio:.2f}x, "
            f"{'slower' if ratio > 1 else 'no slower'}.")


def _p50_note(p50_s: float, transfer_s: float) -> str:
    if not (math.isfinite(p50_s) and math.isfinite(transfer_s)):
        return ""
    return (f"the transfer is the median of the calls that waited for nothing; their p50 "
            f"{_ms(p50_s)} is {p50_s / transfer_s:.2g}x it (the calls that also waited for the "
            "scheduler)")


def context_laws(ctx: dict, *, ranks: int, note: str = "") -> list[dict]:
    """The machine profile's all-reduce transfer (another launch of this run) against this
    sweep's, idle and, where measured, while every core computes (:func:`busy_law`): a call
    that waited for nothing (:func:`labkit.machine.formulas.transfer_of`) on each side. How often calls also waited changes from second to
    second; the notes give the p50s beside the transfers.

    >>> ctx = {"size_bytes": 2 << 20, "idle_s": 2.9e-3, "busy_s": 5.4e-3, "matmuls": 40,
    ...        "idle_transfer_s": 2.2e-3, "busy_transfer_s": 3.4e-3,
    ...        "predicted_idle_s": 2.0e-3, "predicted_busy_s": 3.9e-3}
    >>> [(r["kind"], r["holds"]) for r in context_laws(ctx, ranks=2)]
    [('model', True), ('model', True)]
    >>> len(context_laws(dict(ctx, busy_s=math.nan), ranks=2))
    1
    """
    def joined(*parts):
        return "; ".join(p for p in parts if p)

    rows = [laws.check(
        f"all-reduce transfer, cores idle ({size_text(ctx['size_bytes'])}, N = {ranks}), from "
        "the machine profile", predicted=ctx["predicted_idle_s"] * 1e3,
        measured=ctx["idle_transfer_s"] * 1e3, unit="ms", tolerance_pct=25,
        split=machine_formulas.fastest_split(transfer_s=ctx["idle_transfer_s"],
                                             fastest_s=ctx.get("idle_fastest_s", math.nan)),
        note=joined(note, _p50_note(ctx["idle_s"], ctx["idle_transfer_s"])))]
    if not math.isnan(ctx["busy_s"]):
        share = ctx.get("profile_busy_wait_share", math.nan)
        if share > BUSY_MEDIAN_SHARE and ctx.get("predicted_busy_p50_s", math.nan) > 0:
            # most of the profile's calls waited: its transfer is read off the one or two that
            # did not, so the medians are compared, the statistic both sides measure steadily
            rows.append(busy_law(
                size_bytes=ctx["size_bytes"], ranks=ranks, statistic="p50",
                predicted_s=ctx["predicted_busy_p50_s"], measured_s=ctx["busy_s"],
                matmuls=ctx.get("matmuls"),
                split=p10_split(ctx["busy_s"], ctx.get("busy_p10_s", math.nan)),
                note=joined(note, f"{share:.0%} of the profile's busy calls at this size waited "
                                  f"(more than {BUSY_MEDIAN_SHARE:.0%}): the transfer it would "
                                  "read off the rest is one or two calls, so the p50s are "
                                  f"compared (the profile's transfer {_ms(ctx['predicted_busy_s'])}"
                                  f", the calls' {_ms(ctx['busy_transfer_s'])})")))
        else:
            rows.append(busy_law(
                size_bytes=ctx["size_bytes"], ranks=ranks, predicted_s=ctx["predicted_busy_s"],
                measured_s=ctx["busy_transfer_s"], matmuls=ctx.get("matmuls"),
                split=machine_formulas.fastest_split(
                    transfer_s=ctx["busy_transfer_s"], fastest_s=ctx.get("busy_fastest_s", math.nan)),
                note=joined(note, _p50_note(ctx["busy_s"], ctx["busy_transfer_s"]))))
    return rows


def busy_law(*, size_bytes: float, ranks: int, predicted_s: float, measured_s: float,
             matmuls: int | None, note: str = "", split: dict | None = None,
             statistic: str = "transfer") -> dict:
    """An all-reduce's transfer (or its ``statistic``, "p50") while every core computes,
    predicted by the machine profile's busy sweep (another launch of the run). No mechanism,
    no law: it holds only where the busy thread finished products while the all-reduce was
    timed.

    >>> busy_law(size_bytes=2 << 20, ranks=2, predicted_s=4e-3, measured_s=4.4e-3,
    ...          matmuls=12)["holds"]
    True
    >>> busy_law(size_bytes=2 << 20, ranks=2, predicted_s=4e-3, measured_s=4.4e-3,
    ...          matmuls=0)["holds"]
    False
    """
    return laws.check(
        f"all-reduce {statistic} while every core computes ({size_text(size_bytes)}, "
        f"N = {ranks}), from the machine profile", predicted=predicted_s * 1e3,
        measured=measured_s * 1e3, unit="ms", tolerance_pct=25, mechanism_observed=bool(matmuls),
        note=note, split=split,
        mechanism="the busy thread computed during the timed calls")
