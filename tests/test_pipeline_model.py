"""Pipeline lab, honest laws: the step model on synthetic timelines and profiles (co-run
slowdown, messages), the law rows' kinds and tolerances, sentences that flip with their
numbers and agree with the law rows, and the budget estimate that refuses a grid before launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from labkit.book import laws
from labkit.errors import UsageError
from labkit.pipeline import config, formulas, report, schedules, verdicts
from labkit.pipeline.config import PipelineConfig

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "07_pipeline_bubbles.ipynb"


class Machine:
    """A machine profile's numbers the step model reads: a co-run slowdown (times ranks/cores
    beyond 2 cores), a message's transfer and the scheduler's wait."""

    def __init__(self, co_run=1.25, message_s=1e-3, cores=2, wait_s=3.6e-3):
        self.co_run, self.msg, self.cores = co_run, message_s, cores
        self.scheduler_wait_s = wait_s

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.co_run * max(1.0, ranks / self.cores)

    def transfer_s(self, size_bytes, *, measurement="allreduce", busy=False):
        return self.msg


def _ideal_row(schedule="gpipe", p=2, m=4, forward_s=0.01, backward_s=0.02):
    """A row as the worker makes it from the ideal schedule's blocks."""
    blocks = schedules.simulate(schedule, p, m, forward_s=forward_s, backward_s=backward_s)
    return {"schedule": schedule, "num_stages": p, "num_microbatches": m, "virtual_stages": 1,
            "microbatch_size": 16, "hidden": 64, "step_time_s": max(b["end_s"] for b in blocks),
            "block_times": formulas.block_times([blocks])}


def test_block_overlaps_and_alone_times():
    blocks = schedules.simulate("gpipe", 2, 4, forward_s=1.0, backward_s=2.0)
    over = formulas.block_overlaps(blocks)
    alone = [b for b, f in zip(blocks, over) if f == 0]
    # the fill and drain: rank 0's first forward and last backward, rank 1's last forward
    # and first backward run alone; every other block beside one of the other rank
    assert sorted((b["rank"], b["kind"], b["microbatch"]) for b in alone) == [
        (0, "B", 3), (0, "F", 0), (1, "B", 0), (1, "F", 3)]
    assert all(f == pytest.approx(1.0) for b, f in zip(blocks, over) if b not in alone)
    times = {(t["rank"], t["kind"]): t for t in formulas.block_times([blocks])}
    assert times[(0, "F")]["alone_s"] == 1.0 and times[(1, "B")]["alone_s"] == 2.0
    # no block alone: taken back through the slowdown at its overlap
    got = formulas.alone_seconds([{"rank": 0, "kind": "F", "alone_s": None, "median_s": 1.5,
                                   "overlap": 1.0}], slowdown=1.5)
    assert got == {(0, "F"): 1.0}


@pytest.mark.parametrize("schedule,p,m", [("gpipe", 2, 1), ("gpipe", 2, 8), ("1f1b", 2, 4),
                                          ("1f1b", 4, 8), ("zero_bubble", 2, 4),
                                          ("naive_gpipe", 2, 2)])
def test_model_without_slowdown_or_messages_is_the_ideal_schedule(schedule, p, m):
    alone = {(r, k): d for r in range(p) for k, d in (("F", 1.0), ("B", 2.0), ("W", 0.0))}
    if schedule == "zero_bubble":
        alone.update({(r, k): 1.0 for r in range(p) for k in ("B", "W")})
    ideal = max(b["end_s"] for b in schedules.simulate(schedule, p, m))
    got = schedules.model_step(schedule, p, m, alone=alone, slowdown=dict.fromkeys(
        range(1, p + 1), 1.0), message_s=0.0)
    assert got == pytest.approx(ideal)


def test_co_run_slowdown_and_messages_lengthen_the_step_by_their_measured_terms():
    alone = {(r, k): d for r in (0, 1) for k, d in (("F", 1.0), ("B", 2.0))}

    def step(s, msg=0.0, m=4):
        return schedules.model_step("gpipe", 2, m, alone=alone, slowdown={1: 1.0, 2: s},
                                    message_s=msg)

    # GPipe P = 2, M = 4: 3 F and 3 B slots of both ranks at once, 2 + 2 alone
    assert step(1.0) == pytest.approx(15.0)
    assert step(1.5) == pytest.approx(2 * 1.0 + 3 * 1.5 + 2 * 2.0 + 3 * 3.0)
    # messages on the critical path: the fill's and the drain's, one each way, plus the
    # turn from forwards to backwards
    assert step(1.0, msg=0.1) > step(1.0) and step(1.0, msg=0.1) <= step(1.0) + 0.4 + 1e-9
    # flip: the slowdown only acts where ranks compute together, so M = 1 does not feel it
    assert step(2.0, m=1) == step(1.0, m=1)


