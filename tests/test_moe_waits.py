"""The MoE step model with its all-to-alls as transfers plus the scheduler waits counted in
the row's own median step (labkit.moe.waits), on synthetic rows and a synthetic two-kind
machine profile: the wait term is count x the profile's wait, the count comes from the row's
timeline, the law holds on a step that is transfers + counted waits and fails on one that is
not. No launch."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.moe import formulas, report, verdicts, waits

from ._moe_rows import moe_row
from ._waits_profile import WAIT_S, profile

PROF = profile()
TAGS = ("counts", "dispatch", "combine", "combine_grad", "dispatch_grad")


def _row(**over) -> dict:
    return moe_row(**{"ffn": 64, **over})


def _timeline(transfers: dict, waited=(), *, skew_s: float = 2e-3) -> list[dict]:
    """Two ranks' five all-to-alls: rank 0 enters each ``skew_s`` before rank 1 (it waits for
    rank 1 there, which is not the message's time); each call lasts its transfer after rank 1
    enters, plus a scheduler wait for the tags in ``waited``."""
    out = []
    for i, tag in enumerate(TAGS):
        start = 0.02 * i
        d = transfers["counts" if tag == "counts" else "rows"] + (WAIT_S if tag in waited else 0)
        out += [{"rank": 0, "call": i, "tag": tag, "start_s": start, "end_s": start + skew_s + d},
                {"rank": 1, "call": i, "tag": tag, "start_s": start + skew_s,
                 "end_s": start + skew_s + d}]
    return out


def _transfers(row) -> dict:
    ctx = verdicts.context(row, PROF)
    return {"counts": ctx["counts_s"], "rows": ctx["alltoall_s"]}


def _with_measured_step(row, ctx) -> dict:
    """The row's measured phases set to the model's: a step that is what the model says."""
    return {**row, **{f"{ph}_time_s": ctx[ph] for ph in formulas.PHASES},
            "step_time_p50_s": ctx["step"]}


def test_the_count_comes_from_the_timeline_and_the_wait_term_is_count_x_wait():
    row = _row()
    t = _transfers(row)
    assert t["rows"] == pytest.approx(PROF.transfer_s(
        max(formulas.rows_between(row["kept_by_rank"], world_size=2)[0][1],
            formulas.rows_between(row["kept_by_rank"], world_size=2)[1][0]) * 128 * 4,
        measurement="message"))
    plain = verdicts.context(row, PROF)
    assert plain["waits"] is None and plain["waits_s"] == 0.0  # no timeline: transfers only
    row["a2a_timeline_s"] = _timeline(t, waited=("dispatch", "combine_grad"))
    ctx = verdicts.context(row, PROF)
    got = ctx["waits"]
    assert (got["calls"], got["count"]) == (5, 2)
    assert got["waited"] == {"dispatch": 1, "combine": 1}
    assert ctx["waits_s"] == pytest.approx(2 * PROF.scheduler_wait_s)
    assert ctx["step"] - plain["step"] == pytest.approx(2 * WAIT_S)
    assert ctx["dispatch"] - plain["dispatch"] == pytest.approx(WAIT_S)
    assert ctx["combine"] - plain["combine"] == pytest.approx(WAIT_S)
    # rank 0's 2 ms at each entry were the wait for rank 1, not the message: none counted
    calls = waits.call_times(row["a2a_timeline_s"])
    assert [c["message_s"] for c in calls if c["tag"] == "combine"] == [pytest.approx(t["rows"])]


def test_the_law_holds_on_transfers_plus_counted_waits_and_fails_without_them():
    row = _row()
    row["a2a_timeline_s"] = _timeline(_transfers(row), waited=("combine", "combine_grad",
                                                                "dispatch_grad"))
    ctx = verdicts.context(row, PROF)
    assert ctx["waits"]["count"] == 3
    measured = _with_measured_step(row, ctx)
    law = verdicts.laws(measured, PROF)[-1]
    assert law["holds"] and law["kind"] == "model"
    assert "3 of 5 all-to-alls waited for the scheduler in the median step" in law["note"]
    assert f"{WAIT_S * 1e3:.1f} ms each" in law["note"]
    # the split: what the waits took apart from the dispatch and the combine, the same sum
    split = law["split"]
    assert split[verdicts.WAITS_TERM] == pytest.approx(3 * WAIT_S * 1e3)
    assert sum(split.values()) == pytest.approx(ctx["step"] * 1e3)
    # the same step whose timeline shows no wait: the model prices transfers only and misses
    # the 10.8 ms the waits took
    quiet = {**measured, "a2a_timeline_s": _timeline(_transfers(row))}
    assert verdicts.context(quiet, PROF)["waits"]["count"] == 0
    assert not verdicts.laws(quiet, PROF)[-1]["holds"]


def test_the_waits_sentence_says_how_many_and_flips_with_the_count():
    row = _row()
    t = _transfers(row)
    some = verdicts.waits_sentence({**row, "a2a_timeline_s": _timeline(t, waited=("dispatch",))},
                                   PROF)
    assert "1 of the median step's 5 all-to-alls waited for the scheduler" in some
    assert "next turn (the profile's 3.6 ms a wait)" in some
    assert "The model adds 3.6 ms for it" in some
    none = verdicts.waits_sentence({**row, "a2a_timeline_s": _timeline(t)}, PROF)
    assert none.startswith("on 2 ranks, none of the median step's 5 all-to-alls waited")
    assert "no timeline" in verdicts.waits_sentence(row, PROF)
    frame = report.summary_frame(
        pd.DataFrame([{**row, "a2a_timeline_s": _timeline(t, ("counts",)),
                                         "step_time_p50_s": 0.02, "routing_time_s": 0.001,
                                         "dispatch_time_s": 0.003, "experts_time_s": 0.015,
                                         "combine_time_s": 0.001, "matches_single_process": True}]),
        PROF)
    assert frame.a2a_waited.tolist() == ["1/5"]


def test_a_row_with_different_tags_per_rank_is_refused():
    tl = [{"rank": 0, "call": 0, "tag": "counts", "start_s": 0.0, "end_s": 1e-4},
          {"rank": 1, "call": 0, "tag": "dispatch", "start_s": 0.0, "end_s": 1e-4}]
    with pytest.raises(ValueError, match="different tags"):
        waits.call_times(tl)
