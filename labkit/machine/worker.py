"""Rank side of the machine profile: compute, copies and messages, alone and together.

Run by hand (the launcher builds the same command)::

    torchrun --standalone --nproc-per-node=2 -m labkit.machine.worker \\
        --config '{}' --out machine_profile.json

Rows (rank 0 returns them): one per measurement x context x size, with the p50 time of the
slowest rank (``together``, ``idle``, ``busy``) or of rank 0 (``alone``) and the rate it implies.
"alone": rank 0 works while the others wait at a barrier; "together": every rank does the same
work at once (the co-run slowdown is their ratio); "busy": a thread in every rank keeps that
rank's core computing matrix products while the collective runs (what backward does to an
all-reduce it overlaps).
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.machine.config import MachineConfig
from labkit.metrics import slowest_rank


def _p50(values) -> float:
    return float(torch.tensor(list(values), dtype=torch.float64).median())


def _reps(fn, sample_s: float, device) -> int:
    """How many calls of ``fn`` make one sample of about ``sample_s``, agreed by every rank."""
    t = max(min(timing.repeat_timed(fn, warmup=1, repeat=3, device=device, barrier=False)), 1e-7)
    reps = torch.tensor([max(1, round(sample_s / t))], device=device)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    return int(reps.item())


def _alone_and_together(rt, fn, cfg) -> tuple[float, float]:
    """(p50 seconds of one call on rank 0 alone, p50 of the slowest rank with all at it)."""
    reps = _reps(fn, cfg.sample_s, rt.device)

    def many():
        for _ in range(reps):
            fn()

    alone = [1.0] * cfg.iters  # rank 0's numbers are the ones kept
    dist.barrier()
    if rt.rank == 0:
        alone = timing.repeat_timed(many, warmup=1, repeat=cfg.iters, device=rt.device,
                                    barrier=False)
    dist.barrier()
    together = timing.repeat_timed(many, warmup=1, repeat=cfg.iters, device=rt.device)
    steps, _ = timing.slowest_step_times(together)
    return _p50(alone) / reps, float(sorted(steps)[len(steps) // 2]) / reps


class Busy:
    """A thread that keeps this rank's core computing until stopped (torch frees the GIL
    inside a matrix product, so the collective's thread and this one share the core);
    ``count``: the products it finished, proof that the core computed. The collectives lab
    uses the same thread, so the profile's busy all-reduce predicts its own."""

    def __init__(self, n: int, device):
        self.a = torch.randn(n, n, device=device)
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self):
        while not self.stop.is_set():
            self.a @ self.a
            self.count += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _collective_rows(rt, cfg, context: str) -> list[dict]:
    rows = []
    for size in cfg.sizes():
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=rt.device)
        local = timing.repeat_timed(lambda b=buf: dist.all_reduce(b), warmup=cfg.warmup,
                                    repeat=cfg.iters, device=rt.device)
        t = float(sorted(slowest_rank(timing.gather_samples(local)))[cfg.iters // 2])
        rows.append({"measurement": "allreduce", "context": context, "size_bytes": size,
                     "time_p50_s": t, "bytes_per_s": size / t})
        rows.append(_pingpong(rt, cfg, buf, size, context))
    return rows


def _pingpong(rt, cfg, buf, size: int, context: str) -> dict:
    """Rank 0 sends to rank 1, which sends it back: one way = half the round trip."""
    samples = []
    for i in range(cfg.warmup + cfg.iters):
        dist.barrier()
        runtime.sync(rt.device)
        t0 = timing.time.perf_counter()
        if rt.rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rt.rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        runtime.sync(rt.device)
        if i >= cfg.warmup:
            samples.append((timing.time.perf_counter() - t0) / 2)
    t = _p50(timing.gather_samples(samples)[0])  # rank 0's clock holds the round trip
    return {"measurement": "message", "context": context, "size_bytes": size,
            "time_p50_s": t, "bytes_per_s": size / t}


def on_rank(rt: runtime.Runtime, cfg: MachineConfig) -> dict:
    torch.manual_seed(1234 + rt.rank)
    rows = []
    for n in cfg.matmul_sizes:
        a = torch.randn(n, n, device=rt.device)
        alone, together = _alone_and_together(rt, lambda a=a: a @ a, cfg)
        for context, t in (("alone", alone), ("together", together)):
            rows.append({"measurement": "matmul", "context": context, "n": n, "time_p50_s": t,
                         "flop_per_s": 2 * n ** 3 / t})
    # a training step in miniature (matrix products, elementwise ops and autograd's memory
    # traffic): the co-run slowdown of the labs that train
    w1 = torch.randn(cfg.step_width, cfg.step_width, device=rt.device, requires_grad=True)
    w2 = torch.randn(cfg.step_width, cfg.step_width, device=rt.device, requires_grad=True)
    x = torch.randn(cfg.step_batch, cfg.step_width, device=rt.device)

    def step():
        w1.grad = w2.grad = None
        (torch.tanh(torch.tanh(x @ w1) @ w2) ** 2).mean().backward()

    alone, together = _alone_and_together(rt, step, cfg)
    flop = 6 * 2 * cfg.step_batch * cfg.step_width ** 2  # forward 2 products, backward 4
    for context, t in (("alone", alone), ("together", together)):
        rows.append({"measurement": "step", "context": context, "n": cfg.step_width,
                     "time_p50_s": t, "flop_per_s": flop / t})
    src = torch.ones(cfg.copy_bytes // 4, dtype=torch.float32, device=rt.device)
    dst = torch.empty_like(src)
    alone, together = _alone_and_together(rt, lambda d=dst, s=src: d.copy_(s), cfg)
    for context, t in (("alone", alone), ("together", together)):
        rows.append({"measurement": "copy", "context": context, "size_bytes": cfg.copy_bytes,
                     "time_p50_s": t, "bytes_per_s": 2 * cfg.copy_bytes / t})
    rows += _collective_rows(rt, cfg, "idle")
    with Busy(cfg.busy_n, rt.device):
        rows += _collective_rows(rt, cfg, "busy")
    if rt.rank != 0:
        return {}
    return {"rows": [{"n": None, "size_bytes": None, **r} for r in rows]}


if __name__ == "__main__":
    worker_main(on_rank, MachineConfig)
