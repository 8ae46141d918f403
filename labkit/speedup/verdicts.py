"""Notebook 02's law rows and the sentences it prints, computed from the run's numbers (pure).

Each law says what it is (:mod:`labkit.book.laws`): perfect scaling is a ``naive`` law, its
reason the serial fraction fitted to the same table; the Amdahl and Karp-Flatt fits on the
published tables are this lab's ``model`` applied to published data (their ``source`` says
whose); on the live job the ``model`` carries the co-run slowdown this machine's profile
measured (:func:`labkit.speedup.formulas.corun_speedup`) and plain Amdahl stays beside it as a
``naive`` law whose note is the measured slowdown.
"""

from __future__ import annotations

import math

from labkit import metrics
from labkit.speedup import formulas

#: a serial fraction (a difference of two times' ratios) is judged absolutely
FRACTION_TOLERANCE = 0.05
#: a time, or a speedup (a ratio of times)
RATIO_TOLERANCE_PCT = 25.0
#: Amdahl's fit on the very points it is checked against: a miss means no single f fits
FIT_TOLERANCE_PCT = 10.0


def _law(**kw) -> dict:
    from labkit.book import laws

    return laws.check(**kw)


def perfect_scaling_law(name: str, *, world_size: int, speedup: float, serial_fraction: float,
                        source: str) -> dict:
    """s_N = N on a published table, naive: the reason is the table's own fitted serial part.

    >>> r = perfect_scaling_law("K80", world_size=4, speedup=2.97, serial_fraction=0.135,
    ...                         source="UVA")
    >>> r["kind"], r["holds"], r["note"]
    ('naive', False, "the table's fitted serial fraction f = 0.135 caps s_4 at 1/(f + (1 - f)/4) = 2.85")
    """
    cap = metrics.amdahl_speedup(serial_fraction, world_size)
    return _law(law=f"perfect scaling on {world_size} {name}: s_{world_size} = {world_size}",
                kind="naive", predicted=world_size, measured=speedup,
                tolerance_pct=RATIO_TOLERANCE_PCT, source=source,
                note=f"the table's fitted serial fraction f = {serial_fraction:.3f} caps "
                     f"s_{world_size} at 1/(f + (1 - f)/{world_size}) = {cap:.2f}")


def amdahl_fit_law(name: str, *, world_size: int, speedup: float, serial_fraction: float,
                   source: str) -> dict:
    """Amdahl with the fitted f at the table's largest N: this lab's model, on published data.

    >>> amdahl_fit_law("K80", world_size=4, speedup=2.97, serial_fraction=0.135,
    ...                source="UVA")["kind"]
    'model'
    """
    return _law(law=f"Amdahl with the fitted f: s_{world_size} on {name}", kind="model",
                predicted=metrics.amdahl_speedup(serial_fraction, world_size), measured=speedup,
                tolerance_pct=FIT_TOLERANCE_PCT, source=source,
                note="this lab's fit applied to a published table")


def karp_flatt_law(name: str, *, world_size: int, karp_flatt: float, serial_fraction: float,
                   source: str) -> dict:
    """Karp-Flatt's e_N = the fitted f (a fraction: judged absolutely), on published data.

    >>> r = karp_flatt_law("K80", world_size=4, karp_flatt=0.115, serial_fraction=0.135,
    ...                    source="UVA")
    >>> r["kind"], r["holds"], r["tolerance_abs"]
    ('model', True, 0.05)
    """
    return _law(law=f"Karp-Flatt e_{world_size} = Amdahl's fitted f on {name}", kind="model",
                predicted=serial_fraction, measured=karp_flatt,
                tolerance_abs=FRACTION_TOLERANCE, source=source,
                note="this lab's fit applied to a published table")


def _crowd_note(world_size: int, cores: int) -> str:
    return (f"; {world_size} ranks on {cores} cores take turns" if world_size > cores else "")


def _split(row) -> dict | None:
    """A run's time as rank 0 saw it: the serial part, then the parallel part (ms)."""
    serial, parallel = getattr(row, "serial_part_s", None), getattr(row, "parallel_part_s", None)
    if serial is None or parallel is None or serial != serial or parallel != parallel:  # NaN
        return None
    return {"serial part": float(serial) * 1e3, "parallel part": float(parallel) * 1e3}


