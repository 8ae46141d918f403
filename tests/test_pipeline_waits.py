"""Pipeline lab: messages as their transfer plus the scheduler waits counted in the row's median
step. Synthetic profiles whose messages wait one tick some of the time, synthetic steps whose
timelines hold waits at known messages: the model's wait term is count x wait where the waits
lie on the critical path, the step law holds when the step is transfers + the counted waits and
flips when it is not, the count comes from the timeline, and the sentences follow the numbers.
"""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.book import laws
from labkit.pipeline import formulas, messages, report, schedules, verdicts

from ._pipeline_timelines import WAIT_S, measured_row, message_transfer, wait_profile


def test_step_messages_read_each_delay_beyond_what_the_rank_was_busy_with():
    blocks = schedules.simulate("gpipe", 2, 2, forward_s=1.0, backward_s=2.0)
    got = messages.step_messages(blocks)
    # GPipe P = 2, M = 2: two activations forward, two gradients back
    assert [(m["kind"], m["microbatch"], m["from_rank"], m["to_rank"]) for m in got] == [
        ("F", 0, 0, 1), ("F", 1, 0, 1), ("B", 0, 1, 0), ("B", 1, 1, 0)]
    assert all(m["delay_s"] == 0.0 for m in got)
    # rank 1's second forward starts 0.3 s after its first ended, which ended after rank 0's
    # second forward: the delay counts from the end of what rank 1 was busy with
    late = [dict(b, start_s=b["start_s"] + 0.3, end_s=b["end_s"] + 0.3)
            if b["rank"] == 1 and not (b["kind"] == "F" and b["microbatch"] == 0) else b
            for b in blocks]
    delays = {(m["kind"], m["microbatch"]): m["delay_s"] for m in messages.step_messages(late)}
    assert delays[("F", 1)] == pytest.approx(0.3) and delays[("F", 0)] == 0.0
    assert messages.step_messages([]) == []


def test_the_count_comes_from_the_timeline_and_uses_the_machines_rule():
    transfer = message_transfer(4 * 64 * 512)
    quiet = measured_row(2)
    assert messages.count(quiet["step_messages"], transfer_s=transfer)["count"] == 0
    row = measured_row(2, waited=[("F", 1, 1), ("B", 0, 0)])
    got = messages.count(row["step_messages"], transfer_s=transfer)
    assert (got["messages"], got["count"]) == (4, 2)
    assert set(got["waited"]) == {("F", 1, 1), ("B", 0, 0)}
    # each beyond its transfer; where the rank was still busy when the activation arrived,
    # the transfer hid behind that compute and the wait shows whole
    assert all(WAIT_S - transfer - 1e-12 <= x <= WAIT_S + 1e-12 for x in got["waited"].values())
    # a wait shorter than the threshold (1.5 ms) is a transfer's own spread: not counted
    short = measured_row(2, waited=[("F", 1, 1)], wait_s=1.0e-3)
    assert messages.count(short["step_messages"], transfer_s=transfer)["count"] == 0


@pytest.mark.parametrize("waited", [[("F", 1, 0)], [("B", 0, 0)], [("F", 1, 0), ("B", 0, 0)]])
def test_wait_term_is_count_times_wait_on_the_critical_path(waited):
    """GPipe P = 2, M = 1: both messages lie on the critical path, so each counted wait adds
    the profile's whole wait to the modelled step, and the step law holds."""
    prof = wait_profile()
    df = report.add_model(pd.DataFrame([measured_row(1, waited=waited)]), prof)
    r = df.iloc[0]
    assert (r.messages, r.messages_waited) == (2, len(waited))
    assert r.scheduler_wait_s == pytest.approx(WAIT_S)
    assert r.step_waits_model_s == pytest.approx(len(waited) * prof.scheduler_wait_s)
    assert r.step_waits_measured_s == pytest.approx(len(waited) * WAIT_S)
    assert abs(r.step_model_error_pct) < 1e-6
    (law,) = report.step_laws(df)
    assert law["holds"] and law["kind"] == "model"
    assert f"{len(waited)} of 2 messages waited for the scheduler" in law["note"]
    assert laws.split_sums(law)
    assert law["split"]["scheduler waits (counted)"] == pytest.approx(len(waited) * WAIT_S * 1e3)


