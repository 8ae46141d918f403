"""How far this machine moved while the lab ran: its profile measured before the first notebook
and again after the last one (``labkit lab``), compared quantity by quantity (pure).

Every ``model`` law predicts from the profile taken at the start, and is judged at 25 % (the
widest tolerance, :data:`labkit.book.laws.MAX_TOLERANCE_PCT`). Where the machine itself moved
more than that between two measurements of the same thing, a law on that quantity can miss by
the machine's drift alone: this table is that drift, measured, beside the law counts. Why two
profiles and not one: on the 2-vCPU VM five ``labkit calibrate`` runs back to back (100 s)
read a 1 MiB all-reduce's transfer at 0.70-1.12 ms and the training step's co-run slowdown at
1.06-1.38.
"""

from __future__ import annotations

import math

from labkit.book.laws import MAX_TOLERANCE_PCT, symmetric_error_pct
from labkit.tables import size_text

#: the file ``labkit lab`` stores the second profile in, beside the first (:data:`FILE`)
END_FILE = "machine_profile_end.json"

#: the all-reduce sizes compared: the smallest message's (one buffer, as notebook 01 times its
#: own), one of the labs' gradient buckets, and a large one idle and while every core computes
ALLREDUCE_SIZES = ((8, False, True), (1 << 20, False, False), (8 << 20, False, False),
                   (8 << 20, True, False))


def _largest_n(prof) -> float:
    return max(r["n"] for r in prof.rows if r.get("measurement") == "matmul")


def quantities(prof) -> list[tuple[str, str, float]]:
    """(name, unit, value) of the profile's quantities the labs' models predict from: the
    compute rates and co-run slowdowns, the copy's co-run slowdown, all-reduce transfers at
    :data:`ALLREDUCE_SIZES` and the scheduler's wait (nan where the profile lacks one)."""
    def safe(fn):
        try:
            return float(fn())
        except (KeyError, ValueError, ZeroDivisionError, IndexError):
            return math.nan

    n = safe(lambda: _largest_n(prof))
    out = [("training step's rate alone, largest batch", "GFLOP/s",
            safe(lambda: prof.step_flop_per_s() / 1e9)),
           ("training step's co-run slowdown", "x", safe(lambda: prof.co_run_slowdown)),
           (f"matrix product's rate alone, n = {n:.0f}", "GFLOP/s",
            safe(lambda: prof.matmul_flop_per_s(n) / 1e9)),
           ("largest copy's co-run slowdown", "x", safe(lambda: prof.copy_slowdown))]
    for size, busy, one_buffer in ALLREDUCE_SIZES:
        what = "while every core computes" if busy else "cores idle"
        out.append((f"all-reduce transfer of {size_text(size)}, {what}", "ms",
                     safe(lambda s=size, b=busy, o=one_buffer:
                          prof.transfer_s(s, busy=b, one_buffer=o) * 1e3)))
    out.append(("a scheduler wait", "ms", safe(lambda: prof.scheduler_wait_s * 1e3)))
    return out


