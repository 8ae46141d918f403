"""Notebook 08's model check with messages as transfers plus counted scheduler waits: the
pipeline step prices each message at the profile's transfer and each message that waited in
the row's median step (counted from its timeline) at the profile's scheduler wait; the
all-reduce law compares transfers (the profile's against the calls') and says
how many calls waited. Synthetic profiles and rows whose calls wait one tick, some of the time.
"""

from __future__ import annotations

import pytest

from labkit.book import laws
from labkit.perfmodel import checknotes, modelcheck

from ._pipeline_timelines import WAIT_S, measured_row, wait_profile

WAITED = [("F", 1, 0), ("F", 1, 3), ("B", 0, 3), ("B", 0, 0)]


def _pipe_row(prof, *, waited=(), step_waits: int | None = None):
    """A live pipeline row (P = 2, M = 4) whose timeline holds ``waited`` messages that waited,
    its step what the closed form's compute and bubble take with every transfer and
    ``step_waits`` (default: as many as waited) scheduler waits. Without its blocks timed
    alone (``block_times``), so the check prices it with the closed form, not the replay."""
    row = {k: v for k, v in measured_row(4, waited=waited).items() if k != "block_times"}
    w = len(waited) if step_waits is None else step_waits
    t = modelcheck.pipeline_terms(row, compute_flop_per_s=prof.step_flop_per_s(),
                                  compute_slowdown=prof.compute_slowdown(2),
                                  transfer_s=prof.transfer_s(modelcheck.message_bytes(row),
                                                             measurement="message", busy=True))
    return {**row, "step_time_s": t["step"] + w * prof.scheduler_wait_s}


def test_step_wait_term_is_the_count_from_the_timeline_times_the_profiles_wait():
    prof = wait_profile()
    for waited in ([], WAITED[:1], WAITED):
        row = _pipe_row(prof, waited=waited)
        got = modelcheck.message_waits(prof, row)
        assert got["counted"] and (got["messages"], got["waited"]) == (8, len(waited))
        t = modelcheck.profile_terms(prof, row)
        assert t["scheduler waits"] == pytest.approx(len(waited) * WAIT_S)
        assert t["transfers"] == pytest.approx(8 * got["transfer_s"])
        assert t["step"] == pytest.approx(sum(v for k, v in t.items() if k != "step"))


def test_step_law_holds_with_the_counted_waits_and_flips_without_them():
    prof = wait_profile()
    counted = _pipe_row(prof, waited=WAITED)
    law = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [counted], profile=prof))
           if "pipeline step time" in r["law"]][0]
    assert law["holds"] and law["kind"] == "model"
    assert "4 of 8 messages waited for the scheduler in the median step" in law["note"]
    assert laws.split_sums(law) and "scheduler waits (counted)" in law["split"]
    # the same step, but a timeline where no message waited: the model prices transfers only
    # and misses the four ticks the step took
    hidden = {**counted, **{k: v for k, v in measured_row(4).items()
                            if k in ("step_messages", "median_step_blocks")}}
    miss = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [hidden], profile=prof))
            if "pipeline step time" in r["law"]][0]
    assert not miss["holds"] and "0 of 8 messages waited" in miss["note"]
    assert laws.split_sums(miss) and "measured split: compute" in laws.verdict(miss)


def test_a_row_with_its_blocks_alone_is_priced_by_notebook_07s_replay():
    """A row holding its timelines: the check's step and bubble share are notebook 07's step
    model's (the same numbers as :func:`labkit.pipeline.report.add_model`), the law holds with
    the counted waits priced at the profile's wait and flips where they took four times it."""
    import pandas as pd

    from labkit.pipeline import report

    prof = wait_profile()
    row = measured_row(4, waited=WAITED)
    check = modelcheck.model_check(None, [row], profile=prof)
    replay = report.add_model(pd.DataFrame([row]), prof).iloc[0]
    step = check[check.quantity == "step_time_s"].iloc[0]
    share = check[check.quantity == "bubble_fraction"].iloc[0]
    assert step.step_model == "replay"
    assert step.model == pytest.approx(replay.step_time_model_s)
    assert share.model == pytest.approx(replay.bubble_model)
    assert step.closed_form_s == pytest.approx(modelcheck.profile_terms(prof, row)["step"])
    law = [r for r in modelcheck.check_laws(check) if "pipeline step time" in r["law"]][0]
    assert law["holds"] and law["note"].startswith("notebook 07's step model")
    assert "4 of 8 messages waited for the scheduler in the median step" in law["note"]
    assert "the closed form" in law["note"]
    assert "the step model delays each one counted by that wait where it lies in its replay" \
        in checknotes.waits_sentence(check)
    # the same messages waited four times the profile's wait: priced at the profile's, the
    # step model falls short, and the miss prints its split
    longer = measured_row(4, waited=WAITED, wait_s=4 * WAIT_S)
    miss = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [longer], profile=prof))
            if "pipeline step time" in r["law"]][0]
    assert not miss["holds"] and "4 of 8 messages waited" in miss["note"]
    assert laws.split_sums(miss) and miss["predicted"] < miss["measured"]
    # a row without its messages' timeline (stored before the lab kept it): its waits could
    # not be counted, so the closed form prices it, with the profile's share of waits
    older = {k: v for k, v in row.items() if k != "step_messages"}
    step = modelcheck.model_check(None, [older], profile=prof).iloc[-1]
    assert step.step_model == "closed form" and not step.waits_counted
    # the live row: its parts timed apart too, and the note's closed form says it used them
    live = {**row, "fixed_width": 16, "fixed_step_s": 9e-3, "block_alone_s": 6e-3,
            "fixed_block_alone_s": 0.7e-3}
    law = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [live], profile=prof))
           if "pipeline step time" in r["law"]][0]
    assert law["note"].startswith("notebook 07's step model")
    assert "the step at width 16 for the fixed costs) would say" in law["note"]
    # a frame where one row lacks its blocks alone: the closed form for every row
    mixed = modelcheck.model_check(None, [row, {k: v for k, v in row.items()
                                                if k != "block_times"}], profile=prof)
    assert set(mixed[mixed.quantity == "step_time_s"].step_model) == {"closed form"}


