"""The pipeline lab's verdicts: the sentences notebook 07 and ``labkit pipeline`` print, each
computed from the rows it is given (pure: pandas only).

:func:`bubble_sentence` whether the fill/drain bubble falls with M and the formula holds;
:func:`step_sentence` whether the step model (:func:`labkit.pipeline.report.add_model`) predicts
the step; :func:`waits_sentence` how many messages waited for the scheduler and what that cost; :func:`best_m_sentence` which M gave the shortest step, which M the model picks and
what that costs; :func:`recv_ahead_sentence` what posting the receives ahead did (one line of
:func:`labkit.pipeline.report.recv_ahead_table`). Each judges as its law rows do
(:func:`labkit.book.laws.check`: the same error, the same tolerance); :func:`trend` words a
change by the numbers as printed. :data:`BUBBLE_TOLERANCE`, :data:`STEP_TOLERANCE_PCT` and
:data:`SAME_STEP` are the margins they judge by; :func:`series` and
:func:`best_microbatches` the rows a verdict starts from: they sit here, not in the report,
because the report's printed table carries these sentences (the report imports this module);
:mod:`labkit.pipeline.report` offers them beside its own selections.
"""

from __future__ import annotations

from labkit.results import select_rows

#: how close the fill/drain bubble read off the timeline should come to the formula (absolute)
BUBBLE_TOLERANCE = 0.05
#: how close the step model should come to the measured step (percent, symmetric): its two
#: measured inputs, the blocks alone and the profile's co-run slowdown, each carry the host's
#: step-to-step noise
STEP_TOLERANCE_PCT = 20.0


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


def trend(a: float, b: float, fmt: str = ".2f", *, down: str = "falls", up: str = "rises",
          same: str = "stays at", unit: str = "") -> str:
    """'falls (a -> b)', 'rises (a -> b)' or 'stays at a (a -> b)', judged on the numbers as
    printed, so the word never contradicts them (``unit`` follows b).

    >>> trend(0.33, 0.12), trend(0.12, 0.33, up="grows"), trend(0.071, 0.068)
    ('falls (0.33 -> 0.12)', 'grows (0.12 -> 0.33)', 'stays at 0.07 (0.07 -> 0.07)')
    """
    x, y = format(a, fmt), format(b, fmt)
    word = down if float(y) < float(x) else up if float(y) > float(x) else f"{same} {x}"
    return f"{word} ({x} -> {y}{unit})"


def _signed(e: float, tolerance: float, holds: bool) -> str:
    """``e`` with the digits that show on which side of ``tolerance`` it lies."""
    for digits in (3, 4, 6):
        text = f"{e:+.{digits}f}"
        if (abs(float(text)) <= tolerance) == holds:
            return text
    return f"{e:+g}"


def _bubble_checks(part, tolerance, predicted: str = "bubble_formula"):
    """Each row's fill/drain share against its ``predicted`` column, as the law rows judge it."""
    from labkit.book import laws

    return [laws.check("bubble", predicted=getattr(r, predicted), measured=r.bubble_fill_drain,
                       tolerance_abs=tolerance) for r in part.itertuples()]


