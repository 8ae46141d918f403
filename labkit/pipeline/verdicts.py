"""The pipeline lab's verdicts: the sentences notebook 07 and ``labkit pipeline`` print, each
computed from the rows it is given (pure: pandas only).

:func:`bubble_sentence` whether the fill/drain bubble falls with M and stays near the formula;
:func:`step_sentence` whether (M + P − 1) × t_slot(M) predicts the step; :func:`best_m_sentence`
which M gave the shortest step, and why; :func:`recv_ahead_sentence` what posting the receives
ahead did (one line of :func:`labkit.pipeline.report.recv_ahead_table`). :data:`BUBBLE_TOLERANCE`,
:data:`STEP_TOLERANCE_PCT` and :data:`SAME_STEP` are the margins they judge by; :func:`series` and
:func:`best_microbatches` the rows a verdict starts from: they sit here, not in the report,
because the report's printed table carries these sentences (the report imports this module);
:mod:`labkit.pipeline.report` offers them beside its own selections.
"""

from __future__ import annotations

from labkit.results import select_rows

#: how close the fill/drain bubble read off the timeline should come to the formula (absolute)
BUBBLE_TOLERANCE = 0.05
#: how close (M + P − 1) × t_slot(M) should come to the measured step (percent)
STEP_TOLERANCE_PCT = 15.0


def series(df, schedule: str, num_stages: int | None = None):
    """The rows of one schedule (and P: the smallest in the rows when not given), by M.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": ["gpipe"] * 3, "num_stages": [2] * 3,
    ...                    "num_microbatches": [4, 1, 2]})
    >>> list(series(df, "gpipe").num_microbatches)
    [1, 2, 4]
    """
    from labkit.errors import UsageError

    part = select_rows(df, schedule=schedule)
    if part.empty:
        raise UsageError(f"no rows for schedule {schedule} (have {sorted(set(df.schedule))})")
    p = int(part.num_stages.min()) if num_stages is None else num_stages
    part = select_rows(part, num_stages=p)
    if part.empty:
        raise UsageError(f"no rows for {schedule} at P={p}")
    return part.sort_values("num_microbatches", kind="stable")


def _series_at(df, schedule: str, num_stages: int | None):
    """:func:`series` and its P (what every sentence starts from)."""
    part = series(df, schedule, num_stages)
    return part, int(part.num_stages.iloc[0])


def best_microbatches(df, schedule: str, num_stages: int | None = None):
    """The row of the M with the shortest measured step (one schedule, one P).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [2, 4, 8],
    ...                    "step_time_s": [0.30, 0.20, 0.25]})
    >>> int(best_microbatches(df, "gpipe").num_microbatches)
    4
    """
    part = series(df, schedule, num_stages)
    return part.loc[part.step_time_s.idxmin()]


def bubble_sentence(df, schedule: str, num_stages: int | None = None,
                    tolerance: float = BUBBLE_TOLERANCE) -> str:
    """Whether the fill/drain bubble read off the timeline falls with M, and whether it stays
    within ``tolerance`` of the formula at every M, in one sentence from the rows.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [1, 8],
    ...                    "bubble_fill_drain": [0.49, 0.13], "bubble_formula": [0.5, 1 / 9],
    ...                    "idle_other": [0.02, 0.04]})
    >>> bubble_sentence(df, "gpipe")
    'gpipe, P = 2: the fill/drain bubble read off the timeline falls from 0.49 at M = 1 to 0.13 at M = 8, within 0.05 of the formula at every M.'
    """
    part, p = _series_at(df, schedule, num_stages)
    lo, hi = part.iloc[0], part.iloc[-1]
    head = f"{schedule}, P = {p}: the fill/drain bubble read off the timeline "
    if len(part) == 1:
        head += f"is {lo.bubble_fill_drain:.2f} at M = {lo.num_microbatches}"
    elif hi.bubble_fill_drain < lo.bubble_fill_drain:
        head += (f"falls from {lo.bubble_fill_drain:.2f} at M = {lo.num_microbatches} to "
                 f"{hi.bubble_fill_drain:.2f} at M = {hi.num_microbatches}")
    else:
        head += (f"does not fall: {lo.bubble_fill_drain:.2f} at M = {lo.num_microbatches}, "
                 f"{hi.bubble_fill_drain:.2f} at M = {hi.num_microbatches}")
    err = part.bubble_fill_drain - part.bubble_formula
    off = part[err.abs() > tolerance]
    if off.empty:
        return head + f", within {tolerance:g} of the formula at every M."
    worst = off.loc[(off.bubble_fill_drain - off.bubble_formula).abs().idxmax()]
    ms = ", ".join(str(m) for m in off.num_microbatches)
    return (head + f"; it is more than {tolerance:g} from the formula at M = {ms} (worst "
            f"{worst.bubble_fill_drain - worst.bubble_formula:+.3f} at M = "
            f"{worst.num_microbatches}, where the rest of the idle time, messages and "
            f"scheduling, is {worst.idle_other:.2f} of the step).")


