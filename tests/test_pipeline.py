"""Pipeline lab: bubble formulas, the ideal-schedule simulator, the timeline split, verdicts,
config checks (its 2-rank runs: tests/test_pipeline_launch.py)."""

from __future__ import annotations

import subprocess

import pytest

from labkit import pipeline
from labkit.errors import UsageError
from labkit.pipeline import formulas, report, schedules, verdicts
from labkit.pipeline.config import PipelineConfig


def test_formulas_hand_computed():
    def bubble(p, m, **kw):
        return formulas.bubble_fraction(num_stages=p, num_microbatches=m, **kw)

    assert bubble(8, 16) == pytest.approx(7 / 23)
    assert bubble(2, 1) == 0.5
    assert bubble(1, 4) == 0.0
    assert bubble(4, 8, schedule="interleaved", virtual_stages=2) == pytest.approx(3 / 19)
    assert bubble(4, 8, schedule="interleaved", virtual_stages=1) == bubble(4, 8)
    assert formulas.bubble_time(num_stages=4, num_microbatches=8,
                                stage_compute_s=2.0) == pytest.approx(0.75)
    assert formulas.measured_bubble([1.0, 1.0, 1.0, 1.0], 2.0) == 0.5
    for bad in [(0, 1), (2, 0), (2, 1.5)]:
        with pytest.raises(UsageError):
            bubble(*bad)


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 2, 1, 1), ("gpipe", 4, 8, 1),
                                            ("1f1b", 4, 4, 1), ("1f1b", 3, 7, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_simulated_schedule_matches_formula(schedule, p, m, v):
    blocks = schedules.simulate(schedule, p, m, virtual_stages=v)
    assert len(blocks) == 2 * p * m * v
    step = max(b["end_s"] for b in blocks)
    busy = [sum(b["end_s"] - b["start_s"] for b in blocks if b["rank"] == r) for r in range(p)]
    assert formulas.measured_bubble(busy, step) == pytest.approx(
        formulas.bubble_fraction(num_stages=p, num_microbatches=m, schedule=schedule,
                                 virtual_stages=v))
    for r in range(p):  # a rank never runs two blocks at once
        mine = sorted((b["start_s"], b["end_s"]) for b in blocks if b["rank"] == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (3, 6), (4, 8), (4, 16)])
def test_zero_bubble_simulation(p, m):
    """ZB-H1: F, B and W each one slot; bubble (P−1)/(P−1+3M), a third of 1F1B's idle time."""
    blocks = schedules.simulate("zero_bubble", p, m, forward_s=1.0, backward_s=2.0)
    assert sorted(b["kind"] for b in blocks) == sorted("FBW" * p * m)
    step = max(b["end_s"] for b in blocks)
    assert step == pytest.approx(3 * m + (p - 1))  # 1F1B: 3 (M + P − 1)
    assert formulas.bubble_over_ideal(num_stages=p, num_microbatches=m,
                                      schedule="zero_bubble") == pytest.approx((p - 1) / (3 * m))
    for r in range(p):  # a weight gradient never runs before its input gradient
        mine = {(b["kind"], b["microbatch"]): b for b in blocks if b["rank"] == r}
        assert all(mine[("W", i)]["start_s"] >= mine[("B", i)]["end_s"] for i in range(m))


def test_two_conventions():
    """Share of the step and time over the ideal step: b and b / (1 − b), same idle time."""
    for s, kw in [("gpipe", {}), ("1f1b", {}), ("interleaved", {"virtual_stages": 2}),
                  ("zero_bubble", {})]:
        for p, m in [(2, 1), (2, 8), (4, 4), (8, 16)]:
            b = formulas.bubble_fraction(num_stages=p, num_microbatches=m, schedule=s, **kw)
            r = formulas.bubble_over_ideal(num_stages=p, num_microbatches=m, schedule=s, **kw)
            assert r == pytest.approx(b / (1 - b))
    assert formulas.bubble_over_ideal(num_stages=4, num_microbatches=4) == 0.75
    assert formulas.bubble_fraction(num_stages=4, num_microbatches=4) == pytest.approx(3 / 7)
    with pytest.raises(TypeError):  # keyword-only: a swapped P and M cannot go unseen
        formulas.bubble_over_ideal(4, 8)
    assert formulas.predicted_step_time(num_stages=2, num_microbatches=8,
                                        slot_s=0.01) == pytest.approx(0.09)  # (M+P−1) t_slot


