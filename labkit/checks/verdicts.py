"""Notebook 01's law rows and the sentences it prints about this machine, computed from the
run's numbers (pure).

The all-reduce each launch times is predicted from this run's machine profile (read off its
measured sweep), a ``model`` law where every rank has a core; with more ranks than cores the
ranks take turns and the row is ``naive``, its note the measured crowding. The same holds for
the launch-cost law: a launch of N ranks costs what one rank's does while each has a core.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.machine.formulas import WAIT_THRESHOLD_S, fastest_split

#: a time on a shared 2-core machine
TIME_TOLERANCE_PCT = 25.0


def _law(**kw) -> dict:
    from labkit.book import laws

    return laws.check(**kw)


def _size(size_bytes: float) -> str:
    """
    >>> _size(1 << 20), _size(2048), _size(8)
    ('1 MiB', '2 KiB', '8 B')
    """
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes:g} B"


def _slower(ratio: float) -> str:
    """How a time compares with its reference, as a word and a percentage."""
    if abs(ratio - 1) < 0.005:
        return "as fast"
    return f"{(ratio - 1) * 100:.0f}% slower" if ratio > 1 else f"{(1 - ratio) * 100:.0f}% faster"


def corun_sentence(*, slowdown: float, ranks: int) -> str:
    """The co-run slowdown, said.

    >>> corun_sentence(slowdown=1.25, ranks=2)
    'With 2 ranks computing matrix products at once, each ran 1.25x its time alone: 25% slower.'
    >>> corun_sentence(slowdown=0.9, ranks=2)
    'With 2 ranks computing matrix products at once, each ran 0.9x its time alone: 10% faster.'
    """
    return (f"With {ranks} ranks computing matrix products at once, each ran {slowdown:.3g}x "
            f"its time alone: {_slower(slowdown)}.")


def busy_sentence(*, size_bytes: float, idle_s: float, busy_s: float) -> str:
    """An all-reduce with the cores idle against the same with every core computing.

    >>> busy_sentence(size_bytes=1 << 20, idle_s=0.8e-3, busy_s=1.3e-3)
    'An all-reduce of 1 MiB took 0.8 ms with the cores idle and 1.3 ms while every core also computed: 62% slower when busy.'
    >>> busy_sentence(size_bytes=1 << 20, idle_s=1.3e-3, busy_s=0.8e-3)
    'An all-reduce of 1 MiB took 1.3 ms with the cores idle and 0.8 ms while every core also computed: 38% faster when busy.'
    """
    return (f"An all-reduce of {_size(size_bytes)} took {idle_s * 1e3:.3g} ms with the cores idle "
            f"and {busy_s * 1e3:.3g} ms while every core also computed: "
            f"{_slower(busy_s / idle_s)} when busy.")


def alpha_beta_sentence(*, alpha_s: float, beta_bytes_per_s: float, ranks: int,
                        sizes: Sequence[float], times: Sequence[float]) -> str:
    """How far the α–β line fitted to the idle sweep strays from the sweep it was fitted to:
    within the lab's 25 % everywhere, or not (then the models read times off the sweep).

    >>> alpha_beta_sentence(alpha_s=50e-6, beta_bytes_per_s=1e9, ranks=2, sizes=[8, 1 << 20],
    ...                     times=[100e-6, 1.2e-3])
    'The alpha-beta line fitted to the idle sweep (alpha = 50 us, beta = 1 GB/s) is within 25% of every measured size (worst -4.5%, at 1 MiB).'
    >>> alpha_beta_sentence(alpha_s=50e-6, beta_bytes_per_s=1e9, ranks=2, sizes=[8, 2048],
    ...                     times=[100e-6, 3.3e-3])
    'The alpha-beta line fitted to the idle sweep (alpha = 50 us, beta = 1 GB/s) is 32.3x below the measured time at 2 KiB: the sweep is not one straight line, so the lab reads all-reduce times off the measured sweep.'
    """
    from labkit.book.laws import symmetric_error_pct
    from labkit.collectives.formulas import allreduce_time

    worst, at = 0.0, sizes[0]
    for s, t in zip(sizes, times):
        err = symmetric_error_pct(allreduce_time(size_bytes=s, ranks=ranks, alpha_s=alpha_s,
                                                 beta_bytes_per_s=beta_bytes_per_s), t)
        if abs(err) >= abs(worst):
            worst, at = err, s
    head = (f"The alpha-beta line fitted to the idle sweep (alpha = {alpha_s * 1e6:.3g} us, "
            f"beta = {beta_bytes_per_s / 1e9:.3g} GB/s) ")
    if math.isfinite(worst) and abs(worst) <= TIME_TOLERANCE_PCT:
        return head + (f"is within {TIME_TOLERANCE_PCT:g}% of every measured size (worst "
                       f"{worst:+.1f}%, at {_size(at)}).")
    side = "above" if worst > 0 else "below"
    return head + (f"is {1 + abs(worst) / 100:.3g}x {side} the measured time at {_size(at)}: the "
                   "sweep is not one straight line, so the lab reads all-reduce times off the "
                   "measured sweep.")


def allreduce_sentence(*, world_size: int, size_bytes: float, predicted_s: float,
                       measured_s: float, p50_s: float) -> str:
    """This launch's all-reduce transfer (the median of the calls that waited for nothing) against
    the profile's, and the p50 that the calls which also waited for the scheduler raise.

    >>> allreduce_sentence(world_size=2, size_bytes=1 << 20, predicted_s=1e-3, measured_s=1.2e-3,
    ...                    p50_s=2.5e-3)
    'N = 2: the profile predicts a transfer of 1 ms for an all-reduce of 1 MiB; this launch measured 1.2 ms: 20% slower than the profile. Its p50, 2.5 ms, is 2.1x its transfer: some calls also waited for the scheduler.'
    >>> allreduce_sentence(world_size=2, size_bytes=1 << 20, predicted_s=1e-3, measured_s=0.8e-3,
    ...                    p50_s=0.85e-3).split(". ")[1]
    'Its p50, 0.85 ms, is 1.1x its transfer: few calls waited.'
    """
    ratio = p50_s / measured_s
    why = ("some calls also waited for the scheduler" if p50_s - measured_s > WAIT_THRESHOLD_S / 2
           else "few calls waited")
    return (f"N = {world_size}: the profile predicts a transfer of {predicted_s * 1e3:.3g} ms for "
            f"an all-reduce of {_size(size_bytes)}; this launch measured "
            f"{measured_s * 1e3:.3g} ms: {_slower(measured_s / predicted_s)} than the "
            f"profile. Its p50, {p50_s * 1e3:.3g} ms, is {ratio:.2g}x its transfer: {why}.")


def allreduce_law(*, world_size: int, size_bytes: float, predicted_s: float, measured_s: float,
                  cores: int, p50_s: float | None = None, fastest_s: float | None = None) -> dict:
    """The profile's all-reduce transfer against this launch's (the calls that waited for
    nothing; ``p50_s`` goes in the note): ``model`` with a core per rank, ``naive`` (ranks
    take turns) beyond. ``fastest_s``, the fastest call: the measured split of the transfer
    (:func:`labkit.machine.formulas.fastest_split`).

    >>> allreduce_law(world_size=2, size_bytes=1 << 20, predicted_s=1e-3, measured_s=1.1e-3,
    ...               cores=2, p50_s=3e-3)["note"]
    'transfers (the calls that waited for nothing); the p50 was 3 ms'
    >>> r = allreduce_law(world_size=4, size_bytes=1 << 20, predicted_s=1e-3, measured_s=9e-3,
    ...                   cores=2)
    >>> r["kind"], r["note"]
    ('naive', 'oversubscribed: 4 ranks on 2 cores take turns, a message waits for its rank to run')
    """
    crowded = world_size > cores
    note = ("transfers (the calls that waited for nothing)"
            + (f"; the p50 was {p50_s * 1e3:.3g} ms" if p50_s else ""))
    return _law(law=f"all-reduce transfer of {_size(size_bytes)} on {world_size} ranks (this "
                    "run's machine profile)", kind="naive" if crowded else "model",
                predicted=predicted_s * 1e3, measured=measured_s * 1e3, unit="ms",
                tolerance_pct=TIME_TOLERANCE_PCT,
                split=None if fastest_s is None else fastest_split(transfer_s=measured_s,
                                                                   fastest_s=fastest_s),
                note=(f"oversubscribed: {world_size} ranks on {cores} cores take turns, a message "
                      "waits for its rank to run") if crowded else note)


def _launch_split(measured_s: float, ready_s: float | None) -> dict | None:
    """A launch's wall time in measured parts: the slowest rank's start to joined, the rest.

    >>> _launch_split(1.8, 1.3)
    {'the slowest rank: start to joined (import torch, rendezvous)': 1.3, 'the rest (the agent, the work, the exit)': 0.5}
    """
    if ready_s is None or ready_s != ready_s:
        return None
    return {"the slowest rank: start to joined (import torch, rendezvous)": float(ready_s),
            "the rest (the agent, the work, the exit)": round(measured_s - ready_s, 9)}


def launch_cost_law(*, world_size: int, one_rank_s: float, measured_s: float,
                    cores: int, slowdown: float = 1.0, ready_s: float | None = None) -> dict:
    """t_launch(N) = t_launch(1) × s(N): ``model`` while each rank has a core to import torch
    on, the N imports side by side slowed by the co-run slowdown ``slowdown`` (the machine
    profile's, s(N): they share the memory system and the caches as any N computations do);
    ``naive`` beyond the cores (the ranks take turns), at t_launch(1). ``ready_s``, the
    slowest rank's seconds from its process start to the process group joined: the measured
    split (that, and the rest of the launch: the agent, the work, the exit).

    >>> launch_cost_law(world_size=2, one_rank_s=2.1, measured_s=2.8, cores=2,
    ...                 slowdown=1.3)["predicted"]
    2.73
    >>> launch_cost_law(world_size=2, one_rank_s=2.1, measured_s=2.8, cores=2)["holds"]
    False
    >>> launch_cost_law(world_size=4, one_rank_s=2.4, measured_s=5.0, cores=2)["kind"]
    'naive'
    """
    crowded = world_size > cores
    s = 1.0 if crowded else max(1.0, float(slowdown))
    what = ("what a 1-rank launch does" if crowded else
            "a 1-rank launch x the co-run slowdown")
    return _law(law=f"a launch of {world_size} ranks costs {what}", unit="s",
                kind="naive" if crowded else "model", predicted=round(one_rank_s * s, 9),
                measured=measured_s, split=_launch_split(measured_s, ready_s),
                tolerance_pct=TIME_TOLERANCE_PCT,
                note=(f"oversubscribed: {world_size} ranks on {cores} cores take turns importing "
                      "torch") if crowded else
                f"the 1-rank launch {one_rank_s:.2f} s x {s:.2f}, the profile's co-run slowdown "
                f"of {world_size} ranks (each imports torch on a core of its own, beside the "
                "others)")