def model_speedups(live, *, slowdowns: dict) -> dict:
    """The co-run model's speedup at each world size of a workshare run (1.0 at N = 1), from
    the products each part ran and the profile's slowdown per N.

    >>> import pandas as pd
    >>> live = pd.DataFrame({"world_size": [1, 2], "total_work": [600, 600],
    ...                      "serial_products": [60, 60],
    ...                      "parallel_products_per_rank_max": [540, 270]})
    >>> {n: round(s, 3) for n, s in model_speedups(live, slowdowns={1: 1.0, 2: 1.25}).items()}
    {1: 1.0, 2: 1.509}
    """
    out = {}
    for r in live.itertuples():
        n = int(r.world_size)
        out[n] = 1.0 if n == 1 else formulas.corun_speedup(
            total_work=int(r.total_work), serial_products=int(r.serial_products),
            parallel_products_max=int(r.parallel_products_per_rank_max),
            slowdown=float(slowdowns[n]))
    return dict(sorted(out.items()))


def live_laws(live, live_rows, *, designed_f: float, slowdowns: dict, cores: int) -> list[dict]:
    """The live job's laws, a ``model`` row (the co-run slowdown carried) and a ``naive`` row
    (plain Amdahl) for each quantity: the time (model, with its measured split into the serial
    and parallel parts) and the speedup (plain Amdahl) at every N > 1, the Amdahl fit over the runs
    with a core per rank (when there are two), and Karp-Flatt's e at the largest N (unless the
    fit was over 1 and that N alone, which makes it the same number).

    ``live``: the workshare rows (world_size, time_s, total_work, serial_products,
    parallel_products_per_rank_max; serial_part_s and parallel_part_s where measured);
    ``live_rows``: their speedup table; ``slowdowns``: the
    profile's ``compute_slowdown(N)`` per world size.
    """
    work = {int(r.world_size): r for r in live.itertuples()}
    model_s = model_speedups(live, slowdowns=slowdowns)
    rows = []
    t_1 = float(work[1].time_s)
    for r in live_rows[live_rows.world_size > 1].itertuples():
        n, sd = int(r.world_size), float(slowdowns[int(r.world_size)])
        rows.append(_law(law=f"live: t_{n} with the co-run slowdown", kind="model", unit="ms",
                         predicted=t_1 / model_s[n] * 1e3, measured=float(work[n].time_s) * 1e3,
                         tolerance_pct=RATIO_TOLERANCE_PCT, split=_split(work[n]),
                         note=f"the 1-rank time, its parallel part x the profile's slowdown at "
                              f"{n} ranks{_crowd_note(n, cores)}"))
        rows.append(_law(law=f"live: plain Amdahl s_{n} with the designed f", kind="naive",
                         predicted=metrics.amdahl_speedup(designed_f, n), measured=r.speedup,
                         tolerance_pct=RATIO_TOLERANCE_PCT,
                         note=f"the profile measured each rank {sd:.2f}x slower with {n} "
                              f"computing at once{_crowd_note(n, cores)}"))
    own = sorted(n for n in work if n <= cores)
    if len(own) >= 2:
        times = [float(work[n].time_s) for n in own]
        f_own = metrics.fit_amdahl(own, times)
        # through two rank counts the fit is t_N's own number (judged above as a time) on a
        # scale about six times stricter (f = 2 t_2 / t_1 - 1 at N = 2): a model law only
        # where it fits three or more
        if len(own) >= 3:
            rows.append(_law(law="live: Amdahl fit (a core per rank) = the co-run model's f",
                             kind="model", measured=f_own, tolerance_abs=FRACTION_TOLERANCE,
                             predicted=formulas.apparent_serial_fraction(
                                 own, [model_s[n] for n in own])))
        n2 = own[-1]
        rows.append(_law(law="live: Amdahl fit (a core per rank) = the designed f", kind="naive",
                         predicted=designed_f, measured=f_own, tolerance_abs=FRACTION_TOLERANCE,
                         note=f"the co-run slowdown {float(slowdowns[n2]):.2f}x at {n2} ranks "
                              "slows the parallel part, which a fit reads as serial"))
    n_max = int(live_rows.world_size.max())
    # with a core per rank at every N the fit above is e_N itself: the same row twice
    if n_max > 1 and own != [1, n_max]:
        e = float(live_rows.karp_flatt.iloc[-1])
        sd = float(slowdowns[n_max])
        added = formulas.parallel_added_fraction(serial_fraction=designed_f, world_size=n_max,
                                                 slowdown=sd)
        rows.append(_law(law=f"live: Karp-Flatt e_{n_max} = the co-run model's e", kind="model",
                         predicted=metrics.karp_flatt(model_s[n_max], n_max), measured=e,
                         tolerance_abs=FRACTION_TOLERANCE))
        rows.append(_law(law=f"live: Karp-Flatt e_{n_max} = the designed f", kind="naive",
                         predicted=designed_f, measured=e, tolerance_abs=FRACTION_TOLERANCE,
                         note=f"the profile's slowdown {sd:.2f}x at {n_max} ranks adds "
                              f"{added:.3f} to e{_crowd_note(n_max, cores)}"))
    return rows


