"""The solve-scaling lab: partitions, Krylov methods against scipy, the gate, the CLI.

Pure and single-process tests build the operator in this process (a world of one needs no
collectives). Launching tests (``slow``) use few launches: the weak + strong + throughput sweep,
one 2-rank launch that returns its solutions, the --maxiter 3 gate failure and the manufactured
right-hand side.
"""

from __future__ import annotations

import functools
import json
import math
import types
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse.linalg as spla
import torch

from labkit.cli import main
from labkit.errors import UsageError
from labkit.launch import OversubscribedWarning
from labkit.solve import krylov
from labkit.solve.config import SolveConfig, closest_grid
from labkit.solve.formulas import add_scaling_columns, bytes_per_iteration, spmv_bytes
from labkit.solve.operator import DistOperator
from labkit.solve.partition import make_partition, partition_stats, rcb
from labkit.solve.problems import global_matrix, local_system, rhs
from tests.conftest import LAUNCH_TIMEOUT_S

PARTITIONERS = ("simple", "coordinate", "metis")


def one_rank(dims, rhs_kind="random", dtype=torch.float64):
    part = make_partition("simple", dims, 1)
    local, (indptr, cols, vals), b = local_system(dims, part, 0, rhs_kind, 0)
    return (DistOperator(local, indptr, cols, vals, world_size=1, dtype=dtype),
            torch.from_numpy(b).to(dtype))


def scipy_cg(A, b, rtol=1e-8):
    its = [0]

    def count(_):
        its[0] += 1

    x, info = spla.cg(A, b, rtol=rtol, maxiter=100 * A.shape[0], callback=count)
    assert info == 0
    return x, its[0]


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


# -- Krylov methods, one rank in this process ----------------------------------------------------
@pytest.mark.parametrize("method", ["cg", "pipecg", "pcg", "bicgstab", "gmres", "minres"])
def test_methods_match_scipy(method):
    dims = (40, 30)
    op, b = one_rank(dims)
    A = global_matrix(dims)
    exact = spla.spsolve(A.tocsc(), b.numpy())
    sol = krylov.solve(method, op, b, rtol=1e-10, maxiter=20_000)
    assert sol.converged
    assert np.abs(sol.x.numpy() - exact).max() <= 1e-6 * np.abs(exact).max()
    assert op.residual_norm(sol.x, b) <= 2e-10


def test_cg_iterations_match_scipy_and_double_with_the_side():
    its = {}
    for side in (48, 96):
        op, b = one_rank((side, side))
        sol = krylov.cg(op, b, 1e-8, 100_000)
        _, scipy_its = scipy_cg(global_matrix((side, side)), b.numpy())
        assert abs(sol.iterations - scipy_its) <= 0.02 * scipy_its + 1
        textbook = krylov.cg_textbook(op, b, 1e-8, 100_000)
        assert textbook.iterations == sol.iterations  # same method, rearranged
        its[side] = sol.iterations
    assert 1.6 <= its[96] / its[48] <= 2.4  # CG iterations grow like sqrt(kappa) ~ the side


@pytest.mark.parametrize("kind", ["simple", "coordinate"])
def test_overlapped_matvec_equals_naive_spmv(kind, monkeypatch):
    dims = (30, 20)
    part = make_partition(kind, dims, 3)
    for r in range(3):
        local, (indptr, cols, vals), _ = local_system(dims, part, r, "random", 0)
        op = DistOperator(local, indptr, cols, vals, world_size=1)
        assert op.n_interior + op.n_boundary == op.n_owned and op.n_boundary > 0
        x = torch.rand(op.n_ext, dtype=torch.float64)  # halo tail filled by hand: no messages
        monkeypatch.setattr(op, "post_exchange", lambda _x: [])
        ran = []
        y = op.matvec(x, op.new(), overlap=functools.partial(ran.append, 1))
        assert ran == [1]
        assert torch.allclose(y, torch.mv(op.A, x), rtol=1e-14, atol=1e-14)
        assert torch.allclose(op.matvec_naive(x, op.new()), y, rtol=1e-14, atol=1e-14)


