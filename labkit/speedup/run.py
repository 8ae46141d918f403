"""Host side: :func:`run`, the call behind ``labkit workshare`` and notebook 02's live part.

A job with a serial part you choose: Amdahl's law, measured. Every rank uses one thread, so
that N ranks use N cores and "speedup over one rank" means "over one core".

Because you set the serial fraction, you can check the fit: :func:`labkit.metrics.fit_amdahl`
on the measured times (:func:`labkit.speedup.report.live_speedup`) should give back about
``serial_fraction`` while the ranks have cores of their own, and more than that once they share
cores (oversubscription adds a serial part you did not write).
"""

from __future__ import annotations

import dataclasses

from labkit.config import expect_config
from labkit.launch import LaunchOptions
from labkit.speedup.config import WorkshareConfig

#: one launch per rank count, one thread per rank, 5 minutes a launch
DEFAULT_LAUNCH = LaunchOptions(nprocs=(1, 2), threads_per_rank=1, timeout_s=300.0)


def run(config: WorkshareConfig, launch: LaunchOptions | None = None, store=None):
    """Launch the job once per world size; return one row per world size (a DataFrame).

    Columns (:data:`labkit.speedup.report.COLUMNS`): ``world_size``, ``time_s`` (p50 over
    ``repeat`` runs of the slowest rank, launch excluded), ``time_min_s``, ``time_cv``, its
    measured split (``serial_part_s``, ``parallel_part_s``), every rank's timed runs segment by
    segment (``timeline_s``), the config, and the launch fields (``launch_wall_time_s``,
    ``oversubscribed``, ...).

    ``launch`` defaults to :data:`DEFAULT_LAUNCH`; one that leaves ``threads_per_rank`` unset
    gets 1 (the lab's speedup is over one core); its ``trace_dir``: each launch's timed runs as
    a Chrome trace there (:mod:`labkit.speedup.trace`, the paths in ``df.attrs["trace_paths"]``).
    ``store``: a results file to upsert the rows into, under :data:`labkit.speedup.report.KEY`.
    Everything is checked before the first launch.
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.launch import launch_lab
    from labkit.speedup.report import KEY
    from labkit.speedup.trace import trace_events

    expect_config(config, WorkshareConfig)
    launch = DEFAULT_LAUNCH if launch is None else launch
    if isinstance(launch, LaunchOptions) and launch.threads_per_rank is None:
        launch = dataclasses.replace(launch, threads_per_rank=1)
    launches = launch_lab("workshare", config, launch, store, traced=True)
    rows = [row for res in launches for row in res.rows()]
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's timed runs as a Chrome trace, from the rows (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "workshare", rows, trace_events)]
    return df
