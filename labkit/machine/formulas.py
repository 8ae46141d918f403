"""The profile's arithmetic (pure: no torch).

Three rules carry a measurement taken at a few points to the point a model asks about:

* **interpolation in log-log**: a time measured at sizes s_i is read at s between two of them on
  the straight line through their logarithms (times of collectives and products are power laws
  piece by piece, so a straight line in log-log is the natural in-between);
* **the co-run slowdown**: ``t_together / t_alone``, one rank's work timed with every rank of
  the launch doing the same at once, over the same work timed alone;
* **oversubscription**: with more ranks than cores, each core runs ranks/cores of them in turn,
  so the slowdown grows by that factor on top of the co-run slowdown measured at one rank a core;
* **two kinds of call** (:func:`waits`): a message moves at its transfer's pace, or it also
  waits for the scheduler to give one of its threads a core (on a machine whose cores are all
  computing, up to a scheduler tick: about 4 ms at HZ = 250). The two are predicted apart: how
  often a call waits changes from second to second, how long it takes when it does does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def loglog_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """y at ``x`` on the piecewise straight line through (log xs, log ys); outside the measured
    range, the nearest segment's line continued (a power law extrapolated one step).

    >>> loglog_interp(4, [1, 16], [1, 4])     # y = sqrt(x)
    2.0
    >>> round(loglog_interp(64, [1, 4, 16], [1, 2, 4]), 6)   # continued: y = sqrt(x)
    8.0
    >>> loglog_interp(3, [3], [7])
    7.0
    """
    pts = sorted((float(a), float(b)) for a, b in zip(xs, ys) if a > 0 and b > 0)
    if not pts:
        raise ValueError("no positive points to interpolate")
    if len(pts) == 1:
        return pts[0][1]
    lx = math.log(x)
    for i in range(len(pts) - 1):
        (x0, y0), (x1, y1) = pts[i], pts[i + 1]
        if lx <= math.log(x1) or i == len(pts) - 2:
            if lx < math.log(x0) and i > 0:
                continue
            w = (lx - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    raise AssertionError("unreachable")


def sweep_time(size: float, sizes: Sequence[float], times: Sequence[float]) -> float:
    """A message's time read off a measured size sweep: log-log between two measured sizes;
    below the smallest, the smallest's time (a latency floor); above the largest, that time
    scaled with the bytes (bandwidth-bound), never a noisy last segment's slope continued.

    >>> round(sweep_time(2048, [1024, 4096], [1e-3, 4e-3]), 9)
    0.002
    >>> sweep_time(8, [1024, 4096], [1e-3, 4e-3]), sweep_time(8192, [1024, 4096], [1e-3, 4e-3])
    (0.001, 0.008)
    """
    pts = sorted(zip(sizes, times))
    if size <= pts[0][0]:
        return float(pts[0][1])
    if size >= pts[-1][0]:
        return float(pts[-1][1]) * size / pts[-1][0]
    return loglog_interp(size, [p[0] for p in pts], [p[1] for p in pts])


def slowdown(*, t_together_s: float, t_alone_s: float) -> float:
    """The co-run slowdown: the same work with every rank at it at once, over one rank alone.

    >>> slowdown(t_together_s=0.125, t_alone_s=0.1)
    1.25
    """
    if not (t_alone_s > 0 and t_together_s > 0):
        raise ValueError("times must be > 0")
    return t_together_s / t_alone_s


def compute_slowdown(ranks: int, *, co_run: float, measured_ranks: int, cores: int) -> float:
    """How much slower one rank's compute runs with ``ranks`` ranks computing at once.

    1 for one rank; the measured co-run slowdown ``co_run`` (taken with ``measured_ranks``
    ranks, one a core) up to the cores; beyond them, ``co_run · ranks / cores``: each core takes
    ranks/cores of the ranks in turn. Between 2 and ``measured_ranks`` the measured value is the
    best we have; more ranks than measured (still within the cores) keep it too, and say so in
    the profile's warnings.

    >>> compute_slowdown(1, co_run=1.25, measured_ranks=2, cores=2)
    1.0
    >>> compute_slowdown(2, co_run=1.25, measured_ranks=2, cores=2)
    1.25
    >>> compute_slowdown(4, co_run=1.25, measured_ranks=2, cores=2)
    2.5
    """
    if ranks < 1 or cores < 1:
        raise ValueError("ranks and cores must be >= 1")
    if ranks == 1:
        return 1.0
    return max(1.0, co_run) * max(1.0, ranks / cores)


#: a call waited for the scheduler when it took this much longer than its transfer (at least;
#: a quarter of the transfer where that is more: a large message's own spread is no wait)
WAIT_THRESHOLD_S = 1.5e-3
#: that rule in the sentences that count waits: a call waited when it took longer than this
WAIT_RULE = f"transfer + max({WAIT_THRESHOLD_S * 1e3:g} ms, transfer / 4)"


def _cut(transfer_s: float, threshold_s: float) -> float:
    """How much longer than its transfer a call must take to count as one that waited."""
    return max(threshold_s, transfer_s / 4)


def transfer_of(samples: Sequence[float], *, threshold_s: float = WAIT_THRESHOLD_S) -> float:
    """The transfer of a set of calls of one size: the median of those that waited for nothing,
    the calls within the wait threshold (:data:`WAIT_THRESHOLD_S`, or a quarter of the fastest
    call) of the fastest one. A percentile would not do: of 8 calls of which 7 waited, the 10th
    percentile lies between the one that did not and the fastest that did.

    >>> round(transfer_of([1e-3, 1.1e-3, 4.9e-3, 5e-3, 5.2e-3, 5e-3, 4.8e-3, 5.1e-3]), 6)
    0.00105
    """
    xs = sorted(float(t) for t in samples)
    if not xs:
        raise ValueError("transfer of no samples")
    fast = [t for t in xs if t <= xs[0] + _cut(xs[0], threshold_s)]
    return median(fast)


def fastest_split(*, transfer_s: float, fastest_s: float, scale: float = 1e3) -> dict | None:
    """A transfer (the median of the calls that waited for nothing) taken apart into its
    measured terms, in seconds x ``scale`` (ms by default): the fastest call, and how far the
    transfer lies above it. A transfer law that misses with its fastest call already past the
    prediction was slow in every call: the machine at that moment, not one call's luck. None
    where either is missing.

    >>> fastest_split(transfer_s=1.1e-3, fastest_s=1.0e-3)
    {'fastest call': 1.0, "the unwaited calls' median above it": 0.1}
    """
    if transfer_s is None or fastest_s is None or not (math.isfinite(transfer_s)
                                                        and math.isfinite(fastest_s)):
        return None
    return {"fastest call": round(fastest_s * scale, 12),
            "the unwaited calls' median above it": round((transfer_s - fastest_s) * scale, 12)}


def transfer_split(samples: Sequence[float], *, scale: float = 1e3,
                   threshold_s: float = WAIT_THRESHOLD_S) -> dict | None:
    """:func:`fastest_split` of the transfer of ``samples`` (:func:`transfer_of`). None
    without calls.

    >>> transfer_split([1.0e-3, 1.1e-3, 4.9e-3, 1.3e-3])
    {'fastest call': 1.0, "the unwaited calls' median above it": 0.1}
    """
    xs = [float(t) for t in samples if t == t]
    if not xs:
        return None
    return fastest_split(transfer_s=transfer_of(xs, threshold_s=threshold_s), fastest_s=min(xs),
                         scale=scale)


def waits(samples: Sequence[float], *, transfer_s: float | None = None,
          threshold_s: float = WAIT_THRESHOLD_S) -> dict:
    """The calls of one size in one context, split into those that moved at the transfer's pace
    and those that also waited: ``transfer_s`` (given, else :func:`transfer_of` the samples),
    ``wait_share`` (the calls over ``transfer_s`` + the threshold, :data:`WAIT_THRESHOLD_S` or a
    quarter of the transfer), ``wait_excess_s`` (what each of those took beyond the
    transfer).

    Eight calls of 1 ms, two of them 4 ms later (a scheduler tick):

    >>> w = waits([1e-3] * 6 + [5e-3, 5.2e-3])
    >>> w["transfer_s"], w["wait_share"], [round(x, 4) for x in w["wait_excess_s"]]
    (0.001, 0.25, [0.004, 0.0042])
    """
    xs = sorted(float(t) for t in samples)
    if not xs:
        raise ValueError("waits of no samples")
    if transfer_s is None:
        transfer_s = transfer_of(xs, threshold_s=threshold_s)
    cut = transfer_s + _cut(transfer_s, threshold_s)
    excess = [t - transfer_s for t in xs if t > cut]
    return {"transfer_s": float(transfer_s), "wait_share": len(excess) / len(xs),
            "wait_excess_s": excess}


def counted_waits(durations: Sequence[float], transfers: Sequence[float], *,
                  threshold_s: float = WAIT_THRESHOLD_S) -> dict:
    """The messages of one measured step that waited for the scheduler: each measured
    ``durations[i]`` against the transfer the profile predicts for it, ``transfers[i]``
    (:meth:`labkit.machine.Profile.transfer_s`); it waited when it took longer than its
    transfer + the threshold (as :func:`waits` counts the profile's own calls). ``count``,
    ``share`` (of the messages), ``excess_s`` (what each that waited took beyond its
    transfer) and ``flags`` (per message, whether it waited). A step model prices ``count``
    waits at the profile's
    :meth:`~labkit.machine.Profile.scheduler_wait_s`: how often the scheduler made a message
    wait is this run's (it changes from second to second), how long a wait lasts is the
    machine's.

    >>> w = counted_waits([0.3e-3, 4.1e-3, 0.4e-3], [0.3e-3] * 3)
    >>> w["count"], round(w["share"], 3), [round(x * 1e3, 1) for x in w["excess_s"]], w["flags"]
    (1, 0.333, [3.8], [False, True, False])
    """
    if len(durations) != len(transfers):
        raise ValueError("one transfer per measured message")
    pairs = [(float(d), float(t)) for d, t in zip(durations, transfers)]
    flags = [d > t + _cut(t, threshold_s) for d, t in pairs]
    excess = [d - t for (d, t), waited in zip(pairs, flags) if waited]
    n = len(durations)
    return {"count": len(excess), "share": len(excess) / n if n else 0.0, "excess_s": excess,
            "flags": flags}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile, linear between the sorted values (numpy's default).

    >>> percentile([1, 2, 3, 4, 5], 10), percentile([1, 2, 3, 4, 5], 50)
    (1.4, 3.0)
    """
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("percentile of nothing")
    k = (len(v) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def median_index(values: Sequence[float]) -> int:
    """The index of the median value (the lower middle of an even count; ties in order): which
    timed step is the median one, for a timeline of that very step.

    >>> median_index([0.03, 0.01, 0.02, 0.05]), median_index([0.05, 0.04, 0.09, 0.06])
    (2, 0)
    """
    if not len(values):
        raise ValueError("median of nothing")
    order = sorted(range(len(values)), key=lambda k: float(values[k]))
    return order[(len(values) - 1) // 2]


def median(values: Sequence[float]) -> float:
    """The median (the middle of the sorted values; the mean of the middle two).

    >>> median([3, 1, 2]), median([4, 1, 2, 3])
    (2, 2.5)
    """
    v = sorted(values)
    if not v:
        raise ValueError("median of nothing")
    k = len(v) // 2
    return v[k] if len(v) % 2 else (v[k - 1] + v[k]) / 2
