"""Rank side of :func:`labkit.speedup.run.run`: a fixed job with a serial part, timed per run.

Run by hand (one thread per rank, as the host function does)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.speedup.worker \\
        --config '{"total_work": 400, "serial_fraction": 0.1}' --out workshare.json

Rows: one (rank 0's) with ``time_s`` = p50 over repeats of the slowest rank's run time, its two
parts as rank 0 saw them (``serial_part_s``: the serial products and the barrier after them;
``parallel_part_s``: rank 0's share and the wait for the last rank), every rank's timed runs
segment by segment on one clock (``timeline_s``: :func:`timeline`, the trace's slices), and the
run's device memory peak (None on a CPU). The matrices live on the rank's device.
"""

from __future__ import annotations

import socket
import statistics
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing, trace
from labkit.harness import worker_main
from labkit.speedup.config import WorkshareConfig
from labkit.trace import IDLE


def on_rank(rt: runtime.Runtime, cfg: WorkshareConfig) -> dict:
    runtime.reset_device_peak(rt.device)
    torch.manual_seed(0)
    n = cfg.matrix_size
    # drawn on the host (the same numbers on every device), then moved to the rank's device
    a, b = torch.randn(n, n).to(rt.device), torch.randn(n, n).to(rt.device)
    c = torch.empty(n, n, device=rt.device)
    serial, mine = cfg.split(rt.world_size, rt.rank)
    marks = []  # per run: start, serial products done, serial part done, parallel share done, end

    def job():
        t0 = time.perf_counter()
        for _ in range(serial):  # rank 0 only; the others are already waiting below
            torch.mm(a, b, out=c)
        # on CUDA the products are queued: a rank reaches each barrier when its work is done
        runtime.sync(rt.device)
        t_serial = time.perf_counter()
        dist.barrier()
        t1 = time.perf_counter()
        for _ in range(mine):
            torch.mm(a, b, out=c)
        runtime.sync(rt.device)
        t_share = time.perf_counter()
        dist.barrier()  # the job ends when its last rank does
        marks.append((t0, t_serial, t1, t_share, time.perf_counter()))

    local = timing.repeat_timed(job, warmup=cfg.warmup, repeat=cfg.repeat, device=rt.device)
    stats = timing.summarize(local, prefix="time")
    peak = runtime.max_device_peak_bytes(rt.device)
    every = [None] * rt.world_size  # every rank's timed runs, for the timeline
    dist.all_gather_object(every, (socket.gethostname(), marks[-cfg.repeat:], serial > 0))
    if rt.rank != 0:
        return {}
    timed = [(m[2] - m[0], m[4] - m[2]) for m in marks[-cfg.repeat:]]  # (serial, parallel) part
    return {"rows": [{
        "time_s": stats["time_p50_s"], "time_min_s": stats["time_min_s"], "time_cv": stats["time_cv"],
        "serial_part_s": statistics.median(p[0] for p in timed),
        "parallel_part_s": statistics.median(p[1] for p in timed),
        "total_work": cfg.total_work, "serial_fraction": cfg.serial_fraction,
        "serial_products": serial, "parallel_products_per_rank_max": mine,
        "matrix_size": n, "repeat": cfg.repeat, "device_memory_peak_bytes": peak,
        "timeline_s": timeline(every)}]}


def timeline(every) -> list[dict]:
    """Each timed run's segments on every rank (``every[r]`` = rank r's host, its runs'
    marks from :func:`on_rank`'s job, and whether it has serial products), each run on one
    clock from the first rank's start: on one host ``time.perf_counter`` is the machine's
    monotonic clock, the same in every process; across hosts the barrier before the run is the
    common start. Segments: ``serial`` (rank 0's products alone), ``wait for the serial part``
    (the barrier after it), ``parallel`` (the rank's share), ``wait for the last rank``.

    Rank 0 does 2 ms of serial products, rank 1 starts 0.1 ms later and waits for them:

    >>> run0, run1 = (10.0, 10.002, 10.0021, 10.005, 10.0052), (10.0001, 10.0001, 10.0021, 10.0052, 10.0052)
    >>> [(s["rank"], s["name"], round(s["start_s"], 6), round(s["end_s"], 6))
    ...  for s in timeline([("h", [run0], True), ("h", [run1], False)])][:3]
    [(0, 'serial', 0.0, 0.002), (0, 'wait for the serial part', 0.002, 0.0021), (0, 'parallel', 0.0021, 0.005)]
    """
    hosts = [host for host, _, _ in every]
    out = []
    for k in range(len(every[0][1])):
        offsets = trace.start_offsets([runs[k][0] for _, runs, _ in every], hosts)
        for rank, (_, runs, has_serial) in enumerate(every):
            t0, t_serial, t1, t_share, end = runs[k]
            shift = t0 - offsets[rank]  # the readings, from this run's first start
            parts = [("serial", "serial", t0, t_serial)] if has_serial else []
            parts += [("wait for the serial part", IDLE, t_serial, t1),
                      ("parallel", "parallel", t1, t_share),
                      ("wait for the last rank", IDLE, t_share, end)]
            out += [{"run": k + 1, "rank": rank, "name": name, "cat": cat,
                     "start_s": a - shift, "end_s": b - shift} for name, cat, a, b in parts]
    return out


if __name__ == "__main__":
    worker_main(on_rank, WorkshareConfig)
