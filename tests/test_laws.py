"""The law table's rules: symmetric error, one tolerance semantic per quantity, kinds counted
apart, a mechanism not observed never holds, and the contradiction checker."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from labkit.book import consistency, laws


@pytest.mark.parametrize("p,m", [(2.0, 1.0), (1.3, 1.0), (10.0, 7.0)])
def test_the_error_is_symmetric(p, m):
    a, b = laws.symmetric_error_pct(p, m), laws.symmetric_error_pct(m, p)
    assert a == pytest.approx(-b) and a > 0


def test_a_26_percent_miss_fails_both_ways():
    """The old one-sided error let a measurement 26% slower than predicted hold at 25%."""
    assert not laws.check("t", predicted=1.0, measured=1.26, tolerance_pct=25)["holds"]
    assert not laws.check("t", predicted=1.26, measured=1.0, tolerance_pct=25)["holds"]
    assert laws.check("t", predicted=1.0, measured=1.24, tolerance_pct=25)["holds"]


def test_fractions_are_held_to_an_absolute_tolerance():
    r = laws.check("bubble", predicted=0.04, measured=0.08, tolerance_abs=0.05)
    assert r["holds"] and r["error_abs"] == pytest.approx(-0.04) and r["tolerance_pct"] is None
    assert not laws.check("bubble", predicted=0.10, measured=0.16, tolerance_abs=0.05)["holds"]
    assert "±0.05" in laws.verdict(r)


def test_no_ratio_is_infinitely_wrong():
    r = laws.check("t", predicted=0.0, measured=1.0)
    assert not r["holds"] and r["error_pct"] is None
    assert not laws.check("t", predicted=math.nan, measured=1.0)["holds"]


def test_a_mechanism_not_observed_never_holds():
    r = laws.check("overlap", predicted=1.0, measured=1.0, mechanism_observed=False,
                   mechanism="the all-reduce hidden behind backward")
    assert not r["holds"] and "mechanism not observed" in laws.verdict(r)
    assert laws.check("overlap", predicted=1.0, measured=1.0, mechanism_observed=True)["holds"]


def test_a_model_miss_prints_its_measured_split():
    r = laws.check("step", predicted=50, measured=100, unit="ms",
                   split={"compute": 60, "messages": 30, "wait": 10})
    text = laws.verdict(r)
    assert "measured split: compute 60 + messages 30 + wait 10 = 100 ms" in text
    assert laws.split_sums(r)
    assert not laws.split_sums(laws.check("s", predicted=1, measured=100, split={"a": 10}))
    # a law that holds does not print its split
    assert "split" not in laws.verdict(laws.check("s", predicted=99, measured=100,
                                                  split={"a": 100}))


def test_kinds_are_counted_apart_and_naive_misses_are_lessons():
    rows = [laws.check("a", predicted=1, measured=1),
            laws.check("b", predicted=2, measured=1),
            laws.check("s_8 = 8", kind="naive", predicted=8, measured=3.5, note="serial part"),
            laws.check("busbw", kind="published", predicted=450, measured=370, source="x"),
            laws.check("engines", kind="agreement", predicted=1.0, measured=1.0)]
    df = pd.DataFrame([{"notebook": "n", **r} for r in rows])
    assert laws.counts(df) == [{"kind": "model", "laws": 2, "held": 1},
                               {"kind": "naive", "laws": 1, "held": 0},
                               {"kind": "published", "laws": 1, "held": 1},
                               {"kind": "agreement", "laws": 1, "held": 1}]
    assert "fails, as taught (serial part)" in laws.verdict(rows[2])
    assert "| naive | a naive law | 0 of 1 |" in laws.counts_markdown(df)
    assert 'class="law-counts"' in laws.html(df) and "<td>published</td>" in laws.html(df)


def test_the_checker_flags_each_contradiction_and_passes_the_truth():
    rows = {"speedup": {"holds": False}}
    assert consistency.cell_problems(
        ["speedup: predicted 2, measured 1 (error +100%): holds within 25%."], rows)
    assert not consistency.cell_problems(
        ["speedup: predicted 2, measured 1 (error +100%): does not hold within 25%."], rows)
    assert consistency.line_problems("the bubble grows (0.20 -> 0.13)")
    assert not consistency.line_problems("the bubble grows (0.13 -> 0.20)")
    assert consistency.line_problems("1F1B is more than 5% from the formula (+4.0%)")
    assert not consistency.line_problems("1F1B is more than 5% from the formula (+6.0%)")
    assert not consistency.cell_problems(["errors are mostly positive", "+169.0%", "-3.0%",
                                          "+12.0%"], {})
    assert consistency.cell_problems(["a verdict: predicted 1, measured 1 (error +0.0%): holds "
                                      "within 25%."], {}) == [
        "verdict without a stored law row: a verdict"]


def test_rows_read_back_into_a_dataframe_keep_their_semantics():
    """gather() returns a DataFrame, where a missing tolerance or split is NaN, not None."""
    rows = [laws.check("bubble", predicted=0.2, measured=0.3, tolerance_abs=0.05),
            laws.check("step", predicted=50, measured=100, unit="ms", split={"a": 100})]
    df = pd.DataFrame([{"notebook": "n", **r} for r in rows])
    back = df.to_dict("records")
    assert "±0.05" in laws.verdict(back[0]) and "nan" not in laws.verdict(back[0])
    assert "(error -100%)" in laws.verdict(back[1]) and "measured split: a 100" in laws.verdict(back[1])
    assert "nan" not in laws.markdown(df) and "±0.05" in laws.markdown(df)
