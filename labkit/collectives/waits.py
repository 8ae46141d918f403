"""The calls of a sweep that waited for the scheduler, and the law on their wait (pure).

On a machine whose cores all run ranks a gloo call is one of two kinds
(:func:`labkit.machine.formulas.waits`): it moves at its transfer's pace, or it also waits for
the scheduler to give one of gloo's threads a core. The collectives rows hold each size's
transfer (``transfer_s``) and every rank's timed calls (``timeline_s``): :func:`waits_of` counts the
calls that waited and what each took beyond its transfer, :func:`wait_law` judges that wait
against the machine profile's.
"""

from __future__ import annotations

import math

import numpy as np

from labkit.book import laws


def call_times(rows) -> list[float]:
    """Every timed call of a sweep whose rows hold their calls (``timeline_s``: every rank's
    calls on one clock), as the rows count a call: the slowest rank's; none from a row that
    holds no timeline (None, or NaN in a DataFrame's row).

    >>> call_times([{"timeline_s": [{"rank": 0, "call": 1, "start_s": 0.0, "end_s": 1e-3},
    ...                             {"rank": 1, "call": 1, "start_s": 0.0, "end_s": 2e-3},
    ...                             {"rank": 0, "call": 2, "start_s": 2e-3, "end_s": 6e-3}]},
    ...             {"timeline_s": float("nan")}])
    [0.002, 0.004]
    """
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    out = []
    for r in rows:
        timeline = r.get("timeline_s")
        calls: dict = {}
        for c in timeline if isinstance(timeline, list) else []:
            calls[c["call"]] = max(calls.get(c["call"], 0.0), c["end_s"] - c["start_s"])
        out += list(calls.values())
    return out


def row_transfer(r, prefix: str = "") -> float | None:
    """A row's transfer (``transfer_s``; a row stored before the transfers were: its p10),
    None without either; ``prefix`` ``busy_`` for the all-reduce timed while the cores compute.

    >>> row_transfer({"transfer_s": 2e-4, "time_p10_s": 1e-4}), row_transfer({"time_p10_s": 1e-4})
    (0.0002, 0.0001)
    >>> row_transfer({"transfer_s": float("nan"), "busy_time_p10_s": 3e-4}, "busy_")
    0.0003
    """
    for key in (f"{prefix}transfer_s", f"{prefix}time_p10_s"):
        t = r.get(key)
        if t is not None and t == t:
            return float(t)
    return None


def profile_allreduces(prof, context: str) -> list[dict]:
    """The machine profile's all-reduce rows of ``context`` (``idle`` or ``busy``) timed as this
    lab times its own: back to back (``allreduce_steady``) where the profile has them, else
    (an older profile) its sweep's, each call after a barrier and another size's call.

    >>> class Prof:
    ...     rows = [{"measurement": "allreduce", "context": "idle", "size_bytes": 8},
    ...             {"measurement": "allreduce_steady", "context": "idle", "size_bytes": 8}]
    >>> [r["measurement"] for r in profile_allreduces(Prof(), "idle")]
    ['allreduce_steady']
    >>> Prof.rows = Prof.rows[:1]
    >>> [r["measurement"] for r in profile_allreduces(Prof(), "idle")]
    ['allreduce']
    """
    rows = [r for r in getattr(prof, "rows", ()) if r.get("context") == context]
    steady = [r for r in rows if r.get("measurement") == "allreduce_steady"]
    return steady or [r for r in rows if r.get("measurement") == "allreduce"]


