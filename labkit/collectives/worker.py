"""Collectives sweep in the conventions of nccl-tests: time, algbw, busbw and #wrong per size.

Run by hand (``labkit collectives`` builds the same command, one launch per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.collectives.worker \\
        --config '{"ops": ["all_reduce"], "min_bytes": 8, "max_bytes": 67108864, "factor": 2}'

Per size: ``warmup`` untimed calls, one barrier, then calls back to back, each rank stamping
the clock after every call (no barrier in between, so what is timed is the collective in
steady state, as in a plain loop). The ``iters`` calls of a size come in
:data:`~labkit.collectives.config.PASSES` passes over the op's sizes, each after its own
warm-up: a burst of a neighbour's work as long as one size's calls (on the 2-vCPU VM every
call of one 2 MiB all-reduce took 2.9-8.6 ms, the 4 MiB after it 1.8-2.6 ms) then falls on
part of them, not all, and each size's median spans the op's whole sweep. A call's time is the
slowest rank's; rows carry its median and p10/p90, and every rank's first calls on one clock
(``timeline_s``, seconds from the sweep's start, :mod:`labkit.collectives.trace`): the
readings the times are made of, gathered in place of the times, so no clock read is added.
``check`` runs the op once more on known inputs and counts the elements that differ from the
exact answer, summed over ranks (``wrong``). With ``busy`` every all-reduce size is then timed
once more in each pass, on the same buffer, with
:data:`~labkit.collectives.config.BUSY_CALLS_PER_ITER` times the calls, while a thread in every
rank keeps its core computing matrix products (the machine profile's busy context: what
backward does to an all-reduce it overlaps). Buffers live on the rank's device; each row
carries the size's device memory peak (None on a CPU).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.collectives.config import BUSY_CALLS_PER_ITER, CollectivesConfig, pass_iters
from labkit.collectives.formulas import algbw_gb_per_s, busbw_gb_per_s, size_sweep
from labkit.collectives.trace import TRACED_CALLS, call_timeline, one_clock
from labkit.harness import worker_main
from labkit.machine.config import MachineConfig
from labkit.machine.formulas import transfer_of
from labkit.machine.worker import Busy
from labkit.metrics import slowest_rank

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
          "int64": torch.int64}


def buffers(op: str, count: int, n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of one call; ``count`` elements in the whole buffer (nccl-tests' S)."""
    part = count // n
    sizes = {"all_reduce": (count, count), "broadcast": (count, count),
             "all_gather": (part, count), "reduce_scatter": (count, part),
             "all_to_all": (count, count)}[op]
    return (torch.zeros(sizes[0], dtype=dtype, device=device),
            torch.zeros(sizes[1], dtype=dtype, device=device))


def call(op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "broadcast":
        dist.broadcast(inp, src=0)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, inp)
    else:
        dist.all_to_all_single(out, inp)