def _stall_points(blocks):
    """Times at which no block is running on any rank (every rank between blocks)."""
    edges = sorted({b["start_s"] for b in blocks} | {b["end_s"] for b in blocks})
    return [t for t in edges
            if not any(b["start_s"] < t < b["end_s"] for b in blocks) and 0 < t < edges[-1]]


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 2, 1, 1), ("gpipe", 2, 8, 1),
                                            ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1),
                                            ("zero_bubble", 2, 4, 1), ("zero_bubble", 3, 6, 1),
                                            ("interleaved", 2, 4, 2)])
def test_timeline_split_recovers_fill_drain_and_gaps(schedule, p, m, v):
    """The ideal schedule's blocks split into compute and exactly the formula's bubble; then
    a start-up delay, stalls of the whole pipeline and a wind-down are injected: they come back
    as exactly P × their length of 'other' idle, and the fill/drain bubble stays the same."""
    ideal = schedules.simulate(schedule, p, m, virtual_stages=v)
    step = max(b["end_s"] for b in ideal)
    busy = sum(b["end_s"] - b["start_s"] for b in ideal)
    split = formulas.timeline_split(ideal)
    formula = formulas.bubble_fraction(num_stages=p, num_microbatches=m, schedule=schedule,
                                       virtual_stages=v)
    assert split["bubble_share"] == pytest.approx(formula, abs=1e-12)
    assert split["other_s"] == pytest.approx(0, abs=1e-12)
    assert split["compute_s"] == pytest.approx(busy)
    assert split["bubble_s"] == pytest.approx(p * step - busy)

    start_up, wind_down = 0.25, 0.5
    stalls = {t: 0.125 * (i + 1) for i, t in enumerate(_stall_points(ideal)[::3])}
    assert stalls or m == 1

    def shifted(t):
        return t + start_up + sum(g for at, g in stalls.items() if t >= at)

    late = [{**b, "start_s": shifted(b["start_s"]),
             "end_s": shifted(b["start_s"]) + b["end_s"] - b["start_s"]} for b in ideal]
    injected = start_up + sum(stalls.values()) + wind_down
    end = max(b["end_s"] for b in late) + wind_down
    got = formulas.timeline_split(late, step_start_s=0.0, step_end_s=end)
    assert got["step_s"] == pytest.approx(step + injected)
    assert got["compute_s"] == pytest.approx(busy)
    assert got["bubble_s"] == pytest.approx(p * step - busy)  # the fill and drain, unchanged
    assert got["other_s"] == pytest.approx(p * injected)  # every rank idles through each gap
    assert got["compute_share"] + got["bubble_share"] + got["other_share"] == pytest.approx(1)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_timeline_split_message_delays(m):
    """GPipe, P = 2, every message takes c: rank 1 runs c late, rank 0's backwards 2c late. The
    ideal replay (messages free) idles each rank exactly where the schedule does, so the bubble
    stays the formula's at every M and all 4c the messages add (2c per rank) is other idle."""
    c = 0.125
    ideal = schedules.simulate("gpipe", 2, m)
    moved = [{**b, "start_s": b["start_s"] + d, "end_s": b["end_s"] + d} for b in ideal
             for d in [c if b["rank"] == 1 else (2 * c if b["kind"] == "B" else 0.0)]]
    got = formulas.timeline_split(moved)
    assert got["step_s"] == pytest.approx(3 * (m + 1) + 2 * c)
    assert got["bubble_s"] == pytest.approx(6)
    assert got["other_s"] == pytest.approx(4 * c)
    assert [r["other_s"] for r in got["per_rank"]] == pytest.approx([2 * c] * 2)


