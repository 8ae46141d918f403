"""Rank side of :func:`labkit.speedup.run.run`: a fixed job with a serial part, timed per run.

Run by hand (one thread per rank, as the host function does)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.speedup.worker \\
        --config '{"total_work": 400, "serial_fraction": 0.1}' --out workshare.json

Rows: one (rank 0's) with ``time_s`` = p50 over repeats of the slowest rank's run time, its two
parts as rank 0 saw them (``serial_part_s``: the serial products and the barrier after them;
``parallel_part_s``: rank 0's share and the wait for the last rank), and the run's device
memory peak (None on a CPU). The matrices live on the rank's device.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.speedup.config import WorkshareConfig


def on_rank(rt: runtime.Runtime, cfg: WorkshareConfig) -> dict:
    runtime.reset_device_peak(rt.device)
    torch.manual_seed(0)
    n = cfg.matrix_size
    # drawn on the host (the same numbers on every device), then moved to the rank's device
    a, b = torch.randn(n, n).to(rt.device), torch.randn(n, n).to(rt.device)
    c = torch.empty(n, n, device=rt.device)
    serial, mine = cfg.split(rt.world_size, rt.rank)
    parts = []  # (serial part, parallel part) of every run, in seconds

    def job():
        t0 = time.perf_counter()
        for _ in range(serial):  # rank 0 only; the others are already waiting below
            torch.mm(a, b, out=c)
        # on CUDA the products are queued: a rank reaches each barrier when its work is done
        runtime.sync(rt.device)
        dist.barrier()
        t1 = time.perf_counter()
        for _ in range(mine):
            torch.mm(a, b, out=c)
        runtime.sync(rt.device)
        dist.barrier()  # the job ends when its last rank does
        parts.append((t1 - t0, time.perf_counter() - t1))

    local = timing.repeat_timed(job, warmup=cfg.warmup, repeat=cfg.repeat, device=rt.device)
    stats = timing.summarize(local, prefix="time")
    peak = runtime.max_device_peak_bytes(rt.device)
    if rt.rank != 0:
        return {}
    timed = parts[-cfg.repeat:]
    return {"rows": [{
        "time_s": stats["time_p50_s"], "time_min_s": stats["time_min_s"], "time_cv": stats["time_cv"],
        "serial_part_s": statistics.median(p[0] for p in timed),
        "parallel_part_s": statistics.median(p[1] for p in timed),
        "total_work": cfg.total_work, "serial_fraction": cfg.serial_fraction,
        "serial_products": serial, "parallel_products_per_rank_max": mine,
        "matrix_size": n, "repeat": cfg.repeat, "device_memory_peak_bytes": peak}]}


if __name__ == "__main__":
    worker_main(on_rank, WorkshareConfig)
