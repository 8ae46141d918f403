"""Host side: :func:`run`, the call behind ``labkit tp`` and notebook 09.

One torchrun launch per world size (:mod:`labkit.tp.worker`) runs every variant of the config;
the rows come back with the speedup of each variant against its 1-rank run (when the sweep has
one) and, with a ``store``, are upserted into that results file under
:data:`labkit.tp.report.KEY`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from labkit.launch import LaunchOptions
from labkit.tp.config import TPConfig


class MismatchWarning(UserWarning):
    """A split model's output or gradients differ from one process's: its timings are of a
    wrong computation."""


def warn_mismatches(rows: list[dict], category: type[Warning] = MismatchWarning) -> None:
    """Warn (``category``), at the caller's caller, naming every row whose model does not
    match one process (``matches_single_process``, ``max_rel_error``); the FSDP lab's
    :func:`labkit.fsdp.run.run` warns the same way.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     warn_mismatches([{"variant": "naive", "world_size": 2, "max_rel_error": 0.5,
    ...                       "matches_single_process": False}])
    >>> str(seen[0].message)
    '1 run(s) differ from one process: naive at 2 ranks (error 5.00e-01)'
    """
    bad = [r for r in rows if not r.get("matches_single_process")]
    if bad:
        # stacklevel 3: the line that called the lab's run
        warnings.warn(f"{len(bad)} run(s) differ from one process: " + ", ".join(
            f"{r['variant']} at {r['world_size']} ranks (error {r['max_rel_error']:.2e})"
            for r in bad), category, stacklevel=3)


def add_speedup(rows: list[dict]) -> list[dict]:
    """``speedup_vs_1_rank`` = p50 step time of the 1-rank run of the same variant and model /
    this row's (NaN without one).

    >>> rows = [{"variant": "naive", "world_size": 1, "step_time_p50_s": 0.03},
    ...         {"variant": "naive", "world_size": 2, "step_time_p50_s": 0.02}]
    >>> [r["speedup_vs_1_rank"] for r in add_speedup(rows)]
    [1.0, 1.5]
    """
    from labkit.tp.report import KEY

    def bench(r):
        return tuple(r.get(k) for k in KEY if k != "world_size")

    ones = {bench(r): r["step_time_p50_s"] for r in rows if r.get("world_size") == 1}
    out = []
    for r in rows:
        t1 = ones.get(bench(r))
        out.append({**r, "speedup_vs_1_rank": t1 / r["step_time_p50_s"] if t1 else math.nan})
    return out


def run(config: TPConfig, launch: LaunchOptions | None = None, store=None):
    """Every variant at each world size; one row per (variant, world size) (a DataFrame,
    columns in :data:`labkit.tp.report.COLUMNS`).

    ``launch``: ranks per node, one launch per value (:class:`~labkit.launch.LaunchOptions`);
    one that leaves ``threads_per_rank`` unset gets 1: every rank brings one core, as every
    GPU rank brings one GPU, so the 1-rank run is the whole model on one core and
    ``speedup_vs_1_rank`` asks whether splitting it over P devices pays (several threads in one
    process would split its matrix products already, without any all-reduce).
    ``store``: a results file to upsert into; ``launch.trace_dir``: each launch's timelines (the
    hand-written versions' median step, every rank's compute, waits and messages) as a Chrome
    trace there (:mod:`labkit.tp.trace`; the paths in ``df.attrs["trace_paths"]``).
    Everything is checked before the first launch:
    the config at every world size (heads and hidden size divisible by the ranks, a head per
    rank), the memory it needs, the launch options and the results file. A run whose split
    model does not match one process warns (:class:`MismatchWarning`); its row says so.
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.errors import UsageError
    from labkit.launch import launch_lab
    from labkit.tp.report import KEY
    from labkit.tp.trace import trace_events

    if not isinstance(config, TPConfig):
        raise UsageError(f"config must be a TPConfig, got {type(config).__name__}")
    if isinstance(launch, LaunchOptions) and launch.threads_per_rank is None:
        launch = dataclasses.replace(launch, threads_per_rank=1)
    elif launch is None:
        launch = LaunchOptions(threads_per_rank=1)
    if config.baseline and 1 in launch.world_sizes:  # a 1-rank launch gives the 1-rank rows
        config = dataclasses.replace(config, baseline=False)
    launches = launch_lab("tp", config, launch, store, traced=True)
    rows = add_speedup([row for res in launches for row in res.rows()])
    warn_mismatches(rows)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's median steps as a Chrome trace, from the rows as stored (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "tp", rows, trace_events)]
    return df