def test_add_model_on_a_synthetic_sweep_recovers_the_step():
    """Rows made from the ideal schedule with blocks slowed 1.25x where ranks overlap: the
    model with a 1.25 co-run slowdown predicts them, with 1.0 it misses, and the law row says
    so with the measured split that sums to the measurement."""
    rows = []
    for m in (1, 2, 4, 8):
        # the "measured" step: the blocks as a machine with a 1.25x co-run slowdown and 1 ms
        # messages would run them
        orders = {r: [(k, r, mb, {"F": 0.01, "B": 0.02}[k])
                      for k, mb, _ in schedules._order("gpipe", 2, m, 1, r)] for r in (0, 1)}
        placed = formulas.corun_replay(orders, last_stage=1, rank_of_stage={0: 0, 1: 1},
                                       slowdown={1: 1.0, 2: 1.25}, message_s=1e-3)
        stretched = [{"rank": r, "stage": r, "kind": orders[r][i][0],
                      "microbatch": orders[r][i][2], "start_s": a, "end_s": z}
                     for (r, i), (a, z) in placed.items()]
        measured = max(z for _, z in placed.values())
        bubble = formulas.bubble_fraction(num_stages=2, num_microbatches=m)
        rows.append({"schedule": "gpipe", "num_stages": 2, "num_microbatches": m,
                     "virtual_stages": 1, "microbatch_size": 128 // m, "hidden": 64,
                     "step_time_s": measured, "block_times": formulas.block_times([stretched]),
                     "compute_share": 1 - bubble - 0.02, "bubble_fill_drain": bubble,
                     "idle_other": 0.02, "slot_time_s": 0.03, "bubble_formula": bubble})
    df = pd.DataFrame(rows)
    good = report.add_model(df, Machine(co_run=1.25, message_s=1e-3))
    assert good.step_model_error_pct.abs().max() < 1e-6
    assert (good.corun_slowdown == 1.25).all() and (good.message_transfer_s == 1e-3).all()
    assert all(r["holds"] and r["kind"] == "model" for r in report.step_laws(good))
    blind = report.add_model(df, Machine(co_run=1.0, message_s=0.0))  # no co-run, free messages
    assert (blind.step_model_error_pct[df.num_microbatches > 1] < 0).all()
    off = report.add_model(df, Machine(co_run=2.0, message_s=0.0))
    rows = report.step_laws(off)
    assert [r["holds"] for r in rows][1:] == [False, False, False]
    miss = rows[-1]
    assert laws.split_sums(miss) and "measured split: compute" in laws.verdict(miss)
    assert set(miss["split"]) == {"compute", "fill/drain bubble", "messages and other waits"}


def test_the_schedules_own_work_is_read_off_the_timelines_and_priced_in_the_step():
    """Steps whose ranks pause 2 ms between blocks and spend 3 ms at the step's edges: the
    model reads both off the launch's timelines (the same two numbers for every row) and
    predicts the steps; rows without timelines price neither and read fast by more than the
    edges and a gap."""
    rows = []
    for m in (2, 4, 8):
        orders = {r: [(k, r, mb, {"F": 0.01, "B": 0.02}[k])
                      for k, mb, _ in schedules._order("1f1b", 2, m, 1, r)] for r in (0, 1)}
        placed = formulas.corun_replay(orders, last_stage=1, rank_of_stage={0: 0, 1: 1},
                                       slowdown={1: 1.0, 2: 1.0}, gap_s=2e-3)
        blocks = [{"rank": r, "stage": r, "kind": orders[r][i][0],
                   "microbatch": orders[r][i][2], "start_s": a + 1e-3, "end_s": z + 1e-3}
                  for (r, i), (a, z) in placed.items()]
        rows.append({"schedule": "1f1b", "num_stages": 2, "num_microbatches": m,
                     "virtual_stages": 1, "microbatch_size": 128 // m, "hidden": 64,
                     "step_time_s": max(z for _, z in placed.values()) + 3e-3,
                     "block_times": formulas.block_times([blocks]),
                     "median_step_blocks": blocks, "compute_share": 0.8,
                     "bubble_fill_drain": 0.15, "idle_other": 0.05})
    df = pd.DataFrame(rows)
    got = report.add_model(df, Machine(co_run=1.0, message_s=0.0))
    assert got.schedule_gap_s.tolist() == pytest.approx([2e-3] * 3)
    assert got.step_edges_s.tolist() == pytest.approx([3e-3] * 3)
    assert got.step_model_error_pct.abs().max() < 1e-6
    assert "2.00 ms of the schedule's own work" in report.step_laws(got)[0]["note"]
    blind = report.add_model(df.drop(columns=["median_step_blocks"]), Machine(co_run=1.0,
                                                                              message_s=0.0))
    assert (blind.schedule_gap_s == 0).all() and (blind.step_model_error_pct < 0).all()
    missed = blind.step_time_s - blind.step_time_model_s
    assert (missed > 3e-3 + 2e-3).all() and missed.is_monotonic_increasing  # more blocks, gaps


