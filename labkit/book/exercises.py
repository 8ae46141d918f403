"""Checks for the exercises at the end of each notebook (pure).

A student writes ``answer_1 = ...`` in a cell, and the next cell calls
``check(answer_1, expected, name="Exercise 1")``. An unanswered exercise (``None``) is not an
error, so a notebook with blank answers still runs from top to bottom (in the tests, in a sweep,
on the website); a wrong answer raises ``AssertionError`` with a hint, like a failing ``assert``.
The expected value is computed in the notebook from labkit functions, never typed in.
"""

from __future__ import annotations

import math


def check(answer, expected, *, name: str = "exercise", rel: float = 0.02, abs_tol: float = 0.0,
          hint: str = "") -> bool | None:
    """True if ``answer`` matches ``expected`` (numbers within ``rel``), None if unanswered.

    >>> check(None, 3.0) is None
    exercise: not answered yet (set the answer in the cell above and run this again)
    True
    >>> check(2.29, 8 / 3.49, name="Exercise 1")
    Exercise 1: correct
    True
    >>> check(3.0, 2.29, hint="N / s")
    Traceback (most recent call last):
    ...
    AssertionError: exercise: 3.0 is not right yet. Hint: N / s
    """
    if answer is None:
        print(f"{name}: not answered yet (set the answer in the cell above and run this again)")
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        try:
            ok = math.isclose(float(answer), float(expected), rel_tol=rel, abs_tol=abs_tol)
        except (TypeError, ValueError):
            ok = False
    else:
        ok = answer == expected
    if not ok:
        raise AssertionError(f"{name}: {answer!r} is not right yet." + (f" Hint: {hint}" if hint else ""))
    print(f"{name}: correct")
    return True


def prediction(guess, measured: float, *, name: str, unit: str = "", rel: float = 0.25) -> None:
    """Your prediction (a ``predict_...`` parameter, ``None`` until you set it) beside what the
    run measured, after the measurement. Never raises: a prediction is a
    question asked before the answer, not a test.

    >>> prediction(None, 1.71, name="speedup at 2 ranks")
    speedup at 2 ranks: measured 1.71. You gave no prediction: set it in the parameters cell and run again.
    >>> prediction(2.0, 1.71, name="speedup at 2 ranks")
    speedup at 2 ranks: you predicted 2, measured 1.71 (+17% off): within 25%, a good guess.
    >>> prediction(4, 1.71, name="speedup at 2 ranks")
    speedup at 2 ranks: you predicted 4, measured 1.71 (+134% off): further than 25%; the section explains the gap.
    """
    from labkit.book.laws import symmetric_error_pct

    u = f" {unit}" if unit else ""
    if measured is None or not math.isfinite(float(measured)):
        text = (f"{name}: not measured in this run (outside what it swept), so your "
                f"prediction{'' if guess is None else f' of {float(guess):.3g}{u}'} stays open.")
    elif guess is None:
        text = (f"{name}: measured {measured:.3g}{u}. You gave no prediction: set it in the "
                "parameters cell and run again.")
    else:
        err = symmetric_error_pct(float(guess), float(measured))
        close = math.isfinite(err) and abs(err) <= 100 * rel
        text = (f"{name}: you predicted {float(guess):.3g}{u}, measured {measured:.3g}{u} "
                f"({err:+.0f}% off): " + (f"within {100 * rel:g}%, a good guess." if close else
                                          f"further than {100 * rel:g}%; the section explains "
                                          "the gap."))
    print(text)