def count_wrong(op: str, count: int, rt: runtime.Runtime, dtype) -> int:
    """Run ``op`` once on inputs x_r[i] = (r+1) + i mod 5 and count wrong elements, all ranks."""
    n, r = rt.world_size, rt.rank
    inp, out = buffers(op, count, n, dtype, rt.device)
    idx = torch.arange(inp.numel(), device=rt.device)
    offset = r * (count // n) if op == "all_gather" else 0
    inp.copy_((r + 1) + (idx + offset) % 5)
    call(op, inp, out)
    c = count // n
    if op == "all_reduce":
        got, want = inp, n * (n + 1) // 2 + n * (idx % 5)
    elif op == "broadcast":
        got, want = inp, 1 + idx % 5
    elif op == "all_gather":
        j = torch.arange(count, device=rt.device)
        got, want = out, (j // c + 1) + j % 5
    elif op == "reduce_scatter":
        i = torch.arange(c, device=rt.device)
        got, want = out, n * (n + 1) // 2 + n * ((r * c + i) % 5)
    else:  # all_to_all: chunk j of my output is chunk r of rank j's input
        j = torch.arange(count, device=rt.device)
        got, want = out, (j // c + 1) + (r * c + j % c) % 5
    wrong = (got != want.to(got.dtype)).sum().reshape(1).to(torch.int64)  # on the device: nccl
    dist.all_reduce(wrong)
    return int(wrong.item())


def time_op(op: str, inp, out, cfg: CollectivesConfig, device, iters: int) -> list[float]:
    """This rank's clock readings: at the exit of one barrier, then after each of ``iters``
    calls back to back (call k takes reading k - reading k-1), the device synchronised before
    every clock read (nothing to do on a CPU): :func:`labkit.timing.back_to_back_stamps`."""
    return timing.back_to_back_stamps(lambda: call(op, inp, out), warmup=cfg.warmup,
                                      calls=iters, device=device)


def one_host(rt: runtime.Runtime) -> bool:
    """Every rank on this host: their ``time.perf_counter`` readings are one clock."""
    return rt.local_world_size == rt.world_size


def sweep_origin(rt: runtime.Runtime) -> float:
    """The sweep's start, where every timeline's seconds count from: a barrier's exit, the
    first rank's on one clock (:func:`labkit.collectives.trace.one_clock`)."""
    runtime.sync(rt.device)
    dist.barrier()
    runtime.sync(rt.device)
    readings = timing.gather_samples([time.perf_counter()])
    return float(one_clock(readings, same_host=one_host(rt))[:, 0].min())


def timed_calls(op: str, inp, out, cfg: CollectivesConfig, rt: runtime.Runtime,
                origin_s: float, iters: int) -> tuple[np.ndarray, list[dict]]:
    """(each timed call's seconds, the slowest rank's; the calls' timeline): every rank's
    readings (:func:`time_op`) gathered once, their differences the calls' times and, on one
    clock from ``origin_s``, the timeline (:func:`labkit.collectives.trace.call_timeline`)."""
    stamps = timing.gather_samples(time_op(op, inp, out, cfg, rt.device, iters))
    timeline = call_timeline(one_clock(stamps, same_host=one_host(rt)), origin_s=origin_s)
    return slowest_rank(np.diff(stamps, axis=1)), timeline


def joined(parts: list) -> tuple[np.ndarray, list[dict]]:
    """The passes' (times, timeline) of one size as one: the times in a row, the timeline's
    calls numbered on from pass to pass (1, 2, ... as if back to back), the first
    :data:`~labkit.collectives.trace.TRACED_CALLS` kept.

    >>> a = (np.array([1.0]), [{"rank": 0, "call": 1, "start_s": 0.0, "end_s": 1.0}])
    >>> b = (np.array([2.0]), [{"rank": 0, "call": 1, "start_s": 5.0, "end_s": 7.0}])
    >>> t, tl = joined([a, b])
    >>> t.tolist(), [(c["call"], c["start_s"]) for c in tl]
    ([1.0, 2.0], [(1, 0.0), (2, 5.0)])
    """
    times, timeline, before = [], [], 0
    for steps, calls in parts:
        times.append(np.asarray(steps, dtype=np.float64))
        timeline += [{**c, "call": c["call"] + before} for c in calls
                     if c["call"] + before <= TRACED_CALLS]
        before += len(steps)
    return np.concatenate(times), timeline


def _size_pass(op, size, count, cfg, rt, origin, iters, first: bool) -> dict:
    """One pass of one size: its calls idle (and busy, for a busy all-reduce), and on the
    first pass the wrong-element check and the device memory peak."""
    runtime.reset_device_peak(rt.device)
    inp, out = buffers(op, count, rt.world_size, DTYPES[cfg.dtype], rt.device)
    got = {"idle": timed_calls(op, inp, out, cfg, rt, origin, iters)}
    if first:
        got["wrong"] = (count_wrong(op, count, rt, DTYPES[cfg.dtype]) if cfg.check else None)
        got["peak"] = runtime.max_device_peak_bytes(rt.device)
    if cfg.busy and op == "all_reduce":
        with Busy(MachineConfig().busy_n, rt.device) as spin:
            done = spin.count
            got["busy"] = timed_calls(op, inp, out, cfg, rt, origin,
                                      BUSY_CALLS_PER_ITER * iters)
            got["matmuls"] = spin.count - done
    del inp, out  # freed before the next size's peak starts
    return got


def _row(op, size, count, cfg, rt, passes: list) -> dict:
    steps, timeline = joined([p["idle"] for p in passes])
    p10, p50, p90 = (float(np.percentile(steps, q)) for q in (10, 50, 90))
    busy = {"busy_time_p50_s": None, "busy_time_p10_s": None, "busy_time_p90_s": None,
            "busy_transfer_s": None, "busy_matmuls": None, "busy_timeline_s": None}
    if "busy" in passes[0]:
        busy_steps, busy_timeline = joined([p["busy"] for p in passes])
        busy = {f"busy_time_p{q}_s": float(np.percentile(busy_steps, q)) for q in (50, 10, 90)}
        busy["busy_transfer_s"] = transfer_of(busy_steps)
        busy["busy_matmuls"] = int(sum(p["matmuls"] for p in passes))
        busy["busy_timeline_s"] = busy_timeline
    return {
        "op": op, "world_size": rt.world_size, "size_bytes": size, "count": count,
        "dtype": cfg.dtype, "redop": "sum" if op in ("all_reduce", "reduce_scatter") else "none",
        "root": 0 if op == "broadcast" else -1, "iters": cfg.iters,
        "time_p50_s": p50, "time_p10_s": p10, "time_p90_s": p90,
        "transfer_s": transfer_of(steps),
        "time_mean_s": float(np.mean(steps)),
        "algbw_gb_per_s": algbw_gb_per_s(size_bytes=size, time_s=p50),
        "busbw_gb_per_s": busbw_gb_per_s(op=op, ranks=rt.world_size, size_bytes=size,
                                          time_s=p50),
        "wrong": passes[0]["wrong"], "timeline_s": timeline, **busy,
        "device_memory_peak_bytes": passes[0]["peak"],
    }


def on_rank(rt: runtime.Runtime, cfg: CollectivesConfig) -> dict:
    origin = sweep_origin(rt)
    rows = []
    for op in cfg.ops:
        sweep = size_sweep(op, rt.world_size, cfg.min_bytes, cfg.max_bytes, cfg.factor,
                           cfg.dtype, dense_top=cfg.dense_top)
        passes: dict = {size: [] for size, _ in sweep}
        for k, iters in enumerate(pass_iters(cfg.iters)):
            for size, count in sweep:
                passes[size].append(_size_pass(op, size, count, cfg, rt, origin, iters,
                                               first=k == 0))
        for size, count in sweep:
            row = _row(op, size, count, cfg, rt, passes[size])
            rows.append(row)
            runtime.print0(f"{op} {size} B: {row['time_p50_s'] * 1e6:.1f} us")
    return {"rows": rows if rt.rank == 0 else []}


if __name__ == "__main__":
    worker_main(on_rank, CollectivesConfig)