def test_a_block_that_waits_for_another_rank_pays_the_message_and_a_gap():
    """GPipe, P = 2, M = 1, F 1 s, B 2 s, messages 0.3 s, gaps 0.5 s: rank 1's forward starts
    the message and a gap after rank 0's ended; the last stage's backward, which waits only on
    its own rank, a gap after its forward; rank 0's backward the message and a gap after it."""
    orders = {r: [("F", r, 0, 1.0), ("B", r, 0, 2.0)] for r in (0, 1)}
    placed = formulas.corun_replay(orders, last_stage=1, rank_of_stage={0: 0, 1: 1},
                                   slowdown={1: 1.0, 2: 1.0}, message_s=0.3, gap_s=0.5)
    assert placed[(0, 0)] == pytest.approx((0.0, 1.0))
    assert placed[(1, 0)] == pytest.approx((1.8, 2.8))
    assert placed[(1, 1)] == pytest.approx((3.3, 5.3))
    assert placed[(0, 1)] == pytest.approx((6.1, 8.1))


def test_step_split_is_the_median_steps_own():
    """The split a step law prints is the median step's, taken apart on its timeline (it sums
    to that step), not medians of each share taken apart."""
    r = pd.Series({"step_time_s": 0.2, "compute_share": 0.5, "bubble_fill_drain": 0.1,
                   "idle_other": 0.1,  # medians of shares of different steps: sum 0.7
                   "step_split_s": {"compute": 0.13, "fill/drain bubble": 0.04,
                                    "messages and other waits": 0.03}})
    split = report.step_split(r)
    assert split == pytest.approx({"compute": 130.0, "fill/drain bubble": 40.0,
                                   "messages and other waits": 30.0})
    row = laws.check("step", predicted=100.0, measured=200.0, unit="ms", split=split)
    assert laws.split_sums(row) and "= 200 ms" in laws.verdict(row)
    assert not laws.split_sums(laws.check("step", predicted=100.0, measured=200.0, unit="ms",
                                          split=report.step_split(r.drop("step_split_s"))))


def _boundary_rows(err):
    """One gpipe row per M whose fill/drain share is the formula's minus ``err`` at M = 8."""
    return pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [1, 8],
                         "bubble_formula": [0.5, 1 / 9],
                         "bubble_fill_drain": [0.5, 1 / 9 - err], "idle_other": [0.01, 0.04]})


@pytest.mark.parametrize("err", [0.0499, 0.0501, 0.0505, -0.0505, 0.049999])
def test_bubble_sentence_and_law_rows_judge_alike(err):
    """The sentence says 'holds'/'does not hold' exactly where its law rows do, and its
    printed error sits on the same side of the tolerance (no '+0.050 is more than 0.05')."""
    df = _boundary_rows(err)
    rows = report.bubble_laws(df)
    text = verdicts.bubble_sentence(df, "gpipe")
    holds = all(r["holds"] for r in rows)
    assert ("holds within 0.05 at every M" in text) == holds
    assert ("does not hold within 0.05 at M = 8" in text) == (not holds)
    printed = float(text.split("worst error ")[1].split(" ")[0])
    assert (abs(printed) <= 0.05) == holds
    assert all(r["tolerance_abs"] == 0.05 and r["tolerance_pct"] is None for r in rows)


