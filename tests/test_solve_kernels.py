"""The solve-scaling lab's numerics: the distributed operator, the Krylov methods against scipy,
the C SpMV-with-dots pass and the fused CG kernels.

Single-process tests build the operator in this process (a world of one needs no collectives);
the launching test (``slow``) runs fused and plain CG, and a fixed-iteration run, on two ranks.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse.linalg as spla
import torch

from labkit.solve import krylov
from labkit.solve.config import SolveConfig
from labkit.solve.operator import DistOperator
from labkit.solve.partition import make_partition
from labkit.solve.problems import global_matrix, local_system, rhs
from tests.conftest import LAUNCH_TIMEOUT_S

from ._solve_helpers import one_rank, scipy_cg


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


# -- fewer passes over memory ---------------------------------------------------------------
def test_minimal_bytes_on_a_small_grid_equal_a_hand_count():
    """3x3 grid, 5-point, one rank: nnz = 9 + 2 x 12 = 33 (each of the 12 grid edges couples
    two rows both ways); SpMV 33 x 12 + 10 x 4 + 9 x 8 + 9 x 8 = 580 bytes; a CG iteration must
    also read x, p, s, r, w and write x, p, s, r: 9 x 8 x 9 = 648; 1228 in all."""
    from labkit.solve.formulas import minimal_bytes_per_iteration, spmv_bytes

    op, _ = one_rank((3, 3))
    assert op.nnz == 33 and op.spmv_bytes() == spmv_bytes(33, 9, 0) == 580
    assert minimal_bytes_per_iteration("cg", op.spmv_bytes(), op.n_owned) == 580 + 648


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
    # 25 iterations of 4,000 DOF take a few ms: more timed solves, until they span 0.1 s
    assert fixed["solves_timed"] > fixed["repeat"] == 1
    once = solve.run(SolveConfig(total_dof=4000, warmup=0, repeat=1, iterations=25,
                                 min_timed_s=0.0), launch=launch).iloc[0]
    assert once["solves_timed"] == 1


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
