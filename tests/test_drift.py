"""The machine measured twice in a lab run: the drift table, its sentence, where it is stored and
where it is shown (labkit.book.drift, labkit.book.lab, labkit.book.front)."""

from __future__ import annotations

import math

import pandas as pd

from labkit import results
from labkit.book import drift, front, laws
from labkit.machine import FILE
from tests._copy_profiles import CACHE_AND_MEMORY, copy_profile


def _profile(*, copy_together_scale: float = 1.0, when: str = "2026-11-25T03:00:00+00:00"):
    copies = {s: (a, t * copy_together_scale) for s, (a, t) in CACHE_AND_MEMORY.items()}
    prof = copy_profile(copies)
    return prof.__class__.from_rows([{**r, "timestamp": when} for r in prof.rows])


def test_a_quantity_that_moved_either_way_is_flagged_and_named():
    start = _profile()
    slower = drift.compare(start, _profile(copy_together_scale=0.7))  # copies together 1/0.7x
    faster = drift.compare(start, _profile(copy_together_scale=1 / 0.7))
    for rows, sign in ((slower, 1), (faster, -1)):
        moved = [r for r in rows if r["moved"]]
        assert [r["quantity"] for r in moved] == ["largest copy's co-run slowdown"]
        assert math.copysign(1, moved[0]["moved_pct"]) == sign
        assert abs(abs(moved[0]["moved_pct"]) - 100 * (1 / 0.7 - 1)) < 1e-6
        assert all(abs(r["moved_pct"]) < 1e-9 for r in rows if not r["moved"]
                   and math.isfinite(r["moved_pct"]))
    # the same profile twice moved nothing, and the sentence says so
    same = drift.compare(start, start)
    assert not any(r["moved"] for r in same)
    assert "none of" in drift.sentence(same) and "can miss" not in drift.sentence(same)
    assert "1 of" in drift.sentence(slower) and "can miss" in drift.sentence(slower)


def test_a_quantity_the_profile_lacks_is_not_counted():
    start = _profile()
    rows = drift.compare(start, start)
    # this profile times no scheduler waits: 0 ms at both ends, no ratio, not a quantity moved
    wait = next(r for r in rows if r["quantity"] == "a scheduler wait")
    assert math.isnan(wait["moved_pct"]) and not wait["moved"]
    assert f"of {sum(math.isfinite(r['moved_pct']) for r in rows)} of" in drift.sentence(rows)
    assert "n/a" in drift.markdown(rows)


def test_of_run_reads_both_profiles_and_the_minutes_between(tmp_path):
    assert drift.of_run(tmp_path) is None
    results.store_rows(tmp_path / FILE, list(_profile().rows), ("measurement", "context",
                                                                "size_bytes", "n"))
    assert drift.of_run(tmp_path) is None  # one profile: nothing to compare
    end = _profile(copy_together_scale=0.5, when="2026-11-25T03:03:30+00:00")
    results.store_rows(tmp_path / drift.END_FILE, list(end.rows),
                       ("measurement", "context", "size_bytes", "n"))
    rows, minutes = drift.of_run(tmp_path)
    assert minutes == 3.5
    assert sum(r["moved"] for r in rows) == 1
    assert drift.sentence(rows, minutes=minutes).startswith("Measured again 3.5 min later, 1 of")


def test_run_lab_measures_again_after_the_last_notebook(tmp_path, monkeypatch):
    import labkit.book.lab as lab

    (tmp_path / drift.END_FILE).write_text("a last run's")
    calls = []

    def measure(out, progress=True, file=None, export=True):
        calls.append((file, export, (out / drift.END_FILE).exists()))
        return {"notebook": "machine profile", "ok": True, "elapsed_s": 0.0, "error": None}

    monkeypatch.setattr(lab, "measure_profile", measure)
    monkeypatch.setattr(lab, "execute", lambda nb, out, params, **kw:
                        calls.append(nb) or {"ok": True, "elapsed_s": 0.0, "error": None})
    nb = tmp_path / "01_a.ipynb"
    rows = lab.run_lab([nb], tmp_path, progress=False)
    # the first profile for the notebooks (after the last run's end was removed), the notebook,
    # then the second, kept out of the notebooks' environment
    assert calls == [(None, True, False), nb, (drift.END_FILE, False, False)]
    assert len(rows) == 3
    calls.clear()
    lab.run_lab([nb], tmp_path, progress=False, profile_again=False)
    assert calls == [(None, True, False), nb]


def test_front_page_says_the_drift_between_the_counts_and_the_misses():
    df = pd.DataFrame([{"notebook": "02_speedup", **laws.check("s_2", predicted=1.8,
                                                               measured=1.2)}])
    rows = drift.compare(_profile(), _profile(copy_together_scale=0.7))
    page = front.quarto_markdown(df, (rows, 2.0))
    said = drift.sentence(rows, minutes=2.0)
    assert said in page
    assert page.index("| model |") < page.index(said) < page.index("0 of 1 of this lab's")
    assert "| largest copy's co-run slowdown | x |" in page
    assert said not in front.quarto_markdown(df)
    assert "Measured again 2.0 min later" in front.preview_html(df, (rows, 2.0))