def bubble_sentence(df, schedule: str, num_stages: int | None = None,
                    tolerance: float = BUBBLE_TOLERANCE) -> str:
    """Whether the fill/drain bubble read off the timeline falls with M, and whether the formula
    stays within ``tolerance`` (absolute, as the law rows judge it) of it at every M; the
    error is the law row's, formula − measured.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [1, 8],
    ...                    "bubble_fill_drain": [0.49, 0.13], "bubble_formula": [0.5, 1 / 9],
    ...                    "idle_other": [0.02, 0.04]})
    >>> print(bubble_sentence(df, "gpipe"))
    gpipe, P = 2: the fill/drain bubble read off the timeline falls (0.49 -> 0.13) from M = 1 to M = 8; the formula holds within 0.05 at every M (worst error -0.019 at M = 8).
    """
    part, p = _series_at(df, schedule, num_stages)
    lo, hi = part.iloc[0], part.iloc[-1]
    head = f"{schedule}, P = {p}: the fill/drain bubble read off the timeline "
    if len(part) == 1:
        head += f"is {lo.bubble_fill_drain:.2f} at M = {lo.num_microbatches}"
    else:
        head += (f"{trend(lo.bubble_fill_drain, hi.bubble_fill_drain)} from M = "
                 f"{lo.num_microbatches} to M = {hi.num_microbatches}")
    checks = _bubble_checks(part, tolerance)
    worst_i = max(range(len(checks)), key=lambda i: abs(checks[i]["error_abs"]))
    worst, ms_worst = checks[worst_i], part.iloc[worst_i].num_microbatches
    off = [r.num_microbatches for r, c in zip(part.itertuples(), checks) if not c["holds"]]
    err = _signed(worst["error_abs"], tolerance, worst["holds"])
    if not off:
        return (head + f"; the formula holds within {tolerance:g} at every M (worst error "
                f"{err} at M = {ms_worst}).")
    ms = ", ".join(str(m) for m in off)
    return (head + f"; the formula does not hold within {tolerance:g} at M = {ms} (worst error "
            f"{err} at M = {ms_worst}, where the rest of the idle time, messages and "
            f"scheduling, is {part.iloc[worst_i].idle_other:.2f} of the step)."
            + _model_clause(part, tolerance))


def _model_clause(part, tolerance) -> str:
    """Where the rows carry the step model's share (``bubble_model``) and the formula missed:
    whether the model's replayed step, which carries the gaps, messages and waits, holds."""
    if "bubble_model" not in part or part.bubble_model.isna().any():
        return ""
    checks = _bubble_checks(part, tolerance, predicted="bubble_model")
    off = [str(r.num_microbatches) for r, c in zip(part.itertuples(), checks) if not c["holds"]]
    if not off:
        return (" The step model's replayed step, which carries them, holds within "
                f"{tolerance:g} at every M.")
    return (" The step model's replayed step, which carries them, does not hold within "
            f"{tolerance:g} at M = {', '.join(off)} either.")


def step_sentence(df, schedule: str, num_stages: int | None = None,
                  tolerance_pct: float = STEP_TOLERANCE_PCT) -> str:
    """Whether the step model (``step_model_error_pct``: alone blocks, co-run slowdown,
    messages) predicts the measured step within ``tolerance_pct`` at every M.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "1f1b", "num_stages": 2, "num_microbatches": [2, 4],
    ...                    "step_model_error_pct": [-3.0, -21.0], "idle_other": [0.03, 0.12]})
    >>> print(step_sentence(df, "1f1b"))
    1f1b, P = 2: the step model does not hold within 20% at M = 4 (worst error -21.0% at M = 4, where the idle time outside the fill and drain, messages and waits, is 0.12 of the step).
    """
    part, p = _series_at(df, schedule, num_stages)
    errs = part.step_model_error_pct.abs()
    worst = part.loc[errs.idxmax()]
    off = part[errs > tolerance_pct + 1e-9]
    where = f"worst error {worst.step_model_error_pct:+.1f}% at M = {worst.num_microbatches}"
    if off.empty:
        return (f"{schedule}, P = {p}: the step model holds within {tolerance_pct:g}% at every M "
                f"({where}).")
    ms = ", ".join(str(m) for m in off.num_microbatches)
    return (f"{schedule}, P = {p}: the step model does not hold within {tolerance_pct:g}% at "
            f"M = {ms} ({where}, where the idle time outside the fill and drain, messages and "
            f"waits, is {worst.idle_other:.2f} of the step).")


