"""Scaling math: pure functions, each with its formula and a worked example.

No torch here (``labkit speedup`` must answer without importing it). Inputs are validated: a
non-positive time or rank count is a :class:`~labkit.errors.UsageError`, not a NaN further on.

Worked reference (DDP training on RTX 2080 Ti, N GPUs -> seconds)::

    N:  1    2    3   4   5   6   7   8   9   10
    t: 171  108  79  64  57  52  51  49  49  49

    speedup(171, 49)          = 3.49      (N = 8)
    relative_su(3.49, 8)      = 2.29      (the 8-GPU job costs 2.29x the 1-GPU job)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from labkit.config import positive_int
from labkit.errors import UsageError

PERCENTILES = (50, 75, 90, 95)


def _positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise UsageError(f"{name} must be a positive finite number, got {value!r}")
    return v


def positive_count(name: str, value) -> int:
    """A count (ranks, nodes, microbatches, steps) >= 1, as an int: the check of
    :func:`labkit.config.positive_int`, but a whole number read from a table (numpy's int, a
    float like 4.0) counts too.

    >>> positive_count("ranks", 4.0), positive_count("ranks", 2)
    (4, 2)
    """
    if (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and float(value).is_integer()):
        value = int(value)
    return positive_int(name, value)


def speedup(t1: float, tn: float) -> float:
    """Speedup s = t1 / tN.

    >>> round(speedup(171, 49), 2)
    3.49
    """
    return _positive("t1", t1) / _positive("tN", tn)


def strong_efficiency(t1: float, tn: float, n: int) -> float:
    """Strong-scaling (fixed total work) efficiency E = s / N = t1 / (N tN).

    Perfect scaling is E = 1. Example: t1 = 171 s, t8 = 49 s -> 3.49 / 8 = 0.436.

    >>> round(strong_efficiency(171, 49, 8), 3)
    0.436
    """
    return speedup(t1, tn) / positive_count("N", n)


def weak_efficiency(t1: float, tn: float) -> float:
    """Weak-scaling (fixed work per rank) efficiency E = t1 / tN: the ideal time stays flat.

    >>> weak_efficiency(2.0, 2.5)
    0.8
    """
    return _positive("t1", t1) / _positive("tN", tn)


def throughput_efficiency(thr1: float, thrn: float, n: int) -> float:
    """Throughput efficiency E = (thrN / N) / thr1: work per second per rank against one rank.

    >>> throughput_efficiency(100.0, 180.0, 2)
    0.9
    """
    per_rank = _positive("throughput N", thrn) / positive_count("N", n)
    return per_rank / _positive("throughput 1", thr1)


def model_error_pct(*, model_s: float, measured_s: float) -> float:
    """Model error in % of the measurement: 100·(model − measured)/measured (every lab puts
    its prediction beside its measurement this way).

    >>> model_error_pct(model_s=1.1, measured_s=1.0)
    10.000000000000009
    """
    if measured_s <= 0:
        raise UsageError(f"measured time must be > 0, got {measured_s}")
    return relative_error_pct(model_s, measured_s)


def relative_error_pct(value: float, reference: float) -> float:
    """100·(value − reference)/reference, for any two quantities (bytes, FLOPs, one engine's
    term against another's): 0 where both are 0, NaN where only the reference is.

    >>> relative_error_pct(12, 10), relative_error_pct(0, 0), relative_error_pct(3, 0)
    (20.0, 0.0, nan)
    """
    if not (isinstance(reference, (int, float)) and reference):
        return 0.0 if value == reference else math.nan
    return 100.0 * (value - reference) / reference


def ratio_split(*, base_s: float, compute_s: float, step_s: float, ranks: int = 1,
                names: tuple = ("t_1", "t_c", "t_N")) -> dict | None:
    """A measured speedup  N · base / step  taken apart into measured factors that multiply to
    it: N (left out at 1), base / compute (the compute's own gain, or 1 / its slowdown, as it
    ran on the N ranks) and compute / step (the compute's share of the step: what the
    communication and the waits leave of it). ``names``: how the three times are written.
    None where one is missing or not positive.

    A DDP step of 20 ms whose compute ran 12.5 ms, against 10 ms alone: 2 x 0.8 x 0.625 = 1.0.

    >>> ratio_split(ranks=2, base_s=10.0, compute_s=12.5, step_s=20.0)
    {'N': 2.0, 't_1 / t_c': 0.8, 't_c / t_N (its share of the step)': 0.625}
    """
    times = (base_s, compute_s, step_s)
    if not all(t is not None and t == t and t > 0 for t in times):
        return None
    base, compute, step = names
    out = {"N": float(ranks)} if ranks != 1 else {}
    return {**out, f"{base} / {compute}": base_s / compute_s,
            f"{compute} / {step} (its share of the step)": compute_s / step_s}


def slowdown_split(*, alone_s: float, together_s: float, scale: float = 1e3,
                   names: tuple = ("alone", "together")) -> dict | None:
    """A time measured with every rank at it, in measured factors that multiply to it (times
    ``scale``, ms by default): the same work's time alone, and the slowdown measured between
    the two. A co-run law that misses thus shows whether the machine's slowdown or the work
    alone moved. None where one is missing or not positive.

    >>> slowdown_split(alone_s=0.040, together_s=0.046)
    {'alone (ms)': 40.0, 'together / alone (the slowdown measured)': 1.15}
    """
    if not all(t is not None and t == t and t > 0 for t in (alone_s, together_s)):
        return None
    a, t = names
    return {f"{a} (ms)" if scale == 1e3 else a: round(alone_s * scale, 12),
            f"{t} / {a} (the slowdown measured)": round(together_s / alone_s, 12)}


def relative_su(s: float, n: int) -> float:
    """Relative service units N / s: what an N-rank job costs against its serial run.

    A job that scales perfectly (s = N) costs 1.0; RTX 2080 Ti at N = 8: 8 / 3.49 = 2.29.

    >>> round(relative_su(171 / 49, 8), 2)
    2.29
    """
    return positive_count("N", n) / _positive("speedup", s)


def service_units(walltime_s: float, *, cores: int = 0, gpus: int = 0) -> float:
    """Service units SU = (cores + 2 * GPUs) * walltime in hours.

    A 1-GPU, 1-core job of 171 s: (1 + 2) * 171 / 3600 = 0.1425 SU.

    >>> round(service_units(171, cores=1, gpus=1), 4)
    0.1425
    """
    if cores < 0 or gpus < 0:
        raise UsageError(f"cores and gpus must be >= 0, got cores={cores}, gpus={gpus}")
    if cores + gpus == 0:
        raise UsageError("a job uses at least one core or one GPU")
    return (cores + 2 * gpus) * _positive("walltime_s", walltime_s) / 3600.0


def amdahl_speedup(serial_fraction: float, n: int) -> float:
    """Amdahl's law s(N) = 1 / (f + (1 - f) / N) for serial fraction f of the 1-rank time.

    >>> round(amdahl_speedup(0.1, 8), 3)
    4.706
    """
    f = float(serial_fraction)
    if not 0 <= f <= 1:
        raise UsageError(f"serial fraction must be in [0, 1], got {serial_fraction!r}")
    n = positive_count("N", n)
    return 1.0 / (f + (1.0 - f) / n)


def gustafson_speedup(serial_fraction: float, n: int) -> float:
    """Gustafson's scaled speedup s(N) = N - f (N - 1), f the serial fraction of the N-rank run.

    >>> gustafson_speedup(0.1, 8)
    7.3
    """
    f = float(serial_fraction)
    if not 0 <= f <= 1:
        raise UsageError(f"serial fraction must be in [0, 1], got {serial_fraction!r}")
    n = positive_count("N", n)
    return round(n - f * (n - 1), 12)


def karp_flatt(s: float, n: int) -> float:
    """Karp-Flatt experimentally determined serial fraction e = (1/s - 1/N) / (1 - 1/N).

    Undefined at N = 1 (returns NaN). A growing e with N means overhead grows with N, not a
    fixed serial part. K80, N = 4: s = 226/76 = 2.974 -> e = 0.115.

    >>> round(karp_flatt(226 / 76, 4), 3)
    0.115
    """
    n = positive_count("N", n)
    s = _positive("speedup", s)
    if n == 1:
        return float("nan")
    return (1.0 / s - 1.0 / n) / (1.0 - 1.0 / n)


def fit_amdahl(ns: Sequence[int], times: Sequence[float]) -> float:
    """Least-squares serial fraction f of Amdahl's law, fitted in time space.

    Amdahl's time model is tN / t1 = f + (1 - f) / N, i.e. y = f x with y = tN/t1 - 1/N and
    x = 1 - 1/N. The least-squares slope through the origin is f = sum(x y) / sum(x^2),
    clipped to [0, 1]. Needs the N = 1 time and at least one N > 1.

    RTX 2080 Ti table (above) -> f = 0.187 (Amdahl predicts s(8) = 3.47 against 3.49 measured).

    >>> round(fit_amdahl([1, 2, 4], [100, 55, 32.5]), 3)
    0.1
    """
    table = _time_table(ns, times)
    if len(table) < 2:
        raise UsageError("an Amdahl fit needs the N = 1 time and at least one N > 1")
    t1 = table[1]
    x = np.array([1 - 1 / n for n in table if n > 1])
    y = np.array([table[n] / t1 - 1 / n for n in table if n > 1])
    f = float(np.dot(x, y) / np.dot(x, x))
    return min(1.0, max(0.0, f))


def knee(ns: Sequence[int], efficiencies: Sequence[float], threshold: float = 0.5) -> int:
    """The largest N whose efficiency is still >= threshold (past it, more ranks waste money).

    Efficiency usually falls with N; the knee is taken over the ranks in increasing order and
    stops at the first N below the threshold. RTX 2080 Ti at threshold 0.5: N = 6 (E = 0.548;
    E(7) = 0.479).

    >>> knee([1, 2, 4, 8], [1.0, 0.9, 0.6, 0.3], threshold=0.5)
    4
    """
    if not 0 < threshold <= 1:
        raise UsageError(f"threshold must be in (0, 1], got {threshold!r}")
    pairs = sorted(zip(ns, efficiencies))
    best = pairs[0][0]
    for n, e in pairs:
        if e < threshold:
            break
        best = n
    return int(best)


def cheapest_for_deadline(ns: Sequence[int], times: Sequence[float], deadline_s: float,
                          *, cores_per_rank: int = 0, gpus_per_rank: int = 1) -> int | None:
    """The N with the fewest service units whose time meets the deadline (None if none does).

    SU(N) = (cores_per_rank + 2 gpus_per_rank) * N * tN / 3600; ties go to the smaller N.

    >>> cheapest_for_deadline([1, 2, 4], [100, 55, 40], deadline_s=60)
    2
    """
    table = _time_table(ns, times)
    deadline_s = _positive("deadline_s", deadline_s)
    best, best_su = None, math.inf
    for n, t in table.items():
        if t <= deadline_s:
            su = service_units(t, cores=cores_per_rank * n, gpus=gpus_per_rank * n)
            if su < best_su - 1e-15:
                best, best_su = n, su
    return best


def _time_table(ns: Iterable[int], times: Iterable[float]) -> dict[int, float]:
    ns, times = list(ns), list(times)
    if len(ns) != len(times):
        raise UsageError(f"{len(ns)} rank counts but {len(times)} times")
    table: dict[int, float] = {}
    for n, t in zip(ns, times):
        n = positive_count("N", n)
        if n in table:
            raise UsageError(f"N = {n} given twice")
        table[n] = _positive(f"time at N = {n}", t)
    if 1 not in table:
        raise UsageError("the N = 1 time is needed: speedup and efficiency are measured against it")
    return dict(sorted(table.items()))


def parse_times(specs: Sequence[str]) -> dict[int, float]:
    """Parse ``["1:226", "2:134"]`` into ``{1: 226.0, 2: 134.0}`` with one-line errors."""
    out: dict[int, float] = {}
    for spec in specs:
        parts = str(spec).split(":")
        if len(parts) != 2:
            raise UsageError(f"--times entry {spec!r} is not N:SECONDS (for example 2:134)")
        try:
            n, t = int(parts[0]), float(parts[1])
        except ValueError:
            raise UsageError(f"--times entry {spec!r} is not N:SECONDS (for example 2:134)") from None
        positive_count(f"N in {spec!r}", n)
        _positive(f"seconds in {spec!r}", t)
        if n in out:
            raise UsageError(f"--times gives N = {n} twice")
        out[n] = t
    if not out:
        raise UsageError("--times needs at least one N:SECONDS entry")
    return out


def speedup_table(times: Mapping[int, float], *, cores_per_rank: int = 0, gpus_per_rank: int = 1,
                  threshold: float = 0.5):
    """The full strong-scaling table for measured times ``{N: seconds}``.

    Returns ``(rows, summary)``: rows (a DataFrame) with ``world_size, time_s, speedup,
    efficiency, relative_su, karp_flatt, amdahl_speedup, su`` and a summary dict with
    the Amdahl serial fraction, the knee at ``threshold`` and the fastest N.
    """
    import pandas as pd

    table = _time_table(list(times), list(times.values()))
    t1 = table[1]
    f = fit_amdahl(list(table), list(table.values())) if len(table) > 1 else float("nan")
    rows = []
    for n, t in table.items():
        s = speedup(t1, t)
        rows.append({
            "world_size": n,
            "time_s": t,
            "speedup": s,
            "efficiency": s / n,
            "relative_su": relative_su(s, n),
            "karp_flatt": karp_flatt(s, n),
            "amdahl_speedup": amdahl_speedup(f, n) if not math.isnan(f) else float("nan"),
            "su": service_units(t, cores=cores_per_rank * n, gpus=gpus_per_rank * n)
            if cores_per_rank + gpus_per_rank > 0 else float("nan"),
        })
    df = pd.DataFrame(rows)
    summary = {
        "amdahl_serial_fraction": f,
        "amdahl_max_speedup": (1 / f) if f and not math.isnan(f) else float("inf"),
        "knee_world_size": knee(df.world_size, df.efficiency, threshold),
        "knee_threshold": threshold,
        "fastest_world_size": int(df.loc[df.time_s.idxmin(), "world_size"]),
    }
    return df, summary


def summarize_times(samples: Sequence[float], prefix: str = "time") -> dict[str, float]:
    """Percentiles p50/p75/p90/p95, min, mean and coefficient of variation (std / mean).

    Keys carry the unit: ``{prefix}_p50_s`` ... ``{prefix}_min_s``, ``{prefix}_mean_s``,
    ``{prefix}_cv``, ``{prefix}_count``. Percentiles use linear interpolation (numpy default).

    >>> summarize_times([1.0, 2.0, 3.0, 4.0], "step_time")["step_time_p50_s"]
    2.5
    """
    a = np.asarray(list(samples), dtype=float)
    if a.size == 0:
        raise UsageError("no timing samples to summarize")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise UsageError("timing samples must be finite and >= 0")
    out = {f"{prefix}_p{p}_s": float(np.percentile(a, p)) for p in PERCENTILES}
    mean = float(a.mean())
    out.update({
        f"{prefix}_min_s": float(a.min()),
        f"{prefix}_mean_s": mean,
        f"{prefix}_cv": float(a.std() / mean) if mean > 0 else 0.0,
        f"{prefix}_count": int(a.size),
    })
    return out


def slowest_rank(samples_by_rank) -> np.ndarray:
    """Per-step time of the slowest rank: ``max`` over ranks of a (world_size, steps) array.

    A synchronous step is done when its last rank is; averaging over ranks hides stragglers.

    >>> slowest_rank([[1.0, 2.0], [1.5, 1.0]]).tolist()
    [1.5, 2.0]
    """
    a = np.asarray(samples_by_rank, dtype=float)
    if a.ndim != 2 or a.size == 0:
        raise UsageError("samples must be a non-empty (world_size, steps) array")
    return a.max(axis=0)