def test_timeline_split_a_late_message_is_other_also_where_it_delays_later_blocks():
    """GPipe, P = 2, M = 4: one forward message 1 s late makes rank 1 start F1 late and every
    block after it; rank 1's waits it causes, and rank 0's wait for the late gradients, are
    other, not bubble (the bubble is the replay's, where the message is free)."""
    ideal = schedules.simulate("gpipe", 2, 4)
    step = max(b["end_s"] for b in ideal)
    busy = sum(b["end_s"] - b["start_s"] for b in ideal)
    f1 = next(b for b in ideal if b["rank"] == 1 and b["kind"] == "F" and b["microbatch"] == 1)
    late = [{**b, "start_s": b["start_s"] + 1.0, "end_s": b["end_s"] + 1.0}
            if (b["rank"] == 1 and b["start_s"] >= f1["start_s"]) or (b["rank"] == 0 and b["kind"] == "B")
            else b for b in ideal]
    got = formulas.timeline_split(late)
    assert got["bubble_s"] == pytest.approx(2 * step - busy)
    assert got["other_s"] == pytest.approx(2 * 1.0)


def test_timeline_split_refuses_bad_input():
    b = dict(rank=0, stage=0, kind="F", microbatch=0, start_s=1.0, end_s=2.0)
    for bad in ([], [dict(b, kind="X")], [dict(b, end_s=0.5)]):
        with pytest.raises(UsageError):
            formulas.timeline_split(bad)
    with pytest.raises(UsageError):
        formulas.timeline_split([b], step_start_s=1.5)
    with pytest.raises(UsageError):
        formulas.timeline_split([b], step_end_s=1.5)


def _rows(**over):
    """Synthetic rows of one schedule at M = 2, 4, 8 (P = 2) for the verdict sentences, with
    the step model's columns (report.add_model)."""
    import pandas as pd

    from labkit.book.laws import symmetric_error_pct

    base = dict(schedule="gpipe", num_stages=2, num_microbatches=[2, 4, 8],
                microbatch_size=[64, 32, 16], step_time_s=[0.12, 0.10, 0.11],
                step_time_predicted_s=[0.115, 0.095, 0.1], step_time_error_pct=[-4.0, -5.0, -9.0],
                step_time_model_s=[0.125, 0.104, 0.112],
                slot_time_s=[0.04, 0.019, 0.011], bubble_fill_drain=[0.34, 0.21, 0.12],
                bubble_formula=[1 / 3, 0.2, 1 / 9], idle_other=[0.02, 0.03, 0.05],
                compute_share=[0.64, 0.76, 0.83], corun_slowdown=1.25, message_transfer_s=3e-4)
    base.update(over)
    df = pd.DataFrame(base)
    return df.assign(step_model_error_pct=[symmetric_error_pct(m, s) for m, s in
                                           zip(df.step_time_model_s, df.step_time_s)])


