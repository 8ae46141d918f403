"""Where a DDP step's time goes, and how it scales (pure: no torch).

A DDP step = forward + backward + optimizer, with the gradient all-reduce started *during*
backward, bucket by bucket. Three measured times tell the story:

* ``t_ddp``: the DDP step (slowest rank, percentiles over steps);
* ``t_nosync``: the same step under ``no_sync()``, i.e. without the all-reduce (compute only);
* ``t_ar``: a standalone all-reduce of all the gradient bytes at once.

From them: the *exposed* communication ``t_ddp - t_nosync`` (what the all-reduce adds to a step),
and the *overlap* ``1 - exposed / t_ar`` (the share of a full all-reduce hidden behind backward).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import UsageError
from ..metrics import _positive, _ranks
from .config import ROW_KEY


def algbw_gb_per_s(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth algbw = S / t, in GB/s (1e9 bytes), S = bytes each rank contributes.

    >>> algbw_gb_per_s(16_834_600, 0.010)
    1.68346
    """
    if nbytes < 0:
        raise UsageError(f"nbytes must be >= 0, got {nbytes!r}")
    return nbytes / _positive("seconds", seconds) / 1e9


def busbw_gb_per_s(algbw: float, world_size: int) -> float:
    """All-reduce bus bandwidth busbw = algbw x 2(N-1)/N (nccl-tests' convention).

    A ring all-reduce moves 2(N-1)/N of the buffer through each rank's link, so busbw is what
    each link carried: comparable across N, and against the link's peak. N = 1 moves nothing: 0.

    >>> busbw_gb_per_s(1.0, 2)
    1.0
    >>> busbw_gb_per_s(1.0, 4)
    1.5
    """
    n = _ranks("world_size", world_size)
    if algbw < 0:
        raise UsageError(f"algbw must be >= 0, got {algbw!r}")
    return algbw * 2 * (n - 1) / n


def exposed_comm_s(ddp_step_s: float, nosync_step_s: float) -> float:
    """Communication a DDP step does not hide: max(0, t_ddp - t_nosync).

    >>> round(exposed_comm_s(0.0515, 0.024), 4)
    0.0275
    """
    return max(0.0, _positive("ddp step time", ddp_step_s) - _positive("no_sync step time",
                                                                         nosync_step_s))


def overlap_fraction(exposed_s: float, allreduce_s: float) -> float:
    """Share of the gradient all-reduce hidden behind backward: 1 - exposed / t_ar, in [0, 1].

    0 means DDP's step pays the whole all-reduce on top of compute; 1 means it pays none.
    Example: 28 ms all-reduce, 27.5 ms exposed -> 0.018 (almost nothing hidden).

    >>> round(overlap_fraction(0.0275, 0.028), 3)
    0.018
    """
    if exposed_s < 0:
        raise UsageError(f"exposed time must be >= 0, got {exposed_s!r}")
    return min(1.0, max(0.0, 1.0 - exposed_s / _positive("all-reduce time", allreduce_s)))


def _get(row: dict, key: str) -> float:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def add_scaling_columns(rows: Iterable[dict]) -> list[dict]:
    """Rows with speedup and efficiency against the 1-rank DDP run of the same benchmark.

    Data parallelism keeps the batch *per rank* fixed, so it is weak scaling measured in
    throughput: speedup = thr_N / thr_1 = N t_1 / t_N (aggregate samples/s, p50 step times),
    scaling efficiency = speedup / N = t_1 / t_N. ``speedup_vs_no_ddp`` = thr_N / thr_no_ddp,
    the honest number (what N ranks buy over one process without DDP at all). Rows of another
    benchmark (model, batch, flags) are matched separately; a missing reference leaves NaN.

    >>> rows = [{"variant": "ddp", "world_size": 1, "step_time_p50_s": 0.02, "batch_size": 64},
    ...         {"variant": "ddp", "world_size": 2, "step_time_p50_s": 0.04, "batch_size": 64}]
    >>> [r["scaling_efficiency"] for r in add_scaling_columns(rows)]
    [1.0, 0.5]
    """
    rows = [dict(r) for r in rows]
    skip = {"variant", "world_size", "nproc_per_node", "nnodes", "threads_per_rank",
            "oversubscribed", "launch_wall_time_s", "placement", "timestamp"}

    def bench(r):  # the settings that define "the same benchmark"
        return tuple(str(r.get(k)) for k in ROW_KEY if k not in skip)

    ref, base = {}, {}
    for r in rows:
        if r.get("variant") == "ddp" and r.get("world_size") == 1:
            ref[bench(r)] = r
        elif r.get("variant") == "no_ddp":
            base[bench(r)] = r
    for r in rows:
        n, t = int(r.get("world_size") or 1), _get(r, "step_time_p50_s")
        one, nod = ref.get(bench(r)), base.get(bench(r))
        t1 = _get(one, "step_time_p50_s") if one else math.nan
        t0 = _get(nod, "step_time_p50_s") if nod else math.nan
        r["speedup"] = n * t1 / t if r.get("variant") == "ddp" else math.nan
        r["scaling_efficiency"] = t1 / t if r.get("variant") == "ddp" else math.nan
        r["speedup_vs_no_ddp"] = n * t0 / t
    return rows
