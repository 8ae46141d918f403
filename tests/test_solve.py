"""The solve-scaling lab's host side: partitions, the configuration and its checks, the CLI, the
formulas and the crossover report, and the sweeps that launch.

Pure tests build what they need in this process. Launching tests (``slow``) use few launches: the
weak + strong + throughput sweep, the --maxiter 3 gate failure, the manufactured right-hand side
and one inline-baseline run. The operator, Krylov methods and fused kernels are in
test_solve_kernels.py; transports and halo exchanges in test_solve_transport.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from labkit.cli import main
from labkit.errors import UsageError
from labkit.solve.config import SolveConfig, closest_grid
from labkit.solve.formulas import add_scaling_columns, bytes_per_iteration, spmv_bytes
from labkit.solve.partition import make_partition, partition_stats, rcb
from labkit.solve.problems import global_matrix
from tests.conftest import LAUNCH_TIMEOUT_S

from ._solve_helpers import one_rank

PARTITIONERS = ("simple", "coordinate", "metis")


# -- partitions (pure) ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", PARTITIONERS)
@pytest.mark.parametrize("dims,nparts", [((12, 9), 2), ((12, 9), 3), ((5, 4, 3), 4), ((7, 5), 1)])
def test_rows_owned_once_and_halos_equal_brute_force(kind, dims, nparts):
    if kind == "metis":
        pytest.importorskip("pymetis")
    A = global_matrix(dims).tocsr()
    n = A.shape[0]
    part = make_partition(kind, dims, nparts)
    locals_ = [part.local(r) for r in range(nparts)]
    owned = np.concatenate([lp.owned for lp in locals_])
    assert np.array_equal(np.sort(owned), np.arange(n))  # every row exactly once
    for lp in locals_:
        cols = np.unique(A[lp.owned].indices)
        brute = np.setdiff1d(cols, lp.owned)
        assert np.array_equal(np.sort(lp.halo), brute)
        # what each neighbour sends is exactly the slice of my halo I expect from it, in order
        off = 0
        for q, count in zip(lp.neighbours, lp.recv_counts):
            sent = locals_[q].owned[locals_[q].send[lp.rank]]
            assert np.array_equal(sent, lp.halo[off:off + count])
            off += count
    stats = partition_stats(part)
    assert stats["edge_cut"] == sum(int(part.owner(i) != part.owner(j))
                                    for i, j in zip(*np.nonzero(np.triu(A.toarray(), 1))))
    assert stats["load_imbalance"] >= 1.0


def test_metis_cut_within_20_percent_of_optimal():
    pytest.importorskip("pymetis")
    stats = partition_stats(make_partition("metis", (100, 100), 2))
    assert stats["edge_cut"] <= 1.2 * 100  # optimal 2-way cut of a 100 x 100 grid: one line
    assert stats["load_imbalance"] <= 1.05


def test_simple_and_rcb_cut_a_grid_line():
    assert partition_stats(make_partition("simple", (100, 100), 2))["edge_cut"] == 100
    assert partition_stats(make_partition("coordinate", (100, 100), 2))["edge_cut"] == 100
    parts = rcb((8, 8), 4)
    assert np.bincount(parts).tolist() == [16] * 4


def test_closest_grid_weak_mode():
    assert closest_grid(20_000, 2) == (141, 142)
    assert math.prod(closest_grid(250_000, 3)) == pytest.approx(250_000, rel=0.01)
    for target in (10, 999, 12_345):
        dims = closest_grid(target, 2)
        assert abs(math.prod(dims) - target) <= dims[0]


# -- configuration (pure) ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"methods": ("sor",), "total_dof": 100}, "unknown method"),
    ({"partitioners": ("random",), "total_dof": 100}, "unknown partitioner"),
    ({"modes": ("sideways",), "total_dof": 100}, "unknown mode"),
    ({"rhs": "zeros", "total_dof": 100}, "unknown rhs"),
    ({"total_dof": 0}, ">= 1"),
    ({"modes": ("weak",), "dof_per_rank": -5}, ">= 1"),
    ({"total_dof": 100, "dof_per_rank": 10}, "--dof-per-rank is for weak"),
    ({"modes": ("weak",), "dof_per_rank": 10, "total_dof": 100}, "--total-dof is for strong"),
    ({"modes": ("weak",)}, "need --dof-per-rank"),
    ({}, "strong mode needs --total-dof"),
    ({"total_dof": 100, "transport": "mpi"}, "unknown transport"),
    ({"total_dof": 100, "baseline": "previous"}, "unknown baseline"),
    ({"total_dof": 100, "baseline": "inline", "engine": "torch-sla"}, "needs --engine labkit"),
    ({"total_dof": 100, "min_timed_s": -1}, "min_timed_s must be between"),
])
def test_bad_config_is_a_usage_error(kwargs, match):
    with pytest.raises(UsageError, match=match):
        SolveConfig(**kwargs)


def test_world_size_the_grid_cannot_feed_is_refused_before_launch(tmp_path):
    with pytest.raises(UsageError, match="fewer than 4 ranks"):
        SolveConfig(total_dof=3).check_world_size(4)
    from labkit import solve
    from labkit.launch import LaunchOptions

    store = tmp_path / "never.json"
    with pytest.raises(UsageError, match="fewer than 4 ranks"):
        solve.run(SolveConfig(total_dof=3), launch=LaunchOptions(nprocs=(1, 4)), store=store)
    assert not store.exists()


def test_solve_flags_come_from_the_config():
    """Every CLI field of SolveConfig is a flag of `labkit solve` with the same default."""
    import dataclasses

    from labkit.cli import build_parser

    args = build_parser().parse_args(["solve"])
    cfg = SolveConfig(total_dof=100)
    for f in dataclasses.fields(SolveConfig):
        if f.metadata.get("cli", True):
            value = getattr(args, f.name)
            assert (tuple(value) if isinstance(value, list) else value) == f.default, f.name
    assert cfg.modes == ("strong",)


def test_metis_without_pymetis_is_a_usage_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pymetis" else real(name, *a))
    with pytest.raises(UsageError, match="pymetis"):
        SolveConfig(total_dof=100, partitioners=("metis",))


@pytest.mark.parametrize("argv", [
    ["--method", "sor", "--total-dof", "100"],
    ["--partitioner", "random", "--total-dof", "100"],
    ["--mode", "sideways", "--total-dof", "100"],
    ["--rhs", "zeros", "--total-dof", "100"],
    ["--total-dof", "-1"],
    ["--total-dof", "1", "--nproc", "2"],
    ["--mode", "strong", "--dof-per-rank", "100"],
    ["--mode", "weak", "--total-dof", "100"],
    ["--total-dof", "100", "--transport", "mpi"],
])
def test_cli_bad_input_exits_2_and_writes_nothing(argv, tmp_path, capsys):
    out, fig = tmp_path / "rows.json", tmp_path / "fig.png"
    assert main(["solve", *argv, "--json", str(out), "--plot", str(fig)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labkit solve: error:")
    assert list(tmp_path.iterdir()) == []


# -- formulas and the crossover report (pure) ------------------------------------------------------
def test_bytes_model_and_scaling_columns():
    op, _ = one_rank((3, 3))
    assert op.spmv_bytes() == spmv_bytes(33, 9, 0) == 580
    assert bytes_per_iteration("cg", 580, 9) == 580 + 15 * 8 * 9
    rows = [{"mode": "strong", "world_size": 1, "solve_time_s": 2.0, "time_per_iteration_s": 0.1,
             "throughput_dof_per_s": 5.0, "gate_passed": True},
            {"mode": "strong", "world_size": 2, "solve_time_s": 1.25, "time_per_iteration_s": 0.06,
             "throughput_dof_per_s": 8.0, "gate_passed": True},
            {"mode": "strong", "world_size": 4, "solve_time_s": 0.5, "time_per_iteration_s": 0.03,
             "throughput_dof_per_s": 20.0, "gate_passed": False}]
    out = add_scaling_columns(rows)
    assert out[1]["speedup"] == pytest.approx(1.6) and out[1]["efficiency"] == pytest.approx(0.8)
    assert out[2]["efficiency"] is None  # a failed gate never counts


def _strong_rows(sizes, *, c, k, c_p, ranks=2):
    """Strong rows of a machine that follows the model exactly: t1 = c + k N, tP = c_P + k N / P."""
    rows = []
    for n in sizes:
        for p, t in ((1, c + k * n), (ranks, c_p + k * n / ranks)):
            rows.append({"mode": "strong", "method": "cg", "partitioner": "simple",
                         "world_size": p, "dof_requested": n, "dof_global": n,
                         "time_per_iteration_s": t, "solve_time_s": 100 * t,
                         "speedup": (c + k * n) / t, "gate_passed": True})
    return pd.DataFrame(rows)


def test_crossover_recovers_the_model_on_synthetic_rows():
    from labkit.solve import crossover, verdicts

    # c = 30 us, k = 5 ns/DOF, c_2 = 130 us: N* = 100 us / 2.5 ns = 40,000 DOF; messages 40 us
    df = _strong_rows([2_000, 10_000, 25_000, 50_000, 100_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6)
    table, summary = crossover.crossover(df, message_s=40e-6, ranks=2)
    assert summary["fixed_s"] == pytest.approx(30e-6) and summary["seconds_per_dof_iteration"] == pytest.approx(5e-9)
    assert summary["fixed_p_s"] == pytest.approx(130e-6)
    assert summary["other_s"] == pytest.approx(60e-6)
    assert summary["predicted_crossover_dof"] == pytest.approx(40_000)
    assert summary["naive_crossover_dof"] == pytest.approx(16_000)  # messages only: too small
    # the machine follows the model: every prediction is exact, the measured crossover lies
    # between the sizes around 40,000 (log interpolation of a curve, not a line)
    assert np.allclose(table["predicted_speedup"], table["speedup_per_iteration"])
    assert table["calibration"].tolist() == [True] + [False] * 5
    assert 25_000 < summary["measured_crossover_dof"] < 50_000
    assert abs(math.log(summary["measured_crossover_dof"] / 40_000)) < math.log(1.1)
    assert "start to pay at about" in verdicts.crossover_sentence(summary, table)


def test_crossover_takes_the_inline_t1_of_each_row():
    from labkit.solve import crossover

    # the 1-rank launch ran on a machine twice as slow; the inline t1 (rank 0 alone, beside the
    # 2-rank solves) is the one the model and the speedups must use, and no 1-rank row is needed
    df = _strong_rows([2_000, 10_000, 25_000, 50_000, 100_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6)
    many = df["world_size"] == 2
    df.loc[many, "baseline_time_per_iteration_s"] = 30e-6 + 5e-9 * df.loc[many, "dof_global"]
    df.loc[~many, "time_per_iteration_s"] *= 2
    table, summary = crossover.crossover(df, message_s=40e-6, ranks=2)
    assert (table["t1_source"] == "inline").all()
    assert summary["predicted_crossover_dof"] == pytest.approx(40_000)
    assert np.allclose(table["predicted_speedup"], table["speedup_per_iteration"])
    only_inline, _ = crossover.crossover(df[many], message_s=40e-6, ranks=2)
    assert np.allclose(only_inline["speedup_per_iteration"], table["speedup_per_iteration"])
    # without the inline field the 1-rank launch's (slow) rows count
    launch, _ = crossover.crossover(df.drop(columns="baseline_time_per_iteration_s"), message_s=40e-6)
    assert (launch["t1_source"] == "launch").all()
    assert np.allclose(launch["speedup_per_iteration"], 2 * table["speedup_per_iteration"])


@pytest.mark.parametrize("extra_compute, extra_waits, words", [(100e-6, 10e-6, "largest part: compute."),
                                                               (10e-6, 100e-6, "largest part: waits.")])
def test_crossover_misses_add_up_and_name_the_part(extra_compute, extra_waits, words):
    from labkit.solve import crossover, verdicts

    sizes = [2_000, 10_000, 50_000, 250_000]
    df = _strong_rows(sizes, c=30e-6, k=5e-9, c_p=130e-6)
    many = df["world_size"] == 2
    # the P-rank iteration in parts: 60 us of waits, 10 us of rest, the remainder compute; at
    # 50,000 DOF the ranks compute and wait longer than the model lets them
    df.loc[many, "iterations"] = 100
    bump = df["dof_global"].eq(50_000) & many
    df.loc[bump, "time_per_iteration_s"] += extra_compute + extra_waits
    tp = df.loc[many, "time_per_iteration_s"]
    df.loc[many, "halo_time_s"] = 100 * (40e-6 + extra_waits * bump[many])
    df.loc[many, "allreduce_time_s"] = 100 * 20e-6
    df.loc[many, "spmv_time_s"] = 100 * (tp - 70e-6 - extra_waits * bump[many]) / 2
    df.loc[many, "vector_time_s"] = df.loc[many, "spmv_time_s"]
    table, _ = crossover.crossover(df, message_s=40e-6)
    gap = table["tp_per_iteration_s"] - table["model_tp_per_iteration_s"]
    parts = table[["excess_compute_s", "excess_waits_s", "excess_rest_s"]].sum(axis=1)
    assert np.allclose(parts, gap, atol=1e-12, rtol=0)
    r = table.set_index("dof_global").loc[50_000]
    assert r["excess_compute_s"] == pytest.approx(extra_compute) and r["excess_waits_s"] == pytest.approx(extra_waits)
    sentence = verdicts.miss_sentence(table, 2)
    assert sentence.startswith("Largest miss at 50,000 DOF") and sentence.endswith(words)


def test_add_scaling_columns_prefers_the_inline_t1():
    rows = [{"mode": "strong", "world_size": 1, "solve_time_s": 4.0, "time_per_iteration_s": 4e-3,
             "throughput_dof_per_s": 1.0, "gate_passed": True},
            {"mode": "strong", "world_size": 2, "solve_time_s": 1.25, "time_per_iteration_s": 1.25e-3,
             "throughput_dof_per_s": 1.0, "gate_passed": True,
             "baseline_solve_time_s": 2.0, "baseline_time_per_iteration_s": 2e-3}]
    out = add_scaling_columns(rows)
    assert out[1]["speedup"] == pytest.approx(1.6) and out[1]["efficiency_per_iteration"] == pytest.approx(0.8)
    assert add_scaling_columns(rows[1:])[0]["speedup"] == pytest.approx(1.6)  # no 1-rank row needed


def test_inline_baseline_counts_the_whole_problem_in_rank_0s_memory():
    launch_cfg = SolveConfig(total_dof=1_000_000)
    inline_cfg = SolveConfig(total_dof=1_000_000, baseline="inline")
    assert inline_cfg.memory_bytes_per_rank(1) == launch_cfg.memory_bytes_per_rank(1)
    extra = inline_cfg.memory_bytes_per_rank(2) - launch_cfg.memory_bytes_per_rank(2)
    assert extra == pytest.approx(launch_cfg.memory_bytes_per_rank(1))
    # timing the shares adds each rank's one-rank copy of its rows
    shares_cfg = SolveConfig(total_dof=1_000_000, baseline="inline", shares=True)
    more = shares_cfg.memory_bytes_per_rank(2) - inline_cfg.memory_bytes_per_rank(2)
    assert more == pytest.approx(launch_cfg.memory_bytes_per_rank(2))
    assert SolveConfig(total_dof=1_000_000, baseline="inline", shares=True,
                       methods=("gmres",)).memory_bytes_per_rank(2) == pytest.approx(
        SolveConfig(total_dof=1_000_000, baseline="inline",
                    methods=("gmres",)).memory_bytes_per_rank(2))


@pytest.mark.parametrize("c_p, words", [(31e-6, "already pay at the smallest size"),
                                        (10e-3, "do not pay up to the largest size"),
                                        (130e-6, "start to pay at about")])
def test_crossover_sentence_flips_with_the_numbers(c_p, words):
    from labkit.solve import crossover, verdicts

    table, summary = crossover.crossover(_strong_rows([2_000, 50_000, 250_000], c=30e-6, k=5e-9, c_p=c_p),
                                      message_s=40e-6)
    assert words in verdicts.crossover_sentence(summary, table)


def test_print_crossover_reads_the_messages_off_the_smallest_size(capsys):
    from labkit.solve import crossover

    df = _strong_rows([2_000, 50_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6).assign(
        iterations=100, halo_time_s=100 * 15e-6, allreduce_time_s=100 * 25e-6)
    crossover.print_crossover(df)
    out = capsys.readouterr().out
    assert "CROSSOVER, 2 ranks, cg, simple" in out and "exposed messages there 40.0 us" in out
    assert "c_2 = 130.0 us" in out and "predicted 40,000" in out
    crossover.print_crossover(df[df["dof_requested"] == 50_000])  # one size: nothing to say
    assert capsys.readouterr().out == ""


def test_crossover_needs_two_sizes():
    from labkit.solve import crossover

    with pytest.raises(UsageError, match="at least two sizes"):
        crossover.crossover(_strong_rows([50_000], c=30e-6, k=5e-9, c_p=130e-6), message_s=40e-6)


# -- launches --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_command_weak_strong_throughput_sweep(tmp_path, capsys):
    out, fig = tmp_path / "solve.json", tmp_path / "solve.png"
    argv = ["solve", "--mode", "weak", "strong", "throughput", "--nproc", "1", "2",
            "--dof-per-rank", "1600", "--total-dof", "3200", "--method", "cg", "pcg",
            "--partitioner", "simple", "coordinate", "--warmup", "0", "--repeat", "2",
            "--json", str(out), "--plot", str(fig), "--timeout", str(LAUNCH_TIMEOUT_S)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for mode in ("WEAK", "STRONG", "THROUGHPUT"):
        assert f"{mode} SCALING" in text
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 * 2 * 2 * 2
    from labkit.results import undeclared
    from labkit.solve.report import COLUMNS

    assert undeclared(rows, COLUMNS) == []
    assert {(r["mode"], r["world_size"]) for r in rows} == {
        (m, n) for m in ("weak", "strong", "throughput") for n in (1, 2)}
    for r in rows:
        assert r["gate_passed"] and r["iterations"] > 10 and r["bytes_per_iteration"] > 0
        assert r["efficiency"] is not None and r["speedup"] is not None
        assert r["time_per_iteration_s"] == pytest.approx(r["solve_time_s"] / r["iterations"])
        if r["world_size"] == 1:
            assert r["efficiency"] == pytest.approx(1.0) and r["halo_values"] == 0
    weak2 = [r for r in rows if r["mode"] == "weak" and r["world_size"] == 2]
    assert all(abs(r["dof_global"] - 3200) <= 60 for r in weak2)
    assert fig.stat().st_size > 10_000
    # --plot-only redraws from the file without launching
    fig.unlink()
    assert main(["solve", "--plot-only", "--json", str(out), "--plot", str(fig)]) == 0
    assert fig.exists()


@pytest.mark.slow
def test_maxiter_3_fails_the_gate_and_exits_nonzero(tmp_path, capsys):
    out = tmp_path / "gate.json"
    rc = main(["solve", "--nproc", "1", "--total-dof", "2500", "--maxiter", "3", "--warmup", "0",
               "--repeat", "1", "--json", str(out), "--timeout", str(LAUNCH_TIMEOUT_S)])
    assert rc == 1
    assert "gate failed" in capsys.readouterr().err
    (row,) = json.loads(out.read_text())["rows"]
    assert row["gate_passed"] is False and row["iterations"] == 3
    assert row["rel_residual"] > row["gate_tol"] and row["efficiency"] is None


@pytest.mark.slow
def test_manufactured_rhs_flagged_one_iteration(tmp_path, capsys):
    out = tmp_path / "trap.json"
    rc = main(["solve", "--nproc", "2", "--total-dof", "10000", "--rhs", "manufactured",
               "--warmup", "0", "--repeat", "1", "--json", str(out),
               "--timeout", str(LAUNCH_TIMEOUT_S)])
    assert rc == 0
    assert "eigenvector" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["iterations"] == 1 and row["rhs_is_eigenvector"] is True and row["gate_passed"]


@pytest.mark.slow
def test_inline_baseline_times_rank_0_alone_beside_the_ranks(tmp_path):
    from labkit import solve
    from labkit.launch import LaunchOptions

    cfg = SolveConfig(total_dof=(3000, 6000), partitioners=("simple", "coordinate"), warmup=0,
                      repeat=2, baseline="inline", rtol=1e-10, shares=True)
    df = solve.run(cfg, launch=LaunchOptions(nprocs=(2,), progress=False,
                                             timeout_s=LAUNCH_TIMEOUT_S)).set_index(
        ["dof_requested", "partitioner"])
    assert (df["baseline"] == "inline").all() and df["gate_passed"].all()
    for size in (3000, 6000):
        a, b = df.loc[(size, "simple")], df.loc[(size, "coordinate")]
        # rank 0 alone solves the same problem: CG's iterations match the 2-rank solve's
        assert abs(a["baseline_iterations"] - a["iterations"]) <= 1
        assert a["baseline_solve_time_s"] > 0
        # its SpMV and vector updates kept apart: the floor law's split
        assert a["baseline_spmv_time_s"] > 0 and a["baseline_vector_time_s"] > 0
        assert a["baseline_spmv_time_s"] + a["baseline_vector_time_s"] == pytest.approx(
            a["baseline_compute_time_s"])
        assert 0 < a["spmv_bytes_per_iteration"] < a["bytes_per_iteration"]
        assert a["speedup"] == pytest.approx(a["baseline_solve_time_s"] / a["solve_time_s"])
        # one solve alone per size and method, shared by the partitioners of that size
        assert b["baseline_solve_time_s"] == a["baseline_solve_time_s"]
        # each partition's shares timed alone and together (shares=True)
        for r in (a, b):
            alone, together = (r["share_alone_compute_per_iteration_s"],
                               r["share_together_compute_per_iteration_s"])
            assert alone > 0 and together > 0 and r["share_iterations_timed"] >= 10
            assert r["share_corun_slowdown"] == pytest.approx(together / alone)
    assert solve.crossover.crossover(df.reset_index(), message_s=50e-6)[0]["t1_source"].eq("inline").all()
