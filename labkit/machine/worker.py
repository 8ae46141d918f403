"""Rank side of the machine profile: compute, copies and messages, alone and together.

Run by hand (the launcher builds the same command)::

    torchrun --standalone --nproc-per-node=2 -m labkit.machine.worker \\
        --config '{}' --out machine_profile.json

Rows (rank 0 returns them): one per measurement x context x size, with the p50 time of the
slowest rank (``together``, ``idle``, ``busy``) or of rank 0 (``alone``) and the rate it implies.
Copies are timed at several sizes (``copy_bytes``), interleaved round by round; the products
and the training step (at several batches, ``step_batches``) likewise, half their rounds before
the messages and half after.
"alone": rank 0 works while the others wait at a barrier; "together": every rank does the same
work at once (the co-run slowdown is their ratio); "busy": a thread in every rank keeps that
rank's core computing matrix products while the collective runs (what backward does to an
all-reduce it overlaps). ``allreduce_repeated`` times the small all-reduces once more as
notebook 01 times its own, one size at a time on one buffer: on the 2-vCPU VM the sweep's 8 B
all-reduce (the sizes in turns, each call on another buffer than the last) read 0.28-0.39 ms,
these 0.14-0.24 ms, and notebook 01's 0.15-0.24 ms. ``allreduce_steady`` times every size
once more as the collectives lab does (calls back to back, idle and busy), for the laws that
judge its calls.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.machine import formulas
from labkit.machine.config import REPEATED_MAX_BYTES, SHARDED_FROM_BYTES, MachineConfig
from labkit.metrics import slowest_rank


def _p50(values) -> float:
    return float(torch.tensor(list(values), dtype=torch.float64).median())


def _reps(fn, sample_s: float, device) -> int:
    """How many calls of ``fn`` make one sample of about ``sample_s``, agreed by every rank."""
    t = max(min(timing.repeat_timed(fn, warmup=1, repeat=3, device=device, barrier=False)), 1e-7)
    reps = torch.tensor([max(1, round(sample_s / t))], device=device)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    return int(reps.item())


def _alone_and_together_each(rt, fns, cfg) -> list[tuple[float, float]]:
    """For each call, (p50 seconds of one call on rank 0 alone, p50 of the slowest rank with
    all at it), over ``cfg.iters`` interleaved rounds (:class:`Interleaved`)."""
    timed = Interleaved(rt, fns, cfg)
    timed.rounds(cfg.iters)
    return timed.medians()


class Interleaved:
    """Several calls timed alone and together, interleaved: each round times one sample of
    every call (alone, then together), so a change of the machine's state (a neighbour's
    burst) falls on both alike and their ratio, the co-run slowdown, stays honest; each call's
    medians span the whole measurement, not one burst of it, and calls of different sizes
    compare on the same machine state. Rounds
    may come in parts (:meth:`rounds`), the medians (:meth:`medians`) taken over all of them:
    the profile times its compute before and after the messages, so that its co-run slowdowns
    span the whole profile, not the few seconds of one burst of a neighbour's."""

    def __init__(self, rt, fns, cfg):
        self.rt = rt
        self.counts = [_reps(fn, cfg.sample_s, rt.device) for fn in fns]
        self.manys = [self._many(fn, reps) for fn, reps in zip(fns, self.counts)]
        for many in self.manys:
            many()  # warm-up
        self.alone, self.together = [[] for _ in fns], [[] for _ in fns]

    @staticmethod
    def _many(fn, reps):
        def many():
            for _ in range(reps):
                fn()
        return many

    def rounds(self, k: int) -> None:
        rt = self.rt
        for _ in range(k):
            for i, many in enumerate(self.manys):
                dist.barrier()
                if rt.rank == 0:  # the others wait in the next barrier
                    self.alone[i] += timing.repeat_timed(many, warmup=0, repeat=1,
                                                         device=rt.device, barrier=False)
                self.together[i] += timing.repeat_timed(many, warmup=0, repeat=1,
                                                        device=rt.device)

    def medians(self) -> list[tuple[float, float]]:
        """(alone, together) p50 seconds of one call each. Collective: call on every rank.
        Also sets :attr:`paired`: per call, each round's together over its alone (rank 0's)."""
        out, self.paired = [], []
        for a, t, reps in zip(self.alone, self.together, self.counts):
            steps, _ = timing.slowest_step_times(t)
            a = a or [1.0] * len(steps)  # rank 0's numbers are the ones kept
            out.append((_p50(a) / reps, _p50(steps) / reps))
            self.paired.append([round(float(x / y), 6) for x, y in zip(steps, a)])
        return out


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


def _timed(rt, fn) -> float:
    dist.barrier()
    runtime.sync(rt.device)
    t0 = time.perf_counter()
    fn()
    runtime.sync(rt.device)
    return time.perf_counter() - t0


