"""Pipeline lab on 2 ranks: every schedule against one process, the timeline, the rows'
declared fields, the step model on real rows (the pure parts: tests/test_pipeline.py)."""

from __future__ import annotations

import pytest

from labkit import pipeline, results
from labkit.errors import UsageError
from labkit.launch import LaunchOptions
from labkit.pipeline import activations, formulas, messages, rates, report, verdicts
from labkit.pipeline.config import PipelineConfig

from .conftest import LAUNCH_TIMEOUT_S


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
    config = PipelineConfig(schedules=("naive_gpipe", "gpipe", "1f1b", "interleaved"),
                            microbatches=(1, 2), steps=3, warmup=1, skip_invalid=True,
                            compare_placement_at=(1, 2))
    df = pipeline.run(config, launch=LaunchOptions(nprocs=(2,), progress=False,
                                                   timeout_s=LAUNCH_TIMEOUT_S))
    got = sorted(zip(df.schedule, df.num_microbatches,
                     (str(a) if a in (True, False) else "None" for a in df.recv_ahead)))
    # gpipe and 1f1b both ways (receives posted ahead and torch's placement), the others once
    assert got == sorted([("naive_gpipe", 1, "None"), ("naive_gpipe", 2, "None"),
                          ("gpipe", 1, "True"), ("gpipe", 1, "False"), ("gpipe", 2, "True"),
                          ("gpipe", 2, "False"), ("1f1b", 2, "True"), ("1f1b", 2, "False"),
                          ("interleaved", 2, "None")])
    _check_rows(df, 2)  # both placements give the single process's output and gradients
    # stage 0's saved activations: what each schedule's ideal order implies, to the byte
    assert (df.peak_activation_bytes == df.peak_activation_bytes_formula).all(), \
        df[["schedule", "num_microbatches", "peak_activation_bytes",
            "peak_activation_bytes_formula"]]
    assert all(r["holds"] for r in activations.activation_laws(report.main_rows(df)))
    assert sorted(zip(*[report.main_rows(df)[c] for c in ("schedule", "num_microbatches")])) \
        == sorted([("naive_gpipe", 1), ("naive_gpipe", 2), ("gpipe", 1), ("gpipe", 2),
                   ("1f1b", 2), ("interleaved", 2)])
    assert (report.main_rows(df).recv_ahead.isin([True]).sum() == 3
            and df.compared_placement.sum() == 3)
    table = report.recv_ahead_table(df)
    assert sorted(zip(table.schedule, table.num_microbatches)) == [("1f1b", 2), ("gpipe", 1),
                                                                  ("gpipe", 2)]
    assert "posting every receive" in verdicts.recv_ahead_sentence(table.iloc[0])
    for r in df[df.num_microbatches == 1].itertuples():  # (P−1)/P = 0.5 at M = 1
        assert r.bubble_formula == 0.5
        # one microbatch: no two ranks ever compute at once, so at least half of 2 x the step
        # is idle whatever the machine's load (messages only add to it; the lab judges how much)
        assert r.bubble_measured >= 0.5 - 0.01, (r.schedule, r.bubble_measured)
    blocks = report.schedule_blocks(df, "interleaved", 2, 2)
    assert sorted(blocks.stage.unique()) == [0, 1, 2, 3]
    with pytest.raises(UsageError):
        report.schedule_blocks(df, "1f1b", 2, 1)
    # every field a row carries is declared
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert results.mismatches(df).empty
    assert "bubble_measured" in report.bubble_table(df)


