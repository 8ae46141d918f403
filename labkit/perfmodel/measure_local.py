"""Measure this machine for the ``local`` catalog entry (host side: imports torch inside).

α and β come from an all-reduce sweep of the collectives lab (one torchrun launch, gloo on CPU,
or nccl on GPUs); the compute rate from timing forward + backward of the pipeline lab's layer
(``tanh(x @ W)``, 6·b·h² FLOPs) in this process with one thread, the rate one CPU rank gets.
:func:`measure_local` returns the entry and the rows; ``write=True`` stores ``data/local.yaml``.
"""

from __future__ import annotations

import os
import statistics
import time


def measure_compute_rate(hidden: int = 256, batch: int = 64, repeat: int = 30,
                         threads: int = 1) -> float:
    """FLOP/s of forward + backward of ``tanh(x @ W)`` (6·batch·hidden² FLOPs), median of runs."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(hidden, hidden, requires_grad=True)
        x = torch.randn(batch, hidden, requires_grad=True)
        times = []
        for i in range(repeat + 5):
            t = time.perf_counter()
            torch.tanh(x @ w).sum().backward()
            if i >= 5:
                times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(old)
    return 6.0 * batch * hidden * hidden / statistics.median(times)


def _memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 1.0


def measure_local(world_size: int = 2, *, max_bytes: int = 16 << 20, factor: float = 4.0,
                  iters: int = 20, write: bool = False, path=None, timeout_s: float = 300.0,
                  progress: bool = False):
    """Run the all-reduce sweep and the compute timing; return ``(entry, collective_rows)``."""
    import platform

    from labkit.collectives.config import CollectivesConfig
    from labkit.config import to_dict
    from labkit.launch import launch
    from labkit.perfmodel.calibrate import local_from_rows, write_local
    from labkit.procs import available_cores

    cfg = CollectivesConfig(ops=("all_reduce",), min_bytes=8, max_bytes=max_bytes, factor=factor,
                            iters=iters, warmup=5, check=False)
    res = launch("collectives", world_size, to_dict(cfg), timeout_s=timeout_s, threads_per_rank=1)
    rows = res.rows()
    rate = measure_compute_rate()
    r0 = rows[0]
    how = (f"labkit.perfmodel.measure_local.measure_local() on {time.strftime('%Y-%m-%d')}: all-reduce sweep "
           f"8 B..{max_bytes} B (x{factor:g}), {iters} iters, p50 of the slowest rank, "
           f"{world_size} ranks, backend {r0.get('backend')}, 1 thread per rank, alpha/beta by "
           f"labkit.collectives.formulas.fit_alpha_beta; compute = forward+backward of tanh(x @ W), 64x256 @ "
           f"256x256, 1 thread, median of 30")
    entry = local_from_rows(rows, rate, memory_gb=round(_memory_gb(), 1),
                            name=f"this machine ({available_cores()} cores, {platform.machine()}, "
                                 f"{r0.get('backend')})", measured=how)
    if write:
        write_local(entry, path)
    return entry, rows
