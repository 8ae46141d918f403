"""Each rank's share of a solve, timed alone and with every rank at it (rank side).

The co-run slowdown of the solve's own compute: each rank runs CG on its own rows (the same
matrix rows, vectors and kernels as its share of the distributed solve, with no neighbour and
no all-reduce: a one-rank operator over them), alone while the others wait in a barrier, the
ranks in turn, then all at once; rounds interleaved, so a neighbour's burst falls on both alike.
Why not the whole problem's time over P: a share is 1/P of the data, and on a machine whose
shared cache holds about one whole problem (the 2-vCPU VM's 32 MiB L3 at 250,000 DOF) a share
alone runs faster or slower than that, by a margin that swings between launches (0.81 to 1.26
of it in three lab runs). Comparing a share with itself leaves the cache out of the co-run
slowdown; the share alone over the whole problem's time over P is reported beside it. The
share's copy of its rows is counted in the launch's memory check
(:meth:`labkit.solve.config.SolveConfig.memory_bytes_per_rank`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from labkit import runtime
from labkit.solve import krylov
from labkit.solve.budget import SHARE_SAMPLE_S as SAMPLE_S
from labkit.solve.budget import SHARES_ROUNDS as ROUNDS
from labkit.solve.operator import DistOperator
from labkit.solve.partition import LocalPart
from labkit.timing import worst_over_ranks

#: the fewest iterations of one timed sample
MIN_ITERATIONS = 10


def share_operator(op: DistOperator) -> DistOperator:
    """A one-rank operator over ``op``'s rows: the same CSR (owned and halo columns), the same
    kernels, no neighbour to exchange with and no all-reduce (its halo values stay 0: the
    work per iteration is the share's, what it computes is not the global solve's)."""
    a = op.A
    local = op.local
    alone = LocalPart(rank=local.rank, owned=local.owned, halo=local.halo, neighbours=(),
                      recv_counts=())
    share = DistOperator(alone, a.crow_indices().cpu().numpy(), a.col_indices().cpu().numpy(),
                         a.values().cpu().numpy(), world_size=1, device=op.device,
                         dtype=op.dtype)
    share.fused = getattr(op, "fused", None)
    return share


def _compute_s(rt, share: DistOperator, b: torch.Tensor, method: str, iterations: int,
               restart: int) -> np.ndarray:
    """Seconds of compute per iteration of ``method`` on the share, as [SpMV, vector work]
    (the stopwatch's): a solve of ``iterations`` iterations less one of 1, over
    ``iterations`` - 1 (a solve also sets up, and runs one SpMV more than its iterations: at a
    few iterations a sample that much too long)."""
    def timed(k: int) -> np.ndarray:
        share.sw.reset()
        krylov.solve(method, share, b, rtol=0.0, maxiter=k, restart=restart)
        runtime.sync(rt.device)
        return np.array([share.sw.totals.get(name, 0.0) for name in ("spmv", "vector")])

    return (timed(iterations) - timed(1)) / (iterations - 1)


def _worst(rt, samples: list) -> np.ndarray:
    """The median sample by its total (SpMV + vector), then the slowest rank's, as [total,
    SpMV, vector] on every rank (so its parts sum to the total). Collective."""
    totals = [float(x.sum()) for x in samples]
    mine = samples[int(np.argsort(totals)[(len(totals) - 1) // 2])] if samples else np.zeros(2)
    got = torch.tensor([float(mine.sum()), *map(float, mine)], dtype=torch.float64,
                       device=rt.device)
    every = [torch.zeros_like(got) for _ in range(rt.world_size)]
    dist.all_gather(every, got)
    return max((t.cpu().numpy() for t in every), key=lambda t: t[0])


def share_columns(rt, op: DistOperator, b: torch.Tensor, method: str, *,
                  restart: int = 30) -> dict:
    """The share's compute per iteration alone and together (the slowest rank's median of
    each), and their ratio, the co-run slowdown of the solve's own compute. Collective: every
    rank calls it; nothing on one rank."""
    if rt.world_size < 2:
        return {}
    share = share_operator(op)
    _compute_s(rt, share, b, method, 3, restart)  # pages and code paths warm
    first = max(float(_compute_s(rt, share, b, method, 3, restart).sum()), 1e-7)
    iterations = int(max(MIN_ITERATIONS, min(500, round(SAMPLE_S / worst_over_ranks(rt, first)))))
    alone, together = [], []
    for _ in range(ROUNDS):
        for q in range(rt.world_size):  # rank q alone, the others in the barrier after it
            dist.barrier()
            if rt.rank == q:
                alone.append(_compute_s(rt, share, b, method, iterations, restart))
        dist.barrier()
        together.append(_compute_s(rt, share, b, method, iterations, restart))
    a, t = _worst(rt, alone), _worst(rt, together)
    return {"share_alone_compute_per_iteration_s": float(a[0]),
            "share_together_compute_per_iteration_s": float(t[0]),
            "share_alone_spmv_per_iteration_s": float(a[1]),
            "share_together_spmv_per_iteration_s": float(t[1]),
            "share_corun_slowdown": float(t[0] / a[0]), "share_iterations_timed": iterations}
