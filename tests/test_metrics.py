"""Scaling math against the published tables (Rivanna guide: RTX 2080 Ti and K80 DDP times)."""

import math

import pytest

from labkit import metrics as m
from labkit.errors import UsageError

RTX = {1: 171, 2: 108, 3: 79, 4: 64, 5: 57, 6: 52, 7: 51, 8: 49, 9: 49, 10: 49}
K80 = {1: 226, 2: 134, 3: 95, 4: 76}


def test_rtx_table_speedup_and_relative_su_at_8():
    s = m.speedup(RTX[1], RTX[8])
    assert round(s, 2) == 3.49
    assert round(m.relative_su(s, 8), 2) == 2.29
    assert round(m.strong_efficiency(RTX[1], RTX[8], 8), 3) == 0.436


def test_k80_table():
    df, summary = m.speedup_table(K80)
    assert df.speedup.round(2).tolist() == [1.0, 1.69, 2.38, 2.97]
    assert df.relative_su.round(2).tolist() == [1.0, 1.19, 1.26, 1.35]
    # Karp-Flatt at N=2: (1/1.6866 - 1/2) / (1/2) = 0.1858
    assert df.karp_flatt.iloc[1] == pytest.approx(2 * (134 / 226 - 0.5), rel=1e-12)
    assert math.isnan(df.karp_flatt.iloc[0])
    assert 0.0 < summary["amdahl_serial_fraction"] < 0.2
    assert summary["knee_world_size"] == 4  # efficiency 0.74 at N = 4 is still >= 0.5


def test_rtx_plateau_knee_and_amdahl_fit():
    df, summary = m.speedup_table(RTX, threshold=0.5)
    assert summary["knee_world_size"] == 6  # E(6) = 0.548, E(7) = 0.479
    assert summary["fastest_world_size"] == 8  # 49 s first reached at N = 8
    f = summary["amdahl_serial_fraction"]
    # the least-squares f reproduces the fitted points: residuals in time space are small
    pred = [RTX[1] * (f + (1 - f) / n) for n in RTX]
    assert max(abs(p - t) / t for p, t in zip(pred, RTX.values())) < 0.12
    assert f == pytest.approx(0.187, abs=0.002)


def test_amdahl_fit_recovers_exact_fraction():
    times = [100 * (0.05 + 0.95 / n) for n in (1, 2, 4, 8, 16)]
    assert m.fit_amdahl([1, 2, 4, 8, 16], times) == pytest.approx(0.05, abs=1e-12)


def test_gustafson_and_amdahl_limits():
    assert m.amdahl_speedup(0.0, 16) == 16
    assert m.amdahl_speedup(1.0, 16) == 1
    assert m.gustafson_speedup(0.0, 16) == 16
    assert m.gustafson_speedup(0.25, 5) == 4.0


def test_weak_and_throughput_efficiency():
    assert m.weak_efficiency(2.0, 2.0) == 1.0
    assert m.throughput_efficiency(10.0, 40.0, 4) == 1.0


def test_service_units_and_deadline():
    assert m.service_units(3600, cores=4, gpus=2) == 8.0
    # K80 with 1 GPU per rank: N=2 (134 s) meets a 140 s deadline more cheaply than N=3, 4
    assert m.cheapest_for_deadline(list(K80), list(K80.values()), 140) == 2
    assert m.cheapest_for_deadline(list(K80), list(K80.values()), 10) is None


def test_summarize_times_percentiles_ordered():
    s = m.summarize_times([0.1, 0.4, 0.2, 0.3, 0.5, 0.25], "step_time")
    assert s["step_time_min_s"] <= s["step_time_p50_s"] <= s["step_time_p75_s"] <= \
        s["step_time_p90_s"] <= s["step_time_p95_s"]
    assert s["step_time_count"] == 6


def test_slowest_rank_takes_the_max_not_the_mean():
    assert m.slowest_rank([[1.0, 1.0, 5.0], [2.0, 1.0, 1.0]]).tolist() == [2.0, 1.0, 5.0]


@pytest.mark.parametrize("call", [
    lambda: m.speedup(0, 1),
    lambda: m.speedup(1, -2),
    lambda: m.relative_su(2.0, 0),
    lambda: m.amdahl_speedup(1.5, 2),
    lambda: m.speedup_table({2: 10.0}),
    lambda: m.parse_times(["1:10", "2"]),
    lambda: m.parse_times(["1:10", "two:5"]),
    lambda: m.parse_times(["1:10", "1:11"]),
    lambda: m.parse_times(["0:10"]),
    lambda: m.knee([1, 2], [1, 0.5], threshold=0),
])
def test_bad_input_is_a_usage_error(call):
    with pytest.raises(UsageError):
        call()