def step_sentence(df, schedule: str, num_stages: int | None = None,
                  tolerance_pct: float = STEP_TOLERANCE_PCT) -> str:
    """Whether (M + P − 1) × t_slot(M) predicts the measured step within ``tolerance_pct``.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "1f1b", "num_stages": 2, "num_microbatches": [2, 4],
    ...                    "step_time_error_pct": [-3.0, -21.0], "idle_other": [0.03, 0.12]})
    >>> print(step_sentence(df, "1f1b"))
    1f1b, P = 2: the predicted step is off by more than 15% at M = 4 (worst -21% at M = 4): the model counts compute and the fill/drain bubble only, and at M = 4 the rest of the idle time (messages waiting for a core, the schedule's own work, other jobs) is 0.12 of the step.
    """
    part, p = _series_at(df, schedule, num_stages)
    worst = part.loc[part.step_time_error_pct.abs().idxmax()]
    off = part[part.step_time_error_pct.abs() > tolerance_pct]
    where = f"worst {worst.step_time_error_pct:+.0f}% at M = {worst.num_microbatches}"
    if off.empty:
        return (f"{schedule}, P = {p}: (M + P − 1) × t_slot(M) predicts the measured step "
                f"within {tolerance_pct:g}% at every M ({where}).")
    ms = ", ".join(str(m) for m in off.num_microbatches)
    return (f"{schedule}, P = {p}: the predicted step is off by more than {tolerance_pct:g}% at "
            f"M = {ms} ({where}): the model counts compute and the fill/drain bubble only, and "
            f"at M = {worst.num_microbatches} the rest of the idle time (messages waiting for a "
            f"core, the schedule's own work, other jobs) is {worst.idle_other:.2f} of the step.")


def best_m_sentence(df, schedule: str, num_stages: int | None = None) -> str:
    """Which M gave the shortest step, and why it is (or is not) the largest M: the bubble
    shrinks while each smaller microbatch costs more per sample.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [2, 8],
    ...                    "microbatch_size": [64, 16], "step_time_s": [0.09, 0.1],
    ...                    "slot_time_s": [0.03, 0.011], "bubble_fill_drain": [0.33, 0.12]})
    >>> best_m_sentence(df, "gpipe")[:75]
    'gpipe, P = 2: the shortest step is at M = 2 (90.0 ms), not at the largest M'
    """
    part, p = _series_at(df, schedule, num_stages)
    best, top = best_microbatches(part, schedule, p), part.iloc[-1]
    if best.num_microbatches == top.num_microbatches:
        lo = part.iloc[0]
        c_lo, c_top = (r.num_microbatches * r.slot_time_s * 1e3 for r in (lo, top))
        bubble = (f"({lo.bubble_fill_drain:.2f} at M = {lo.num_microbatches} -> "
                  f"{top.bubble_fill_drain:.2f})")
        compute = f"(compute per stage M × t_slot {c_lo:.1f} -> {c_top:.1f} ms)"
        if top.bubble_fill_drain >= lo.bubble_fill_drain:
            why = (f"the fill/drain bubble does not fall {bubble}, compute per stage goes "
                   f"{c_lo:.1f} -> {c_top:.1f} ms: the other idle time decides")
        elif c_top > c_lo:
            why = (f"the fill/drain bubble's fall {bubble} outweighs the slower small "
                   f"microbatches {compute}")
        else:
            why = (f"the fill/drain bubble falls {bubble} and small microbatches cost no more "
                   f"here {compute}")
        return (f"{schedule}, P = {p}: the shortest step is at the largest M = "
                f"{top.num_microbatches} ({top.step_time_s * 1e3:.1f} ms): {why}.")
    per = {r.num_microbatches: r.slot_time_s / r.microbatch_size * 1e3 for r in (best, top)}
    compute = {r.num_microbatches: r.num_microbatches * r.slot_time_s * 1e3 for r in (best, top)}
    bubble = ("shrinks" if top.bubble_fill_drain < best.bubble_fill_drain
              else "does not shrink here")
    grows = "grows" if compute[top.num_microbatches] > compute[best.num_microbatches] else "changes"
    return (f"{schedule}, P = {p}: the shortest step is at M = {best.num_microbatches} "
            f"({best.step_time_s * 1e3:.1f} ms), not at the largest M = {top.num_microbatches} "
            f"({top.step_time_s * 1e3:.1f} ms): from M = {best.num_microbatches} to "
            f"{top.num_microbatches} the fill/drain bubble {bubble} ({best.bubble_fill_drain:.2f}"
            f" -> {top.bubble_fill_drain:.2f} of the step), and each stage's compute per step "
            f"(M × t_slot) {grows} from {compute[best.num_microbatches]:.1f} to "
            f"{compute[top.num_microbatches]:.1f} ms: a microbatch of {top.microbatch_size} "
            f"samples costs {per[top.num_microbatches]:.3f} ms per sample against "
            f"{per[best.num_microbatches]:.3f} at {best.microbatch_size}.")