def test_verdict_sentences_follow_the_numbers():
    df = _rows()
    assert "the formula holds within 0.05 at every M" in verdicts.bubble_sentence(df, "gpipe")
    assert "falls (0.34 -> 0.12) from M = 2 to M = 8" in verdicts.bubble_sentence(df, "gpipe")
    far = _rows(bubble_fill_drain=[0.34, 0.21, 0.30])
    assert "does not hold within 0.05 at M = 8" in verdicts.bubble_sentence(far, "gpipe")
    rising = far.assign(bubble_fill_drain=[0.3, 0.3, 0.35])
    assert "rises (0.30 -> 0.35)" in verdicts.bubble_sentence(rising, "gpipe")

    assert "step model holds within 20% at every M" in verdicts.step_sentence(df, "gpipe")
    off = _rows(step_time_model_s=[0.125, 0.13, 0.112])  # +30% at M = 4
    assert "does not hold within 20% at M = 4 (worst error +30.0% at M = 4" in \
        verdicts.step_sentence(off, "gpipe")

    best = verdicts.best_microbatches(df, "gpipe")
    assert best.num_microbatches == 4  # computed from the rows: the shortest measured step
    text = verdicts.best_m_sentence(df, "gpipe")
    assert "shortest measured step is at M = 4 (100.0 ms); the model picks M = 4" in text
    assert "bubble falls (0.21 -> 0.12)" in text and "grows (76.0 -> 88.0 ms)" in text
    largest = _rows(step_time_s=[0.12, 0.10, 0.09])
    assert verdicts.best_microbatches(largest, "gpipe").num_microbatches == 8
    assert "From M = 2 to M = 8" in verdicts.best_m_sentence(largest, "gpipe")
    cheap = largest.assign(slot_time_s=[0.04, 0.02, 0.009])  # M x t_slot falls: 80 -> 72 ms
    assert "shrinks (80.0 -> 72.0 ms)" in verdicts.best_m_sentence(cheap, "gpipe")
    flat = largest.assign(bubble_fill_drain=[0.2, 0.2, 0.2049])  # equal as printed
    assert "stays at 0.20 (0.20 -> 0.20)" in verdicts.best_m_sentence(flat, "gpipe")

    rows = report.best_m_laws(df)  # the measured step at the model's M against the best
    assert [(r["predicted"], r["measured"], r["holds"]) for r in rows] == [(100.0, 100.0, True)]
    wrong = _rows(step_time_model_s=[0.09, 0.104, 0.112])  # the model picks M = 2: 120 ms
    rows = report.best_m_laws(wrong)
    assert [(r["predicted"], r["holds"]) for r in rows] == [(120.0, True)]  # +20%: on the edge
    worse = _rows(step_time_model_s=[0.09, 0.104, 0.112], step_time_s=[0.125, 0.10, 0.11])
    assert [r["holds"] for r in report.best_m_laws(worse)] == [False]
    assert "does not hold within 20%" in verdicts.best_m_sentence(worse, "gpipe")
    assert [r["holds"] for r in report.bubble_laws(df)] == [True, True, True]
    assert [r["holds"] for r in report.bubble_laws(far)] == [True, True, False]
    assert all(r["holds"] for r in report.step_laws(df))
    assert [r["holds"] for r in report.step_laws(off)] == [True, False, True]


def test_recv_ahead_sentence_follows_the_numbers():
    import pandas as pd

    line = pd.Series({"schedule": "1f1b", "num_stages": 2, "num_microbatches": 4,
                      "step_ms_torch": 200.0, "step_ms_ahead": 160.0, "slot_ms_torch": 30.0,
                      "slot_ms_ahead": 30.0, "error_pct_torch": -20.0, "error_pct_ahead": -5.0,
                      "idle_other_torch": 0.2, "idle_other_ahead": 0.05})
    assert "the step falls (200.0 -> 160.0 ms: 1.25x faster)" in \
        verdicts.recv_ahead_sentence(line)
    assert "the idle time outside the fill and drain falls (0.20 -> 0.05 of the step)" in \
        verdicts.recv_ahead_sentence(line)
    assert "t_slot stays at 30.0 (30.0 -> 30.0 ms)" in verdicts.recv_ahead_sentence(line)
    assert "-20.0% with torch's placement (within 20%)" in verdicts.recv_ahead_sentence(line)
    line["error_pct_torch"] = -20.5
    assert "-20.5% with torch's placement (outside 20%)" in verdicts.recv_ahead_sentence(line)
    slower = line.copy()
    slower["step_ms_ahead"] = 250.0
    assert "the step rises (200.0 -> 250.0 ms: 1.25x slower)" in \
        verdicts.recv_ahead_sentence(slower)
    same = line.copy()
    same[["step_ms_ahead", "slot_ms_ahead"]] = [199.0, 33.0]
    assert ("about the same, since the idle time fell and t_slot rose"
            in verdicts.recv_ahead_sentence(same))
    same["slot_ms_ahead"] = 29.0  # the idle time fell, t_slot did not rise: no such claim
    assert "ms: about the same)" in verdicts.recv_ahead_sentence(same)
    same["slot_ms_ahead"] = 30.04  # rose, but not as printed: no such claim either
    assert "ms: about the same)" in verdicts.recv_ahead_sentence(same)
    df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [4, 8],
                       "recv_ahead": [True, True], "step_time_s": 0.1, "slot_time_s": 0.01,
                       "step_time_error_pct": 0.0, "idle_other": 0.1})
    with pytest.raises(UsageError, match="both with and without"):
        report.recv_ahead_table(df)


