"""Rank side: honest timing.

Rules every lab follows through these helpers:

1. warm-up runs first and is not recorded;
2. queued CUDA work is synchronised before every clock read (otherwise you time the launch of
   a kernel, not the kernel);
3. every rank times itself; the samples are gathered from all ranks, and a step's time is the
   *slowest* rank's (a synchronous step ends when its last rank does; a mean over ranks hides
   the straggler that sets the pace);
4. summaries are p50/p75/p90/p95, min, mean and coefficient of variation
   (:func:`labkit.metrics.summarize_times`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from labkit.metrics import slowest_rank, summarize_times
from labkit.runtime import mark_progress, rank_device, sync


def repeat_timed(fn: Callable[[], object], *, warmup: int, repeat: int,
                 device: torch.device | None = None, barrier: bool = True) -> list[float]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed; this rank's seconds.

    With ``barrier`` every timed repeat starts with all ranks together, so per-rank times of
    one repeat are comparable and their maximum is that repeat's wall time. ``device``
    (default: the rank's, :func:`labkit.runtime.rank_device`) is synchronised before each
    clock read.
    """
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup must be >= 0 and repeat >= 1, got {warmup}, {repeat}")
    device = rank_device() if device is None else device
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeat):
        if barrier and dist.is_initialized():
            dist.barrier()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
        mark_progress()  # outside the timed region: a timeout can name a rank that stalls
    return samples


def back_to_back_stamps(fn: Callable[[], object], *, warmup: int, calls: int,
                        device: torch.device | None = None) -> list[float]:
    """This rank's clock readings of ``calls`` calls of ``fn`` back to back: ``warmup``
    untimed calls, one barrier, a reading at its exit, then one after each call (call k takes
    reading k - reading k-1; no barrier between calls, so what is timed is ``fn`` in steady
    state, as in a plain loop). ``device`` is synchronised before every reading."""
    device = rank_device() if device is None else device
    for _ in range(warmup):
        fn()
    sync(device)
    if dist.is_initialized():
        dist.barrier()
    sync(device)
    stamps = [time.perf_counter()]
    for _ in range(calls):
        fn()
        sync(device)
        stamps.append(time.perf_counter())
    return stamps


def gather_samples(local: list[float]) -> np.ndarray:
    """All ranks' samples as a (world_size, n) array, on every rank (n must match).

    One tensor all_gather (not all_gather_object: no pickling) of a tensor made on the rank's
    device (:func:`labkit.runtime.rank_device`): a host tensor is no NCCL buffer.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return np.asarray(local, dtype=np.float64)[None, :]
    t = torch.tensor(local, dtype=torch.float64, device=rank_device())
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def slowest_step_times(local: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(per-step time of the slowest rank, the full (world_size, n) sample array)."""
    allr = gather_samples(local)
    return slowest_rank(allr), allr


def summarize(local: list[float], prefix: str = "step_time") -> dict:
    """Gather, take the slowest rank per step, summarize. Collective: call on every rank."""
    steps, allr = slowest_step_times(local)
    out = summarize_times(steps, prefix)
    # how far the ranks drift apart: the mean over steps of (slowest - fastest) / slowest
    out[f"{prefix}_rank_spread"] = float(np.mean((allr.max(0) - allr.min(0)) / allr.max(0)))
    return out


def stamp(device) -> float | torch.cuda.Event:
    """Now, on ``device``'s clock, without waiting for it: a host clock reading
    (``time.perf_counter``) on a CPU; on CUDA an event recorded on the current stream, which
    marks when the device gets there (a host reading would mark only when the work was queued).
    Read two of them with :func:`seconds_between` once the device has finished."""
    if torch.device(device).type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def seconds_between(origin, later) -> float:
    """Seconds from ``origin`` to ``later``, two :func:`stamp` readings of one device (on CUDA
    only after a synchronisation: an event not yet reached has no time).

    >>> seconds_between(1.25, 1.75)
    0.5
    """
    if isinstance(later, float):
        return later - origin
    return origin.elapsed_time(later) / 1e3


class Stopwatch:
    """Accumulates time into named buckets, synchronising CUDA around each read (``device``,
    default the rank's).

    >>> sw = Stopwatch()
    >>> with sw("spmv"):
    ...     pass
    >>> sorted(sw.totals)
    ['spmv']
    """

    def __init__(self, device: torch.device | None = None, enabled: bool = True):
        self.device = device
        self.enabled = enabled
        self.totals: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def __call__(self, name: str) -> Stopwatch:
        self._name = name
        return self

    def __enter__(self) -> Stopwatch:
        if self.enabled:
            sync(self._device())
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            sync(self._device())
            name = self._name or "total"
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - self._t0

    def _device(self) -> torch.device:
        # resolved at each read: a stopwatch may be made before the rank joins its world
        return rank_device() if self.device is None else self.device

    def reset(self) -> None:
        self.totals.clear()


def gather_stamps(device, payload) -> tuple[list, bool]:
    """Every rank's ``payload`` (what it stamped), on every rank, and whether their stamps
    share one clock: every rank on one host stamping with the host's clock (a CPU's
    ``time.perf_counter``; a GPU's events count on that GPU alone). Collective."""
    import socket

    mine = (socket.gethostname(), torch.device(device).type, payload)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    shared = len({(host, dev) for host, dev, _ in every}) == 1 and every[0][1] == "cpu"
    return [got for *_, got in every], shared


def worst_over_ranks(rt, value: float) -> float:
    """The largest ``value`` of any rank, on every rank. Collective."""
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def in_turns(rt, seconds) -> float:
    """``seconds()`` (a measurement returning seconds) on each rank **alone**: the ranks take
    turns while the others wait in a barrier (a step model multiplies by the machine's co-run
    slowdown where ranks compute at once). The slowest rank's, on every rank. Collective."""
    mine = float("nan")
    for turn in range(rt.world_size):
        if turn == rt.rank:
            mine = seconds()
        if rt.world_size > 1:
            dist.barrier()
    return worst_over_ranks(rt, mine)