def test_trend_words_follow_the_printed_numbers():
    assert verdicts.trend(0.071, 0.068) == "stays at 0.07 (0.07 -> 0.07)"
    assert verdicts.trend(0.075, 0.064).startswith("falls")
    assert verdicts.trend(0.064, 0.075).startswith("rises")
    assert verdicts.trend(80.0, 72.0, ".1f", up="grows", down="shrinks", unit=" ms") == \
        "shrinks (80.0 -> 72.0 ms)"


def test_every_law_row_says_its_kind_and_keeps_to_the_caps():
    df = _sweep()
    rows = (report.bubble_laws(df) + report.over_ideal_laws(df) + report.step_laws(df)
            + report.best_m_laws(df))
    assert rows and all(r["kind"] == "model" for r in rows)
    for r in rows:
        if r["law"].startswith(("bubble", "fill/drain share")):  # fractions: absolute
            assert r["tolerance_abs"] == verdicts.BUBBLE_TOLERANCE <= laws.MAX_TOLERANCE_ABS
        else:  # times: relative
            assert r["tolerance_pct"] == verdicts.STEP_TOLERANCE_PCT <= laws.MAX_TOLERANCE_PCT
            assert r["unit"] == "ms"
    assert not [r for r in rows if "M with the shortest" in r["law"]]  # no argmin law


def _sweep():
    """Ideal rows of gpipe at M = 1, 2, 4 with the model's columns (a fake profile)."""
    rows = []
    for m in (1, 2, 4):
        row = _ideal_row(m=m)
        bubble = formulas.bubble_fraction(num_stages=2, num_microbatches=m)
        row.update(compute_share=1 - bubble, bubble_fill_drain=bubble, bubble_formula=bubble,
                   idle_other=0.0, slot_time_s=0.03, bubble_over_ideal_formula=bubble / (1 - bubble),
                   bubble_over_ideal_measured=bubble / (1 - bubble))
        rows.append(row)
    return report.add_model(pd.DataFrame(rows), Machine(co_run=1.0, message_s=0.0))


def _notebook_parameters() -> dict:
    cell = next(c for c in json.loads(NOTEBOOK.read_text())["cells"]
                if "parameters" in c.get("metadata", {}).get("tags", []))
    ns: dict = {}
    exec("".join(cell["source"]), ns)  # annotated literals only
    return {k: v for k, v in ns.items() if not k.startswith("__")}


def _notebook_config(**over) -> tuple[PipelineConfig, list]:
    p = {**_notebook_parameters(), **over}
    cfg = PipelineConfig(schedules=p["schedules"], microbatches=p["microbatches"],
                         layers=p["layers"], hidden=p["hidden"], batch=p["batch"],
                         steps=p["steps"], warmup=1, recv_ahead=p["recv_ahead"],
                         skip_invalid=True, compare_placement_at=[max(p["microbatches"])]
                         if p["compare_placement"] else [])
    return cfg, p["world_sizes"]


#: the matrix-product rate of one rank on the 2-core machine the budget is set for
RATE, CORES = 32e9, 2


@pytest.mark.parametrize("over,fits", [
    ({}, True),                                                        # the defaults
    ({"world_sizes": [4]}, True),                                      # "[4] oversubscribes"
    ({"world_sizes": [2, 4]}, False),                                  # "[2, 4] is over"
    ({"schedules": ["naive_gpipe", "1f1b", "zero_bubble"]}, True),     # swap in naive_gpipe
    ({"schedules": ["gpipe", "1f1b", "interleaved"]}, True),           # swap in interleaved
    ({"schedules": ["naive_gpipe", "gpipe", "1f1b", "zero_bubble", "interleaved"]}, False),
    ({"hidden": 256}, True),                                           # Exercise 4's width
    ({"recv_ahead": False}, True), ({"compare_placement": False}, True),
])
def test_documented_values_fit_the_budget_or_are_refused(over, fits):
    """Each value the parameters cell documents: estimated within the notebook's share of the
    lab's budget on this machine, or refused before launch with its estimate."""
    cfg, world = _notebook_config(**over)
    est = config.estimate_seconds(cfg, world, flop_per_s=RATE, cores=CORES)
    assert est > config.NOTEBOOK_S + config.LAUNCH_S
    if fits:
        assert config.check_budget(cfg, world, flop_per_s=RATE, cores=CORES) == est
        assert est <= config.NOTEBOOK_BUDGET_S
    else:
        with pytest.raises(UsageError, match=rf"estimated at {est:.0f} s .* over the 32 s "
                                             r"budget: use fewer"):
            config.check_budget(cfg, world, flop_per_s=RATE, cores=CORES)


