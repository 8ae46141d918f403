"""Rank side of :func:`labkit.speedup.run.run`: a fixed job with a serial part, timed per run.

Run by hand (one thread per rank, as the host function does)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.speedup.worker \\
        --config '{"total_work": 400, "serial_fraction": 0.1}' --out workshare.json

Rows: one (rank 0's) with ``time_s`` = p50 over repeats of the slowest rank's run time.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.speedup.config import WorkshareConfig


def run(rt: runtime.Runtime, cfg: WorkshareConfig) -> dict:
    torch.manual_seed(0)
    n = cfg.matrix_size
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    serial, mine = cfg.split(rt.world_size, rt.rank)

    def job():
        for _ in range(serial):  # rank 0 only; the others are already waiting below
            torch.mm(a, b, out=c)
        dist.barrier()
        for _ in range(mine):
            torch.mm(a, b, out=c)
        dist.barrier()  # the job ends when its last rank does

    local = timing.repeat_timed(job, warmup=cfg.warmup, repeat=cfg.repeat, device=rt.device)
    stats = timing.summarize(local, prefix="time")
    if rt.rank != 0:
        return {}
    return {"rows": [{
        "time_s": stats["time_p50_s"], "time_min_s": stats["time_min_s"], "time_cv": stats["time_cv"],
        "total_work": cfg.total_work, "serial_fraction": cfg.serial_fraction,
        "serial_products": serial, "parallel_products_per_rank_max": mine,
        "matrix_size": n, "repeat": cfg.repeat}]}


if __name__ == "__main__":
    worker_main(run, WorkshareConfig)
