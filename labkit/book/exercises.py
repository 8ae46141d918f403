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
