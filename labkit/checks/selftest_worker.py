"""A launch that succeeds or fails on purpose, to see (and test) what the launcher does.

Run by hand::

    torchrun --standalone --nproc-per-node=2 -m labkit.checks.selftest_worker \\
        --config '{"fault": "raise", "fault_rank": 1}'

Faults: none, raise, exit (code 3), kill (SIGKILL itself), hang (an all-reduce the peers never
join; only the launcher's timeout ends it), stop (SIGSTOP itself, as a debugger or a frozen node
would: its heartbeat stops, and the timeout message names it).
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.checks.config import SelftestConfig
from labkit.harness import worker_main


def on_rank(rt: runtime.Runtime, cfg: SelftestConfig) -> dict:
    time.sleep(cfg.sleep_s)
    if rt.rank == cfg.fault_rank:
        if cfg.fault == "raise":
            raise RuntimeError(f"injected failure on rank {rt.rank}")
        if cfg.fault == "exit":
            runtime.print0("exiting")  # rank 0 only: stays quiet here
            os._exit(3)
        if cfg.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if cfg.fault == "hang":
            dist.all_reduce(torch.ones(1, device=rt.device))  # peers never join
            time.sleep(3600)
        if cfg.fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
    if cfg.fault in ("hang", "stop"):
        time.sleep(3600)  # the other ranks wait too, like ranks stuck behind a straggler
    t = torch.tensor([float(rt.rank)], device=rt.device)
    dist.all_reduce(t)
    row = {"rank_sum": float(t.item()), "pid": os.getpid()}
    if cfg.step_sleep_s:
        nap = cfg.step_sleep_s[rt.rank % len(cfg.step_sleep_s)]
        local = timing.repeat_timed(lambda: time.sleep(nap), warmup=1, repeat=cfg.steps,
                                    device=rt.device)
        row.update(timing.summarize(local, prefix="step_time"))
    return {"rows": [row]} if rt.rank == 0 else {}


if __name__ == "__main__":
    worker_main(on_rank, SelftestConfig)