def _collective_rows(rt, cfg, context: str) -> list[dict]:
    """All-reduce and ping-pong over every size, and reduce-scatter and all-gather over the
    sizes from :data:`labkit.machine.config.SHARDED_FROM_BYTES` (sharded data parallelism's
    buffers), the sizes interleaved (one sample of each size per round): each size's median
    spans the whole sweep, not one burst of it. A reduce-scatter of S reduces an S-byte buffer
    into each rank's S/N, an all-gather of S gathers S/N from each (nccl-tests' S)."""
    n = rt.world_size
    sizes = cfg.sizes()
    bufs = {s: torch.ones(max(n, s // 4), dtype=torch.float32, device=rt.device) for s in sizes}
    parts = {s: torch.empty(max(n, s // 4) // n, dtype=torch.float32, device=rt.device)
             for s in sizes if s >= SHARDED_FROM_BYTES}
    ops = {"allreduce": lambda s: dist.all_reduce(bufs[s]),
           # rank 0's clock holds the round trip: half of it is one way
           "message": lambda s: _pingpong(rt, bufs[s]),
           "reduce_scatter": lambda s: dist.reduce_scatter_tensor(
               parts[s], bufs[s][:parts[s].numel() * n]),
           "all_gather": lambda s: dist.all_gather_into_tensor(
               bufs[s][:parts[s].numel() * n], parts[s])}
    times = {(op, s): [] for op in ops for s in sizes if op in ("allreduce", "message")
             or s in parts}
    for i in range(cfg.warmup + cfg.iters):
        for s in sizes:
            for op, call in ops.items():
                if (op, s) in times:
                    t = _timed(rt, lambda c=call, s=s: c(s)) / (2 if op == "message" else 1)
                    if i >= cfg.warmup:
                        times[(op, s)].append(t)
        runtime.mark_progress()
    rows = []
    for (name, s), local in times.items():
        gathered = timing.gather_samples(local)
        samples = gathered[0] if name == "message" else slowest_rank(gathered)
        rows.append(_call_row(name, context, s, samples))
    return rows


def _call_row(measurement: str, context: str, size: int, samples) -> dict:
    """One row of the profile's calls of one size: p50, p10, p90, the transfer and the
    scheduler waits (:func:`labkit.machine.formulas.waits`)."""
    t = _p50(samples)
    w = formulas.waits(samples)
    return {"measurement": measurement, "context": context, "size_bytes": size,
            "time_p50_s": t, "bytes_per_s": size / t, "transfer_s": w["transfer_s"],
            "time_p10_s": formulas.percentile(samples, 10),
            "time_p90_s": formulas.percentile(samples, 90),
            "wait_share": w["wait_share"], "wait_excess_s": w["wait_excess_s"]}


def _repeated_rows(rt, cfg) -> list[dict]:
    """The all-reduces up to :data:`~labkit.machine.config.REPEATED_MAX_BYTES` as notebook 01
    times its own: per size, ``warmup`` untimed calls, then ``iters`` calls on one buffer, a
    barrier before each (a call's time: the slowest rank's)."""
    rows = []
    for s in [s for s in cfg.sizes() if s <= REPEATED_MAX_BYTES]:
        buf = torch.ones(max(rt.world_size, s // 4), dtype=torch.float32, device=rt.device)
        for _ in range(cfg.warmup):
            dist.all_reduce(buf)
        local = [_timed(rt, lambda b=buf: dist.all_reduce(b)) for _ in range(cfg.iters)]
        rows.append(_call_row("allreduce_repeated", "idle", s,
                              slowest_rank(timing.gather_samples(local))))
    return rows


#: the passes over the sizes of the back-to-back all-reduces, as the collectives lab makes
STEADY_PASSES = 2
#: the back-to-back all-reduces of a size and context, as a multiple of ``iters``: a busy call's
#: time spreads wide (8 MiB on the 2-vCPU VM: p10 8 ms, p90 21-28 ms), and the p50 of 11 calls
#: read 8.4-15.5 ms in three back-to-back measurements of one launch; 33 calls halve that spread
STEADY_CALLS_PER_ITER = 3


def _steady_calls(rt, buf, calls: int) -> list[float]:
    """``calls`` all-reduces back to back after one untimed call and a barrier, each this
    rank's reading less the one before, timed as the collectives lab times its own
    (:func:`labkit.timing.back_to_back_stamps`)."""
    stamps = timing.back_to_back_stamps(lambda: dist.all_reduce(buf), warmup=1, calls=calls,
                                        device=rt.device)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _steady_rows(rt, cfg) -> list[dict]:
    """``allreduce_steady``: every size's all-reduce called back to back, idle and then while
    a thread in every rank computes (``busy``), in :data:`STEADY_PASSES` passes over the sizes
    (:data:`STEADY_CALLS_PER_ITER` x ``iters`` calls a size in all), each size on a buffer of
    its own: the collectives lab's way, steady state, no barrier between calls (a call's time:
    the slowest rank's). The sweep's calls each follow a barrier and another size's call: where
    the laws on the collectives lab's calls missed in 16 lab runs on the 2-vCPU VM, the sweep
    read the latency floor 1.3-2.2x and a 512 KiB all-reduce 1.4-1.7x (5 of 6) what that lab
    measured."""
    sizes = cfg.sizes()
    total = STEADY_CALLS_PER_ITER * cfg.iters
    per_pass = [total // STEADY_PASSES + (k < total % STEADY_PASSES) for k in range(STEADY_PASSES)]
    local = {(c, s): [] for c in ("idle", "busy") for s in sizes}
    for calls in per_pass:
        for s in sizes:
            buf = torch.ones(max(rt.world_size, s // 4), dtype=torch.float32, device=rt.device)
            local[("idle", s)] += _steady_calls(rt, buf, calls)
            with Busy(cfg.busy_n, rt.device):
                local[("busy", s)] += _steady_calls(rt, buf, calls)
            del buf
        runtime.mark_progress()
    return [_call_row("allreduce_steady", c, s, slowest_rank(timing.gather_samples(t)))
            for (c, s), t in local.items()]


def _pingpong(rt, buf) -> None:
    """Rank 0 sends to rank 1, which sends it back (one way = half the round trip)."""
    if rt.rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    elif rt.rank == 1:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def on_rank(rt: runtime.Runtime, cfg: MachineConfig) -> dict:
    torch.manual_seed(1234 + rt.rank)
    rows = []
    # the products and a training step in miniature (matrix products, elementwise ops and
    # autograd's memory traffic: the co-run slowdown of the labs that train) at several
    # batches, interleaved round by round: their co-run slowdowns are read off one machine state
    mats = [torch.randn(n, n, device=rt.device) for n in cfg.matmul_sizes]
    w1 = torch.randn(cfg.step_width, cfg.step_width, device=rt.device, requires_grad=True)
    w2 = torch.randn(cfg.step_width, cfg.step_width, device=rt.device, requires_grad=True)

    def step_of(x):
        def step():
            w1.grad = w2.grad = None
            (torch.tanh(torch.tanh(x @ w1) @ w2) ** 2).mean().backward()
        return step

    steps = [step_of(torch.randn(b, cfg.step_width, device=rt.device)) for b in cfg.step_batches]
    compute = Interleaved(rt, [lambda a=a: a @ a for a in mats] + steps, cfg)
    compute.rounds(cfg.iters - cfg.iters // 2)  # half now, the rest after the messages
    # copies of several sizes, interleaved: the co-run slowdown of memory traffic depends on
    # where it lives (every rank's copy within the shared cache, or out in the memory)
    srcs = [torch.ones(size // 4, dtype=torch.float32, device=rt.device)
            for size in cfg.copy_bytes]
    pairs = [(src, torch.empty_like(src)) for src in srcs]
    copies = _alone_and_together_each(
        rt, [lambda d=dst, s=src: d.copy_(s) for src, dst in pairs], cfg)
    for size, (alone, together) in zip(cfg.copy_bytes, copies):
        for context, t in (("alone", alone), ("together", together)):
            rows.append({"measurement": "copy", "context": context, "size_bytes": size,
                         "time_p50_s": t, "bytes_per_s": 2 * size / t})
    del srcs, pairs  # up to twice the largest copy a rank: not held through the messages
    rows += _collective_rows(rt, cfg, "idle")
    rows += _repeated_rows(rt, cfg)
    rows += _steady_rows(rt, cfg)
    with Busy(cfg.busy_n, rt.device):
        rows += _collective_rows(rt, cfg, "busy")
    compute.rounds(cfg.iters // 2)
    timed = compute.medians()
    for n, (alone, together) in zip(cfg.matmul_sizes, timed):
        for context, t in (("alone", alone), ("together", together)):
            rows.append({"measurement": "matmul", "context": context, "n": n, "time_p50_s": t,
                         "flop_per_s": 2 * n ** 3 / t})
    for b, (alone, together), paired in zip(cfg.step_batches, timed[len(mats):],
                                            compute.paired[len(mats):]):
        flop = 6 * 2 * b * cfg.step_width ** 2  # forward 2 products, backward 4
        for context, t in (("alone", alone), ("together", together)):
            rows.append({"measurement": "step", "context": context, "n": cfg.step_width,
                         "batch": b, "time_p50_s": t, "flop_per_s": flop / t,
                         **({"paired_slowdowns": paired} if context == "together" else {})})
    if rt.rank != 0:
        return {}
    return {"rows": [{"n": None, "batch": None, "size_bytes": None, **r} for r in rows]}


if __name__ == "__main__":
    worker_main(on_rank, MachineConfig)