def waits_sentence(df, schedule: str, num_stages: int | None = None) -> str:
    """How many messages of each M's median step waited for the scheduler (counted from the
    timeline against the profile's transfer: :func:`labkit.pipeline.report.add_model`), why,
    and what the waits add to the step, in the model and measured; or that none waited.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [2, 8],
    ...                    "messages": [4, 16], "messages_waited": [0, 3],
    ...                    "scheduler_wait_s": 3.6e-3, "step_waits_model_s": [0.0, 7.1e-3],
    ...                    "step_waits_measured_s": [0.0, 6.8e-3]})
    >>> print(waits_sentence(df, "gpipe"))
    gpipe, P = 2: 3 of 20 messages waited for the scheduler in the median steps (M = 2: 0 of 4, M = 8: 3 of 16), counted from their timelines: a message whose receiver's core is computing waits for the scheduler's next turn, which the profile's waits put at 3.6 ms on this machine. Where they waited, they add up to 7.1 ms to the predicted step (M = 8) and took up to 6.8 ms of the measured one.
    >>> print(waits_sentence(df.assign(messages_waited=0), "gpipe"))
    gpipe, P = 2: none of the 20 messages of the median steps waited for the scheduler (each arrived within its transfer + max(1.5 ms, transfer / 4), counted from their timelines): the model prices their transfers only.
    """
    from labkit.machine.formulas import WAIT_RULE

    part, p = _series_at(df, schedule, num_stages)
    head = f"{schedule}, P = {p}: "
    if "messages" not in part or part.messages.isna().any():
        return head + ("the rows hold no per-message timeline, so no message's wait for the "
                       "scheduler was counted.")
    n, k = int(part.messages.sum()), int(part.messages_waited.sum())
    if k == 0:
        return head + (f"none of the {n} messages of the median steps waited for the scheduler "
                       f"(each arrived within its {WAIT_RULE}, "
                       "counted from their timelines): the model prices their transfers only.")
    each = ", ".join(f"M = {r.num_microbatches}: {int(r.messages_waited)} of {int(r.messages)}"
                     for r in part.itertuples())
    top = part.loc[part.step_waits_model_s.idxmax()]
    return head + (f"{k} of {n} messages waited for the scheduler in the median steps ({each}), "
                   "counted from their timelines: a message whose receiver's core is computing "
                   "waits for the scheduler's next turn, which the profile's waits put at "
                   f"{part.scheduler_wait_s.iloc[0] * 1e3:.1f} ms on this machine. Where they "
                   f"waited, they add up to {top.step_waits_model_s * 1e3:.1f} ms to the "
                   f"predicted step (M = {top.num_microbatches}) and took up to "
                   f"{part.step_waits_measured_s.max() * 1e3:.1f} ms of the measured one.")


def best_m_sentence(df, schedule: str, num_stages: int | None = None,
                    tolerance_pct: float = STEP_TOLERANCE_PCT) -> str:
    """Which M gave the shortest measured step and which the model picks; what picking by the
    model costs (judged as the law row :func:`labkit.pipeline.report.best_m_laws` judges it);
    and why the best M is not simply the largest: from the best M to the largest, the fill/drain
    bubble and each stage's compute per step (M × t_slot) move, as printed.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [2, 8],
    ...                    "microbatch_size": [64, 16], "step_time_s": [0.09, 0.1],
    ...                    "step_time_model_s": [0.095, 0.098],
    ...                    "slot_time_s": [0.03, 0.011], "bubble_fill_drain": [0.33, 0.12]})
    >>> print(best_m_sentence(df, "gpipe"))
    gpipe, P = 2: the shortest measured step is at M = 2 (90.0 ms); the model picks M = 2, whose measured step is 90.0 ms (error +0.0%: holds within 20%). From M = 2 to M = 8 the fill/drain bubble falls (0.33 -> 0.12) and each stage's compute per step (M × t_slot) grows (60.0 -> 88.0 ms).
    """
    from labkit.book import laws

    part, p = _series_at(df, schedule, num_stages)
    best = part.loc[part.step_time_s.idxmin()]
    pick = part.loc[part.step_time_model_s.idxmin()]
    top = part.iloc[-1]
    row = laws.check("best M", predicted=pick.step_time_s * 1e3, measured=best.step_time_s * 1e3,
                     tolerance_pct=tolerance_pct)
    judged = (f"error {row['error_pct']:+.1f}%: "
              f"{'holds' if row['holds'] else 'does not hold'} within {tolerance_pct:g}%")
    text = (f"{schedule}, P = {p}: the shortest measured step is at M = {best.num_microbatches} "
            f"({best.step_time_s * 1e3:.1f} ms); the model picks M = {pick.num_microbatches}, "
            f"whose measured step is {pick.step_time_s * 1e3:.1f} ms ({judged}).")
    start = part.iloc[0] if best.num_microbatches == top.num_microbatches else best
    compute = [r.num_microbatches * r.slot_time_s * 1e3 for r in (start, top)]
    return text + (f" From M = {start.num_microbatches} to M = {top.num_microbatches} the "
                   f"fill/drain bubble {trend(start.bubble_fill_drain, top.bubble_fill_drain)} "
                   f"and each stage's compute per step (M × t_slot) "
                   f"{trend(*compute, '.1f', up='grows', down='shrinks', unit=' ms')}.")