def test_the_estimate_grows_with_the_work_and_shrinks_with_the_rate():
    cfg, world = _notebook_config()
    base = config.estimate_seconds(cfg, world, flop_per_s=RATE, cores=CORES)
    bigger, _ = _notebook_config(hidden=2048)
    assert config.estimate_seconds(bigger, world, flop_per_s=RATE, cores=CORES) > base
    assert config.estimate_seconds(cfg, world, flop_per_s=2 * RATE, cores=CORES) < base
    assert config.estimate_seconds(cfg, [4], flop_per_s=RATE, cores=1) > \
        config.estimate_seconds(cfg, [4], flop_per_s=RATE, cores=4)
    with pytest.raises(UsageError, match="estimated at"):
        config.check_budget(bigger, world, flop_per_s=RATE, cores=CORES)


@pytest.mark.parametrize("over", [{"world_sizes": [4]}, {"schedules": ["naive_gpipe", "1f1b"]},
                                  {"schedules": ["gpipe", "interleaved"]}])
def test_model_and_sentences_work_at_documented_values(over):
    """The step model and every sentence at the documented non-default values, on the ideal
    schedule's blocks (P = 4 oversubscribes 2 cores: the slowdown grows with the ranks)."""
    cfg, world = _notebook_config(**over)
    p = world[0]
    rows = []
    for s, m in cfg.runnable(p):
        if s == "naive_gpipe":
            blocks = schedules.simulate("gpipe", p, m, forward_s=0.01, backward_s=0.02)
        else:
            v = cfg.virtual_stages if s == "interleaved" else 1
            blocks = schedules.simulate(s, p, m, virtual_stages=v, forward_s=0.01,
                                        backward_s=0.02)
        bubble = formulas.bubble_fraction(num_stages=p, num_microbatches=m, schedule=s,
                                          virtual_stages=cfg.virtual_stages)
        step = max(b["end_s"] for b in blocks)
        rows.append({"schedule": s, "num_stages": p, "num_microbatches": m,
                     "virtual_stages": cfg.virtual_stages if s == "interleaved" else 1,
                     "microbatch_size": cfg.batch // m, "hidden": cfg.hidden,
                     "step_time_s": step, "block_times": formulas.block_times([blocks]),
                     "compute_share": 1 - bubble, "bubble_fill_drain": bubble,
                     "bubble_formula": bubble, "idle_other": 0.0, "slot_time_s": 0.03})
    df = report.add_model(pd.DataFrame(rows), Machine(co_run=1.0, message_s=0.0))
    assert (df.step_time_model_s > 0).all()
    if p == 4:  # 4 ranks on 2 cores: 2x slower wherever more than 2 compute at once
        assert df.corun_slowdown.iloc[0] == 2.0
    for s in dict.fromkeys(df.schedule):
        for text in (verdicts.bubble_sentence(df, s), verdicts.step_sentence(df, s)):
            assert text.startswith(f"{s}, P = {p}")
        if df[df.schedule == s].num_microbatches.nunique() > 1:
            assert "the model picks M =" in verdicts.best_m_sentence(df, s)
    assert all(r["kind"] == "model" for r in report.step_laws(df) + report.best_m_laws(df))


def test_a_noisy_profile_does_not_refuse_the_defaults():
    """One size of the profile's sweep slowed by another program (here 512: 20 GFLOP/s where
    256 reached 33) would, read at the notebook's width, refuse the defaults; the budget reads
    the fastest rate the sweep measured."""

    class Noisy:
        rows = tuple({"measurement": "matmul", "context": c, "n": n, "flop_per_s": f}
                     for n, f in ((128, 32.8e9), (256, 33.4e9), (512, 20.6e9))
                     for c in ("alone", "together"))

    cfg, world = _notebook_config()
    rate = config.best_matmul_flop_per_s(Noisy())
    assert rate == 33.4e9
    assert config.check_budget(cfg, world, flop_per_s=rate, cores=2) <= config.NOTEBOOK_BUDGET_S
    with pytest.raises(UsageError, match="over the 32 s budget"):
        config.check_budget(cfg, world, flop_per_s=12.7e9, cores=2)  # 1024, extrapolated
