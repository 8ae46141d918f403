"""The regimes of a size sweep: where the α–β line applies, and the floor below it (pure).

On a real fabric one α–β line runs through a whole sweep. On gloo over a few busy cores a call
is one of two kinds (:func:`labkit.machine.formulas.waits`): it moves at its transfer's pace,
or it also waits for the scheduler to run one of gloo's threads (about a scheduler tick), and
how often calls wait changes from second to second. The model is fitted to the **transfers**
(:func:`labkit.machine.formulas.transfer_of`: the calls that waited for nothing) where the
rows hold them; their p50s mix
both kinds. Even the transfers do not follow one line: large messages follow a line whose
slope is the copy bandwidth, while small ones take a time that barely depends on their size.
One line fitted through both describes neither, so the lab's model is regime-aware:

* the **bandwidth regime** is the :data:`MIN_POINTS` largest sizes, grown downward one size
  at a time while one α–β line fits every size of the run within the tolerance; α and β are
  fitted there only. The three largest are kept whether or not their own line fits each of
  them (the line law at the largest size says whether it does): with fewer no line is tested;
* the **latency regime** is every smaller size: its model is the **floor**, the median of
  their times, reported with its spread (the lowest and highest among them);
* the **naive** law is the single line fitted through every size's p50, kept to show its
  residuals per regime.

A sweep that ends below the crossover S* of its own fit has no bandwidth regime: the bandwidth
term never decided a time there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from labkit.collectives.formulas import (
    busbw_factor,
    collective_time,
    crossover_bytes,
    fit_alpha_beta,
)
from labkit.collectives.waits import call_times, row_transfer
from labkit.errors import UsageError
from labkit.machine.formulas import fastest_split

#: the fewest sizes a bandwidth regime has (two sizes fit any line exactly)
MIN_POINTS = 3
#: how far (symmetric, %) a size of the bandwidth regime may lie from its line
TOLERANCE_PCT = 25.0


def error_pct(predicted: float, measured: float) -> float:
    """Symmetric error in %: the larger of the two relative errors, + when predicted is larger
    (the rule the law tables score by).

    >>> error_pct(2.0, 1.0), error_pct(1.0, 2.0)
    (100.0, -100.0)
    """
    p, m = float(predicted), float(measured)
    if p <= 0 or m <= 0:
        return math.copysign(math.inf, p - m)
    return math.copysign(100.0 * (max(p, m) / min(p, m) - 1.0), p - m)


def p10_split(measured_s: float, p10_s: float) -> dict | None:
    """A measured time (a p50) taken apart into its measured terms, in ms: the p10 (the calls
    least disturbed by the other processes on the cores) and the rest up to the measurement.
    None without a p10.

    >>> p10_split(3e-3, 1e-3)
    {'p10': 1.0, 'p50 - p10': 2.0}
    """
    if not math.isfinite(p10_s) or not math.isfinite(measured_s):
        return None
    return {"p10": p10_s * 1e3, "p50 - p10": (measured_s - p10_s) * 1e3}


@dataclass(frozen=True)
class Regimes:
    """One sweep (one op at one world size) split into its regimes, with each one's model."""

    op: str
    ranks: int
    sizes: tuple  # every size, ascending
    times: tuple  # their times (s): the transfers (p10) where ``statistic`` says so, else p50
    bandwidth_from_bytes: float  # smallest size of the bandwidth regime (inf: none)
    alpha_s: float  # α–β of the bandwidth regime (nan: none)
    beta_bytes_per_s: float
    naive_alpha_s: float  # the single line through every size (nan: no fit)
    naive_beta_bytes_per_s: float
    notes: tuple = field(default=())
    p10s: tuple = field(default=())  # the sizes' p10 times (s), where given: a miss's split
    statistic: str = "p50"  # what ``times`` are: "transfer" (the transfers) or "p50"
    naive_times: tuple = field(default=())  # the p50s the naive line runs through (default times)
    fastests: tuple = field(default=())  # the sizes' fastest calls (s), where given: a split

    def split(self, size_bytes: float, measured_s: float) -> dict | None:
        """A time measured at ``size_bytes`` (read on the sweep) taken apart into its measured
        terms, in ms: where the times are p50s, the p10 there (the calls least disturbed) and
        the rest up to the measurement (:func:`p10_split`); where they are the transfers, the
        fastest call there and the rest up to the transfer
        (:func:`labkit.machine.formulas.fastest_split`). None without those times or outside
        the sweep."""
        if self.statistic == "transfer":
            if not self.fastests:
                return None
            low = time_at(size_bytes, sizes=self.sizes, times=self.fastests)
            return fastest_split(transfer_s=measured_s, fastest_s=low) if low == low else None
        if not self.p10s:
            return None
        return p10_split(measured_s, time_at(size_bytes, sizes=self.sizes, times=self.p10s))

    def floor_split(self) -> dict | None:
        """The latency floor taken apart as :meth:`split` takes a time: the median over the
        regime of its sizes' p10s (or fastest calls, where the times are the transfers), and
        the rest up to the floor. None without those times or a floor
        (:attr:`floor_sizes`)."""
        low = self.fastests if self.statistic == "transfer" else self.p10s
        lows = self._floor_times(low) if low else []
        if not lows:
            return None
        name = "fastest call" if self.statistic == "transfer" else "p10"
        base = float(np.median(lows))
        return {f"{name} (median over the regime)": base * 1e3,
                "the rest of the floor": (self.floor_s - base) * 1e3}

    @property
    def has_bandwidth(self) -> bool:
        return math.isfinite(self.bandwidth_from_bytes)

    def regime(self, size_bytes: float) -> str:
        """``"bandwidth"`` or ``"latency"``."""
        return "bandwidth" if size_bytes >= self.bandwidth_from_bytes else "latency"

    def _part(self, name: str) -> tuple[list, list]:
        pts = [(s, t) for s, t in zip(self.sizes, self.times) if self.regime(s) == name]
        return [p[0] for p in pts], [p[1] for p in pts]

    @property
    def latency_sizes(self) -> list:
        return self._part("latency")[0]

    @property
    def bandwidth_sizes(self) -> list:
        return self._part("bandwidth")[0]

    @property
    def floor_sizes(self) -> list:
        """The sizes of the latency floor: the latency regime's; where one line runs through
        the whole sweep (no latency regime, as on a fabric), the sizes its latency term decides
        (the bandwidth term under a tenth of the line's time there).

        >>> r = Regimes("all_reduce", 2, (8, 1024, 1 << 20, 8 << 20), (3e-4, 3e-4, 1e-3, 6e-3),
        ...             8, 1.5e-4, 1.4e9, 1.5e-4, 1.4e9)
        >>> r.latency_sizes, r.floor_sizes
        ([], [8, 1024])
        """
        lat = self.latency_sizes
        if lat or not self.has_bandwidth:
            return lat
        fixed = self.line_s(0)
        return [s for s in self.sizes if self.line_s(s) - fixed <= 0.1 * self.line_s(s)]

    def _floor_times(self, times=None) -> list:
        keep = set(self.floor_sizes)
        return [t for s, t in zip(self.sizes, self.times if times is None else times)
                if s in keep]

    @property
    def floor_s(self) -> float:
        """The latency floor: the median time over :attr:`floor_sizes` (nan: none)."""
        t = self._floor_times()
        return float(np.median(t)) if t else math.nan

    @property
    def floor_range_s(self) -> tuple[float, float]:
        """The lowest and highest time over :attr:`floor_sizes` (its spread across sizes)."""
        t = self._floor_times()
        return (min(t), max(t)) if t else (math.nan, math.nan)

    @property
    def crossover_bytes(self) -> float:
        """S* of the bandwidth regime's line (nan: no bandwidth regime)."""
        if not self.has_bandwidth:
            return math.nan
        return crossover_bytes(self.op, self.ranks, alpha_s=self.alpha_s,
                               beta_bytes_per_s=self.beta_bytes_per_s)

    @property
    def meeting_bytes(self) -> float:
        """Where the bandwidth regime's line reaches the latency floor: the crossover of the
        regime-aware model where its line has no latency term (α fitted at 0, so S* = 0);
        nan without a floor, a line, or a floor above the line's fixed part.

        >>> r = Regimes("all_reduce", 2, (8, 64, 1 << 20, 2 << 20, 4 << 20),
        ...             (3e-4, 3e-4, 5e-4, 1e-3, 2e-3), 1 << 20, 0.0, 2 ** 21 / 1e-3,
        ...             0.0, 1e9)
        >>> r.meeting_bytes == 0.6 * (1 << 20)  # the line 1 ms per 2 MiB reaches 0.3 ms there
        True
        """
        if not self.has_bandwidth:
            return math.nan
        floor, fixed = self.floor_s, self.line_s(0)
        if not (floor == floor and floor > fixed):
            return math.nan
        per_byte = (self.line_s(1 << 20) - fixed) / (1 << 20)
        return (floor - fixed) / per_byte if per_byte > 0 else math.nan

    @property
    def top_segment(self) -> tuple[int, int]:
        """The indices (i, j) of the sweep's top segment: the largest size j and the largest
        size of the bandwidth regime at most a quarter of it (else the size below it). A
        segment a factor 4 long keeps the noise of one size's time from deciding its slope
        (with ``dense_top`` the size below the largest is only half of it)."""
        j = len(self.sizes) - 1
        band = set(self.bandwidth_sizes)
        quarter = [i for i in range(j) if self.sizes[i] in band
                   and self.sizes[i] <= self.sizes[j] / 4]
        return (quarter[-1] if quarter else j - 1), j

    @property
    def top_beta_bytes_per_s(self) -> float:
        """β of the sweep's top segment (:attr:`top_segment`): each byte's marginal cost there,
        ``busbw factor x (S2 - S1) / (t2 - t1)`` (nan: no bandwidth regime, or the larger size
        not slower). It is what busbw approaches once α is amortised; the regime's fitted β
        is a compromise over all its sizes (on the 2-vCPU VM the per-byte cost doubled beyond
        2 MiB: 8 MiB took 7.5 ms, 2 MiB 1.7 ms, 512 KiB 1.0 ms).

        >>> r = Regimes("all_reduce", 2, (1 << 20, 4 << 20), (1.5e-3, 4.5e-3), 1 << 20, 5e-4,
        ...             1.4e9, 5e-4, 1.4e9)
        >>> round(r.top_beta_bytes_per_s / 1e9, 3)  # 3 MiB more in 3 ms more
        1.049
        >>> r = Regimes("all_reduce", 2, (2 << 20, 4 << 20, 8 << 20), (1e-3, 2.6e-3, 4.4e-3),
        ...             2 << 20, 0.0, 2e9, 0.0, 2e9)
        >>> r.top_segment, round(r.top_beta_bytes_per_s / 1e9, 3)  # 2 -> 8 MiB, not 4 -> 8
        ((0, 2), 1.85)
        """
        if not self.has_bandwidth or len(self.bandwidth_sizes) < 2:
            return math.nan
        i, j = self.top_segment
        (s1, s2), (t1, t2) = (self.sizes[i], self.sizes[j]), (self.times[i], self.times[j])
        if t2 <= t1:
            return math.nan
        return busbw_factor(self.op, self.ranks) * (s2 - s1) / (t2 - t1)

    def line_s(self, size_bytes: float) -> float:
        """The bandwidth regime's α–β line at any size (nan: no bandwidth regime)."""
        if not self.has_bandwidth:
            return math.nan
        return collective_time(op=self.op, ranks=self.ranks, size_bytes=size_bytes,
                               alpha_s=self.alpha_s, beta_bytes_per_s=self.beta_bytes_per_s)

    def time_s(self, size_bytes: float) -> float:
        """The regime-aware model: the α–β line in the bandwidth regime, the floor below it."""
        if self.regime(size_bytes) == "bandwidth":
            return self.line_s(size_bytes)
        return self.floor_s

    def naive_s(self, size_bytes: float) -> float:
        """The single α–β line through every size (nan: no fit)."""
        if not math.isfinite(self.naive_beta_bytes_per_s):
            return math.nan
        return collective_time(op=self.op, ranks=self.ranks, size_bytes=size_bytes,
                               alpha_s=self.naive_alpha_s,
                               beta_bytes_per_s=self.naive_beta_bytes_per_s)

    @property
    def medians(self) -> tuple:
        """Every size's p50 (what the naive line runs through)."""
        return self.naive_times or self.times

    def naive_residuals_pct(self) -> dict:
        """The naive line's symmetric errors per regime against each size's p50: ``{"latency":
        (lowest, median, highest), "bandwidth": (...)}`` in %; a regime without sizes is left
        out."""
        out = {}
        p50 = dict(zip(self.sizes, self.medians))
        for name in ("latency", "bandwidth"):
            sizes = self._part(name)[0]
            times = [p50[s] for s in sizes]
            if sizes and math.isfinite(self.naive_beta_bytes_per_s):
                errs = [error_pct(self.naive_s(s), t) for s, t in zip(sizes, times)]
                out[name] = (min(errs), float(np.median(errs)), max(errs))
        return out


