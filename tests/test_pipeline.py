"""Pipeline lab: bubble formulas, the ideal-schedule simulator, config checks, 2-rank runs."""

from __future__ import annotations

import subprocess

import pytest

from labkit import bubbles
from labkit.errors import UsageError

from .conftest import LAUNCH_TIMEOUT_S


def test_formulas_hand_computed():
    assert bubbles.bubble_fraction(8, 16) == pytest.approx(7 / 23)
    assert bubbles.bubble_fraction(2, 1) == 0.5
    assert bubbles.bubble_fraction(1, 4) == 0.0
    assert bubbles.interleaved_bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    assert bubbles.interleaved_bubble_fraction(4, 8, 1) == bubbles.bubble_fraction(4, 8)
    assert bubbles.bubble_time(4, 8, 2.0) == pytest.approx(0.75)
    assert bubbles.measured_bubble([1.0, 1.0, 1.0, 1.0], 2.0) == 0.5
    for bad in [(0, 1), (2, 0), (2, 1.5)]:
        with pytest.raises(UsageError):
            bubbles.bubble_fraction(*bad)


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 2, 1, 1), ("gpipe", 4, 8, 1),
                                            ("1f1b", 4, 4, 1), ("1f1b", 3, 7, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_simulated_schedule_matches_formula(schedule, p, m, v):
    blocks = bubbles.simulate(schedule, p, m, virtual_stages=v)
    assert len(blocks) == 2 * p * m * v
    step = max(b["end_s"] for b in blocks)
    busy = [sum(b["end_s"] - b["start_s"] for b in blocks if b["rank"] == r) for r in range(p)]
    assert bubbles.measured_bubble(busy, step) == pytest.approx(
        bubbles.schedule_bubble(schedule, p, m, v))
    for r in range(p):  # a rank never runs two blocks at once
        mine = sorted((b["start_s"], b["end_s"]) for b in blocks if b["rank"] == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))


def test_1f1b_holds_at_most_p_microbatches():
    blocks = sorted(bubbles.simulate("1f1b", 4, 8), key=lambda b: b["start_s"])
    for r in range(4):
        live = peak = 0
        for b in (b for b in blocks if b["rank"] == r):
            live += 1 if b["kind"] == "F" else -1
            peak = max(peak, live)
        assert peak <= 4 - r


def test_stage_layers():
    assert bubbles.stage_layers(8, 2) == [range(0, 4), range(4, 8)]
    assert [len(s) for s in bubbles.stage_layers(10, 4)] == [3, 3, 2, 2]
    with pytest.raises(UsageError):
        bubbles.stage_layers(2, 3)


@pytest.mark.parametrize("kw,p", [(dict(schedules=("bogus",)), 2), (dict(microbatches=(0,)), 2),
                                  (dict(batch=10, microbatches=(3,)), 2),
                                  (dict(layers=1), 2), (dict(schedules=("1f1b",), microbatches=(1,)), 2),
                                  (dict(schedules=("interleaved",), layers=6, microbatches=(4,)), 4),
                                  (dict(schedules=("interleaved",), microbatches=(3,), batch=96), 2)])
def test_config_refuses(kw, p):
    with pytest.raises(UsageError):
        bubbles.PipelineConfig(**kw).validate_for(p)


def test_1f1b_refusal_message():
    with pytest.raises(UsageError, match=r"M=1 < P=2"):
        bubbles.PipelineConfig(schedules=("1f1b",), microbatches=(1, 2)).validate_for(2)


@pytest.mark.parametrize("args", [["--schedule", "bogus"], ["--microbatches", "0"],
                                  ["--batch", "10", "--microbatches", "3"], ["--layers", "1"],
                                  ["--schedule", "1f1b", "--microbatches", "1"]])
def test_cli_bad_input_exit_2(args, labkit_cmd):
    p = subprocess.run([*labkit_cmd, "pipeline", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def _check_rows(df, p):
    assert df.matches_single_process.all(), df[["schedule", "max_output_diff", "max_grad_diff"]]
    for r in df.itertuples():
        blocks = r.blocks
        v = r.virtual_stages
        for kind in "FB":
            assert sum(b["kind"] == kind for b in blocks) == p * r.num_microbatches * v
        assert {b["rank"] for b in blocks} == set(range(p))
        assert all(b["end_s"] >= b["start_s"] >= 0 for b in blocks)
        assert 0 <= r.bubble_measured < 1
        assert r.busy_time_s <= p * r.step_time_s * 1.001


@pytest.mark.slow
def test_every_schedule_on_two_ranks():
    """One launch: output and gradients equal one process, P×M F and B blocks per schedule,
    GPipe's measured bubble at M = 1 within 0.1 of (P−1)/P."""
    from labkit.commlab import pipeline, schedule_blocks

    df = pipeline([2], schedules=bubbles.SCHEDULES, microbatches=(1, 2), steps=3, warmup=1,
                  skip_invalid=True, progress=False, timeout_s=LAUNCH_TIMEOUT_S)
    got = sorted(zip(df.schedule, df.num_microbatches))
    assert got == sorted([("naive_gpipe", 1), ("naive_gpipe", 2), ("gpipe", 1), ("gpipe", 2),
                          ("1f1b", 2), ("interleaved", 2)])
    _check_rows(df, 2)
    for r in df[df.num_microbatches == 1].itertuples():  # (P−1)/P = 0.5 at M = 1
        assert r.bubble_formula == 0.5
        assert abs(r.bubble_measured - 0.5) < 0.1, (r.schedule, r.bubble_measured)
    blocks = schedule_blocks(df, "interleaved", 2, 2)
    assert sorted(blocks.stage.unique()) == [0, 1, 2, 3]
    with pytest.raises(UsageError):
        schedule_blocks(df, "1f1b", 2, 1)

def test_skip_invalid_keeps_gpipe_m1():
    cfg = bubbles.PipelineConfig(schedules=("gpipe", "1f1b"), microbatches=(1, 2), skip_invalid=True)
    cfg.validate_for(2)
    assert cfg.runnable(2) == [("gpipe", 1), ("gpipe", 2), ("1f1b", 2)]
    with pytest.raises(UsageError):
        bubbles.PipelineConfig(schedules=("1f1b",), microbatches=(1,), skip_invalid=True).validate_for(2)