def test_a_row_without_a_message_timeline_gets_the_profiles_share():
    prof = wait_profile(share_busy=0.5)
    row = {k: v for k, v in _pipe_row(prof).items()
           if k not in ("step_messages", "median_step_blocks")}
    got = modelcheck.message_waits(prof, row)
    assert not got["counted"] and got["waited"] == pytest.approx(0.5 * 8)
    law = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [row], profile=prof))
           if "pipeline step time" in r["law"]][0]
    assert "no per-message timeline: the profile's share of waits, 4 of 8" in law["note"]
    assert "other waits (messages, scheduling)" in law["split"]


def _calls(times):
    """A collectives row's timeline: two ranks, back to back, the slower rank each call's."""
    out, t = [], 0.0
    for k, d in enumerate(times, start=1):
        out += [{"rank": 0, "call": k, "start_s": t, "end_s": t + d},
                {"rank": 1, "call": k, "start_s": t, "end_s": t + d * 0.9}]
        t += d
    return out


def _allreduce_row(times, size=524288):
    import numpy as np

    return {"op": "all_reduce", "world_size": 2, "size_bytes": size, "iters": len(times),
            "time_p10_s": float(np.percentile(times, 10)),
            "time_p50_s": float(np.percentile(times, 50)),
            "time_p90_s": float(np.percentile(times, 90)), "time_mean_s": float(np.mean(times)),
            "timeline_s": _calls(times)}


@pytest.mark.parametrize("waits", [0, 4, 6])
def test_allreduce_law_compares_transfers_whatever_share_of_the_calls_waited(waits):
    """Ten calls at the profile's transfer, ``waits`` of them a tick later: the transfers agree
    whatever the share (the medians would not: the p50 is the transfer or the transfer + a
    tick, either far from the profile's average), and the note says how many calls waited."""
    prof = wait_profile()
    transfer = prof.transfer_s(524288, ranks=2)
    row = _allreduce_row([transfer] * (10 - waits) + [transfer + WAIT_S] * waits)
    df = modelcheck.model_check([row], None, profile=prof)
    (law,) = modelcheck.check_laws(df)
    assert law["law"] == "all_reduce of 524,288 B on 2 ranks (this run's machine profile)"
    assert law["holds"] and law["predicted"] == pytest.approx(transfer * 1e3)  # in ms
    assert law["measured"] == pytest.approx(row["time_p10_s"] * 1e3)
    assert f"{waits} of 10 calls waited for the scheduler (share {waits / 10:.2f})" in law["note"]
    r = df.iloc[0]
    assert r.wait_share == pytest.approx(waits / 10)
    assert r.in_context_s == pytest.approx(transfer + waits / 10 * WAIT_S)
    old = laws.check("p50 against the profile's average", predicted=prof.allreduce_s(524288),
                     measured=row["time_p50_s"])
    # what comparing the median with the profile's average made of the same calls: a median
    # of a few calls is one mode or the other, never the average of both
    assert not old["holds"]


def test_allreduce_law_flips_when_the_calls_transfers_are_slower():
    prof = wait_profile()
    transfer = prof.transfer_s(524288, ranks=2)
    row = _allreduce_row([2 * transfer] * 10)  # every call twice the profile's transfer
    (law,) = modelcheck.check_laws(modelcheck.model_check([row], None, profile=prof))
    assert not law["holds"] and law["error_pct"] == pytest.approx(-100.0)
    assert "0 of 10 calls waited" in law["note"]


def test_waits_sentence_follows_the_counts():
    from labkit.perfmodel import checknotes

    prof = wait_profile()
    transfer = prof.transfer_s(524288, ranks=2)
    coll = [_allreduce_row([transfer] * 7 + [transfer + WAIT_S] * 3)]
    check = modelcheck.model_check(coll, [_pipe_row(prof, waited=WAITED)], profile=prof)
    text = checknotes.waits_sentence(check)
    assert "4 of 8 at M = 4 (counted from the timelines)" in text
    assert "the profile's waits put at 3.6 ms on this machine" in text
    assert "The all-reduce of 524,288 B: 3 of its 10 timed calls waited" in text
    quiet = modelcheck.model_check([_allreduce_row([transfer] * 10)], [_pipe_row(prof)],
                                   profile=prof)
    text = checknotes.waits_sentence(quiet)
    assert "No message of the pipeline's median steps waited for the scheduler (0 of 8" in text
    assert "none of its 10 timed calls waited" in text
