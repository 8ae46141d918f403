"""The sentences notebooks 08 and 90 print about their numbers, computed from those numbers
(pure: no torch, no pandas). A sentence that says "faster", "within" or "mostly negative" says so
because the numbers beside it do; the tests flip each one by flipping its numbers.
"""

from __future__ import annotations

import math


def error_signs(errors_pct, *, what: str = "time") -> str:
    """Which way the model misses a set of measured times: most errors negative (the model
    faster than the measurement), most positive (slower), or as many each way. Errors are
    ``100 · (model − measured)``-signed (:func:`labkit.book.laws.symmetric_error_pct`).

    >>> error_signs([-20.0, -50.0, 10.0])
    'errors are mostly negative (the model predicts a shorter time than measured in 2 of 3 time rows: -20%, -50%, +10%)'
    >>> error_signs([20.0, 169.0, -10.0])
    'errors are mostly positive (the model predicts a longer time than measured in 2 of 3 time rows: +20%, +169%, -10%)'
    >>> error_signs([5.0, -5.0])
    'errors are as often positive as negative (2 time rows: +5%, -5%)'
    """
    vals = [float(e) for e in errors_pct if e is not None and not math.isnan(float(e))]
    if not vals:
        return f"no {what} rows to compare"
    listed = ", ".join(f"{e:+.0f}%" for e in vals)
    neg, pos = sum(e < 0 for e in vals), sum(e > 0 for e in vals)
    if neg > pos:
        return (f"errors are mostly negative (the model predicts a shorter {what} than measured "
                f"in {neg} of {len(vals)} {what} rows: {listed})")
    if pos > neg:
        return (f"errors are mostly positive (the model predicts a longer {what} than measured "
                f"in {pos} of {len(vals)} {what} rows: {listed})")
    return f"errors are as often positive as negative ({len(vals)} {what} rows: {listed})"


def load_sentence(load: float, cores: int) -> str:
    """What the load average says about the live runs that follow.

    >>> load_sentence(1.8, 2)
    'load average 1.8 on 2 cores: other work shares the cores with the live runs'
    >>> load_sentence(0.2, 2)
    'load average 0.2 on 2 cores: the cores are mostly free for the live runs'
    """
    if load >= 0.5 * cores:
        return f"load average {load:.1f} on {cores} cores: other work shares the cores with the live runs"
    return f"load average {load:.1f} on {cores} cores: the cores are mostly free for the live runs"


def agreement(term: str, diff_pct: float, tolerance_pct: float) -> str:
    """One engine's term beside the other's: agree within the tolerance, or differ by more.
    ``diff_pct`` is labkit's symmetric error against mlsysim.

    >>> agreement("compute", -0.04, 1.0)
    'compute: labkit and mlsysim agree within 1% (-0.04%)'
    >>> agreement("TP all-reduces", 10.5, 1.0)
    'TP all-reduces: labkit and mlsysim differ by more than 1% (+10.5%)'
    """
    if diff_pct is None or math.isnan(diff_pct):
        return f"{term}: no ratio (one engine prices it at zero)"
    if abs(diff_pct) <= tolerance_pct:
        return f"{term}: labkit and mlsysim agree within {tolerance_pct:g}% ({diff_pct:+.2g}%)"
    return f"{term}: labkit and mlsysim differ by more than {tolerance_pct:g}% ({diff_pct:+.3g}%)"


def old_bubble(*, old_step_s: float, step_s: float) -> str:
    """How much longer mlsysim's pre-0.3.0 formula made a step than the model does.

    >>> old_bubble(old_step_s=9.0, step_s=2.5)
    'the old formula makes the step 3.6x longer than this model (9 s against 2.5 s)'
    >>> old_bubble(old_step_s=2.0, step_s=2.5)
    'the old formula makes the step 0.8x as long as this model (2 s against 2.5 s)'
    """
    r = old_step_s / step_s
    how = f"{r:.2g}x longer than" if r > 1 else f"{r:.2g}x as long as"
    return f"the old formula makes the step {how} this model ({old_step_s:.3g} s against {step_s:.3g} s)"
