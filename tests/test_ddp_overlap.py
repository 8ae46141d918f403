"""The DDP overlap read off a timeline, the interleaved bucket A/B, MFU and the roofline: pure
parts on synthetic numbers (the launch that records a real timeline is in test_ddp.py)."""

from __future__ import annotations

import math

import pytest

from labkit.ddp import abtest, formulas, overlap, plots, verdicts
from labkit.errors import UsageError
from labkit.machine import roofline
from labkit.machine.plots import roofline_plot

#: a step on one clock (s): backward 10-40 ms, three buckets; bucket 1 launched while bucket 0
#: still runs, bucket 2 at backward's end
STEP = {"backward_start_s": 0.010, "backward_end_s": 0.040, "step_end_s": 0.055,
        "comm_intervals_s": [[0.020, 0.030], [0.028, 0.045], [0.040, 0.050]]}


def test_overlap_split_of_a_synthetic_timeline():
    s = overlap.overlap_split(STEP["backward_start_s"], STEP["backward_end_s"],
                              STEP["comm_intervals_s"])
    assert s["total_s"] == pytest.approx(0.030)  # the union 20-50 ms, not the sum 37 ms
    assert s["hidden_s"] == pytest.approx(0.020)
    assert s["exposed_s"] == pytest.approx(0.010)
    assert s["hidden_share"] == pytest.approx(2 / 3)
    assert s["hidden_s"] + s["exposed_s"] == pytest.approx(s["total_s"])


def test_overlap_split_edges():
    # everything after backward: nothing hidden; everything inside: nothing exposed
    after = overlap.overlap_split(0.0, 0.01, [(0.01, 0.02), (0.015, 0.03)])
    assert after["hidden_share"] == 0.0 and after["exposed_s"] == pytest.approx(0.02)
    inside = overlap.overlap_split(0.0, 0.05, [(0.01, 0.02), (0.03, 0.04)])
    assert inside["hidden_share"] == 1.0 and inside["exposed_s"] == 0.0
    assert math.isnan(overlap.overlap_split(0.0, 0.05, [])["hidden_share"])
    with pytest.raises(ValueError):
        overlap.overlap_split(0.05, 0.01, [])
    with pytest.raises(ValueError):
        overlap.overlap_split(0.0, 0.05, [(0.02, 0.01)])


def test_summarize_takes_medians_and_the_stretch_decides_what_hid():
    slow = {**STEP, "comm_intervals_s": [[0.020, 0.050]]}  # 10 ms exposed of 30
    out = overlap.summarize([STEP, STEP, slow], [{**STEP, "backward_end_s": 0.030}])
    assert out["comm_exposed_s"] == pytest.approx(0.010)
    assert out["backward_s"] == pytest.approx(0.030) and out["nosync_backward_s"] == pytest.approx(0.020)
    assert len(out["comm_intervals_s"]) == 3
    # backward 10 ms longer than without the all-reduce and 10 ms exposed: of all-reduces
    # that take 25 ms alone, 5 ms hid; of ones that take 15 ms alone, none
    assert overlap.hidden_for_free_s(exposed_s=0.010, backward_s=0.030, nosync_backward_s=0.020,
                                     standalone_s=0.025) == pytest.approx(0.005)
    assert overlap.hid_some(out, standalone_s=0.025) is True
    assert overlap.hid_some(out, standalone_s=0.015) is False
    assert overlap.hid_some({k: v for k, v in out.items() if k != "nosync_backward_s"},
                            standalone_s=0.025) is None
    assert overlap.hid_some(out, standalone_s=float("nan")) is None
    assert overlap.summarize([]) == {}
    text = verdicts.timeline_sentence(out, standalone_s=0.025)
    assert "3 buckets' all-reduces" in text and "paid 10.0 + 10.0 = 20.0 ms" in text
    assert "5.0 ms of them (20%) hid" in text
    assert "paid" not in verdicts.timeline_sentence(out)  # no standalone time: no verdict


def test_ab_rounds_reports_only_beyond_the_spread():
    same = abtest.ab_rounds([0.1, 0.102, 0.099, 0.101], [0.101, 0.1, 0.1, 0.1])
    assert not same["differs"] and same["p25_pct"] <= 0 <= same["p75_pct"]
    slower = abtest.ab_rounds([0.1, 0.102, 0.099, 0.101], [0.11, 0.111, 0.108, 0.112])
    assert slower["differs"] and slower["median_pct"] < 0 and slower["p75_pct"] < 0
    assert "slower" in verdicts.ab_rounds_sentence(slower, cap_a=25, cap_b=1,
                                                   model_delta_pct=-5)
    with pytest.raises(UsageError):
        abtest.ab_rounds([0.1], [0.1])
    with pytest.raises(UsageError):
        abtest.ab_rounds([0.1, 0.1, 0.1], [0.1, 0.1])


def test_ab_config_is_a_ddp_config_with_run_a():
    cfg = abtest.ABConfig(bucket_cap_mb=1, compare_bucket_cap_mb=25)
    assert cfg.bucket_cap_mb == 1.0 and cfg.compare_bucket_cap_mb == 25.0
    assert abtest.ABConfig().compare_bucket_cap_mb is None
    for bad in (0, -1, True, float("nan")):
        with pytest.raises(UsageError):
            abtest.ABConfig(compare_bucket_cap_mb=bad)


def test_mfu_columns_and_roofline():
    rows = formulas.add_mfu_columns(
        [{"variant": "ddp", "batch_size": 64, "step_time_p50_s": 0.05},
         {"variant": "no_ddp_all_cores", "batch_size": 64, "step_time_p50_s": 0.02}],
        flop_per_sample=1e6, peak_flop_per_s=2e9, catalog_peak_flop_per_s=4e9)
    assert rows[0]["model_flop_per_s"] == pytest.approx(64e6 / 0.05)
    assert rows[0]["mfu"] == pytest.approx(0.64) and rows[0]["mfu_catalog"] == pytest.approx(0.32)
    assert "mfu" not in rows[1]
    roof = roofline.Roofline(peak_flop_per_s=40e9, bandwidth_bytes_per_s=10e9)
    assert roof.ridge_flop_per_byte == 4.0
    assert roof.attainable_flop_per_s(2.0) == 20e9 and roof.attainable_flop_per_s(8.0) == 40e9
    with pytest.raises(ValueError):
        roofline.Roofline(peak_flop_per_s=0, bandwidth_bytes_per_s=1e9)


def test_roofline_from_a_profile_and_the_figures():
    from types import SimpleNamespace

    rates = {64: 5e9, 256: 12e9, 512: 11e9}
    prof = SimpleNamespace(
        rows=[{"measurement": "matmul", "context": c, "n": n} for n in rates
              for c in ("alone", "together")],
        matmul_flop_per_s=lambda n, together=False: rates[n] * (0.8 if together else 1),
        copy_bytes_per_s=lambda together=False: 6e9)
    roof = roofline.from_profile(prof)
    assert roof.peak_flop_per_s == 12e9 and roof.bandwidth_bytes_per_s == 6e9
    fig = roofline_plot(roof, matmul=list(rates.items()), points=[("a step", 3e9)])
    assert len(fig.axes) == 1
    row = {"world_size": 2, "batch_size": 16, "bucket_cap_mb": 1.0, "nosync_backward_s": 0.025,
           **{f"timeline_{k}": [STEP[k]] for k in ("backward_start_s", "backward_end_s",
                                                    "step_end_s")},
           "comm_intervals_s": [STEP["comm_intervals_s"]]}
    fig = plots.comm_timeline(row)
    assert len(fig.axes[0].patches) >= 3  # one bar per bucket, and backward's span