def test_law_holds_with_counted_waits_and_flips_without_them():
    """Four microbatches, four of the eight messages waited: the model that counts them
    predicts the step; the same rows priced at their transfers only (no per-message timeline)
    miss it, and so does a step whose waits were far longer than a tick."""
    prof = wait_profile()
    waited = [("F", 1, 0), ("F", 1, 3), ("B", 0, 3), ("B", 0, 0)]
    rows = pd.DataFrame([measured_row(4, waited=waited, forward_s=1e-3, backward_s=2e-3)])
    good = report.add_model(rows, prof)
    assert good.messages_waited.iloc[0] == 4
    assert 0 < good.step_waits_model_s.iloc[0] <= 4 * WAIT_S + 1e-9
    assert abs(good.step_model_error_pct.iloc[0]) < 1.0
    assert all(r["holds"] for r in report.step_laws(good))
    blind = report.add_model(rows.drop(columns=["step_messages", "median_step_blocks"]), prof)
    assert blind.step_waits_model_s.iloc[0] == 0.0 and pd.isna(blind.messages_waited.iloc[0])
    (miss,) = report.step_laws(blind)
    assert not miss["holds"] and "scheduler waits not counted" in miss["note"]
    assert set(miss["split"]) == {"compute", "fill/drain bubble", "messages and other waits"}
    slow = pd.DataFrame([measured_row(4, waited=waited, wait_s=10 * WAIT_S, forward_s=1e-3,
                                      backward_s=2e-3)])
    (off,) = report.step_laws(report.add_model(slow, prof))
    assert not off["holds"] and laws.split_sums(off)
    assert "4 of 8 messages waited" in off["note"]
    assert "scheduler waits (counted)" in laws.verdict(off)


def test_a_wait_off_the_critical_path_adds_nothing_not_less(monkeypatch):
    """The model's step with the counted waits and without them are two replays: where a wait
    lies off the critical path they sum the same blocks in another order, and their difference
    can read a rounding below zero (-1e-18 s in a launch). The wait term is then 0, not less."""
    monkeypatch.setattr(schedules, "model_blocks", lambda *a, **kw: [
        dict(rank=0, stage=0, kind="F", microbatch=0, start_s=0.0, end_s=0.3)])
    monkeypatch.setattr(schedules, "model_step", lambda *a, **kw: 0.1 + 0.2)
    df = report.add_model(pd.DataFrame([measured_row(1, waited=[("F", 1, 0)])]), wait_profile())
    assert 0.3 - (0.1 + 0.2) < 0 and df.step_waits_model_s.iloc[0] == 0.0


def test_measured_wait_share_counts_a_wait_off_the_critical_path_less():
    """A wait the schedule hides (rank 1's second forward waits while rank 0 still computes its
    own) takes less of the step than one on the critical path; never less than nothing."""
    row = measured_row(4, waited=[("F", 1, 1)], forward_s=1e-3, backward_s=2e-3)
    share = messages.wait_share_s(row["median_step_blocks"], {("F", 1, 1): WAIT_S},
                                  step_end_s=row["step_time_s"])
    assert 0.0 <= share <= WAIT_S + 1e-12
    assert messages.wait_share_s(row["median_step_blocks"], {}) == 0.0
    split = formulas.timeline_split(row["median_step_blocks"])
    assert share <= split["other_s"] / 2 + 1e-12


def test_waits_sentence_follows_the_counts():
    prof = wait_profile()
    rows = [measured_row(m, waited=w) for m, w in ((1, []), (2, [("B", 0, 1)]))]
    df = report.add_model(pd.DataFrame(rows), prof)
    text = verdicts.waits_sentence(df, "gpipe")
    assert text.startswith("gpipe, P = 2: 1 of 6 messages waited for the scheduler")
    assert "(M = 1: 0 of 2, M = 2: 1 of 4)" in text and "the profile's waits put at 3.6 ms" in text
    assert "receiver's core is computing" in text
    quiet = report.add_model(pd.DataFrame([measured_row(m) for m in (1, 2)]), prof)
    assert "none of the 6 messages of the median steps waited" in verdicts.waits_sentence(
        quiet, "gpipe")
    blind = report.add_model(pd.DataFrame([measured_row(1)]).drop(columns=["step_messages"]),
                             prof)
    assert "no per-message timeline" in verdicts.waits_sentence(blind, "gpipe")


def test_the_models_columns_are_declared():
    from labkit import results

    df = report.add_model(pd.DataFrame([measured_row(2, waited=[("F", 1, 0)])]), wait_profile())
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
