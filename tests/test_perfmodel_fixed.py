"""Notebook 08's pipeline step with its parts timed apart in the launch: the same step at a
width where the arithmetic is almost nothing (the fixed costs of blocks, hops and the
scheduler's turns) and one microbatch's blocks on a rank alone at both widths (the arithmetic).
Synthetic profiles and rows; the rank side runs in tests/test_pipeline_launch.py."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.book import laws
from labkit.errors import UsageError
from labkit.perfmodel import checknotes, modelcheck
from labkit.pipeline.config import PipelineConfig

from ._pipeline_timelines import CO_RUN, measured_row, wait_profile

FIXED_S, BLOCK_S, SMALL_BLOCK_S = 9e-3, 6e-3, 0.7e-3


def _fixed_row(m: int = 4, *, fixed_s: float = FIXED_S) -> dict:
    """A live row (P = 2) with its parts timed apart, its step what they add up to with the
    profile's transfers (of a message at widths 512 and 16). Without its blocks timed alone
    (``block_times``), so the check prices it with the closed form, not notebook 07's replay."""
    prof = wait_profile()
    row = {k: v for k, v in measured_row(m, waited=[("F", 1, 0)]).items() if k != "block_times"}
    row = {**row, "fixed_width": 16, "fixed_step_s": fixed_s,
           "block_alone_s": BLOCK_S, "fixed_block_alone_s": SMALL_BLOCK_S}
    extra = (prof.transfer_s(4 * 128 // m * 512, measurement="message", busy=True)
             - prof.transfer_s(4 * 128 // m * 16, measurement="message", busy=True))
    stage = m * (BLOCK_S - SMALL_BLOCK_S) * CO_RUN
    waits = modelcheck.message_waits(prof, row)["waited"] * prof.scheduler_wait_s
    return {**row, "step_time_s": stage * (1 + 1 / m) + FIXED_S + 2 * m * extra + waits}


def test_fixed_width_is_validated_and_has_its_flag():
    assert PipelineConfig(fixed_width=16).fixed_width == 16
    for bad in (512, 1024, -1):
        with pytest.raises(UsageError, match="fixed_width"):
            PipelineConfig(fixed_width=bad)
    from labkit.cli import build_parser

    args = build_parser().parse_args(["pipeline", "--fixed-width", "16"])
    assert args.fixed_width == 16


def test_terms_carry_the_fixed_step_and_the_counted_waits():
    row = dict(layers=8, hidden=256, batch=64, num_stages=2, num_microbatches=4)
    kw = dict(compute_slowdown=1.25, transfer_s=1e-4, waited=2, scheduler_wait_s=3.6e-3)
    plain = modelcheck.pipeline_terms(row, block_s=1e-3, **kw)
    fixed = modelcheck.pipeline_terms(row, block_s=1e-3, fixed_s=9e-3, fixed_transfer_s=4e-5,
                                      **kw)
    assert plain["scheduler waits"] == pytest.approx(7.2e-3) and "fixed costs" not in plain
    # the fixed step's hops find the peer idle: the real step's counted waits are priced too
    assert fixed["scheduler waits"] == pytest.approx(7.2e-3) and fixed["fixed costs"] == 9e-3
    assert fixed["transfers"] == pytest.approx(8 * 6e-5)
    assert fixed["compute"] == pytest.approx(4 * 1e-3 * 1.25)
    assert fixed["step"] == pytest.approx(sum(v for k, v in fixed.items() if k != "step"))
    for both_or_none in ({}, {"block_s": 1e-3, "compute_flop_per_s": 1e9}):
        with pytest.raises(UsageError, match="one of them"):
            modelcheck.pipeline_terms(row, **both_or_none)
    with pytest.raises(UsageError):
        modelcheck.pipeline_terms(row, block_s=1e-3, fixed_s=-1.0)


def test_step_law_holds_with_its_parts_and_flips_without_the_fixed_costs():
    prof = wait_profile()
    row = _fixed_row()
    check = modelcheck.model_check(None, [row], profile=prof)
    step = check[check.quantity == "step_time_s"].iloc[0]
    assert step.model == pytest.approx(row["step_time_s"])
    assert step.block_s == pytest.approx(BLOCK_S - SMALL_BLOCK_S)
    law = [r for r in modelcheck.check_laws(check) if "pipeline step time" in r["law"]][0]
    assert law["holds"] and law["kind"] == "model"
    assert law["note"].startswith("a microbatch's arithmetic on a rank 5.30 ms alone")
    assert "fixed costs 9.0 ms" in law["note"] and "beyond the fixed costs" in law["note"]
    assert modelcheck.message_waits(prof, row)["waited"] == 1  # and priced in the model
    # the same measured step, the fixed step timed 30 ms slower: the model misses, too slow
    slow = {**row, "fixed_step_s": FIXED_S + 30e-3}
    miss = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [slow], profile=prof))
            if "pipeline step time" in r["law"]][0]
    assert not miss["holds"] and miss["error_pct"] > 0
    assert laws.split_sums(miss)


def test_a_row_without_its_parts_keeps_the_profiles_rate_and_counted_waits():
    prof = wait_profile()
    row = measured_row(4, waited=[("F", 1, 0)])
    t = modelcheck.profile_terms(prof, row)
    assert "fixed costs" not in t and t["scheduler waits"] > 0
    assert modelcheck.fixed_step(prof, {**row, "fixed_step_s": None}) == {}
    # the fixed step without the blocks timed alone: the profile's rate for the arithmetic
    got = modelcheck.fixed_step(prof, {**row, "fixed_width": 16, "fixed_step_s": FIXED_S})
    assert set(got) == {"fixed_s", "fixed_transfer_s"}


def test_notes_and_sentence_say_what_the_model_took():
    prof = wait_profile()
    check = modelcheck.model_check(None, [_fixed_row(2), _fixed_row(4)], profile=prof)
    rows = check[check.quantity == "step_time_s"].to_dict("records")
    assert all(checknotes.step_note(r) == checknotes.fixed_note(r) for r in rows)
    sentence = checknotes.waits_sentence(check)
    assert "holds such waits in its fixed costs" in sentence
    # a row without its parts or its blocks' times: the closed form with every transfer
    bare = {k: v for k, v in measured_row(4, waited=[("F", 1, 0)]).items() if k != "block_times"}
    plain = modelcheck.model_check(None, [bare], profile=prof)
    assert "adds that for each one counted" in checknotes.waits_sentence(plain)
    quiet = pd.DataFrame([{**rows[0], "messages_waited": 0}])
    assert "fixed costs (the same step" in checknotes.waits_sentence(quiet)


def test_the_bubble_law_takes_the_step_models_share_and_shows_the_formula_as_naive():
    """With a profile, the model's bubble share is its (P-1)/M T_stage over its whole step
    (transfers, waits and fixed costs make the step longer: the share smaller than the
    formula's); the formula stays beside it as the naive law."""
    prof = wait_profile()
    row = _fixed_row()
    check = modelcheck.model_check(None, [row], profile=prof)
    bubble = check[check.quantity == "bubble_fraction"].iloc[0]
    step = check[check.quantity == "step_time_s"].iloc[0]
    assert bubble.model == pytest.approx(step.model_bubble_s / step.model)
    assert bubble.model < bubble.formula == pytest.approx(1 / 5)  # P = 2, M = 4
    rows = [r for r in modelcheck.check_laws(check) if "bubble" in r["law"]]
    assert [r["kind"] for r in rows] == ["model", "naive"]
    assert rows[0]["predicted"] == pytest.approx(bubble.model)
    assert rows[1]["predicted"] == pytest.approx(1 / 5)