def _fit(op, ranks, sizes, times) -> tuple[float, float] | None:
    try:
        return fit_alpha_beta(op, ranks, sizes=sizes, times=times)
    except UsageError:
        return None


def _within(op, ranks, fit, sizes, times, tolerance_pct) -> bool:
    line = collective_time(op=op, ranks=ranks, size_bytes=np.asarray(sizes, float),
                           alpha_s=fit[0], beta_bytes_per_s=fit[1])
    return all(abs(error_pct(p, t)) <= tolerance_pct for p, t in zip(line, times))


def find_regimes(op: str, ranks: int, *, sizes: Sequence[float], times: Sequence[float],
                 tolerance_pct: float = TOLERANCE_PCT, min_points: int = MIN_POINTS,
                 fit_min_bytes: float = 0, p10s: Sequence[float] = (),
                 naive_times: Sequence[float] = (), statistic: str = "p50",
                 fastests: Sequence[float] = ()) -> Regimes:
    """Split a sweep into its bandwidth and latency regimes (see the module docstring).

    ``fit_min_bytes`` > 0 sets the bandwidth regime by hand (every size >= it); ``p10s``, the
    sizes' p10 times, and ``fastests``, their fastest calls, are kept for the split of a miss
    (:meth:`Regimes.split`);
    ``naive_times`` (default ``times``): the p50s the naive line runs through, where ``times``
    are the transfers (``statistic="transfer"``). A synthetic
    sweep: a scattered floor of about 1 ms up to 8 KiB, then the line α = 100 µs, β = 1 GB/s:

    >>> sizes = [8 * 4**k for k in range(11)]
    >>> line = collective_time(op="all_reduce", ranks=2, size_bytes=np.array(sizes, float),
    ...                        alpha_s=100e-6, beta_bytes_per_s=1e9)
    >>> times = [1e-3, 3e-3, 1e-3, 1.2e-3, 2e-3, 0.9e-3] + list(line[6:])
    >>> r = find_regimes("all_reduce", 2, sizes=sizes, times=times)
    >>> r.bandwidth_from_bytes, round(r.alpha_s * 1e6), round(r.beta_bytes_per_s / 1e9, 3)
    (32768.0, 100, 1.0)
    >>> round(r.floor_s * 1e3, 2), [round(t * 1e3, 1) for t in r.floor_range_s]
    (1.1, [0.9, 3.0])
    >>> r.regime(8), r.regime(1 << 20)
    ('latency', 'bandwidth')
    """
    lows = [float(t) for t in p10s] if len(p10s) == len(sizes) else [math.nan] * len(sizes)
    mids = ([float(t) for t in naive_times] if len(naive_times) == len(sizes)
            else [float(t) for t in times])
    fasts = ([float(t) for t in fastests] if len(fastests) == len(sizes)
             else [math.nan] * len(sizes))
    pts = sorted(zip((float(s) for s in sizes), (float(t) for t in times), lows, mids, fasts))
    xs, ts = [p[0] for p in pts], [p[1] for p in pts]
    kept_p10s = tuple(p[2] for p in pts) if len(p10s) == len(sizes) else ()
    kept_fastests = (tuple(p[4] for p in pts) if len(fastests) == len(sizes)
                     and all(p[4] == p[4] for p in pts) else ())
    p50s = tuple(p[3] for p in pts) if len(naive_times) == len(sizes) else ()
    if len(xs) != len(set(xs)) or not xs:
        raise UsageError("the regimes need one time per distinct size")
    naive = _fit(op, ranks, xs, list(p50s or ts))
    notes = []
    start, fit = len(xs), None
    if fit_min_bytes and fit_min_bytes > 0:
        start = next((i for i, s in enumerate(xs) if s >= fit_min_bytes), len(xs))
        fit = _fit(op, ranks, xs[start:], ts[start:]) if len(xs) - start >= 2 else None
    elif len(xs) >= min_points:
        start = len(xs) - min_points
        fit = _fit(op, ranks, xs[start:], ts[start:])
        while fit is not None and start > 0:
            wider = _fit(op, ranks, xs[start - 1:], ts[start - 1:])
            if wider is None or not _within(op, ranks, wider, xs[start - 1:], ts[start - 1:],
                                            tolerance_pct):
                break
            start, fit = start - 1, wider
    if fit is not None and xs[-1] < crossover_bytes(op, ranks, alpha_s=fit[0],
                                                    beta_bytes_per_s=fit[1]):
        notes.append("the sweep ends below the crossover S*: the bandwidth term never decided "
                     "a time, so there is no bandwidth regime")
        fit = None
    if fit is None:
        if not notes and fit_min_bytes and fit_min_bytes > 0:
            notes.append(f"no α–β line through the sizes >= {fit_min_bytes:g} B (fewer than 2, "
                         "or no bandwidth term): no bandwidth regime")
        elif not notes:
            notes.append(f"no α–β line through the {min_points} largest sizes (fewer sizes, or no "
                         "bandwidth term): no bandwidth regime")
        start = len(xs)
    return Regimes(op=op, ranks=int(ranks), sizes=tuple(xs), times=tuple(ts),
                   bandwidth_from_bytes=xs[start] if start < len(xs) else math.inf,
                   alpha_s=fit[0] if fit else math.nan,
                   beta_bytes_per_s=fit[1] if fit else math.nan,
                   naive_alpha_s=naive[0] if naive else math.nan,
                   naive_beta_bytes_per_s=naive[1] if naive else math.nan, notes=tuple(notes),
                   p10s=kept_p10s, statistic=statistic, naive_times=p50s,
                   fastests=kept_fastests)