#: steps within this ratio of each other count as the same step (the host's step-to-step noise)
SAME_STEP = 0.03


def recv_ahead_sentence(line, tolerance_pct: float = STEP_TOLERANCE_PCT) -> str:
    """What posting the receives ahead did, from one line of :func:`recv_ahead_table`: the
    idle time outside the fill and drain, t_slot, the step and the step model's error (judged
    as the law rows judge it), both ways, and where the messages' cost went when the step did
    not get shorter. Every change is worded by its printed numbers (:func:`trend`).

    >>> import pandas as pd
    >>> line = pd.Series({"schedule": "gpipe", "num_stages": 2, "num_microbatches": 8,
    ...                   "step_ms_torch": 240.0, "step_ms_ahead": 180.0, "slot_ms_torch": 20.0,
    ...                   "slot_ms_ahead": 19.0, "error_pct_torch": -21.0, "error_pct_ahead": -6.0,
    ...                   "idle_other_torch": 0.17, "idle_other_ahead": 0.06})
    >>> print(recv_ahead_sentence(line))
    gpipe, P = 2, M = 8, posting every receive at the step's start instead of torch's placement: the idle time outside the fill and drain falls (0.17 -> 0.06 of the step), t_slot falls (20.0 -> 19.0 ms) and the step falls (240.0 -> 180.0 ms: 1.33x faster). The step model is off by -21.0% with torch's placement (outside 20%) and -6.0% with receives ahead (within 20%).
    >>> same = line.copy()
    >>> same[["step_ms_ahead", "slot_ms_ahead"]] = [236.0, 22.0]
    >>> print(recv_ahead_sentence(same).split(" and the step ")[1])
    falls (240.0 -> 236.0 ms: about the same, since the idle time fell and t_slot rose instead: moving a message takes CPU time wherever its receive is posted). The step model is off by -21.0% with torch's placement (outside 20%) and -6.0% with receives ahead (within 20%).
    """
    r = line
    idle = trend(r.idle_other_torch, r.idle_other_ahead, unit=" of the step")
    slot = trend(r.slot_ms_torch, r.slot_ms_ahead, ".1f", unit=" ms")
    ratio = r.step_ms_torch / r.step_ms_ahead
    if ratio > 1 + SAME_STEP:
        verdict = f"{ratio:.2f}x faster"
    elif ratio < 1 - SAME_STEP:
        verdict = f"{1 / ratio:.2f}x slower"
    else:
        verdict = "about the same"
        if idle.startswith("falls") and slot.startswith("rises"):
            verdict += (", since the idle time fell and t_slot rose instead: moving a message "
                        "takes CPU time wherever its receive is posted")
    step = trend(r.step_ms_torch, r.step_ms_ahead, ".1f", unit=f" ms: {verdict}")

    def within(e):
        return f"{'within' if abs(e) <= tolerance_pct + 1e-9 else 'outside'} {tolerance_pct:g}%"

    return (f"{r.schedule}, P = {int(r.num_stages)}, M = {int(r.num_microbatches)}, posting "
            f"every receive at the step's start instead of torch's placement: the idle time "
            f"outside the fill and drain {idle}, t_slot {slot} and the step {step}. The step "
            f"model is off by {r.error_pct_torch:+.1f}% with torch's placement "
            f"({within(r.error_pct_torch)}) and {r.error_pct_ahead:+.1f}% with receives ahead "
            f"({within(r.error_pct_ahead)}).")