@pytest.mark.slow
def test_zero_bubble_and_timeline_on_two_ranks():
    """1F1B and zero bubble on 2 ranks: same output and gradients as one process, F, B and W
    blocks per microbatch, the timeline split adding up, every row field declared, and the
    parts timed apart (the step at the fixed width, a rank's blocks alone at both widths)."""
    config = PipelineConfig(schedules=("1f1b", "zero_bubble"), microbatches=(2, 4), hidden=128,
                            batch=32, steps=2, warmup=1, fixed_width=8)
    df = pipeline.run(config, launch=LaunchOptions(nprocs=(2,), progress=False,
                                                   timeout_s=LAUNCH_TIMEOUT_S))
    assert sorted(zip(df.schedule, df.num_microbatches)) == [
        ("1f1b", 2), ("1f1b", 4), ("zero_bubble", 2), ("zero_bubble", 4)]
    assert df.matches_single_process.all(), df[["schedule", "max_output_diff", "max_grad_diff"]]
    for r in df.itertuples():
        kinds = "FBW" if r.schedule == "zero_bubble" else "FB"
        assert sorted(b["kind"] for b in r.blocks) == sorted(kinds * 2 * r.num_microbatches)
        assert r.compute_share + r.bubble_fill_drain + r.idle_other == pytest.approx(1, abs=0.05)
        assert 0 <= r.bubble_fill_drain < 1 and r.slot_time_s > 0
        assert r.step_time_predicted_s == pytest.approx(formulas.predicted_step_time(
            num_stages=2, num_microbatches=r.num_microbatches, slot_s=r.slot_time_s,
            schedule=r.schedule))
        split = formulas.timeline_split(r.blocks)  # the stored blocks: one clock, from 0
        assert split["compute_s"] > 0 and min(b["start_s"] for b in r.blocks) >= 0
        # the median step, whose span is the row's step, and its messages: P = 2, one
        # activation and one gradient per microbatch, each delay read off its blocks
        assert max(b["end_s"] for b in r.median_step_blocks) <= r.step_time_s + 1e-9
        assert len(r.step_messages) == 2 * r.num_microbatches
        assert r.step_messages == messages.step_messages(r.median_step_blocks)
        assert all(m["delay_s"] >= 0 and m["from_rank"] != m["to_rank"]
                   for m in r.step_messages)
    assert (df.fixed_width == 8).all() and (df.fixed_step_s > 0).all()
    assert (df.fixed_step_p10_s <= df.fixed_step_s).all()
    assert (df.fixed_step_s <= df.fixed_step_p90_s).all()
    assert ((df.block_alone_s > 0) & (df.fixed_block_alone_s > 0)).all()
    assert df[df.schedule == "zero_bubble"].weight_time_s.notna().all()
    assert (df.peak_activation_bytes == df.peak_activation_bytes_formula).all()
    assert df.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert "bubble_fill_drain" in report.bubble_table(df)
    assert len(report.ideal_blocks(df, "zero_bubble", 2, 4)) == 3 * 2 * 4
    for r in df.itertuples():  # every rank's every kind of block, timed alone or not
        kinds = "FBW" if r.schedule == "zero_bubble" else "FB"
        assert {(t["rank"], t["kind"]) for t in r.block_times} == {
            (rank, k) for rank in (0, 1) for k in kinds}
        assert all(t["median_s"] >= 0 and 0 <= t["overlap"] <= 1 for t in r.block_times)

    class Machine:  # a profile's numbers: a co-run slowdown, a transfer, a scheduler wait
        scheduler_wait_s = 3.6e-3

        def compute_slowdown(self, ranks):
            return 1.0 if ranks == 1 else 1.2

        def transfer_s(self, size_bytes, *, measurement, busy):
            return 1e-4

    modelled = report.add_model(df, Machine())
    assert (modelled.step_time_model_s > 0).all() and (modelled.corun_slowdown == 1.2).all()
    assert (modelled.messages == 2 * modelled.num_microbatches).all()
    assert (modelled.messages_waited <= modelled.messages).all()
    assert (modelled.step_waits_model_s >= 0).all() and (modelled.step_waits_measured_s >= 0).all()
    assert len(report.step_laws(modelled)) == 4 and len(report.best_m_laws(modelled)) == 2
    # the median step's own split: its terms sum to a step of the row
    from labkit.book import laws

    assert all(laws.split_sums(row) for row in report.step_laws(modelled))
    assert results.undeclared(modelled.to_dict("records"), report.COLUMNS) == []

    class Products:  # a profile's matrix products: 1 GFLOP/s per n, measured at 64 and 256
        rows = tuple({"measurement": "matmul", "context": "alone", "n": n} for n in (64, 256))

        def matmul_flop_per_s(self, n, *, together=False):
            return 1e9 * min(max(n, 64), 256)

    rated = rates.add_rates(modelled, Products())
    assert (rated.block_flop_per_s > 0).all()
    assert (rated.block_flop == 6 * 8 / 2 * rated.microbatch_size * 128 ** 2).all()
    assert results.undeclared(rated.to_dict("records"), report.COLUMNS) == []
    assert rates.rate_sentence(rated, "1f1b").startswith(
        "1f1b, P = 2, from microbatches of 16 to 8 samples (M = 2 to 4)")
