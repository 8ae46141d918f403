"""Collectives lab: nccl-tests factors, the α–β model and fit, config validation, a 2-rank sweep."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from labkit import collectives, metrics, results
from labkit.collectives import formulas, regimes, report
from labkit.errors import UsageError
from labkit.launch import LaunchOptions


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_busbw_factors_are_nccl_tests(n):
    assert formulas.busbw_factor("all_reduce", n) == 2 * (n - 1) / n
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert formulas.busbw_factor(op, n) == (n - 1) / n
    assert formulas.busbw_factor("broadcast", n) == 1.0


def test_algbw_busbw():
    assert formulas.algbw_gb_per_s(size_bytes=2e9, time_s=1.0) == 2.0
    assert formulas.busbw_gb_per_s(op="all_reduce", ranks=4, size_bytes=2e9,
                               time_s=1.0) == pytest.approx(3.0)
    with pytest.raises(UsageError):
        formulas.algbw_gb_per_s(size_bytes=1, time_s=0)


def test_ring_model_hand_computed():
    # 140 GB over 32 ranks at 50 GB/s, α = 5 µs: 2·31/32·2.8 s + 62·5 µs
    t = formulas.allreduce_time(size_bytes=140e9, ranks=32, alpha_s=5e-6, beta_bytes_per_s=50e9)
    assert t == pytest.approx(2 * 31 / 32 * 140e9 / 50e9 + 62 * 5e-6)
    assert formulas.allreduce_time(size_bytes=1e6, ranks=8, alpha_s=1e-6, beta_bytes_per_s=1e9,
                               algorithm="tree") == pytest.approx(6 * (1e-3 + 1e-6))


@pytest.mark.parametrize("op,n", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4),
                                  ("reduce_scatter", 4), ("broadcast", 4), ("all_to_all", 3)])
def test_fit_recovers_synthetic_alpha_beta(op, n):
    alpha, beta = 37e-6, 1.7e9
    sizes = [8 * 2**k for k in range(24)]
    times = formulas.collective_time(op=op, ranks=n, size_bytes=sizes, alpha_s=alpha,
                                 beta_bytes_per_s=beta)
    a, b = formulas.fit_alpha_beta(op, n, sizes=sizes, times=list(times))
    assert a == pytest.approx(alpha, rel=1e-6)
    assert b == pytest.approx(beta, rel=1e-6)
    assert formulas.crossover_bytes(op, n, alpha_s=a, beta_bytes_per_s=b) == pytest.approx(
        formulas.latency_steps(op, n) * alpha * beta / formulas.busbw_factor(op, n), rel=1e-6)


def test_fit_with_noise_and_model_error():
    rng = __import__("numpy").random.default_rng(0)
    sizes = [8 * 2**k for k in range(24)]
    t = formulas.allreduce_time(size_bytes=sizes, ranks=2, alpha_s=100e-6,
                            beta_bytes_per_s=1.5e9) * rng.uniform(0.97, 1.03, len(sizes))
    a, b = formulas.fit_alpha_beta("all_reduce", 2, sizes=sizes, times=t)
    assert a == pytest.approx(100e-6, rel=0.1) and b == pytest.approx(1.5e9, rel=0.1)
    rows = [{"op": "all_reduce", "world_size": 2, "dtype": "float32", "size_bytes": s,
             "time_p50_s": x} for s, x in zip(sizes, t)]
    fitted = regimes.add_fit(rows)
    assert all(abs(r["model_error_pct"]) < 5 for r in fitted)
    assert {r["regime"] for r in fitted} == {"bandwidth"}  # one line fits: no latency regime
    assert fitted[0]["crossover_bytes"] == pytest.approx(2 * a * b)
    assert metrics.model_error_pct(model_s=1.1, measured_s=1.0) == pytest.approx(10.0)


def test_fit_refuses_degenerate_input():
    with pytest.raises(UsageError):
        formulas.fit_alpha_beta("all_reduce", 2, sizes=[8], times=[1e-4])
    with pytest.raises(UsageError):
        formulas.fit_alpha_beta("all_reduce", 1, sizes=[8, 16], times=[1e-4, 1e-4])
    one_rank = regimes.add_fit([{"op": "all_reduce", "world_size": 1, "size_bytes": 8,
                              "time_p50_s": 1e-5}])
    assert math.isnan(one_rank[0]["alpha_s"])


def test_sizes_and_sweep():
    assert formulas.parse_size("64M") == 64 << 20 and formulas.parse_size("1.5K") == 1536
    for bad in ("", "8X", "-1", "0", "1.5"):
        with pytest.raises(UsageError):
            formulas.parse_size(bad)
    sweep = formulas.size_sweep("all_reduce", 2, 8, 1 << 20, 2)
    assert sweep[0] == (8, 2) and sweep[-1] == (1 << 20, 1 << 18) and len(sweep) == 18
    assert all(c % 3 == 0 for _, c in formulas.size_sweep("all_to_all", 3, 8, 4096, 2))


@pytest.mark.parametrize("kw", [dict(ops=("bogus",)), dict(min_bytes="1M", max_bytes="8"),
                                dict(factor=1), dict(factor=0.5), dict(iters=0),
                                dict(dtype="complex64"), dict(ops=())])
def test_config_refuses(kw):
    with pytest.raises(UsageError):
        collectives.CollectivesConfig(**kw)


def test_config_sizes_and_fit_floor():
    cfg = collectives.CollectivesConfig()
    assert (cfg.min_bytes, cfg.max_bytes, cfg.fit_min_bytes) == (8, 64 << 20, 0)
    assert collectives.CollectivesConfig(fit_min_bytes="1K").fit_min_bytes == 1024
    with pytest.raises(UsageError):
        collectives.CollectivesConfig(fit_min_bytes="1X")


@pytest.mark.parametrize("args", [["--op", "bogus"], ["--min-bytes", "1M", "--max-bytes", "8"],
                                  ["--factor", "1"], ["--json", "/nonexistent/dir/x.json"],
                                  ["--fit-min-bytes", "1X"]])
def test_cli_bad_input_exit_2(args):
    p = subprocess.run([sys.executable, "-m", "labkit.cli", "collectives", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.slow
def test_two_rank_sweep_every_op_checked(tmp_path):
    store = tmp_path / "collectives.json"
    config = collectives.CollectivesConfig(ops=formulas.OPS, min_bytes=8, max_bytes="2M", factor=8,
                                           iters=5, warmup=1, check=True, busy=True)
    df = collectives.run(config, launch=LaunchOptions(nprocs=(2,), progress=False, timeout_s=180),
                         store=store)
    assert set(df.op) == set(formulas.OPS)
    assert (df.wrong == 0).all(), df[["op", "size_bytes", "wrong"]]
    assert df.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    for r in df.itertuples():
        assert r.algbw_gb_per_s == pytest.approx(r.size_bytes / r.time_p50_s / 1e9)
        assert r.busbw_gb_per_s == pytest.approx(r.algbw_gb_per_s * formulas.busbw_factor(r.op, 2))
        assert r.time_p10_s <= r.time_p50_s <= r.time_p90_s
    ar = df[df.op == "all_reduce"]
    assert ar.model_time_s.notna().all()
    # the naive line through every p50 exists unless those p50s slope down (5 calls a size on
    # 2 busy cores can): then no size has one
    assert ar.naive_time_s.notna().all() or ar.naive_time_s.isna().all()
    assert set(ar.regime) <= {"latency", "bandwidth"}
    assert set(ar.columns) >= {"model_time_s", "model_error_pct", "crossover_bytes", "oversubscribed"}
    # busy: the all-reduce timed again while the cores computed, and they did compute
    assert ar.busy_time_p50_s.notna().all() and (ar.busy_matmuls > 0).all()
    assert df[df.op != "all_reduce"].busy_time_p50_s.isna().all()
    # every field a row carries is declared, in memory and as stored (provenance included)
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    stored = results.read_rows(store)
    assert len(stored) == len(df) and results.undeclared(stored, report.COLUMNS) == []
    assert "# Avg bus bandwidth" in report.nccl_tests_table(df, warmup=1)
    assert report.wrong_elements(df) == 0
