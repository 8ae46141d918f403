"""Worker of the solve-scaling lab: every (mode, partitioner, method) point at one world size.

Run by hand (``labkit solve`` and :func:`labkit.solve.run.run` build this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.solve.worker \\
        --config '{"modes": ["strong"], "total_dof": 250000}'

For each point: build this rank's rows of the Poisson matrix and its part of ``b``, measure
the copy bandwidth on a buffer of the same size (all ranks at once, and each alone; before
the solves and again after them, the best kept), run a 3-iteration untimed solve (a launch's
first solve pays for first-touched pages and cold code paths: up to 2x at the smallest
sizes), ``warmup`` untimed solves, then ``repeat`` timed ones, or more where they are short
(:func:`~labkit.solve.config.timed_solves`; each starts with a barrier; a repeat takes as long
as its slowest rank), and check every solve with a fresh distributed
SpMV: ``||b - A x|| / ||b||``. The last timed solve also records when each phase of its first
and last iterations ran, every rank on one clock (:mod:`labkit.solve.timeline`: the rows'
``timeline_*`` columns, the trace's slices). Points that share a grid (weak and throughput at
the same DOF per rank) are measured once. With ``baseline="inline"`` (strong mode, more than
one rank), rank 0 also holds the whole problem as one rank would and, before each timed solve
of the ranks, solves it alone while the others wait: t1 and tP side by side, seconds apart;
each rank's share is then timed alone and with every rank at it (:mod:`labkit.solve.shares`).
Each row also carries the most device memory a rank held during its point (CUDA; empty on a
CPU).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

from labkit import runtime
from labkit.harness import worker_main
from labkit.solve import krylov
from labkit.solve.config import SolveConfig, points, timed_solves
from labkit.solve.formulas import (
    SPMVS_PER_ITERATION,
    bandwidth_columns,
    bytes_per_iteration,
    footprint_bytes,
    minimal_bytes_per_iteration,
)
from labkit.solve.fused import make_kernels
from labkit.solve.operator import DistOperator
from labkit.solve.partition import Partition, make_partition, summarize_locals
from labkit.solve.problems import local_system
from labkit.solve.shares import share_columns
from labkit.solve.timeline import PhaseRecorder
from labkit.solve.timeline import gather as gather_timeline
from labkit.solve.transport import make_transport
from labkit.timing import summarize

BUCKETS = ("spmv", "halo", "allreduce", "vector")


def build_partition(rt: runtime.Runtime, kind: str, dims: tuple) -> Partition:
    """coordinate is deterministic on every rank; metis runs on rank 0 and is broadcast."""
    if kind != "metis" or rt.world_size == 1:
        return make_partition(kind, dims, rt.world_size)
    parts = torch.empty(math.prod(dims), dtype=torch.int64, device=rt.device)  # nccl: CUDA
    if rt.rank == 0:
        parts.copy_(torch.from_numpy(make_partition(kind, dims, rt.world_size).parts))
    dist.broadcast(parts, src=0)
    return Partition(kind, dims, rt.world_size, parts.cpu().numpy())


def copy_bandwidth(rt: runtime.Runtime, nbytes: float, repeat: int = 10,
                   alone: bool = False) -> float:
    """This rank's copy bandwidth (GB/s, read + write counted) on a buffer of ``nbytes / 2``
    (the working set's size, so caches help it as much as they help the solve), with every rank
    copying at the same time (they share the memory bus) or, with ``alone``, each rank in turn
    while the others wait (what one process gets of the machine). The best of ``repeat`` copies,
    as STREAM reports it: other jobs only ever slow a copy down, and a floor must be a limit."""
    n = max(int(nbytes // 16), 1 << 14)
    src = torch.rand(n, dtype=torch.float64, device=rt.device)
    dst = torch.empty_like(src)
    turns = range(rt.world_size) if alone else [None]
    times = []
    for turn in turns:
        for i in range(repeat + 2):
            if rt.world_size > 1:
                dist.barrier()
            if turn is not None and turn != rt.rank:
                continue
            runtime.sync(rt.device)
            t0 = time.perf_counter()
            dst.copy_(src)
            runtime.sync(rt.device)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    return 2 * n * 8 / float(np.min(times)) / 1e9


def message_cost(rt: runtime.Runtime, op: DistOperator, rounds: int = 5,
                 round_s: float = 0.01) -> float | None:
    """Seconds for one halo exchange and one 2-value all-reduce with no work between them (CG's
    messages of one iteration, alone): the median of ``rounds`` rounds of ~``round_s`` each
    (10 to 200 calls: shm's ~50 us or gloo's ~1 ms alike), each round after a barrier. What a
    solve's waits hold beyond this is the ranks arriving at different times. None on one rank."""
    if rt.world_size == 1:
        return None
    x, red = op.new_ext(), torch.zeros(2, dtype=op.dtype, device=op.device)

    def timed(calls: int) -> float:
        dist.barrier()
        runtime.sync(rt.device)
        t0 = time.perf_counter()
        for _ in range(calls):
            op.wait(op.post_exchange(x))
            op.wait(op.allreduce_start(red), "allreduce")
        runtime.sync(rt.device)
        return (time.perf_counter() - t0) / calls

    first = _sum(rt, [timed(1)])[0] / rt.world_size  # every rank must make the same count
    calls = int(min(max(round_s / max(first, 1e-9), 10), 200))
    per_call = [timed(calls) for _ in range(rounds)]
    op.sw.reset()
    return float(np.median(per_call))


def _spmv_dots_notice(op) -> str | None:
    """Why the fused CG's dots do not ride on the SpMV here (the pass did not load, or it cannot
    read this operator's arrays), None when they do."""
    if op.fused.spmv_dots is None:
        return op.fused.spmv_dots_notice
    return op.c_pass_unfit


def _sum(rt, values, op=dist.ReduceOp.SUM) -> list[float]:
    # on the rank's device: nccl carries CUDA tensors only
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(t, op=op)
    return t.tolist()


def _max(rt, values) -> list[float]:
    return _sum(rt, values, op=dist.ReduceOp.MAX)


def alone_problem(rt: runtime.Runtime, cfg: SolveConfig, dims: tuple, kernels):
    """Rank 0's copy of the whole problem as a 1-rank launch builds it (the inline baseline's
    operator and b); None on the other ranks."""
    if rt.rank != 0:
        return None
    local, (indptr, cols, vals), b = local_system(dims, make_partition("simple", dims, 1), 0,
                                                  cfg.rhs, cfg.seed)
    op = DistOperator(local, indptr, cols, vals, world_size=1, device=rt.device)
    op.fused = kernels
    return op, torch.from_numpy(b).to(rt.device)


def measure(rt, cfg: SolveConfig, op: DistOperator, b: torch.Tensor, method: str,
            n_global: int, sla=None, *, inline: bool = False, alone=None,
            alone_timed: dict | None = None, shares: bool = False) -> dict:
    """One point's row. ``inline``: time rank 0 alone on ``alone`` (its :func:`alone_problem`)
    before each timed solve of the ranks (every rank must pass the same ``inline``), unless
    ``alone_timed`` holds the baseline fields of an earlier point of the same problem and
    method in this launch (another partitioner): those are reused, the solve alone is the same.
    ``shares``: also time each rank's share alone and together (:mod:`labkit.solve.shares`;
    every rank must pass the same)."""
    if alone_timed is not None:
        inline, alone = False, None
    runtime.reset_device_peak(rt.device)  # the point's own peak, read at its end
    maxiter = cfg.maxiter or 10 * n_global
    rtol = cfg.rtol
    if cfg.iterations is not None:  # HPCG-style: exactly N iterations, no convergence test
        maxiter, rtol = cfg.iterations, 0.0

    def solve(operator=op, rhs=b, rtol=rtol, maxiter=maxiter):
        if sla is not None:  # torch-sla: same matrix and b; no iteration count comes back
            return krylov.Solution(sla.solve(method, cfg.rtol, maxiter, cfg.restart), None,
                                   True, float("nan"))
        return krylov.solve(method, operator, rhs, rtol=rtol, maxiter=maxiter,
                            restart=cfg.restart)

    kernels = krylov.fused_kernels(op) if method == "cg" else None  # what cg runs with
    fused = kernels is not None
    spmv_dots = fused and krylov.dots_in_spmv(op, kernels)

    def local_bytes_at(its):
        return bytes_per_iteration(method, op.spmv_bytes(), op.n_owned, restart=cfg.restart,
                                   iterations=its, fused=fused, spmv_dots=spmv_dots,
                                   one_pass_dots=fused and kernels.one_pass_dots())

    copies_before = None
    if sla is None:
        # the copy bandwidth before the solves and again after them, the best kept: a copy
        # near the size of the L3 runs fast or slow as other jobs fill that cache, and a floor
        # must be a limit
        copies_before = (copy_bandwidth(rt, local_bytes_at(None)),
                         copy_bandwidth(rt, local_bytes_at(None), alone=True))
        solve(rtol=0.0, maxiter=3)  # first touch: pages and code paths warm before timing
        if alone is not None:
            solve(*alone, rtol=0.0, maxiter=3)
    for _ in range(cfg.warmup):
        solve()
        if alone is not None:
            solve(*alone)
    samples, iterations, splits, residuals, converged, estimates = [], [], [], [], [], []
    alone_samples, alone_iterations, alone_splits = [], [], []
    recorder, traced = None, (0.0, 0.0)
    count = cfg.repeat  # known after the first timed solve (timed_solves), agreed by the ranks
    while len(samples) < count:
        if inline:  # rank 0 alone, the others waiting in the barrier after it
            dist.barrier()
            if alone is not None:
                alone[0].sw.reset()
                runtime.sync(rt.device)  # CUDA: time the queued work, not its launch
                t0 = time.perf_counter()
                alone_iterations.append(solve(*alone).iterations)
                runtime.sync(rt.device)
                alone_samples.append(time.perf_counter() - t0)
                alone_splits.append([alone[0].sw.totals.get(k, 0.0) for k in ("spmv", "vector")])
        if rt.world_size > 1:
            dist.barrier()
        plain = op.sw
        if sla is None and len(samples) == count - 1:
            # the last timed solve also keeps when its phases ran, for its trace
            op.sw = recorder = PhaseRecorder(plain.device)
        op.sw.reset()
        runtime.sync(rt.device)
        t0 = time.perf_counter()
        sol = solve()
        runtime.sync(rt.device)
        t_end = time.perf_counter()
        samples.append(t_end - t0)
        splits.append([op.sw.totals.get(k, 0.0) for k in BUCKETS])
        op.sw, traced = plain, (t0, t_end)
        iterations.append(sol.iterations)
        converged.append(sol.converged)
        residuals.append(op.residual_norm(sol.x, b))  # the gate: a fresh distributed SpMV
        estimates.append(sol.residual_estimate)
        if len(samples) == 1:
            count = int(_max(rt, [timed_solves(cfg.repeat, samples[0],
                                               min_timed_s=cfg.min_timed_s)])[0])
    # every rank's recorded iterations of the last timed solve, on one clock
    timeline = gather_timeline(rt, recorder, *traced)
    times = summarize(samples, "solve_time")
    t = times["solve_time_p50_s"]
    if sla is not None:
        return {**_sla_row(rt, cfg, times, residuals, n_global, maxiter),
                "device_memory_peak_bytes": runtime.max_device_peak_bytes(rt.device)}, sol.x
    its = int(np.median(iterations))
    # the split: each rank's median over repeats, averaged over ranks
    mine = np.median(np.array(splits), axis=0)
    split = [v / rt.world_size for v in _sum(rt, mine.tolist())]
    # a rank that computes more than the others makes them wait at every halo and all-reduce:
    # its share over the mean is the steady part of the waits (the rest: each iteration's jitter
    # and the messages' own cost)
    compute = _max(rt, [float(mine[0] + mine[3])])[0]
    mean_compute = split[0] + split[3]
    imbalance = compute / mean_compute if mean_compute > 0 else None
    local_bytes = local_bytes_at(its)
    local_min = minimal_bytes_per_iteration(method, op.spmv_bytes(), op.n_owned)
    messages = message_cost(rt, op)
    # the same buffer size as before the solves (GMRES's bytes per iteration depend on its
    # iterations, not known then)
    bw = max(copy_bandwidth(rt, local_bytes_at(None)), copies_before[0])
    bw_alone = max(copy_bandwidth(rt, local_bytes_at(None), alone=True), copies_before[1])
    local_footprint = footprint_bytes(method, nnz=op.nnz, rows=op.n_owned, halo=op.n_halo,
                                      restart=cfg.restart, iterations=its,
                                      index_bytes=op.index_bytes, word=op.word_bytes)
    total_bytes, total_bw, halo, total_min, total_alone, footprint, spmv_total = _sum(
        rt, [local_bytes, bw, op.n_halo, local_min or 0.0, bw_alone, local_footprint,
             SPMVS_PER_ITERATION[method] * op.spmv_bytes()])
    # the point ends here (solves, messages, copies): the most device memory any rank held
    memory_peak = runtime.max_device_peak_bytes(rt.device)
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
        "compute_imbalance": imbalance,
        "message_time_alone_s": messages,
        "bytes_per_iteration": total_bytes,
        "spmv_bytes_per_iteration": spmv_total,
        "footprint_bytes": footprint,
        "halo_bytes_per_iteration": 8 * halo * SPMVS_PER_ITERATION[method],
        "copy_bandwidth_gb_per_s": total_bw,
        **bandwidth_columns(total_bytes, t / max(its, 1), total_bw),
        "throughput_dof_per_s": n_global / t,
        "dof_iterations_per_s": n_global * its / t,
        "rel_residual": max(residuals),
        "gate_tol": cfg.gate_factor * cfg.rtol,
        "maxiter": maxiter,
        "kernels": "fused" if fused else "plain",
        "spmv_dots": spmv_dots if fused else None,
        "spmv_dots_notice": _spmv_dots_notice(op) if fused else None,
        "fixed_iterations": cfg.iterations,
        "solves_timed": len(samples),
        "copy_bandwidth_alone_gb_per_s": total_alone / rt.world_size,
        "device_memory_peak_bytes": memory_peak,
        "baseline": "inline" if inline or alone_timed else None,
        **(alone_timed or {}),
        **timeline,
    }
    if alone_samples:  # rank 0's solves alone, each just before one of the ranks'
        t1, its1 = float(np.median(alone_samples)), int(np.median(alone_iterations))
        spmv1, vector1 = np.median(np.array(alone_splits), axis=0).tolist()
        row.update(baseline_solve_time_s=t1, baseline_iterations=its1,
                   baseline_time_per_iteration_s=t1 / max(its1, 1),
                   baseline_compute_time_s=spmv1 + vector1, baseline_spmv_time_s=spmv1,
                   baseline_vector_time_s=vector1)
    if shares and sla is None:
        row.update(share_columns(rt, op, b, method, restart=cfg.restart))
    if local_min is not None:
        floor = total_min / (total_bw * 1e9)
        row.update(minimal_bytes_per_iteration=total_min, minimal_floor_s=floor,
                   minimal_bandwidth_fraction=floor / (t / max(its, 1)))
    if cfg.iterations is not None:
        # no convergence claim: the gate checks that the true residual is the one the method
        # reports (a solve that went wrong drifts away from its own recurrence)
        row["gate_tol"] = cfg.gate_factor * max(max(estimates), 1e-14)
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