class _Stage:
    """What post_receives_ahead uses of a PipelineStage: one receive op per microbatch and
    kind, forward and backward that log what they were given."""

    def __init__(self):
        self.log = []

    def get_fwd_recv_ops(self, i):
        return [("F", i)]

    def get_bwd_recv_ops(self, i):
        return [("B", i)]

    def forward_one_chunk(self, i, *args, **kwargs):
        self.log.append(("forward", i))

    def backward_one_chunk(self, i, *args, **kwargs):
        self.log.append(("backward", i))


def test_receives_posted_ahead_in_order_and_waited_before_each_block(monkeypatch):
    """At the step's first receive every receive of the step is posted, activations and
    gradients in microbatch order; the schedule's own receive ops are empty; each block waits
    for its own message first; the next step posts again."""
    from labkit.pipeline import ahead

    class Work:
        def __init__(self, op):
            self.op = op

        def wait(self):
            stage.log.append(("wait", self.op))

    def batch_isend_irecv(ops):
        stage.log.append(("post", *ops))
        return [Work(op) for op in ops]

    monkeypatch.setattr(ahead.dist, "batch_isend_irecv", batch_isend_irecv)
    stage = _Stage()
    assert ahead.post_receives_ahead(stage, 2)
    for _ in range(2):  # two steps of GPipe's order
        stage.log.clear()
        assert stage.get_fwd_recv_ops(0) == []
        stage.forward_one_chunk(0)
        assert stage.get_fwd_recv_ops(1) == [] and stage.get_bwd_recv_ops(0) == []
        stage.forward_one_chunk(1)
        stage.backward_one_chunk(0)
        stage.backward_one_chunk(1)
        assert stage.log == [("post", ("F", 0)), ("post", ("B", 0)), ("post", ("F", 1)),
                             ("post", ("B", 1)), ("wait", ("F", 0)), ("forward", 0),
                             ("wait", ("F", 1)), ("forward", 1), ("wait", ("B", 0)),
                             ("backward", 0), ("wait", ("B", 1)), ("backward", 1)]


def test_receives_ahead_leave_a_stage_without_the_methods_alone():
    from labkit.pipeline import ahead

    class Bare:
        def get_fwd_recv_ops(self, i):
            return []

    bare = Bare()
    assert ahead.post_receives_ahead(bare, 4) is False
    assert "get_fwd_recv_ops" not in vars(bare)


def test_timed_blocks_are_seconds_since_the_step_start():
    """A stage's F and B on the host clock from the step's start, in the order they ran; a W
    block starts where a B run inside its weight pass ends."""
    import time

    import torch
    from torch import nn

    from labkit.pipeline.worker import Timed

    torch.manual_seed(0)
    mod = Timed(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), 3, device=torch.device("cpu"))
    assert mod._anchor.device == torch.device("cpu")
    mod.reset(time.perf_counter())
    x = torch.randn(2, 4, requires_grad=True)
    mod(x).sum().backward()
    y = mod(x)
    mod.timed_weight(lambda mb: y.sum().backward())(1)
    blocks = mod.blocks()
    assert [(b["stage"], b["kind"], b["microbatch"]) for b in blocks] == [
        (3, "F", 0), (3, "B", 0), (3, "F", 1), (3, "B", 1), (3, "W", 1)]
    assert list(blocks[0]) == ["stage", "kind", "microbatch", "start_s", "end_s"]
    assert all(0 <= b["start_s"] <= b["end_s"] for b in blocks)
    assert all(a["end_s"] <= b["start_s"] for a, b in zip(blocks[:3], blocks[1:4]))
    assert blocks[4]["start_s"] == blocks[3]["end_s"]  # W after the B inside its pass