def compare(start, end, *, tolerance_pct: float = MAX_TOLERANCE_PCT) -> list[dict]:
    """One row per quantity (:func:`quantities`) of two profiles of this machine: ``start``,
    ``end``, ``moved_pct`` (the laws' symmetric error of the end against the start, signed +
    when the end is larger) and ``moved`` (beyond ``tolerance_pct``, the laws' widest).

    >>> from labkit.machine import Profile
    >>> rows = lambda t, s: [
    ...     {"measurement": "matmul", "context": c, "n": 256, "time_p50_s": 1e-3,
    ...      "flop_per_s": 3.3e10} for c in ("alone", "together")] + [
    ...     {"measurement": "step", "context": "alone", "batch": 64, "time_p50_s": 1e-3,
    ...      "flop_per_s": 5e10},
    ...     {"measurement": "step", "context": "together", "batch": 64, "time_p50_s": s * 1e-3,
    ...      "flop_per_s": 5e10 / s}] + [
    ...     {"measurement": "copy", "context": c, "size_bytes": 1 << 20, "time_p50_s": 1e-4,
    ...      "bytes_per_s": 2e10} for c in ("alone", "together")] + [
    ...     {"measurement": m, "context": c, "size_bytes": b, "time_p50_s": t * b * 1e-9 + 2e-4,
    ...      "transfer_s": t * b * 1e-9 + 2e-4, "wait_excess_s": [3e-3]}
    ...     for m in ("allreduce", "message") for c in ("idle", "busy") for b in (8, 1 << 20, 8 << 20)]
    >>> got = compare(Profile.from_rows(rows(1.0, 1.1)), Profile.from_rows(rows(2.0, 1.2)))
    >>> [(r["quantity"], round(r["start"], 3), round(r["end"], 3), r["moved"]) for r in got][1:6:4]
    [("training step's co-run slowdown", 1.1, 1.2, False), ('all-reduce transfer of 1 MiB, cores idle', 1.249, 2.297, True)]
    """
    rows = []
    for (name, unit, a), (_, _, b) in zip(quantities(start), quantities(end)):
        known = math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
        moved = symmetric_error_pct(b, a) if known else math.nan
        rows.append({"quantity": name, "unit": unit, "start": a, "end": b, "moved_pct": moved,
                     "moved": bool(known and abs(moved) > tolerance_pct)})
    return rows


def sentence(rows: list[dict], *, minutes: float | None = None,
             tolerance_pct: float = MAX_TOLERANCE_PCT) -> str:
    """The drift in one sentence, computed from :func:`compare`'s rows.

    >>> r = [{"quantity": "a", "moved_pct": 40.0, "moved": True},
    ...      {"quantity": "b", "moved_pct": -10.0, "moved": False}]
    >>> print(sentence(r, minutes=3.2))
    Measured again 3.2 min later, 1 of 2 of the profile's quantities had moved by more than the laws' 25% (the most: a, +40%): a law that predicts from one of them can miss by the machine's own drift.
    >>> sentence([dict(r[1])])
    "Measured again at the run's end, none of 1 of the profile's quantities had moved by more than the laws' 25% (the most: b, -10%)."
    """
    known = [r for r in rows if math.isfinite(r["moved_pct"])]
    if not known:
        return "The profile could not be compared with itself: no quantity was measured twice."
    when = (f"Measured again {minutes:.1f} min later" if minutes is not None
            else "Measured again at the run's end")
    most = max(known, key=lambda r: abs(r["moved_pct"]))
    moved = sum(r["moved"] for r in known)
    count = f"{moved} of {len(known)}" if moved else f"none of {len(known)}"
    head = (f"{when}, {count} of the profile's quantities had moved by more than the laws' "
            f"{tolerance_pct:g}% (the most: {most['quantity']}, {most['moved_pct']:+.0f}%)")
    return head + (": a law that predicts from one of them can miss by the machine's own drift." if moved else ".")


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (quantity, unit, start, end, moved)."""
    lines = ["| quantity | unit | at the start | at the end | moved |", "|---|---|---|---|---|"]
    for r in rows:
        moved = f"{r['moved_pct']:+.0f}%" if math.isfinite(r["moved_pct"]) else "n/a"
        lines.append(f"| {r['quantity']} | {r['unit']} | {r['start']:.3g} | {r['end']:.3g} | "
                     f"{'**' + moved + '**' if r['moved'] else moved} |")
    return "\n".join(lines)


def of_run(executed_dir) -> tuple[list[dict], float | None] | None:
    """:func:`compare`'s rows for a run of ``labkit lab`` and the minutes between its two
    profiles; None where the run holds no second profile (a run of some notebooks by hand, a
    sweep, a run before the lab measured it twice)."""
    from datetime import datetime
    from pathlib import Path

    from labkit import results
    from labkit.machine import FILE, Profile

    first, second = Path(executed_dir) / FILE, Path(executed_dir) / END_FILE
    if not (first.exists() and second.exists()):
        return None
    start, end = (Profile.from_rows(results.read_rows(p), source=str(p)) for p in (first, second))
    try:
        minutes = (datetime.fromisoformat(end.measured_at)
                   - datetime.fromisoformat(start.measured_at)).total_seconds() / 60
    except (TypeError, ValueError):
        minutes = None
    return compare(start, end), minutes
