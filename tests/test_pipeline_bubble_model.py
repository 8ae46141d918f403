"""The fill/drain share the step model predicts: read off its replayed step as the measured
share is off the measured one, equal to the formula where blocks are equal and everything else
is free, and the one the share law and its sentence judge where the rows carry it."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.pipeline import formulas, imbalance, report, schedules, verdicts

from ._pipeline_timelines import measured_row, wait_profile


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zero_bubble"])
@pytest.mark.parametrize("m", [2, 4, 8])
def test_the_model_share_is_the_formula_with_equal_blocks_and_free_messages(schedule, m):
    # one slot a block; zero bubble's B and W are each half a backward (one slot each)
    d = {"F": 1.0, "B": 1.0 if schedule == "zero_bubble" else 2.0, "W": 1.0}
    alone = {(r, k): v for r in (0, 1) for k, v in d.items()}
    kw = dict(alone=alone, slowdown={1: 1.0, 2: 1.0}, message_s=0.0)
    blocks = schedules.model_blocks(schedule, 2, m, **kw)
    assert formulas.timeline_split(blocks)["bubble_share"] == pytest.approx(
        formulas.bubble_fraction(num_stages=2, num_microbatches=m, schedule=schedule))
    assert max(b["end_s"] for b in blocks) == schedules.model_step(schedule, 2, m, **kw)


def _short_blocks(ms=(2, 4, 8)):
    """Blocks of 0.1 and 0.2 ms beside messages of 0.1 ms and more (the profile's): the step
    grows more than the fill and drain, as at hidden 256 on the 2-vCPU VM."""
    rows = [measured_row(m, forward_s=1e-4, backward_s=2e-4) for m in ms]
    return report.add_model(pd.DataFrame(rows), wait_profile())


def test_short_blocks_miss_the_formula_and_hold_the_model():
    df = _short_blocks()
    assert (df.bubble_formula - df.bubble_fill_drain > 0.05).any()
    assert df.bubble_model.tolist() == pytest.approx(df.bubble_fill_drain.tolist(), abs=1e-9)
    got = imbalance.bubble_laws(df)
    assert all(r["holds"] for r in got)
    assert all(r["law"].startswith("fill/drain share, the step model's timeline") for r in got)
    assert all("the formula (P−1)/(P−1+M) says" in r["note"] for r in got)
    # without the step model the same rows are judged against the formula, and miss
    plain = imbalance.bubble_laws(df.drop(columns=["bubble_model"]))
    assert [r["law"].startswith("bubble (P−1)/(P−1+M)") for r in plain] == [True] * 3
    assert not all(r["holds"] for r in plain)


def test_the_model_share_law_flips_with_its_numbers():
    df = _short_blocks()
    off = df.assign(bubble_model=df.bubble_model + 0.08)
    assert not any(r["holds"] for r in imbalance.bubble_laws(off))
    assert all(r["split"] for r in imbalance.bubble_laws(off))


def test_the_bubble_sentence_says_whether_the_model_holds_where_the_formula_missed():
    df = _short_blocks()
    text = verdicts.bubble_sentence(df, "gpipe")
    assert "the formula does not hold within 0.05" in text
    assert text.endswith("The step model's replayed step, which carries them, holds within 0.05 "
                         "at every M.")
    off = df.assign(bubble_model=df.bubble_model.where(df.num_microbatches != 4,
                                                       df.bubble_model + 0.08))
    assert verdicts.bubble_sentence(off, "gpipe").endswith(
        "does not hold within 0.05 at M = 4 either.")
    assert "step model" not in verdicts.bubble_sentence(df.drop(columns=["bubble_model"]), "gpipe")