def waits_of(rows) -> dict:
    """The sweep's calls that also waited for the scheduler (:func:`labkit.machine.formulas.waits`,
    each size's calls against that size's transfer): ``calls``, ``waited``, ``share``,
    ``excess_s`` (what each that waited took beyond its transfer).

    Two sizes, each with one call 4 ms over its transfer:

    >>> row = lambda t: {"transfer_s": t, "timeline_s": [
    ...     {"call": k, "start_s": 0.0, "end_s": t + (4e-3 if k == 3 else 0.0)} for k in (1, 2, 3)]}
    >>> w = waits_of([row(1e-3), row(2e-3)])
    >>> w["calls"], w["waited"], [round(x * 1e3, 1) for x in w["excess_s"]]
    (6, 2, [4.0, 4.0])
    """
    from labkit.machine.formulas import waits

    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    calls, excess = 0, []
    for r in rows:
        times = call_times([r])
        transfer = row_transfer(r)
        if not times or transfer is None:
            continue
        w = waits(times, transfer_s=transfer)
        calls += len(times)
        excess += w["wait_excess_s"]
    return {"calls": calls, "waited": len(excess), "share": len(excess) / calls if calls else 0.0,
            "excess_s": excess}


def profile_wait_sentence(w: dict, prof) -> str:
    """How many of this sweep's calls waited (:func:`waits_of`) and what the machine profile's
    wait is, the one the wait law predicts with (:meth:`labkit.machine.Profile.steady_wait_s`):
    its all-reduces called back to back with the cores idle, or, in a profile without them,
    every call of its sweep that waited.

    >>> class Prof:
    ...     def steady_wait_s(self): return 3.6e-3
    ...     def steady_waited(self): return True
    >>> w = {"calls": 192, "waited": 80, "share": 80 / 192, "excess_s": []}
    >>> print(profile_wait_sentence(w, Prof()))  # doctest: +NORMALIZE_WHITESPACE
    80 of 192 timed all-reduce calls (42%) also waited for the scheduler; the machine profile's
    all-reduces called back to back with the cores idle waited 3.60 ms beyond their transfer
    (median)
    >>> Prof.steady_waited = lambda self: False
    >>> profile_wait_sentence(w, Prof()).split("; ")[1][:60]
    "the machine profile's calls that waited (every kind: it time"
    """
    whose = ("all-reduces called back to back with the cores idle" if prof.steady_waited()
             else "calls that waited (every kind: it timed none back to back that waited)")
    return (f"{w['waited']} of {w['calls']} timed all-reduce calls ({w['share']:.0%}) also "
            f"waited for the scheduler; the machine profile's {whose} waited "
            f"{prof.steady_wait_s() * 1e3:.2f} ms beyond their transfer (median)")


#: the fewest calls that waited for a wait law to judge (fewer: its mechanism not observed)
MIN_WAITED = 3


def wait_law(w: dict, *, predicted_s: float, ranks: int, note: str = "") -> dict:
    """The calls of this sweep that waited for the scheduler, against the machine profile's
    wait (another launch: :meth:`labkit.machine.Profile.steady_wait_s`, its all-reduces called
    back to back as this lab calls its own): the median of what each took beyond its transfer.
    How often calls waited is this sweep's own (printed), how long one waits is the machine's.
    Judged where at least :data:`MIN_WAITED` calls waited.

    >>> w = {"calls": 40, "waited": 9, "share": 0.225, "excess_s": [3.6e-3] * 9}
    >>> r = wait_law(w, predicted_s=3.5e-3, ranks=2)
    >>> r["kind"], r["holds"], r["note"]
    ('model', True, '9 of 40 calls (22%) waited')
    >>> wait_law(dict(w, waited=1, excess_s=[3.6e-3]), predicted_s=3.5e-3, ranks=2)["holds"]
    False
    """
    waited = w["excess_s"]
    median_s = float(np.median(waited)) if waited else math.nan
    return laws.check(
        f"a call that waited for the scheduler, beyond its transfer (N = {ranks}), from the "
        "machine profile", predicted=predicted_s * 1e3,
        measured=median_s * 1e3, unit="ms",
        tolerance_pct=25, mechanism_observed=w["waited"] >= MIN_WAITED,
        mechanism=f"at least {MIN_WAITED} calls that waited",
        split={"the shortest wait": min(waited) * 1e3,
               "the median wait above it": (median_s - min(waited)) * 1e3} if waited else None,
        note="; ".join(p for p in (f"{w['waited']} of {w['calls']} calls ({w['share']:.0%}) "
                                   "waited", note) if p))
