"""Where a DDP step's time goes, and how it scales (pure: no torch).

A DDP step = forward + backward + optimizer, with the gradient all-reduce started *during*
backward, bucket by bucket. Three measured times tell the story:

* ``t_ddp``: the DDP step (slowest rank, percentiles over steps);
* ``t_nosync``: the same step under ``no_sync()``, i.e. without the all-reduce (compute only);
* ``t_ar``: a standalone all-reduce of all the gradient bytes at once.

The all-reduce's bandwidths are the collectives lab's (:func:`labkit.collectives.formulas.
algbw_gb_per_s`, :func:`~labkit.collectives.formulas.busbw_gb_per_s`, nccl-tests' convention).
From them: the *exposed* communication ``t_ddp - t_nosync`` (what the all-reduce adds to a step),
and the *overlap* ``1 - exposed / t_ar`` (the share of a full all-reduce hidden behind backward).

The sum of a DDP step (:func:`ddp_step_time`)::

    t_DDP(b) = t_c(b) + t_copy + max(0, t_ar - t_window)

``t_c(b)``: compute at ``b`` samples per rank; ``t_ar``: the all-reduces of the gradient
buckets; ``t_copy``: DDP's copies of the gradients into its buckets and back; ``t_window``: the
backward time the all-reduce can hide behind (:func:`overlap_window`). The lab's model of each
term on this machine, from its machine profile, is :mod:`labkit.ddp.predict`. Against one process
without DDP (:func:`ddp_speedup`): ``N t_no_ddp(b) / t_DDP(b)``; with step times linear in the
batch (:func:`fit_step_time`) the batch where that is 1 follows in closed form
(:func:`predicted_crossover_batch`), and the measured one from a sweep (:func:`crossover_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from labkit.config import positive_int, positive_number
from labkit.errors import UsageError


def exposed_comm_s(ddp_step_s: float, nosync_step_s: float) -> float:
    """Communication a DDP step does not hide: max(0, t_ddp - t_nosync).

    >>> round(exposed_comm_s(0.0515, 0.024), 4)
    0.0275
    """
    return max(0.0, positive_number("ddp step time", ddp_step_s)
               - positive_number("no_sync step time", nosync_step_s))


def overlap_fraction(exposed_s: float, allreduce_s: float) -> float:
    """Share of the gradient all-reduce hidden behind backward: 1 - exposed / t_ar, in [0, 1].

    0 means DDP's step pays the whole all-reduce on top of compute; 1 means it pays none.
    Example: 28 ms all-reduce, 27.5 ms exposed -> 0.018 (almost nothing hidden).

    >>> round(overlap_fraction(0.0275, 0.028), 3)
    0.018
    """
    if exposed_s < 0:
        raise UsageError(f"exposed time must be >= 0, got {exposed_s!r}")
    return min(1.0, max(0.0, 1.0 - exposed_s / positive_number("all-reduce time", allreduce_s)))


def mfu(*, flop_per_sample: float, batch: int, step_s: float, peak_flop_per_s: float) -> float:
    """Model FLOPs utilisation of one rank's training step: the model's FLOPs of the step
    (forward and backward of ``batch`` samples, :func:`labkit.ddp.budget.flop_per_sample`,
    counted from the model's shapes) per second of step, over the peak rate of one rank.

    The default MLP (25.3 MFLOP a sample) at batch 128 in 0.1 s: 32.4 GFLOP/s, 72% of a peak of
    45 GFLOP/s:

    >>> round(mfu(flop_per_sample=25.3e6, batch=128, step_s=0.1, peak_flop_per_s=45e9), 2)
    0.72
    """
    return (positive_number("FLOP per sample", flop_per_sample) * positive_int("batch", batch)
            / positive_number("step time", step_s) / positive_number("peak rate", peak_flop_per_s))


def add_mfu_columns(rows: Iterable[dict], *, flop_per_sample: float, peak_flop_per_s: float,
                    catalog_peak_flop_per_s: float | None = None) -> list[dict]:
    """Rows (no-DDP and DDP) with their model FLOPs per step and per second of one rank and
    their :func:`mfu` against ``peak_flop_per_s`` (the machine's measured peak of one rank) and,
    where given, against a catalogue's peak (a GPU's datasheet). Other rows unchanged.

    >>> r = add_mfu_columns([{"variant": "ddp", "batch_size": 128, "step_time_p50_s": 0.1}],
    ...                     flop_per_sample=25.3e6, peak_flop_per_s=45e9)[0]
    >>> round(r["model_flop_per_s"] / 1e9, 2), round(r["mfu"], 2)
    (32.38, 0.72)
    """
    rows = [dict(r) for r in rows]
    for r in rows:
        t = row_value(r, "step_time_p50_s")
        if r.get("variant") not in ("ddp", "no_ddp") or not t > 0:
            continue
        flop = float(flop_per_sample) * int(r["batch_size"])
        r.update(model_flop_per_step=flop, model_flop_per_s=flop / t,
                 peak_flop_per_s=float(peak_flop_per_s),
                 mfu=mfu(flop_per_sample=flop_per_sample, batch=int(r["batch_size"]), step_s=t,
                         peak_flop_per_s=peak_flop_per_s))
        if catalog_peak_flop_per_s:
            r.update(catalog_peak_flop_per_s=float(catalog_peak_flop_per_s),
                     mfu_catalog=flop / t / float(catalog_peak_flop_per_s))
    return rows


def row_value(row: dict, key: str) -> float:
    """A row's finite number, else NaN (a missing or non-numeric field)."""
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
    ref = references(rows, "ddp", world_size=1)
    base = references(rows, "no_ddp")
    whole = references(rows, "no_ddp_all_cores")
    for r in rows:
        n, t = int(r.get("world_size") or 1), row_value(r, "step_time_p50_s")
        t1 = row_value(ref.get(benchmark_key(r), {}), "step_time_p50_s")
        t0 = row_value(base.get(benchmark_key(r), {}), "step_time_p50_s")
        r["speedup"] = n * t1 / t if r.get("variant") == "ddp" else math.nan
        r["scaling_efficiency"] = t1 / t if r.get("variant") == "ddp" else math.nan
        r["speedup_vs_no_ddp"] = n * t0 / t
        if r.get("variant") == "ddp" and whole:
            tw = row_value(whole.get(benchmark_key(r), {}), "step_time_p50_s")
            r["speedup_vs_all_cores"] = n * tw / t
    return rows


#: the settings that make two rows the same benchmark: the model and its sizes, the batch per
#: rank, the DDP flags and the device (a row's key adds its variant and world size)
BENCHMARK = ("model", "input_dim", "hidden_dim", "output_dim", "num_layers", "image_size",
             "seq_len", "num_heads", "batch_size", "bucket_cap_mb", "broadcast_buffers",
             "static_graph", "gradient_as_bucket_view", "device")


def benchmark_key(r: dict) -> tuple:
    """What makes two rows the same benchmark (:data:`BENCHMARK`)."""
    return tuple(str(r.get(k)) for k in BENCHMARK)


def references(rows: list[dict], variant: str, **equal) -> dict:
    """The rows of ``variant`` (with the given fields) by their benchmark."""
    return {benchmark_key(r): r for r in rows if r.get("variant") == variant
            and all(r.get(k) == v for k, v in equal.items())}


def ddp_speedup(*, ranks: int, noddp_step_s: float, ddp_step_s: float) -> float:
    """Throughput of N DDP ranks against one process without DDP, each rank training on as
    many samples per step as that process: N t_no_DDP / t_DDP.

    >>> ddp_speedup(ranks=2, noddp_step_s=0.275, ddp_step_s=0.30)
    1.8333333333333335
    """
    return (positive_int("ranks", ranks) * positive_number("no-DDP step time", noddp_step_s)
            / positive_number("DDP step time", ddp_step_s))


def ddp_step_time(*, compute_s: float, allreduce_s: float, bucket_copy_s: float = 0.0,
                  overlap_window_s: float = 0.0) -> float:
    """The model of a DDP step: compute, DDP's gradient copies, and the all-reduce that the
    overlap window does not hide::

        t_DDP = t_c + t_copy + max(0, t_ar - t_window)

    ``compute_s``: the step without the all-reduce (its ``no_sync`` step); ``allreduce_s``: the
    all-reduces of every gradient bucket; ``bucket_copy_s``: DDP copying each
    gradient into its bucket (scaled by 1/N) and back, work on the cores that compute, so never
    hidden; ``overlap_window_s``: the part of backward the all-reduce can run behind
    (:func:`overlap_window`). Left out: DDP's fixed costs per step (its hooks, waking a rank
    that waits for the other), a few milliseconds that dominate only steps of a few
    milliseconds (tiny models). 30 ms of compute, a 16 ms all-reduce, 6 ms of copies, nothing
    hidden; then 300 ms of compute whose backward hides 200 ms:

    >>> round(ddp_step_time(compute_s=0.030, allreduce_s=0.016, bucket_copy_s=0.006), 6)
    0.052
    >>> round(ddp_step_time(compute_s=0.300, allreduce_s=0.016, overlap_window_s=0.2), 6)
    0.3
    """
    for name, v in (("bucket copy time", bucket_copy_s), ("all-reduce time", allreduce_s),
                    ("overlap window", overlap_window_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {v!r}")
    return (positive_number("compute time", compute_s) + bucket_copy_s
            + max(0.0, allreduce_s - overlap_window_s))


def overlap_window(*, compute_s: float, bucket_bytes) -> float:
    """The backward time a DDP step's all-reduce can hide behind::

        t_window = 2/3 t_c (1 - S_first / S)

    A bucket is all-reduced once backward has produced all its gradients, the last layers'
    first. The first bucket's all-reduce can start when backward has done its share
    ``S_first / S`` of the gradients, and the all-reduces run beside the rest of backward
    (about 2/3 of the compute: backward does twice the forward's products); the last bucket's
    all-reduce never overlaps. One bucket (DDP's default cap of 25 MB holds all 16.8 MB of the
    lab's MLP) leaves no window. The window is time the all-reduce *can* hide in: it hides
    only where something else runs it (a GPU's copy engines and NCCL's kernels, or a spare
    core for gloo; :func:`labkit.ddp.predict.spare_core`).

    >>> overlap_window(compute_s=0.3, bucket_bytes=[16e6])
    0.0
    >>> round(overlap_window(compute_s=0.3, bucket_bytes=[4e6, 4e6, 4e6, 4e6]), 3)
    0.15
    """
    sizes = [float(b) for b in bucket_bytes]
    if len(sizes) < 2:
        return 0.0
    return 2.0 / 3.0 * positive_number("compute time", compute_s) * (1.0 - sizes[0] / sum(sizes))


def fit_step_time(batches, times) -> tuple[float, float]:
    """Least-squares fixed time t0 (s) and time per sample c (s) of ``t(b) = t0 + c b`` over a
    batch sweep, minimising relative error (small batches count as much as large ones);
    a negative t0 (noise) is clamped to 0.

    >>> fit_step_time([16, 64, 256, 1024], [0.012 + 2.6e-4 * b for b in (16, 64, 256, 1024)])
    (0.012, 0.00026)
    """
    import numpy as np

    b = np.asarray(batches, dtype=float)
    t = np.asarray(times, dtype=float)
    if b.shape != t.shape or len(np.unique(b)) < 2:
        raise UsageError("the step-time fit needs at least two distinct batch sizes")
    if np.any(b <= 0) or np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise UsageError("the step-time fit needs positive batch sizes and times")
    a = np.column_stack([np.ones_like(b), b]) / t[:, None]
    (t0, c), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if t0 < 0:
        t0, c = 0.0, float(np.sum(b / t) / np.sum((b / t) ** 2))
    if c <= 0:
        raise UsageError("the step-time fit found no time per sample: sweep larger batches")
    return round(float(t0), 12), round(float(c), 12)


def predicted_crossover_batch(*, ranks: int, noddp_fixed_s: float, noddp_per_sample_s: float,
                              compute_fixed_s: float, compute_per_sample_s: float,
                              comm_s: float) -> float:
    """The batch per rank from which N DDP ranks out-run one process without DDP.

    With ``t_no_DDP(b) = a0 + a1 b`` and a DDP step ``t_c(b) + E = c0 + c1 b + E`` (E: what DDP
    adds: copies, exposed all-reduce and counted waits), ``N t_no_DDP(b) = t_c(b) + E`` at

        b* = (c0 + E - N a0) / (N a1 - c1)

    0 when DDP pays at any batch, ``inf`` when it never does. Same compute on both sides
    (12 ms + 0.26 ms per sample), 23 ms added by DDP, 2 ranks: DDP pays from 42 samples on.

    >>> round(predicted_crossover_batch(ranks=2, noddp_fixed_s=0.012, noddp_per_sample_s=2.6e-4,
    ...                                 compute_fixed_s=0.012, compute_per_sample_s=2.6e-4,
    ...                                 comm_s=0.023), 1)
    42.3
    """
    n = positive_int("ranks", ranks)
    num = compute_fixed_s + comm_s - n * noddp_fixed_s
    den = n * noddp_per_sample_s - compute_per_sample_s
    if num <= 0 and den >= 0:
        return 0.0
    if den <= 0:
        return math.inf if num > 0 else 0.0
    return num / den


def crossover_batch(batches, speedups) -> float:
    """The measured batch from which DDP pays: where the speedup, read along the sweep, crosses 1
    for the last time (interpolated linearly in log batch between the two batches around it).
    NaN when the sweep does not bracket it: every speedup >= 1 (it lies below the smallest
    batch) or the largest batch's < 1 (DDP does not pay in this sweep).

    >>> round(crossover_batch([16, 32, 64, 128], [0.8, 0.9, 1.1, 1.3]), 2)
    45.25
    >>> crossover_batch([16, 32, 64], [1.1, 1.2, 1.3]), crossover_batch([16, 32], [0.5, 0.9])
    (nan, nan)
    """
    pairs = sorted(zip((float(b) for b in batches), (float(s) for s in speedups)))
    if len(pairs) < 2:
        raise UsageError("a crossover needs a sweep of at least two batch sizes")
    below = [i for i, (_, s) in enumerate(pairs) if s < 1.0]
    if not below or below[-1] == len(pairs) - 1:
        return math.nan
    (b0, s0), (b1, s1) = pairs[below[-1]], pairs[below[-1] + 1]
    f = (1.0 - s0) / (s1 - s0)
    return math.exp(math.log(b0) + f * (math.log(b1) - math.log(b0)))


def param_count(*, model: str, input_dim: int, hidden_dim: int, output_dim: int,
                num_layers: int, seq_len: int = 32) -> int:
    """Parameters of the lab's models (labkit.ddp.models), counted from their shapes.

    * mlp: ``i h + h + (L-1)(h^2 + h) + h o + o``;
    * cnn: 3x3 convolutions without bias, BatchNorm (2 per channel), a linear head:
      ``9 i c + 2 c + (L-1)(9 c^2 + 2 c) + c o + o``;
    * transformer: embedding ``i d + d``, positions ``s d``, per encoder layer
      ``12 d^2 + 13 d`` (attention 4 d^2 + 4 d, feed-forward 8 d^2 + 5 d, two norms 4 d),
      head ``d o + o``.

    MLP 1024 -> 4096 -> 4096 -> 10: 1024·4096 + 4096 + 4096·4096 + 4096 + 4096·10 + 10.

    >>> param_count(model="mlp", input_dim=1024, hidden_dim=4096, output_dim=10, num_layers=2)
    21020682
    """
    i, h, o, n = input_dim, hidden_dim, output_dim, num_layers
    if model == "mlp":
        return i * h + h + (n - 1) * (h * h + h) + h * o + o
    if model == "cnn":
        return 9 * i * h + 2 * h + (n - 1) * (9 * h * h + 2 * h) + h * o + o
    return i * h + h + seq_len * h + n * (12 * h * h + 13 * h) + h * o + o


def memory_bytes_per_rank(*, params: int, batch_size: int, activations_per_sample: float,
                          sample_values: int, batches: int) -> float:
    """Bytes one DDP rank holds at its peak (float32), estimated before a launch.

    Parameters, gradients, SGD momentum and DDP's gradient buckets: ``4 x 4 P``; activations
    kept for backward, twice over (forward outputs and their gradients):
    ``2 x 4 b a``; the synthetic batches ``4 n b v``; Python, torch and gloo ~0.4 GB.

    >>> round(memory_bytes_per_rank(params=4_241_418, batch_size=1024,
    ...                             activations_per_sample=9_000, sample_values=1024,
    ...                             batches=8) / 1e9, 3)
    0.575
    """
    return (0.4e9 + 16 * params + 8 * batch_size * activations_per_sample
            + 4 * batches * batch_size * sample_values)