def speedup_sentence(*, world_size: int, measured: float, amdahl: float, model: float,
                     slowdown: float) -> str:
    """The live speedup beside plain Amdahl and the co-run model, in one computed sentence.

    >>> speedup_sentence(world_size=2, measured=1.52, amdahl=1.82, model=1.51, slowdown=1.25)
    'N = 2: measured s = 1.52, below plain Amdahl (1.82) by 16.5%; with each rank 1.25x slower when all compute at once, the co-run model predicts 1.51.'
    >>> speedup_sentence(world_size=2, measured=1.9, amdahl=1.82, model=1.85, slowdown=1.02)
    'N = 2: measured s = 1.9, above plain Amdahl (1.82) by 4.4%; with each rank 1.02x slower when all compute at once, the co-run model predicts 1.85.'
    """
    side = "below" if measured < amdahl else "above" if measured > amdahl else "equal to"
    gap = abs(measured - amdahl) / amdahl * 100
    by = f" by {gap:.1f}%" if side != "equal to" else ""
    return (f"N = {world_size}: measured s = {measured:.3g}, {side} plain Amdahl "
            f"({amdahl:.3g}){by}; with each rank {slowdown:.2f}x slower when all compute at "
            f"once, the co-run model predicts {model:.3g}.")


def karp_flatt_sentence(*, world_size: int, e: float, designed_f: float,
                        cores: int) -> str:
    """Whether Karp-Flatt's e sits above the designed serial fraction (a serial part you did not
    write: slower compute together, ranks taking turns) or not.

    >>> karp_flatt_sentence(world_size=4, e=0.41, designed_f=0.1, cores=2)
    'Karp-Flatt e_4 = 0.41 is above the designed f = 0.1 by 0.31: a serial part you did not write (4 ranks on 2 cores).'
    >>> karp_flatt_sentence(world_size=2, e=0.08, designed_f=0.1, cores=2)
    'Karp-Flatt e_2 = 0.08 is below the designed f = 0.1 by 0.02: the run beat Amdahl (noise, or a slowed 1-rank run).'
    """
    if not math.isfinite(e):
        return f"Karp-Flatt e_{world_size}: not defined here."
    d = e - designed_f
    crowd = f" ({world_size} ranks on {cores} cores)" if world_size > cores else ""
    if abs(d) < 0.005:
        return (f"Karp-Flatt e_{world_size} = {e:.3g} equals the designed f = {designed_f:.3g}: "
                "no serial part beyond the one you wrote.")
    if d > 0:
        return (f"Karp-Flatt e_{world_size} = {e:.3g} is above the designed f = "
                f"{designed_f:.3g} by {d:.2f}: a serial part you did not write{crowd}.")
    return (f"Karp-Flatt e_{world_size} = {e:.3g} is below the designed f = {designed_f:.3g} by "
            f"{-d:.2f}: the run beat Amdahl (noise, or a slowed 1-rank run).")
