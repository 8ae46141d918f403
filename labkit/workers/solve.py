"""Worker of the solve-scaling lab: every (mode, partitioner, method) point at one world size.

Run by hand (``labkit solve`` and :func:`labkit.solve.run.solve_scaling` build this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.workers.solve \\
        --config '{"modes": ["strong"], "world_sizes": [2], "total_dof": 250000}'

For each point: build this rank's rows of the Poisson matrix and its part of ``b``, measure the
copy bandwidth on a buffer of the same size (all ranks at once), run ``warmup`` untimed solves,
then ``repeat`` timed ones (each starts with a barrier; a repeat takes as long as its slowest
rank), and check every solve with a fresh distributed SpMV: ``||b - A x|| / ||b||``. Points
that share a grid (weak and throughput at the same DOF per rank) are measured once.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

from labkit import runtime
from labkit.solve import krylov
from labkit.solve.config import SolveConfig, grid_for
from labkit.solve.measure import SPMVS_PER_ITERATION, bandwidth_columns, bytes_per_iteration
from labkit.solve.operator import DistOperator
from labkit.solve.partition import Partition, make_partition, summarize_locals
from labkit.solve.problems import local_system
from labkit.solve.transport import make_transport
from labkit.timing import summarize
from labkit.workers._harness import worker_main

BUCKETS = ("spmv", "halo", "allreduce", "vector")


def build_partition(rt: runtime.Runtime, kind: str, dims: tuple) -> Partition:
    """coordinate is deterministic on every rank; metis runs on rank 0 and is broadcast."""
    if kind != "metis" or rt.world_size == 1:
        return make_partition(kind, dims, rt.world_size)
    parts = torch.empty(math.prod(dims), dtype=torch.int64)
    if rt.rank == 0:
        parts.copy_(torch.from_numpy(make_partition(kind, dims, rt.world_size).parts))
    dist.broadcast(parts, src=0)
    return Partition(kind, dims, rt.world_size, parts.numpy())


def copy_bandwidth(rt: runtime.Runtime, nbytes: float, repeat: int = 10) -> float:
    """This rank's copy bandwidth (GB/s, read + write counted) on a buffer of ``nbytes / 2``,
    with every rank copying at the same time (they share the memory bus)."""
    n = max(int(nbytes // 16), 1 << 14)
    src = torch.rand(n, dtype=torch.float64)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeat + 2):
        if rt.world_size > 1:
            dist.barrier()
        t0 = time.perf_counter()
        dst.copy_(src)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n * 8 / float(np.median(times)) / 1e9


def _sum(rt, values) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if rt.world_size > 1:
        dist.all_reduce(t)
    return t.tolist()


def measure(rt, cfg: SolveConfig, op: DistOperator, b: torch.Tensor, method: str,
            n_global: int, sla=None) -> dict:
    maxiter = cfg.maxiter or 10 * n_global

    def solve():
        if sla is not None:  # torch-sla: same matrix and b; no iteration count comes back
            return krylov.Solution(sla.solve(method, cfg.rtol, maxiter, cfg.restart), None,
                                   True, float("nan"))
        return krylov.solve(method, op, b, rtol=cfg.rtol, maxiter=maxiter, restart=cfg.restart)

    for _ in range(cfg.warmup):
        solve()
    samples, iterations, splits, residuals, converged = [], [], [], [], []
    for _ in range(cfg.repeat):
        if rt.world_size > 1:
            dist.barrier()
        op.sw.reset()
        t0 = time.perf_counter()
        sol = solve()
        samples.append(time.perf_counter() - t0)
        splits.append([op.sw.totals.get(k, 0.0) for k in BUCKETS])
        iterations.append(sol.iterations)
        converged.append(sol.converged)
        residuals.append(op.residual_norm(sol.x, b))  # the gate: a fresh distributed SpMV
    times = summarize(samples, "solve_time")
    t = times["solve_time_p50_s"]
    if sla is not None:
        return _sla_row(rt, cfg, times, residuals, n_global, maxiter), sol.x
    its = int(np.median(iterations))
    # the split: each rank's median over repeats, averaged over ranks
    split = [v / rt.world_size for v in _sum(rt, np.median(np.array(splits), axis=0).tolist())]
    local_bytes = bytes_per_iteration(method, op.spmv_bytes(), op.n_owned,
                                      restart=cfg.restart, iterations=its)
    bw = copy_bandwidth(rt, local_bytes)
    total_bytes, total_bw, halo = _sum(rt, [local_bytes, bw, op.n_halo])
    row = {
        "iterations": its,
        "iterations_per_repeat": iterations,
        "converged": all(converged),
        "solve_time_s": t,
        "solve_time_min_s": times["solve_time_min_s"],
        "solve_time_cv": times["solve_time_cv"],
        "solve_time_rank_spread": times["solve_time_rank_spread"],
        "time_per_iteration_s": t / max(its, 1),
        **{f"{k}_time_s": v for k, v in zip(BUCKETS, split)},
        "other_time_s": max(t - sum(split), 0.0),
        "bytes_per_iteration": total_bytes,
        "halo_bytes_per_iteration": 8 * halo * SPMVS_PER_ITERATION[method],
        "copy_bandwidth_gb_per_s": total_bw,
        **bandwidth_columns(total_bytes, t / max(its, 1), total_bw),
        "throughput_dof_per_s": n_global / t,
        "dof_iterations_per_s": n_global * its / t,
        "rel_residual": max(residuals),
        "gate_tol": cfg.gate_factor * cfg.rtol,
        "maxiter": maxiter,
    }
    row["gate_passed"] = bool(row["rel_residual"] <= row["gate_tol"])
    return row, sol.x


def _sla_row(rt, cfg, times, residuals, n_global, maxiter) -> dict:
    t = times["solve_time_p50_s"]
    row = {"iterations": None, "converged": None, "solve_time_s": t,
           "solve_time_min_s": times["solve_time_min_s"], "solve_time_cv": times["solve_time_cv"],
           "solve_time_rank_spread": times["solve_time_rank_spread"],
           "time_per_iteration_s": None, "throughput_dof_per_s": n_global / t,
           "rel_residual": max(residuals), "gate_tol": cfg.gate_factor * cfg.rtol,
           "maxiter": maxiter}
    row["gate_passed"] = bool(row["rel_residual"] <= row["gate_tol"])
    return row


def gather_global(rt, op: DistOperator, x: torch.Tensor) -> list | None:
    """The global solution on rank 0 (global row order), for tests; None elsewhere."""
    pieces = [None] * rt.world_size
    dist.all_gather_object(pieces, (op.local.owned.tolist(), x.tolist()))
    if rt.rank != 0:
        return None
    out = np.zeros(sum(len(g) for g, _ in pieces))
    for gids, vals in pieces:
        out[gids] = vals
    return out.tolist()


def run(rt: runtime.Runtime, cfg: SolveConfig) -> dict:
    if rt.world_size not in cfg.world_sizes:
        raise ValueError(f"launched at {rt.world_size} ranks; the config lists {cfg.world_sizes}")
    rows, measured, problems, solutions = [], {}, {}, {}
    for mode in cfg.modes:
        dims = grid_for(cfg, mode, rt.world_size)
        n_global = math.prod(dims)
        for kind in cfg.partitioners:
            # on one rank every partitioner owns everything: one problem, each method measured once
            same = kind if rt.world_size > 1 else "-"
            if (dims, same) not in problems:
                sla = None
                if cfg.engine == "torch-sla":
                    from labkit.solve.sla import SlaProblem

                    sla = SlaProblem(dims, kind, rt.world_size, cfg.rhs, cfg.seed)
                    part = sla.partition  # torch-sla's ownership, labkit's gate and halo count
                else:
                    part = build_partition(rt, kind, dims)
                local, (indptr, cols, vals), b = local_system(dims, part, rt.rank, cfg.rhs, cfg.seed)
                comm = make_transport(
                    cfg.transport if cfg.engine == "labkit" else "torch", rt,
                    {q: len(local.send[q]) for q in local.neighbours},
                    dict(zip(local.neighbours, local.recv_counts)),
                    max_reduce=max(16, cfg.restart + 2))
                op = DistOperator(local, indptr, cols, vals, world_size=rt.world_size,
                                  device=rt.device, transport=comm)
                stats = [None] * rt.world_size
                dist.all_gather_object(stats, (local.n_owned, local.n_halo, local.cut_edges,
                                               op.nnz))
                pstats = summarize_locals(*[[s[i] for s in stats] for i in range(3)])
                pstats["global_nnz"] = int(sum(s[3] for s in stats))
                problems[(dims, same)] = (op, torch.from_numpy(b).to(rt.device), pstats, sla)
            op, b, pstats, sla = problems[(dims, same)]
            for method in cfg.methods:
                point = (dims, same, method)
                if point not in measured:
                    runtime.print0(f"[solve] {mode} P={rt.world_size} grid={dims} {kind} {method}")
                    measured[point], x = measure(rt, cfg, op, b, method, n_global, sla)
                    if cfg.keep_solution:
                        solutions[f"{mode}/{kind}/{method}"] = gather_global(rt, op, x)
                rows.append({
                    "mode": mode, "dim": cfg.dim, "grid": list(dims),
                    "dof_global": n_global,
                    "dof_per_rank": int(round(n_global / rt.world_size)),
                    "dof_requested": cfg.dof_requested(mode),
                    "partitioner": kind, "method": method, "engine": cfg.engine,
                    # what carried the halos and all-reduces: shm or torch (gloo / nccl)
                    "transport": op.comm.name if rt.world_size > 1 else None,
                    "rhs": cfg.rhs, "rhs_is_eigenvector": cfg.rhs == "manufactured",
                    "rtol": cfg.rtol, "restart": cfg.restart if method == "gmres" else None,
                    "warmup": cfg.warmup, "repeat": cfg.repeat,
                    **pstats, **measured[point],
                })
    return {"rows": rows, "solutions": solutions} if cfg.keep_solution else {"rows": rows}


if __name__ == "__main__":
    worker_main(run, SolveConfig)