def test_stage_layers():
    assert schedules.stage_layers(8, 2) == [range(0, 4), range(4, 8)]
    assert [len(s) for s in schedules.stage_layers(10, 4)] == [3, 3, 2, 2]
    with pytest.raises(UsageError):
        schedules.stage_layers(2, 3)


@pytest.mark.parametrize("kw,p", [(dict(schedules=("bogus",)), 2), (dict(microbatches=(0,)), 2),
                                  (dict(batch=10, microbatches=(3,)), 2),
                                  (dict(layers=1), 2), (dict(schedules=("1f1b",), microbatches=(1,)), 2),
                                  (dict(schedules=("interleaved",), layers=6, microbatches=(4,)), 4),
                                  (dict(schedules=("interleaved",), microbatches=(3,), batch=96), 2),
                                  (dict(schedules=("zero_bubble",), microbatches=(1,)), 2),
                                  (dict(schedules=("zero_bubble",), microbatches=(5,), batch=80), 2)])
def test_config_refuses(kw, p):
    with pytest.raises(UsageError):
        PipelineConfig(**kw).check_world_size(p)


def test_1f1b_refusal_message():
    with pytest.raises(UsageError, match=r"M=1 < P=2"):
        PipelineConfig(schedules=("1f1b",), microbatches=(1, 2)).check_world_size(2)


@pytest.mark.parametrize("args", [["--schedule", "bogus"], ["--microbatches", "0"],
                                  ["--batch", "10", "--microbatches", "3"], ["--layers", "1"],
                                  ["--schedule", "1f1b", "--microbatches", "1"],
                                  ["--batch", "256", "--microbatches", "2", "3", "4"],
                                  ["--schedule", "zero_bubble", "--microbatches", "1"],
                                  ["--microbatches", "2", "--compare-placement-at", "4"]])
def test_cli_bad_input_exit_2(args, labkit_cmd):
    p = subprocess.run([*labkit_cmd, "pipeline", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_uneven_microbatches_refused_before_launch(labkit_cmd):
    """One line, exit 2, and no launch (the run would take seconds; the refusal does not)."""
    p = subprocess.run([*labkit_cmd, "pipeline", "--batch", "100", "--microbatches", "3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "labkit pipeline: error: batch 100 is not divisible by 3 microbatches"]
    assert "launch" not in p.stdout


def test_skip_invalid_keeps_gpipe_m1():
    cfg = PipelineConfig(schedules=("gpipe", "1f1b"), microbatches=(1, 2), skip_invalid=True)
    cfg.check_world_size(2)
    assert cfg.runnable(2) == [("gpipe", 1), ("gpipe", 2), ("1f1b", 2)]
    with pytest.raises(UsageError):
        PipelineConfig(schedules=("1f1b",), microbatches=(1,), skip_invalid=True).check_world_size(2)


def test_run_defaults_to_two_ranks_and_a_300_s_timeout(monkeypatch):
    import labkit.launch

    seen = {}

    def fake_launch_lab(worker, config, launch, store, traced=False):
        seen.update(worker=worker, launch=launch)
        return []

    monkeypatch.setattr(labkit.launch, "launch_lab", fake_launch_lab)
    assert pipeline.run(PipelineConfig()).empty
    assert seen["worker"] == "pipeline"
    assert (seen["launch"].nprocs, seen["launch"].timeout_s) == ((2,), 300.0)
