"""The workshare job's model on this machine, and what a notebook run of it costs (pure).

Amdahl's law gives every rank a core of its own that runs as fast as one rank alone. This
machine's profile says otherwise: with N ranks computing at once each runs ``slowdown(N)``
times slower than alone (memory and caches shared, ranks taking turns once there are more
ranks than cores). The job's serial part runs on rank 0 alone (the others wait at a barrier,
off the cores), its parallel part on every rank at once, so its time on N ranks is

    t_N = t_product · (serial + share_max(N) · slowdown(N))

with ``share_max`` the busiest rank's products, and its speedup over one rank
``s_N = total / (serial + share_max · slowdown)``: plain Amdahl when the slowdown is 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.errors import UsageError

#: notebook 02's share of the lab's budget (seconds of wall time at its defaults)
BUDGET_S = 16.0
#: one launch of a few ranks, each with a core: the agent, one Python per rank importing torch
#: and the rendezvous (about 2-3 s on a 2-core machine)
LAUNCH_S = 2.5
#: the notebook outside its live launches: the kernel, imports, the published tables' figures
NOTEBOOK_FIXED_S = 6.5
#: untimed runs before the timed ones in every live launch (WorkshareConfig.warmup)
WARMUP = 1


def corun_speedup(*, total_work: int, serial_products: int, parallel_products_max: int,
                  slowdown: float) -> float:
    """The speedup over one rank when the parallel part runs ``slowdown`` times slower than
    alone (the profile's co-run slowdown at N ranks; 1 is plain Amdahl).

    600 products, 60 serial, 270 on the busiest of 2 ranks, each 1.25x slower together:

    >>> round(corun_speedup(total_work=600, serial_products=60, parallel_products_max=270,
    ...                     slowdown=1.25), 3)
    1.509
    >>> corun_speedup(total_work=600, serial_products=60, parallel_products_max=270, slowdown=1)
    1.818...
    """
    if slowdown <= 0:
        raise ValueError(f"slowdown must be > 0, got {slowdown}")
    return total_work / (serial_products + parallel_products_max * slowdown)


def parallel_added_fraction(*, serial_fraction: float, world_size: int, slowdown: float) -> float:
    """What the co-run slowdown adds to a serial fraction read off a speedup by Karp-Flatt:
    ``e_N - f = (1 - f)(slowdown - 1) / (N - 1)`` (0 at N = 1).

    >>> parallel_added_fraction(serial_fraction=0.1, world_size=2, slowdown=1.25)
    0.225
    """
    if world_size < 2:
        return 0.0
    return (1 - serial_fraction) * (slowdown - 1) / (world_size - 1)


def apparent_serial_fraction(world_sizes: Sequence[int], speedups: Sequence[float]) -> float:
    """The serial fraction an Amdahl fit reads off these speedups (the fit of
    :func:`labkit.metrics.fit_amdahl` on the times 1/s): what the model says the fit will find.

    >>> round(apparent_serial_fraction([1, 2], [1, 1 / 0.6625]), 3)
    0.325
    """
    from labkit.metrics import fit_amdahl

    return fit_amdahl(list(world_sizes), [1 / s for s in speedups])


def job_seconds(*, total_work: int, matrix_size: int, flop_per_s: float,
                serial_fraction: float, world_size: int, slowdown: float) -> float:
    """One run of the job on ``world_size`` ranks: its products at the rate of one rank alone,
    the parallel part ``slowdown`` times slower.

    >>> round(job_seconds(total_work=600, matrix_size=192, flop_per_s=30e9, serial_fraction=0.1,
    ...                   world_size=2, slowdown=1.25), 3)
    0.188
    """
    product_s = 2 * matrix_size ** 3 / flop_per_s
    serial = round(total_work * serial_fraction)
    share = math.ceil((total_work - serial) / world_size)
    return product_s * (serial + share * slowdown)


def notebook_seconds(*, live_world_sizes: Sequence[int], total_work: int, matrix_size: int,
                     serial_fraction: float, repeat: int, cores: int, flop_per_s: float,
                     co_run: float) -> float:
    """Notebook 02's wall time, estimated before its live launches: the fixed part, then per
    world size a launch (ranks beyond the cores take turns importing torch) and ``WARMUP +
    repeat`` runs of the job (``co_run``: the profile's co-run slowdown at one rank a core).

    >>> round(notebook_seconds(live_world_sizes=[1, 2, 4], total_work=600, matrix_size=192,
    ...                        serial_fraction=0.1, repeat=3, cores=2, flop_per_s=30e9,
    ...                        co_run=1.25), 1)
    19.1
    """
    total = NOTEBOOK_FIXED_S
    for n in live_world_sizes:
        crowd = max(1.0, n / cores)
        slowdown = 1.0 if n == 1 else co_run * crowd
        total += LAUNCH_S * crowd + (WARMUP + repeat) * job_seconds(
            total_work=total_work, matrix_size=matrix_size, flop_per_s=flop_per_s,
            serial_fraction=serial_fraction, world_size=n, slowdown=slowdown)
    return total


def check_budget(*, budget_s: float = BUDGET_S, **run) -> float:
    """The estimate of :func:`notebook_seconds` (keyword arguments ``run``), or a one-line
    :class:`~labkit.errors.UsageError` when it is over ``budget_s``, before anything launches.

    >>> check_budget(live_world_sizes=[1, 2], total_work=600, matrix_size=192,
    ...              serial_fraction=0.1, repeat=3, cores=2, flop_per_s=30e9, co_run=1.25) < 16
    True
    """
    est = notebook_seconds(**run)
    if est > budget_s:
        raise UsageError(
            f"notebook 02 with live_world_sizes={list(run['live_world_sizes'])}, total_work="
            f"{run['total_work']}, repeat={run['repeat']} would take about {est:.0f} s, over its "
            f"budget of {budget_s:g} s: use fewer world sizes (each launch costs about "
            f"{LAUNCH_S:g} s, more beyond {run['cores']} ranks), a smaller total_work or repeat")
    return est