#: steps within this ratio of each other count as the same step (the host's step-to-step noise)
SAME_STEP = 0.03


def recv_ahead_sentence(line, tolerance_pct: float = STEP_TOLERANCE_PCT) -> str:
    """What posting the receives ahead did, from one line of :func:`recv_ahead_table`: the
    idle time outside the fill and drain, t_slot, the step and the prediction's error, both
    ways, and where the messages' cost went when the step did not get shorter.

    >>> import pandas as pd
    >>> line = pd.Series({"schedule": "gpipe", "num_stages": 2, "num_microbatches": 8,
    ...                   "step_ms_torch": 240.0, "step_ms_ahead": 180.0, "slot_ms_torch": 20.0,
    ...                   "slot_ms_ahead": 19.0, "error_pct_torch": -21.0, "error_pct_ahead": -6.0,
    ...                   "idle_other_torch": 0.17, "idle_other_ahead": 0.06})
    >>> print(recv_ahead_sentence(line))
    gpipe, P = 2, M = 8: posting every receive at the step's start took the idle time outside the fill and drain from 0.17 to 0.06 of the step and t_slot from 20.0 to 19.0 ms; the step went from 240.0 to 180.0 ms (1.33x faster). (M + P − 1) × t_slot(M) is off by -21% with torch's placement (outside 15%) and -6% with receives ahead (within 15%).
    >>> same = line.copy()
    >>> same[["step_ms_ahead", "slot_ms_ahead"]] = [236.0, 22.0]
    >>> print(recv_ahead_sentence(same).split("; ")[1])
    the step went from 240.0 to 236.0 ms (about the same: the idle time fell and t_slot rose instead, since moving a message takes CPU time wherever its receive is posted). (M + P − 1) × t_slot(M) is off by -21% with torch's placement (outside 15%) and -6% with receives ahead (within 15%).
    """
    r = line
    ratio = r.step_ms_torch / r.step_ms_ahead
    if ratio > 1 + SAME_STEP:
        verdict = f"{ratio:.2f}x faster"
    elif ratio < 1 - SAME_STEP:
        verdict = f"{1 / ratio:.2f}x slower"
    else:
        verdict = "about the same"
        if r.idle_other_ahead < r.idle_other_torch and r.slot_ms_ahead > r.slot_ms_torch:
            verdict += (": the idle time fell and t_slot rose instead, since moving a message "
                        "takes CPU time wherever its receive is posted")

    def within(e):
        return f"{'within' if abs(e) <= tolerance_pct else 'outside'} {tolerance_pct:g}%"

    return (f"{r.schedule}, P = {int(r.num_stages)}, M = {int(r.num_microbatches)}: posting every "
            f"receive at the step's start took the idle time outside the fill and drain from "
            f"{r.idle_other_torch:.2f} to {r.idle_other_ahead:.2f} of the step and t_slot from "
            f"{r.slot_ms_torch:.1f} to {r.slot_ms_ahead:.1f} ms; the step went from "
            f"{r.step_ms_torch:.1f} to {r.step_ms_ahead:.1f} ms ({verdict}). (M + P − 1) × "
            f"t_slot(M) is off by {r.error_pct_torch:+.0f}% with torch's placement "
            f"({within(r.error_pct_torch)}) and {r.error_pct_ahead:+.0f}% with receives ahead "
            f"({within(r.error_pct_ahead)}).")
