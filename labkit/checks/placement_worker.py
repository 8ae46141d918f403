"""Verify placement: where every rank runs, and one timed all-reduce across them.

Run by hand (the launcher builds the same command)::

    torchrun --standalone --nproc-per-node=2 -m labkit.checks.placement_worker \\
        --config '{"allreduce_bytes": 1048576}' --out placement.json

Rows: one per rank, the placement table (rank, local_rank, host, pid, device, device_name,
cuda_visible_devices, threads, problem) plus the all-reduce time of the slowest rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.checks.config import PlacementConfig
from labkit.harness import worker_main
from labkit.machine.formulas import transfer_of


def on_rank(rt: runtime.Runtime, cfg: PlacementConfig) -> dict:
    n = max(1, cfg.allreduce_bytes // 4)
    # one checked call first: every element 1 on every rank sums to world_size
    buf = torch.ones(n, dtype=torch.float32, device=rt.device)
    dist.all_reduce(buf)
    correct = bool(torch.allclose(buf, torch.full_like(buf, float(rt.world_size)), rtol=1e-4))
    # the timed calls sum zeros: ones multiplied by world_size at every call would overflow
    # float32 at 8 ranks within 43 calls
    buf.zero_()
    local = timing.repeat_timed(lambda: dist.all_reduce(buf), warmup=cfg.warmup,
                                repeat=cfg.repeat, device=rt.device)
    # and the timed calls left zeros: a garbage or NaN sum would show here
    correct = correct and bool((buf == 0).all())
    stats = timing.summarize(local, prefix="allreduce_time")
    # the transfer: the median of the calls that waited for nothing
    steps, _ = timing.slowest_step_times(local)
    stats["allreduce_transfer_s"] = transfer_of(steps)
    table = runtime.placement(rt)
    if rt.rank != 0:
        return {}
    rows = [{**row, "allreduce_bytes": n * 4, "allreduce_correct": correct, **stats} for row in table]
    return {"rows": rows}


if __name__ == "__main__":
    worker_main(on_rank, PlacementConfig)