def on_rank(rt: runtime.Runtime, cfg: SolveConfig) -> dict:
    cfg.check_world_size(rt.world_size)
    rows, measured, problems, solutions, alone_timed = [], {}, {}, {}, {}
    kernels, notice, compile_s = None, None, None
    if cfg.kernels == "fused" and "cg" in cfg.methods:
        # compiled before anything is timed; the cost is in the rows, not in a solve
        kernels, notice = make_kernels(rt.device)
        compile_s = kernels.compile_time_s if kernels else None
        if notice:
            runtime.print0(f"[solve] fused kernels unavailable, plain ones used: {notice}")
    for mode, requested, dims in points(cfg, rt.world_size):
        n_global = math.prod(dims)
        for kind in cfg.partitioners:
            # on one rank every partitioner owns everything: one problem, each method measured once
            same = kind if rt.world_size > 1 else "-"
            if (dims, same) not in problems:
                sla = None
                if cfg.engine == "torch-sla":
                    from labkit.solve.sla import SlaProblem

                    sla = SlaProblem(dims, kind, rt.world_size, cfg.rhs, cfg.seed,
                                     device=rt.device)
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
                op.fused = kernels  # read by krylov.cg only
                stats = [None] * rt.world_size
                dist.all_gather_object(stats, (local.n_owned, local.n_halo, local.cut_edges,
                                               op.nnz))
                pstats = summarize_locals(*[[s[i] for s in stats] for i in range(3)])
                pstats["global_nnz"] = int(sum(s[3] for s in stats))
                problems[(dims, same)] = (op, torch.from_numpy(b).to(rt.device), pstats, sla)
            op, b, pstats, sla = problems[(dims, same)]
            inline = cfg.inline_baseline(mode, rt.world_size)
            if inline and (dims, "alone") not in problems:
                problems[(dims, "alone")] = alone_problem(rt, cfg, dims, kernels)
            for method in cfg.methods:
                point = (dims, same, method, inline)
                if point not in measured:
                    runtime.print0(f"[solve] {mode} P={rt.world_size} grid={dims} {kind} {method}")
                    measured[point], x = measure(rt, cfg, op, b, method, n_global, sla,
                                                 inline=inline,
                                                 alone=problems.get((dims, "alone")),
                                                 alone_timed=alone_timed.get((dims, method)),
                                                 shares=cfg.time_shares(mode, rt.world_size,
                                                                        method))
                    if inline and (dims, method) not in alone_timed:
                        # every rank records that this problem and method were timed alone
                        # (rank 0 with the fields, the others with none), so later points of
                        # it skip the solve alone on every rank alike and pass no barrier
                        alone_timed[(dims, method)] = {k: v for k, v in measured[point].items()
                                                       if k.startswith("baseline_")}
                    if cfg.keep_solution:
                        solutions[f"{mode}/{kind}/{method}"] = gather_global(rt, op, x)
                rows.append({
                    "mode": mode, "dim": cfg.dim, "grid": list(dims),
                    "dof_global": n_global,
                    "dof_per_rank": int(round(n_global / rt.world_size)),
                    "dof_requested": requested,
                    "partitioner": kind, "method": method, "engine": cfg.engine,
                    # what carried the halos and all-reduces: shm or torch (gloo / nccl)
                    "transport": op.comm.name if rt.world_size > 1 else None,
                    "rhs": cfg.rhs, "rhs_is_eigenvector": cfg.rhs == "manufactured",
                    "rtol": cfg.rtol, "restart": cfg.restart if method == "gmres" else None,
                    "warmup": cfg.warmup, "repeat": cfg.repeat,
                    "kernels_requested": cfg.kernels, "kernels_notice": notice,
                    "compile_time_s": compile_s,
                    **pstats, **measured[point],
                })
    return {"rows": rows, "solutions": solutions} if cfg.keep_solution else {"rows": rows}


if __name__ == "__main__":
    worker_main(on_rank, SolveConfig)