def test_pipecg_iterations_match_cg():
    op, b = one_rank((96, 96))
    cg, pipe = krylov.cg(op, b, 1e-8, 100_000), krylov.pipecg(op, b, 1e-8, 100_000)
    assert abs(pipe.iterations - cg.iterations) <= 0.02 * cg.iterations + 1
    assert op.residual_norm(pipe.x, b) <= 2e-8


def test_manufactured_rhs_is_an_eigenvector_one_iteration():
    op, b = one_rank((60, 60), "manufactured")
    assert krylov.cg(op, b, 1e-8, 10_000).iterations == 1
    op, b = one_rank((60, 60), "random")
    assert krylov.cg(op, b, 1e-8, 10_000).iterations > 100


def test_ones_rhs_has_solution_all_ones():
    op, b = one_rank((20, 10), "ones")
    sol = krylov.cg(op, b, 1e-12, 10_000)
    assert np.allclose(sol.x.numpy(), 1.0, atol=1e-9)
    assert np.allclose(rhs("ones", (20, 10), np.arange(200)), global_matrix((20, 10)) @ np.ones(200))


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
    from labkit.solve import report, verdicts

    # c = 30 us, k = 5 ns/DOF, c_2 = 130 us: N* = 100 us / 2.5 ns = 40,000 DOF; messages 40 us
    df = _strong_rows([2_000, 10_000, 25_000, 50_000, 100_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6)
    table, summary = report.crossover(df, message_s=40e-6, ranks=2)
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
    from labkit.solve import report

    # the 1-rank launch ran on a machine twice as slow; the inline t1 (rank 0 alone, beside the
    # 2-rank solves) is the one the model and the speedups must use, and no 1-rank row is needed
    df = _strong_rows([2_000, 10_000, 25_000, 50_000, 100_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6)
    many = df["world_size"] == 2
    df.loc[many, "baseline_time_per_iteration_s"] = 30e-6 + 5e-9 * df.loc[many, "dof_global"]
    df.loc[~many, "time_per_iteration_s"] *= 2
    table, summary = report.crossover(df, message_s=40e-6, ranks=2)
    assert (table["t1_source"] == "inline").all()
    assert summary["predicted_crossover_dof"] == pytest.approx(40_000)
    assert np.allclose(table["predicted_speedup"], table["speedup_per_iteration"])
    only_inline, _ = report.crossover(df[many], message_s=40e-6, ranks=2)
    assert np.allclose(only_inline["speedup_per_iteration"], table["speedup_per_iteration"])
    # without the inline field the 1-rank launch's (slow) rows count
    launch, _ = report.crossover(df.drop(columns="baseline_time_per_iteration_s"), message_s=40e-6)
    assert (launch["t1_source"] == "launch").all()
    assert np.allclose(launch["speedup_per_iteration"], 2 * table["speedup_per_iteration"])


@pytest.mark.parametrize("extra_compute, extra_waits, words", [(100e-6, 10e-6, "largest part: compute."),
                                                               (10e-6, 100e-6, "largest part: waits.")])
def test_crossover_misses_add_up_and_name_the_part(extra_compute, extra_waits, words):
    from labkit.solve import report, verdicts

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
    table, _ = report.crossover(df, message_s=40e-6)
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


@pytest.mark.parametrize("c_p, words", [(31e-6, "already pay at the smallest size"),
                                        (10e-3, "do not pay up to the largest size"),
                                        (130e-6, "start to pay at about")])
def test_crossover_sentence_flips_with_the_numbers(c_p, words):
    from labkit.solve import report, verdicts

    table, summary = report.crossover(_strong_rows([2_000, 50_000, 250_000], c=30e-6, k=5e-9, c_p=c_p),
                                      message_s=40e-6)
    assert words in verdicts.crossover_sentence(summary, table)


def test_print_crossover_reads_the_messages_off_the_smallest_size(capsys):
    from labkit.solve import report

    df = _strong_rows([2_000, 50_000, 250_000], c=30e-6, k=5e-9, c_p=130e-6).assign(
        iterations=100, halo_time_s=100 * 15e-6, allreduce_time_s=100 * 25e-6)
    report.print_crossover(df)
    out = capsys.readouterr().out
    assert "CROSSOVER, 2 ranks, cg, simple" in out and "exposed messages there 40.0 us" in out
    assert "c_2 = 130.0 us" in out and "predicted 40,000" in out
    report.print_crossover(df[df["dof_requested"] == 50_000])  # one size: nothing to say
    assert capsys.readouterr().out == ""


def test_crossover_needs_two_sizes():
    from labkit.solve import report

    with pytest.raises(UsageError, match="at least two sizes"):
        report.crossover(_strong_rows([50_000], c=30e-6, k=5e-9, c_p=130e-6), message_s=40e-6)


# -- launches ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "torch"])
def test_two_rank_solution_equals_one_rank_and_scipy(transport):
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = SolveConfig(modes=("strong",), total_dof=3000,
                      methods=("cg", "pipecg", "minres"), partitioners=("simple", "metis"),
                      warmup=0, repeat=1, keep_solution=True, transport=transport)
    dims = closest_grid(3000, 2)
    # shm needs CPU tensors: gloo even where GPUs would give nccl
    res = launch("solve", 2, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S,
                 backend="gloo" if transport == "shm" else None)
    A = global_matrix(dims)
    b = rhs("random", dims, np.arange(A.shape[0]))
    x_scipy, scipy_its = scipy_cg(A, b)
    op, bt = one_rank(dims)
    x_one = krylov.cg(op, bt, 1e-8, 100_000).x.numpy()
    scale = np.abs(x_scipy).max()
    for key, x in res.payload["solutions"].items():
        x = np.asarray(x)
        assert np.abs(x - x_one).max() <= 1e-6 * scale, key
        assert np.abs(x - x_scipy).max() <= 1e-6 * scale, key
    for row in res.rows():
        assert row["gate_passed"] and row["world_size"] == 2 and row["transport"] == transport
        if row["method"] in ("cg", "pipecg"):
            assert abs(row["iterations"] - scipy_its) <= 0.02 * scipy_its + 1
        assert row["halo_values"] == sum(row["halo_values_per_rank"]) > 0
        assert sum(row["owned_rows_per_rank"]) == row["dof_global"]
        # device memory on GPUs only; a CPU's is the launch's RSS
        assert (row["device_memory_peak_bytes"] is None) == (row["backend"] == "gloo")


@pytest.mark.slow
@pytest.mark.parametrize("worker,cfg", [
    ("solve", SolveConfig(total_dof=600, methods=("cg", "pipecg", "pcg", "bicgstab", "gmres",
                                                  "minres"), partitioners=("simple", "metis"),
                          warmup=0, repeat=1, transport="torch", kernels="fused",
                          baseline="inline")),
    ("transport", None)], ids=["solve", "transport"])
def test_every_tensor_handed_to_torch_distributed_is_on_the_rank_device(worker, cfg, tmp_path,
                                                                        monkeypatch):
    """Under the device audit (labkit.audit: cpu:0 stands for the GPU) a host tensor handed to
    torch.distributed fails the launch, as on NCCL; the audit must have seen device tensors."""
    from labkit.checks.config import TransportCheckConfig
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = cfg or TransportCheckConfig(rounds=5, repeat=5, jitter_us=0.0)
    monkeypatch.setenv("LABKIT_DEVICE_AUDIT", "1")
    monkeypatch.setenv("LABKIT_DEVICE_AUDIT_DIR", str(tmp_path))
    # the audit runs on gloo ranks (on nccl the GPU itself is the check)
    rows = launch(worker, 2, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S, backend="gloo").rows()
    assert rows and all(r.get("gate_passed", r.get("errors") == 0) for r in rows)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.audit.json").read_text())
        assert seen["failures"] == [] and seen["on_device"] > 0, seen


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_shm_transport_delivers_every_message_in_order(nproc):
    """Ranks out of step by random waits, 3 ranks on 2 cores included (the polling must yield):
    every value received is the one sent, every all-reduce sums right, on both transports."""
    from labkit.checks.config import TransportCheckConfig
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = TransportCheckConfig(rounds=150, values=257, jitter_us=300.0, repeat=50)
    with warnings.catch_warnings():  # 3 ranks on 2 cores: oversubscribed on purpose
        warnings.simplefilter("ignore", OversubscribedWarning)
        rows = launch("transport", nproc, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S).rows()
    # unset transports: every one the ranks' device supports (no shm on GPUs)
    assert [r["transport"] for r in rows] == (
        ["torch"] if rows[0]["backend"] == "nccl" else ["shm", "torch"])
    for r in rows:
        assert r["errors"] == 0 and r["rounds"] == 150, r
        assert 0 < r["exchange_time_p50_s"] < 1 and 0 < r["allreduce_time_p50_s"] < 1


def test_transport_choice():
    from labkit.runtime import Runtime
    from labkit.solve.transport import TorchTransport, make_transport, shm_possible

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert shm_possible(2, 1, cpu) == "ranks span several hosts"
    assert shm_possible(2, 2, cuda) == "tensors live on cuda"
    one_node_gpu = Runtime(0, 2, 0, 2, "nccl", cuda)
    assert isinstance(make_transport("auto", one_node_gpu, {}, {}), TorchTransport)
    with pytest.raises(ValueError, match="shm is not possible: tensors live on cuda"):
        make_transport("shm", one_node_gpu, {}, {})
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("mpi", one_node_gpu, {}, {})


class _Recorder:
    """Stands in for torch.distributed's point-to-point calls: records them, returns requests."""

    def __init__(self, monkeypatch, backend):
        from labkit.solve import transport

        self.calls, self.waited = [], []
        monkeypatch.setattr(transport.dist, "get_backend", lambda: backend)
        monkeypatch.setattr(transport.dist, "isend", self._call("isend", "dst"))
        monkeypatch.setattr(transport.dist, "irecv", self._call("irecv", "src"))
        monkeypatch.setattr(transport.dist, "P2POp", lambda op, t, peer: (op.kind, t, peer))
        monkeypatch.setattr(transport.dist, "batch_isend_irecv", self._batch)

    def _request(self, what):
        return types.SimpleNamespace(wait=lambda: self.waited.append(what))

    def _call(self, kind, peer_name):
        def call(tensor, **peer):
            self.calls.append((kind, tensor, peer[peer_name]))
            return self._request((kind, peer[peer_name]))
        call.kind = kind
        return call

    def _batch(self, ops):
        self.calls.append(("batch", ops))
        return [self._request((kind, peer)) for kind, _, peer in ops]


@pytest.mark.parametrize("backend,gloo_batched,batched", [
    ("nccl", False, True), ("gloo", False, False), ("gloo", True, True)])
def test_halo_exchange_is_one_batch_on_nccl_and_as_chosen_on_gloo(monkeypatch, backend,
                                                                   gloo_batched, batched):
    """nccl deadlocks on separately posted pairs: every exchange of the operator is one
    batch_isend_irecv there; gloo posts as GLOO_BATCHED says. Either way each receive lands in
    its neighbour's slice of the halo, each send carries the values that neighbour expects, and
    the requests are waited on later."""
    from labkit.solve import transport

    monkeypatch.setattr(transport, "GLOO_BATCHED", gloo_batched)
    rec = _Recorder(monkeypatch, backend)
    part = make_partition("coordinate", (12, 12), 4)
    local, (indptr, cols, vals), _ = local_system((12, 12), part, 0, "random", 0)
    assert len(local.neighbours) == 2
    op = DistOperator(local, indptr, cols, vals, world_size=4,
                      transport=transport.TorchTransport())
    x = torch.rand(op.n_ext, dtype=torch.float64)
    reqs = op.post_exchange(x)
    assert rec.waited == []  # posted, not waited: the interior rows overlap the messages
    ops = rec.calls[0][1] if batched else rec.calls
    assert len(rec.calls) == (1 if batched else 4)
    assert [(kind, peer) for kind, _, peer in ops] == (
        [("irecv", q) for q in local.neighbours] + [("isend", q) for q in local.neighbours])
    lo = op.n_owned
    for (_, t, _), count in zip(ops[:2], local.recv_counts):
        assert t.data_ptr() == x[lo:].data_ptr() and t.numel() == count  # its halo slice
        lo += count
    for _, t, q in ops[2:]:
        assert torch.equal(t, x[torch.from_numpy(local.send[q])])
    op.wait(reqs)
    assert rec.waited == [(kind, peer) for kind, _, peer in ops]


def test_shm_on_gpu_ranks_is_refused_before_launch_and_noted_where_only_ranks_know(
        monkeypatch):
    from labkit import checks, solve
    from labkit.checks.config import TransportCheckConfig
    from labkit.checks.transport_worker import transports_to_run
    from labkit.launch import LaunchOptions
    from labkit.runtime import Runtime
    from labkit.solve.transport import shm_possible

    monkeypatch.setattr("labkit.launch.choose_backend", lambda nproc, backend, **kw: ("nccl", False))
    monkeypatch.setattr("labkit.launch.run_spec", lambda *a, **k: pytest.fail("launched"))
    launch = LaunchOptions(nprocs=(2,), progress=False)
    with pytest.raises(UsageError, match="shm copies CPU memory.*use torch"):
        checks.transport_check(TransportCheckConfig(transports=("torch", "shm")), launch=launch)
    with pytest.raises(UsageError, match="shm copies CPU memory"):
        solve.run(SolveConfig(total_dof=3000, transport="shm"), launch=launch)
    TransportCheckConfig().check_backend("nccl")  # unset: the ranks pick what they can run
    SolveConfig(total_dof=3000).check_backend("nccl")  # auto: torch on GPUs
    # on the ranks: unset means what the device supports; shm asked for gets a note
    gpu = Runtime(0, 2, 0, 2, "nccl", torch.device("cuda", 0))
    cpu = Runtime(0, 2, 0, 2, "gloo", torch.device("cpu"))
    assert transports_to_run(gpu, TransportCheckConfig()) == [("torch", None)]
    assert transports_to_run(gpu, TransportCheckConfig(transports=("shm",))) == [
        ("shm", "tensors live on cuda")]
    if shm_possible(2, 2, cpu.device) is None:  # x86-64 with /dev/shm
        assert transports_to_run(cpu, TransportCheckConfig()) == [("shm", None), ("torch", None)]


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


# -- fewer passes over memory ---------------------------------------------------------------
def test_minimal_bytes_on_a_small_grid_equal_a_hand_count():
    """3x3 grid, 5-point, one rank: nnz = 9 + 2 x 12 = 33 (each of the 12 grid edges couples
    two rows both ways); SpMV 33 x 12 + 10 x 4 + 9 x 8 + 9 x 8 = 580 bytes; a CG iteration must
    also read x, p, s, r, w and write x, p, s, r: 9 x 8 x 9 = 648; 1228 in all."""
    from labkit.solve.formulas import minimal_bytes_per_iteration, spmv_bytes

    op, _ = one_rank((3, 3))
    assert op.nnz == 33 and op.spmv_bytes() == spmv_bytes(33, 9, 0) == 580
    assert minimal_bytes_per_iteration("cg", op.spmv_bytes(), op.n_owned) == 580 + 648


@pytest.mark.slow
@functools.cache
def _kernels():
    from labkit.solve.fused import make_kernels

    return make_kernels(torch.device("cpu"))


@pytest.mark.parametrize("dots", ["torch.dot", "their own pass", "in the SpMV's pass"])
def test_fused_cg_equals_the_textbook_loop_on_one_rank(dots):
    import dataclasses

    kernels, why = _kernels()
    if kernels is None:
        pytest.skip(f"no fused kernels here: {why}")
    if dots == "in the SpMV's pass" and kernels.spmv_dots is None:
        pytest.skip(f"no SpMV-with-dots pass here: {kernels.spmv_dots_notice}")
    if dots != "in the SpMV's pass":
        kernels = dataclasses.replace(kernels, spmv_dots=None)
    if dots == "torch.dot":
        kernels = dataclasses.replace(kernels, dots_pass=None)
    op, b = one_rank((60, 70))
    plain = krylov.cg(op, b, 1e-10, 10_000)
    op.fused = kernels
    fused = krylov.cg(op, b, 1e-10, 10_000)
    assert fused.iterations == plain.iterations
    scale = float(plain.x.abs().max())
    assert float((fused.x - plain.x).abs().max()) <= 1e-10 * scale


def test_fused_update_equals_the_four_torch_updates():
    """The C update: x += a0 p, p = u + b p, s = w + b s, r -= a s, with u a vector of its own
    or r itself (as CG without preconditioner passes it), as four torch calls give them."""
    kernels, why = _kernels()
    if kernels is None:
        pytest.skip(f"no fused kernels here: {why}")
    gen = torch.Generator().manual_seed(3)
    for u_is_r in (False, True):
        x, p, s, r, u, w = (torch.rand(1001, dtype=torch.float64, generator=gen)
                            for _ in range(6))
        if u_is_r:
            u = r
        want = [v.clone() for v in (x, p, s, r)]
        wx, wp, ws, wr = want
        wx.add_(wp, alpha=0.3)
        wp.mul_(0.7).add_(r.clone() if u_is_r else u)
        ws.mul_(0.7).add_(w)
        wr.sub_(0.2 * ws)
        kernels.step(x, p, s, r, u, w, 0.3, 0.2, 0.7)
        for got, exp in zip((x, p, s, r), want):
            assert torch.allclose(got, exp, rtol=1e-14, atol=1e-15)


@pytest.mark.slow
def test_compiled_update_as_a_gpu_runs_it_equals_the_c_loop():
    """The torch.compile'd update (what a GPU runs; Inductor's C++ here) gives what the C loop
    gives, to rounding (FMA), with the scalars passed as floats."""
    from labkit.solve import fused as fused_module

    kernels, why = _kernels()
    if kernels is None:
        pytest.skip(f"no fused kernels here: {why}")
    try:
        compiled = fused_module._compiled_update(torch.device("cpu"))
    except Exception as e:  # noqa: BLE001 - no C++ compiler for Inductor here
        pytest.skip(f"torch.compile unavailable: {type(e).__name__}")
    gen = torch.Generator().manual_seed(4)
    a = [torch.rand(5003, dtype=torch.float64, generator=gen) for _ in range(6)]
    b = [v.clone() for v in a]
    for k in range(3):  # new scalars each call: no recompile, no stale values
        kernels.step(*a, 0.1 * k, 0.3 + k, 0.7 / (k + 1))
        compiled(*b, 0.1 * k, 0.3 + k, 0.7 / (k + 1))
    for got, want in zip(b, a):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-13)


def test_fused_cg_takes_the_dots_pass_where_the_spmv_pass_cannot_read_the_matrix():
    """An operator the SpMV pass cannot read (int64 indices past 2^31 entries, here marked so):
    CG keeps the fused update and takes the dots in their own pass, same iterations."""
    kernels, why = _kernels()
    if kernels is None or kernels.spmv_dots is None:
        pytest.skip(f"no SpMV-with-dots pass here: {why or kernels.spmv_dots_notice}")
    op, b = one_rank((40, 50))
    plain = krylov.cg(op, b, 1e-10, 10_000)
    calls = []
    op.fused = kernels
    op.c_pass_unfit = "indices wider than int32 (as marked by this test)"
    op.matvec_dots = lambda *a: calls.append(a)  # must not be reached
    fused = krylov.cg(op, b, 1e-10, 10_000)
    assert not calls and fused.iterations == plain.iterations
    assert float((fused.x - plain.x).abs().max()) <= 1e-10 * float(plain.x.abs().max())


def test_fused_kernels_keep_out_of_vectors_they_cannot_read():
    """float32 vectors: the C loops read float64, so CG runs the plain loop (same answer)."""
    kernels, why = _kernels()
    if kernels is None:
        pytest.skip(f"no fused kernels here: {why}")
    assert kernels.fits(torch.float64) and not kernels.fits(torch.float32)
    op, b = one_rank((20, 20), dtype=torch.float32)
    plain = krylov.cg(op, b, 1e-5, 1000)
    op.fused = kernels
    fused = krylov.cg(op, b, 1e-5, 1000)
    assert fused.iterations == plain.iterations and torch.equal(fused.x, plain.x)


def test_spmv_dots_pass_equals_torch_mv_and_dot():
    """The C pass on a 2-D Poisson CSR: y = A x as torch.mv gives it, (x, x) and (y, x) as
    torch.dot gives them (to rounding); with a row list it writes those rows only."""
    from labkit.solve import cspmv

    kernel, why = cspmv.load(torch.device("cpu"), torch.float64, torch.int32)
    if kernel is None:
        pytest.skip(f"no C pass here: {why}")
    op, _ = one_rank((37, 23))
    x = torch.rand(op.n_owned, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y, acc = torch.full_like(x, 7.0), torch.zeros(2, dtype=torch.float64)
    kernel.run(op.A, x, y, acc)
    want = torch.mv(op.A, x)
    # the same products summed in another order: equal to rounding (A's entries are 4 and -1)
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-13)
    assert torch.allclose(acc, torch.stack([torch.dot(x, x), torch.dot(want, x)]), rtol=1e-12)
    rows = torch.tensor([3, 0, 5], dtype=torch.int64)  # a CSR of 3 rows: rows 3, 0, 5 of A
    dense = op.A.to_dense()[rows]
    sub = dense.to_sparse_csr()
    sub = torch.sparse_csr_tensor(sub.crow_indices().int(), sub.col_indices().int(),
                                  sub.values(), size=sub.shape)
    y2, acc2 = torch.full_like(x, 7.0), torch.zeros(2, dtype=torch.float64)
    kernel.run(sub, x, y2, acc2, rows=rows, count_rr=False)
    assert torch.allclose(y2[rows], dense @ x, rtol=1e-12, atol=1e-13)
    assert (y2[[1, 2, 4]] == 7.0).all() and acc2[0] == 0.0
    assert float(acc2[1]) == pytest.approx(float((dense @ x) @ x[rows]), rel=1e-12)


def test_spmv_dots_pass_says_why_it_cannot_run(monkeypatch, tmp_path):
    from labkit.solve import cspmv

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    kernel, why = cspmv.load(torch.device("cpu"), torch.float64, torch.int32)
    assert kernel is None and why.startswith("no C compiler pass")
    assert cspmv.load(torch.device("cpu"), torch.float32, torch.int32)[1].startswith(
        "the C pass takes float64")
    assert cspmv.load(torch.device("meta"), torch.float64, torch.int32)[1].startswith(
        "the C pass runs on the CPU only")


def test_fused_dots_equal_torch_dot():
    import dataclasses

    kernels, why = _kernels()
    if kernels is None:
        pytest.skip(f"no fused kernels here: {why}")
    gen = torch.Generator().manual_seed(0)
    r, w = (torch.rand(100_003, dtype=torch.float64, generator=gen) for _ in range(2))
    want = torch.stack([torch.dot(r, r), torch.dot(w, r)])
    assert kernels.one_pass_dots()
    assert torch.allclose(kernels.dots(r, w), want, rtol=1e-12, atol=0)
    # as on a GPU (no dots pass): two torch.dot calls, 12 streams counted
    gpu_like = dataclasses.replace(kernels, dots_pass=None)
    assert not gpu_like.one_pass_dots()
    assert torch.equal(gpu_like.dots(r, w), want)


@pytest.mark.slow
def test_inline_baseline_times_rank_0_alone_beside_the_ranks(tmp_path):
    from labkit import solve
    from labkit.launch import LaunchOptions

    cfg = SolveConfig(total_dof=(3000, 6000), partitioners=("simple", "coordinate"), warmup=0,
                      repeat=2, baseline="inline", rtol=1e-10)
    df = solve.run(cfg, launch=LaunchOptions(nprocs=(2,), progress=False,
                                             timeout_s=LAUNCH_TIMEOUT_S)).set_index(
        ["dof_requested", "partitioner"])
    assert (df["baseline"] == "inline").all() and df["gate_passed"].all()
    for size in (3000, 6000):
        a, b = df.loc[(size, "simple")], df.loc[(size, "coordinate")]
        # rank 0 alone solves the same problem: CG's iterations match the 2-rank solve's
        assert abs(a["baseline_iterations"] - a["iterations"]) <= 1
        assert a["baseline_solve_time_s"] > 0
        assert a["speedup"] == pytest.approx(a["baseline_solve_time_s"] / a["solve_time_s"])
        # one solve alone per size and method, shared by the partitioners of that size
        assert b["baseline_solve_time_s"] == a["baseline_solve_time_s"]
    assert solve.report.crossover(df.reset_index(), message_s=50e-6)[0]["t1_source"].eq("inline").all()


@pytest.mark.slow
def test_fused_kernels_and_fixed_iterations_at_two_ranks(tmp_path):
    """Two ranks: fused and plain CG take the same iterations to the same solution; a
    fixed-iteration run does exactly N iterations, is marked and gated on its own residual."""
    from labkit import solve
    from labkit.launch import LaunchOptions

    launch = LaunchOptions(nprocs=(2,), progress=False, timeout_s=LAUNCH_TIMEOUT_S)
    rows = {}
    for kernels in ("plain", "fused"):
        cfg = SolveConfig(total_dof=4000, warmup=0, repeat=1, kernels=kernels, rtol=1e-10)
        rows[kernels] = solve.run(cfg, launch=launch).iloc[0]
    assert rows["fused"]["kernels"] in ("fused", "plain")  # plain with a notice: no compiler
    if rows["fused"]["kernels"] == "fused":
        assert rows["fused"]["compile_time_s"] > 0
        assert rows["fused"]["bytes_per_iteration"] < rows["plain"]["bytes_per_iteration"]
    assert rows["fused"]["iterations"] == rows["plain"]["iterations"]
    assert rows["fused"]["gate_passed"] and rows["plain"]["gate_passed"]
    # the busiest rank's compute over the mean: at least 1, and near it for equal halves
    for row in rows.values():
        assert row["compute_imbalance"] >= 1.0
        # the messages of one iteration timed alone: a cost, a few tens of microseconds on shm
        # (bounds loose: one solve on a shared 2-core machine)
        assert 0 < row["message_time_alone_s"] < 10 * row["time_per_iteration_s"]
    assert rows["plain"]["minimal_bytes_per_iteration"] < rows["plain"]["bytes_per_iteration"]
    # the dots in the SpMV's pass (2 ranks: interior rows, then the boundary rows in place)
    # leave the fewest bytes a CG iteration can move
    if rows["fused"]["spmv_dots"]:
        assert rows["fused"]["minimal_bytes_per_iteration"] == rows["fused"]["bytes_per_iteration"]
    for r in rows.values():
        assert r["copy_bandwidth_alone_gb_per_s"] > 0
    fixed = solve.run(SolveConfig(total_dof=4000, warmup=0, repeat=1, iterations=25),
                      launch=launch).iloc[0]
    assert fixed["iterations"] == 25 and fixed["fixed_iterations"] == 25
    assert not fixed["converged"] and fixed["gate_passed"]


def test_spmv_dots_notice_says_why_the_dots_stay_out_of_the_spmv():
    from types import SimpleNamespace

    from labkit.solve.cspmv import unfit
    from labkit.solve.worker import _spmv_dots_notice

    def op(kernel, notice, index_dtype):
        why = unfit(torch.device("cpu"), torch.float64, index_dtype)
        return SimpleNamespace(fused=SimpleNamespace(spmv_dots=kernel, spmv_dots_notice=notice),
                               c_pass_unfit=why and f"{why}: 3,000,000,000 entries")

    assert _spmv_dots_notice(op(object(), None, torch.int32)) is None
    assert _spmv_dots_notice(op(None, "no C compiler", torch.int32)) == "no C compiler"
    wide = _spmv_dots_notice(op(object(), None, torch.int64))
    assert "int64" in wide and "3,000,000,000 entries" in wide


def test_matvec_dots_falls_back_where_the_c_pass_cannot_read_the_values():
    """A float32 operator never reaches the C pass (it reads doubles): matvec and two dots."""
    from labkit.solve import cspmv

    kernel, why = cspmv.load(torch.device("cpu"), torch.float64, torch.int32)
    if kernel is None:
        pytest.skip(f"no SpMV-with-dots pass here: {why}")
    part = make_partition("simple", (9, 7), 1)
    local, (indptr, cols, vals), _ = local_system((9, 7), part, 0, "random", 0)
    op = DistOperator(local, indptr, cols, vals, world_size=1, dtype=torch.float32)
    assert "float64" in op.c_pass_unfit and f"{op.nnz:,} entries" in op.c_pass_unfit
    x = torch.rand(op.n_ext, dtype=torch.float32)
    out, want = op.new(), op.new()
    got = op.matvec_dots(x, out, kernel)
    op.matvec(x, want)
    assert torch.equal(out, want)
    assert torch.allclose(got, torch.stack([x @ x, want @ x]), rtol=1e-5)
