"""The collectives lab's verdicts: the sentences and law rows notebook 06 prints, each computed
from the numbers it is given (pure: no torch).

Sentences: :func:`regimes_sentence` (the regimes a sweep shows), :func:`naive_sentence` (one
line through every size, its residuals per regime), :func:`crossover_sentence` (where S* lies
and what the sweep measured there), :func:`sharded_gradients_sentence` (FSDP /
ZeRO's reduce-scatter beside DDP's all-reduce), :func:`experts_sentence` (a mixture of experts'
all-to-alls). Law rows (:func:`labkit.book.laws.check`):
:func:`sweep_laws` (the regime-aware model of one sweep, and the naive line beside it),
:func:`line_law` (one op's line at its largest size). The all-reduce beside the machine
profile's, idle and busy: :mod:`labkit.collectives.context`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from labkit.book import laws
from labkit.collectives.formulas import moe_all_to_all_bytes
from labkit.collectives.regimes import Regimes, time_at
from labkit.collectives.waits import profile_allreduces, row_transfer
from labkit.errors import UsageError
from labkit.tables import size_text

#: how much the p50 may vary across the latency regime's sizes and still be called flat
FLAT_RATIO = 1.25
#: the largest size must be this many S* for busbw to be near its plateau (the line's busbw
#: there is β·k/(k+1): within the 25 % tolerance of β from k = 4)
PLATEAU_S_STAR = 4.0


def _ms(t: float) -> str:
    return f"{t * 1e3:.3g} ms"


def regimes_sentence(reg: Regimes) -> str:
    """What the sweep shows: the bandwidth regime's line and the latency regime's floor.

    >>> r = Regimes("all_reduce", 2, (8, 64, 512, 4096, 1 << 20, 4 << 20), (4e-4, 3e-3, 5e-4,
    ...             4.5e-4, 1.1e-3, 3.5e-3), 1 << 20, 2.5e-4, 1.4e9, 3e-4, 1.3e9)
    >>> print(regimes_sentence(r))
    bandwidth regime: 1 MiB to 4 MiB (2 sizes) on one α–β line, α = 250 µs, β = 1.4 GB/s. latency regime: 8 B to 4 KiB (4 sizes), floor 0.475 ms (the median p50); the p50 ranges from 0.4 ms to 3 ms across its sizes (7.5x, more than 1.25x: scattered).
    >>> r2 = Regimes("all_reduce", 2, (8, 64, 4096), (4e-4, 4.2e-4, 4.4e-4), math.inf,
    ...              math.nan, math.nan, 4e-4, 1e12, ("the sweep ends below S*",))
    >>> print(regimes_sentence(r2))
    no bandwidth regime (the sweep ends below S*). latency regime: 8 B to 4 KiB (3 sizes), floor 0.42 ms (the median p50); the p50 ranges from 0.4 ms to 0.44 ms across its sizes (1.1x, within 1.25x: flat).
    """
    parts = []
    band = reg.bandwidth_sizes
    if band:
        parts.append(f"bandwidth regime: {size_text(band[0])} to {size_text(band[-1])} "
                     f"({len(band)} sizes) on one α–β line, α = {reg.alpha_s * 1e6:.3g} µs, "
                     f"β = {reg.beta_bytes_per_s / 1e9:.3g} GB/s.")
    else:
        why = f" ({'; '.join(reg.notes)})" if reg.notes else ""
        parts.append(f"no bandwidth regime{why}.")
    lat = reg.latency_sizes
    if lat:
        lo, hi = reg.floor_range_s
        ratio = hi / lo
        flat = ratio <= FLAT_RATIO
        what = "transfer" if reg.statistic == "transfer" else "p50"
        parts.append(f"latency regime: {size_text(lat[0])} to {size_text(lat[-1])} "
                     f"({len(lat)} sizes), floor {_ms(reg.floor_s)} (the median {what}); the "
                     f"{what} ranges from {_ms(lo)} to {_ms(hi)} across its sizes ({ratio:.2g}x, "
                     f"{'within' if flat else 'more than'} {FLAT_RATIO:g}x: "
                     f"{'flat' if flat else 'scattered'}).")
    else:
        parts.append("no latency regime: every size lies on the line.")
    return " ".join(parts)


def naive_sentence(reg: Regimes, *, tolerance_pct: float = 25.0) -> str:
    """One α–β line through every size, judged per regime by its residuals (symmetric %).

    >>> r = Regimes("all_reduce", 2, (8, 64, 1 << 20, 4 << 20), (4e-4, 3e-3, 1.9e-3, 4.6e-3),
    ...             1 << 20, 2.5e-4, 1.2e9, 5e-4, 1.2e9)
    >>> print(naive_sentence(r))
    one α–β line through every size (α = 500 µs, β = 1.2 GB/s): in the latency regime off by -200% to +150% (median -25%), outside 25%; in the bandwidth regime off by -2% to -1% (median -2%), within 25%.
    """
    if not math.isfinite(reg.naive_beta_bytes_per_s):
        return "one α–β line through every size: no fit (the sweep has no bandwidth term)."
    out = []
    for name, (lo, med, hi) in reg.naive_residuals_pct().items():
        fits = max(abs(lo), abs(hi)) <= tolerance_pct
        out.append(f"in the {name} regime off by {lo:+.0f}% to {hi:+.0f}% (median {med:+.0f}%), "
                   f"{'within' if fits else 'outside'} {tolerance_pct:g}%")
    return (f"one α–β line through every size (α = {reg.naive_alpha_s * 1e6:.3g} µs, "
            f"β = {reg.naive_beta_bytes_per_s / 1e9:.3g} GB/s): " + "; ".join(out) + ".")


def crossover_sentence(reg: Regimes) -> str:
    """Where the bandwidth regime's S* lies in the sweep, and the time measured there.

    >>> r = Regimes("all_reduce", 2, (8, 64 << 10, 1 << 20, 8 << 20), (4e-4, 6e-4, 1.2e-3,
    ...             7.6e-3), 64 << 10, 2.5e-4, 1.2e9, 2.5e-4, 1.2e9)
    >>> print(crossover_sentence(r))
    S* = N α β = 586 KiB lies inside the sweep (8 B to 8 MiB): the model gives 1 ms there (both terms equal), the sweep measured 1.04 ms; the largest size is 14 S*.
    >>> r2 = Regimes("all_reduce", 2, (8, 64 << 10), (4e-4, 6e-4), 8, 2.5e-4, 1.2e9, 2.5e-4,
    ...              1.2e9)
    >>> print(crossover_sentence(r2))
    S* = N α β = 586 KiB lies above the largest size swept (64 KiB): no measured time there; the largest size is 0.11 S*.
    >>> r3 = Regimes("all_reduce", 2, (8, 64 << 10, 1 << 20), (4e-4, 6e-4, 1.2e-3), 64 << 10,
    ...              0.0, 1.2e9, 2.5e-4, 1.2e9)
    >>> print(crossover_sentence(r3))
    the bandwidth regime's line has no latency term (α = 0 µs), so no S* to place; the line reaches the latency floor at 469 KiB, the regimes' crossover: the model gives 0.8 ms there (the floor and the line, equal), the sweep measured 0.987 ms.
    """
    if not reg.has_bandwidth:
        return "no bandwidth regime, so no S* to place."
    s_star = reg.crossover_bytes
    if not s_star > 0:  # the bandwidth regime's line met the axis at or below zero
        head = (f"the bandwidth regime's line has no latency term (α = "
                f"{reg.alpha_s * 1e6:.3g} µs), so no S* to place")
        meet = reg.meeting_bytes
        there = time_at(meet, sizes=reg.sizes, times=reg.times) if meet == meet else math.nan
        if math.isnan(there):
            return head + "."
        return (head + f"; the line reaches the latency floor at {size_text(meet)}, the "
                f"regimes' crossover: the model gives {_ms(reg.floor_s + reg.line_s(meet))} "
                f"there (the floor and the line, equal), the sweep measured {_ms(there)}.")
    lo, hi = reg.sizes[0], reg.sizes[-1]
    head = f"S* = N α β = {size_text(s_star)} lies "
    tail = f"; the largest size is {hi / s_star:.2g} S*."
    measured = time_at(s_star, sizes=reg.sizes, times=reg.times)
    if math.isnan(measured):
        where = ("above the largest size swept" if s_star > hi else "below the smallest size "
                 "swept")
        return head + f"{where} ({size_text(hi if s_star > hi else lo)}): no measured time there" \
            + tail
    return (head + f"inside the sweep ({size_text(lo)} to {size_text(hi)}): the model gives "
            f"{_ms(reg.time_s(s_star))} there (both terms equal), the sweep measured "
            f"{_ms(measured)}" + tail)


def _residual_note(reg: Regimes) -> str:
    parts = [f"{name} regime residuals {lo:+.0f}%..{hi:+.0f}% (median {med:+.0f}%)"
             for name, (lo, med, hi) in reg.naive_residuals_pct().items()]
    return "; ".join(parts) if parts else "no fit"


def betas_note(reg: Regimes) -> str:
    """The top segment's β (each byte's marginal cost over :attr:`Regimes.top_segment`) beside
    the regime's fitted β, or why there is no top segment: the note of the line and busbw
    laws."""
    top = reg.top_beta_bytes_per_s
    if top != top:
        return ("no top segment (fewer than 2 sizes in the bandwidth regime, or the largest no "
                "slower than the one below it)")
    i, j = reg.top_segment
    return (f"beta of the top segment ({size_text(reg.sizes[i])} -> {size_text(reg.sizes[j])}: "
            f"each byte's marginal cost there) {top / 1e9:.2f} GB/s, the regime's fitted beta "
            f"{reg.beta_bytes_per_s / 1e9:.2f} GB/s over its {len(reg.bandwidth_sizes)} sizes")


def line_law(reg: Regimes) -> dict:
    """The bandwidth regime's α–β line at the largest size against the measured time there
    (its transfer, where the regimes were fitted to the transfers; else its p50). The note
    sets the line's β, fitted over the regime's sizes, beside the top segment's (each byte's
    marginal cost between the two largest sizes): a line that reads low at the top is one
    whose per-byte cost rose past the sizes it was fitted to.

    >>> r = Regimes("all_reduce", 2, (1 << 20, 2 << 20, 8 << 20), (1.0e-3, 1.7e-3, 9.0e-3),
    ...             1 << 20, 3e-4, 1.5e9, 5e-4, 1.4e9)
    >>> law = line_law(r)
    >>> law["holds"], round(law["predicted"], 2), law["note"]  # doctest: +NORMALIZE_WHITESPACE
    (False, 6.19, "the line's alpha 0.3 ms; beta of the top segment (2 MiB -> 8 MiB: each byte's
     marginal cost there) 0.86 GB/s, the regime's fitted beta 1.50 GB/s over its 3 sizes")
    """
    s, t = reg.sizes[-1], reg.times[-1]
    note = (f"the line's alpha {reg.alpha_s * 1e3:.2g} ms; {betas_note(reg)}"
            if reg.has_bandwidth else "")
    return laws.check(f"alpha-beta {reg.op}, bandwidth regime, largest size ({size_text(s)}, "
                      f"N = {reg.ranks})",
                      predicted=reg.line_s(s) * 1e3, measured=t * 1e3, unit="ms",
                      tolerance_pct=25, mechanism_observed=reg.has_bandwidth,
                      mechanism="a bandwidth regime in the sweep", split=reg.split(s, t),
                      note=note)


def busbw_split(reg: Regimes) -> dict | None:
    """busbw at the largest size S in measured factors that multiply to it: the top segment's
    β (each byte's marginal cost between the size below, S₁, and S), S / (S − S₁), and
    (t − t₁) / t. busbw reaches β only where the last two cancel: where the time grew in
    proportion to the size (no fixed part left in t). None without a top segment.

    >>> r = Regimes("all_reduce", 2, (1 << 20, 4 << 20), (1.5e-3, 4.5e-3), 1 << 20, 5e-4,
    ...             1.4e9, 5e-4, 1.4e9)
    >>> {k: round(v, 3) for k, v in busbw_split(r).items()}
    {'beta of the top segment (GB/s)': 1.049, 'S / (S - S_below)': 1.333, '(t - t_below) / t': 0.667}
    """
    top = reg.top_beta_bytes_per_s
    if top != top:
        return None
    i, j = reg.top_segment
    (s1, s2), (t1, t2) = (reg.sizes[i], reg.sizes[j]), (reg.times[i], reg.times[j])
    return {"beta of the top segment (GB/s)": top / 1e9, "S / (S - S_below)": s2 / (s2 - s1),
            "(t - t_below) / t": (t2 - t1) / t2}


def sweep_laws(reg: Regimes, *, busbw_gb_per_s: float | None = None,
               profile_floor_s: float | None = None, profile_note: str = "") -> list[dict]:
    """The laws of one all-reduce sweep: the regime-aware model (the line at the largest size,
    busbw → β, the time at the crossover (S*, or where a line without a latency term reaches
    the floor), the latency floor predicted by the machine profile when ``profile_floor_s`` is
    given) and the naive single line at the smallest size's p50.
    ``busbw_gb_per_s``: the busbw measured at the largest size; default, that of the sweep's
    time there (its transfer, where the regimes were fitted to the transfers).

    >>> r = Regimes("all_reduce", 2, (8, 64, 64 << 10, 1 << 20, 8 << 20), (4e-4, 3e-3, 6e-4,
    ...             1.2e-3, 7.3e-3), 64 << 10, 2.5e-4, 1.2e9, 5e-4, 1.3e9)
    >>> rows = sweep_laws(r, busbw_gb_per_s=1.15, profile_floor_s=1.5e-3)
    >>> [(x["kind"], x["holds"]) for x in rows]
    [('model', True), ('model', True), ('model', True), ('model', True), ('naive', False)]
    """
    s_max = reg.sizes[-1]
    if busbw_gb_per_s is None:
        from labkit.collectives.formulas import busbw_gb_per_s as busbw

        busbw_gb_per_s = busbw(op=reg.op, ranks=reg.ranks, size_bytes=s_max, time_s=reg.times[-1])
    s_star = reg.crossover_bytes
    # S* = 0 where the line has no latency term (α fitted at 0): no S* to read the sweep at
    has_star = reg.has_bandwidth and s_star > 0
    rows = [line_law(reg)]
    # no latency term: every size is on the plateau (busbw = β at every size)
    ratio = (s_max / s_star if has_star else math.inf) if reg.has_bandwidth else math.nan
    top = reg.top_beta_bytes_per_s
    rows.append(laws.check(
        f"busbw -> beta at the largest size ({size_text(s_max)}, N = {reg.ranks})",
        predicted=top / 1e9, measured=busbw_gb_per_s, unit="GB/s",
        split=busbw_split(reg), split_op="product",
        tolerance_pct=25, mechanism_observed=bool(ratio >= PLATEAU_S_STAR and top == top),
        mechanism=f"the largest size at least {PLATEAU_S_STAR:g} S* (busbw near its plateau) "
                  "and slower than the size below it",
        note=(betas_note(reg) + "; " + (f"S = {ratio:.2g} S*" if math.isfinite(ratio) or math.isnan(ratio)
                        else "S* = 0: the line has no latency term")
              + ("; busbw of the transfer" if reg.statistic == "transfer" else ""))))
    # without a latency term the model's crossover is where its line reaches the floor: the
    # two terms equal there, and the time is their sum, as at S* of one α–β line
    cross = s_star if has_star else reg.meeting_bytes
    has_cross = cross == cross and cross > 0
    model_cross = (reg.time_s(cross) if has_star else reg.floor_s + reg.line_s(cross)
                   if has_cross else math.nan)
    at_cross = time_at(cross, sizes=reg.sizes, times=reg.times) if has_cross else math.nan
    where = (f"S* = N alpha beta = {size_text(s_star)}; " if has_star else
             f"the bandwidth regime's line has no latency term (alpha fitted at 0), so S* = 0; "
             f"its crossover is where the line reaches the floor, {size_text(cross)}: the floor "
             f"plus the line there (both terms equal); "
             if has_cross else
             "no S*: the bandwidth regime's line has no latency term (alpha fitted at 0) and "
             "no floor to reach, nothing to read the sweep at; " if reg.has_bandwidth else "")
    rows.append(laws.check(
        f"time at the predicted crossover (N = {reg.ranks})",
        predicted=model_cross * 1e3,
        measured=at_cross * 1e3, unit="ms", tolerance_pct=25,
        mechanism_observed=not math.isnan(at_cross), mechanism="the crossover inside the sweep",
        split=reg.split(cross, at_cross) if has_cross else None,
        note=where + "measured: the sweep read there between its two neighbouring sizes "
                     "(log-log)"))
    sizes = reg.floor_sizes
    if sizes and profile_floor_s is not None:
        lo, hi = reg.floor_range_s
        floor_split = reg.floor_split()
        what = "transfer" if reg.statistic == "transfer" else "p50"
        which = ("regime" if reg.latency_sizes else
                 "one line through the whole sweep: the sizes its latency term decides,")
        rows.append(laws.check(
            f"latency-regime floor (N = {reg.ranks}), from the machine profile",
            predicted=profile_floor_s * 1e3, measured=reg.floor_s * 1e3, unit="ms",
            tolerance_pct=25, split=floor_split,
            note=f"{which} {size_text(sizes[0])} to {size_text(sizes[-1])}, {what} "
                 f"{lo * 1e3:.3g}-{hi * 1e3:.3g} ms across it"
                 + (f"; {profile_note}" if profile_note else "")))
    s_min = reg.sizes[0]
    rows.append(laws.check(
        f"one alpha-beta line through every size, smallest size ({size_text(s_min)}, "
        f"N = {reg.ranks})", kind="naive", predicted=reg.naive_s(s_min) * 1e3,
        measured=reg.medians[0] * 1e3, unit="ms", tolerance_pct=25, note=_residual_note(reg)))
    return rows


def profile_floor_s(latency_sizes: Sequence[float], prof, *, ranks: int,
                    statistic: str = "transfer") -> float | None:
    """The machine profile's prediction of the latency floor, in the floor's own statistic
    (``Regimes.statistic``): the median over the profile's idle all-reduce sizes inside the
    regime's range (a floor does not depend on the size) of their transfers
    (:func:`~labkit.collectives.waits.row_transfer`) or, for a sweep without transfers
    (``statistic="p50"``), their p50s, of its calls timed as this sweep's
    (:func:`~labkit.collectives.waits.profile_allreduces`); where the profile measured none
    there, the median of ``prof.transfer_s(size, ranks=ranks, steady=True)`` over the regime's
    sizes. None: no latency regime. Why one statistic: a p10 of a few calls lies below the median of the calls that waited
    for nothing, so a p10 set against the sweep's transfers reads the floor too low.

    >>> class Prof:
    ...     rows = [{"measurement": "allreduce", "context": "idle", "size_bytes": s,
    ...              "time_p50_s": t, "time_p10_s": t / 3, "transfer_s": t / 2}
    ...             for s, t in ((8, 5e-4), (64, 3e-3), (512, 6e-4), (1 << 20, 2e-3))]
    ...     def transfer_s(self, s, *, ranks, busy=False, steady=False):
    ...         return 1e-4 + s * 1e-9
    >>> round(profile_floor_s([8, 32, 128, 512], Prof(), ranks=2) * 1e6)
    300
    >>> round(profile_floor_s([8, 32, 128, 512], Prof(), ranks=2, statistic="p50") * 1e6)
    600
    >>> round(profile_floor_s([16, 32], Prof(), ranks=2) * 1e6, 3)
    100.024

    With calls back to back as well, the floor is theirs:

    >>> class Steady(Prof):
    ...     rows = Prof.rows + [{"measurement": "allreduce_steady", "context": "idle",
    ...                          "size_bytes": s, "time_p50_s": 2e-4, "transfer_s": 1.5e-4}
    ...                         for s in (8, 512)]
    >>> round(profile_floor_s([8, 32, 128, 512], Steady(), ranks=2) * 1e6)
    150
    """
    if statistic not in ("transfer", "p50"):
        raise UsageError(f"statistic must be 'transfer' or 'p50', got {statistic!r}")
    if not latency_sizes:
        return None
    lo, hi = min(latency_sizes), max(latency_sizes)
    own = [row_transfer(r) if statistic == "transfer" else r["time_p50_s"]
           for r in profile_allreduces(prof, "idle") if lo <= r["size_bytes"] <= hi]
    own = [t for t in own if t is not None]
    if ranks != getattr(prof, "world_size", ranks) or not own:
        own = [prof.transfer_s(s, ranks=ranks, steady=True) for s in latency_sizes]
    return float(np.median(own))


def _modelled(reg: Regimes, size_bytes: float) -> str:
    """The regime-aware model at a size, and what it is (the line, or the floor below it)."""
    if not reg.has_bandwidth:
        return f"no α–β line ({reg.op} has no bandwidth regime here)"
    return f"{_ms(reg.time_s(size_bytes))} ({reg.regime(size_bytes)} regime)"


def sharded_gradients_sentence(rs: Regimes | None, ar: Regimes, *, grad_bytes: float) -> str:
    """FSDP and ZeRO-2 reduce-scatter the gradients where DDP all-reduces them: the two
    measured at the largest size both swept, then each one's model at ``grad_bytes``.

    >>> ar = Regimes("all_reduce", 2, (8, 1 << 20, 8 << 20), (4e-4, 1.2e-3, 7.6e-3), 1 << 20,
    ...              2.5e-4, 1.2e9, 2.5e-4, 1.2e9)
    >>> rs = Regimes("reduce_scatter", 2, (8, 1 << 20, 8 << 20), (3e-4, 7e-4, 4e-3), 1 << 20,
    ...              1.2e-4, 1.1e9, 1.2e-4, 1.1e9)
    >>> print(sharded_gradients_sentence(rs, ar, grad_bytes=16.8e6))
    FSDP and ZeRO-2 reduce-scatter the gradients (each of the N = 2 ranks keeps the 1/N it updates) where DDP all-reduces them: at 8 MiB the reduce-scatter took 4 ms against the all-reduce's 7.6 ms (0.53x; a ring all-reduce is a reduce-scatter then an all-gather). For 16 MiB of gradients the reduce-scatter's model gives 7.76 ms (bandwidth regime), the all-reduce's 14.5 ms (bandwidth regime).
    >>> sharded_gradients_sentence(None, ar, grad_bytes=16.8e6)
    'reduce_scatter was not swept (add it to other_ops): no FSDP / ZeRO line.'
    """
    if rs is None:
        return "reduce_scatter was not swept (add it to other_ops): no FSDP / ZeRO line."
    size = min(rs.sizes[-1], ar.sizes[-1])
    t_rs = time_at(size, sizes=rs.sizes, times=rs.times)
    t_ar = time_at(size, sizes=ar.sizes, times=ar.times)
    return (f"FSDP and ZeRO-2 reduce-scatter the gradients (each of the N = {rs.ranks} ranks "
            f"keeps the 1/N it updates) where DDP all-reduces them: at {size_text(size)} the "
            f"reduce-scatter took {_ms(t_rs)} against the all-reduce's {_ms(t_ar)} "
            f"({t_rs / t_ar:.2g}x; a ring all-reduce is a reduce-scatter then an all-gather). "
            f"For {size_text(grad_bytes)} of gradients the reduce-scatter's model gives "
            f"{_modelled(rs, grad_bytes)}, the all-reduce's {_modelled(ar, grad_bytes)}.")


def experts_sentence(a2a: Regimes | None, *, tokens: int, experts_per_token: int,
                     hidden_size: int, bytes_per_value: int, layers: int) -> str:
    """A mixture-of-experts layer's all-to-alls (2 forward, 2 backward, of t·k·h·bytes), priced
    by this sweep's all-to-all model, and what they cost a step of ``layers`` such layers.

    >>> a2a = Regimes("all_to_all", 2, (8, 1 << 20, 8 << 20), (3e-4, 8e-4, 4.4e-3), 1 << 20,
    ...               1.6e-4, 1.0e9, 1.6e-4, 1.0e9)
    >>> print(experts_sentence(a2a, tokens=512, experts_per_token=2, hidden_size=4096,
    ...                        bytes_per_value=2, layers=32))
    A mixture-of-experts layer sends each of a rank's 512 tokens to its 2 experts and back: 2 all-to-alls forward and 2 backward of t·k·h·bytes = 8 MiB each. Here one takes 4.35 ms (bandwidth regime; the sweep measured 4.4 ms at that size), so 4 x 32 layers cost 0.557 s of a step on N = 2 ranks.
    >>> experts_sentence(None, tokens=512, experts_per_token=2, hidden_size=4096,
    ...                  bytes_per_value=2, layers=32)
    'all_to_all was not swept (add it to other_ops): no expert all-to-all priced.'
    """
    if a2a is None:
        return "all_to_all was not swept (add it to other_ops): no expert all-to-all priced."
    size = moe_all_to_all_bytes(tokens=tokens, experts_per_token=experts_per_token,
                                hidden_size=hidden_size, bytes_per_value=bytes_per_value)
    measured = time_at(size, sizes=a2a.sizes, times=a2a.times)
    seen = (f"; the sweep measured {_ms(measured)} at that size" if not math.isnan(measured)
            else "; beyond the sweep")
    head = (f"A mixture-of-experts layer sends each of a rank's {tokens} tokens to its "
            f"{experts_per_token} experts and back: 2 all-to-alls forward and 2 backward of "
            f"t·k·h·bytes = {size_text(size)} each.")
    if not a2a.has_bandwidth:
        return head + f" Here there is {_modelled(a2a, size)}{seen}."
    one = a2a.time_s(size)
    return (head + f" Here one takes {_ms(one)} ({a2a.regime(size)} regime{seen}), so 4 x "
            f"{layers} layers cost {4 * layers * one:.3g} s of a step on N = {a2a.ranks} ranks.")