def time_at(size_bytes: float, *, sizes: Sequence[float], times: Sequence[float]) -> float:
    """A measured time read at ``size_bytes`` on the log-log line between the two swept sizes
    around it (nan outside the sweep: a measurement is not extrapolated).

    >>> round(time_at(4096, sizes=[1024, 16384], times=[1e-3, 4e-3]), 6)
    0.002
    >>> time_at(8, sizes=[1024, 16384], times=[1e-3, 4e-3])
    nan
    """
    pts = sorted(zip((float(s) for s in sizes), (float(t) for t in times)))
    if not pts or not pts[0][0] <= size_bytes <= pts[-1][0]:
        return math.nan
    lx = [math.log(s) for s, _ in pts]
    ly = [math.log(t) for _, t in pts]
    return float(math.exp(np.interp(math.log(size_bytes), lx, ly)))


def of_rows(rows, *, fit_min_bytes: float = 0, **kw) -> Regimes:
    """:func:`find_regimes` of one sweep given as rows (dicts or a DataFrame of one op at one
    world size: ``op, world_size, size_bytes, time_p50_s``, and ``transfer_s`` where given):
    fitted to the transfers where every row has one, the naive line through the p50s."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    keys = {(r["op"], int(r["world_size"])) for r in rows}
    if len(keys) != 1:
        raise UsageError(f"the regimes are of one op at one world size, got {sorted(keys)}")
    (op, n), = keys
    return find_regimes(op, n, sizes=[r["size_bytes"] for r in rows], fit_min_bytes=fit_min_bytes,
                        **_times(rows), **kw)


def _times(rows) -> dict:
    """The keyword arguments of :func:`find_regimes` for rows: the transfers where every row
    has one, else the p50s."""
    p50 = [float(r["time_p50_s"]) for r in rows]
    p10 = [row_transfer(r) for r in rows]
    if all(t is not None for t in p10):
        calls = [call_times([r]) for r in rows]
        fastests = [min(c) for c in calls] if all(calls) else []
        return {"times": p10, "naive_times": p50, "statistic": "transfer", "fastests": fastests}
    return {"times": p50}


def add_fit(rows: list[dict], min_fit_bytes: float = 0) -> list[dict]:
    """The regime-aware model beside each measured row, per (op, world_size, dtype).

    Reads ``op, world_size, dtype, size_bytes, time_p50_s`` (and ``transfer_s``, the transfers
    the model is fitted to, where every row has one: :func:`of_rows`); adds ``regime``,
    ``alpha_s`` and ``beta_gb_per_s`` (the bandwidth regime's line), ``floor_s`` (the latency
    regime's), ``model_time_s`` (the regime-aware model), ``model_busbw_gb_per_s``,
    ``model_error_pct`` (against the transfer, or the p50 without one), ``crossover_bytes``,
    and ``naive_time_s``/``naive_error_pct`` (one line through every size's p50). Rows of a 1-rank world (nothing moves) get NaN. ``min_fit_bytes`` > 0 sets the
    bandwidth regime by hand. Returns new dicts; the input is unchanged.

    >>> line = collective_time(op="all_reduce", ranks=2, size_bytes=np.array([1e5, 1e6, 1e7]),
    ...                        alpha_s=1e-4, beta_bytes_per_s=1e9)
    >>> rows = [{"op": "all_reduce", "world_size": 2, "size_bytes": s, "time_p50_s": t}
    ...         for s, t in zip([8, 64, 1e5, 1e6, 1e7], [1e-3, 2e-3, *line])]
    >>> [(r["regime"], round(r["model_time_s"] * 1e3, 2)) for r in add_fit(rows)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('latency', 1.5), ('latency', 1.5), ('bandwidth', 0.3), ('bandwidth', 1.2),
     ('bandwidth', 10.2)]
    """
    from labkit.collectives.formulas import busbw_gb_per_s
    from labkit.metrics import model_error_pct

    out = [dict(r) for r in rows]
    groups: dict[tuple, list[dict]] = {}
    for r in out:
        groups.setdefault((r["op"], r["world_size"], r.get("dtype")), []).append(r)
    nan = math.nan
    for (op, n, _), part in groups.items():
        try:
            reg = find_regimes(op, n, sizes=[r["size_bytes"] for r in part],
                               fit_min_bytes=min_fit_bytes, **_times(part))
        except UsageError:
            reg = None
        moves = reg is not None and n > 1
        for r in part:
            s, p50 = r["size_bytes"], r["time_p50_s"]
            measured = row_transfer(r) if reg is not None and reg.statistic == "transfer" else p50
            t = reg.time_s(s) if moves else nan
            naive = reg.naive_s(s) if moves else nan
            r.update({
                "regime": reg.regime(s) if moves else None,
                "alpha_s": reg.alpha_s if moves else nan,
                "beta_gb_per_s": reg.beta_bytes_per_s / 1e9 if moves else nan,
                "floor_s": reg.floor_s if moves else nan,
                "model_time_s": t,
                "model_busbw_gb_per_s": (busbw_gb_per_s(op=op, ranks=n, size_bytes=s, time_s=t)
                                         if math.isfinite(t) else nan),
                "model_error_pct": (model_error_pct(model_s=t, measured_s=measured)
                                    if math.isfinite(t) else nan),
                "crossover_bytes": reg.crossover_bytes if moves else nan,
                "naive_time_s": naive,
                "naive_error_pct": (model_error_pct(model_s=naive, measured_s=p50)
                                    if math.isfinite(naive) else nan),
            })
    return out
