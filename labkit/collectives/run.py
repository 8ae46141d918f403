"""Host side: :func:`run`, the call behind ``labkit collectives`` and notebook 06.

One torchrun launch per world size sweeps every op over every size
(:mod:`labkit.collectives.worker`); the rows come back with the α–β model fitted per
(op, world size, dtype) beside each measurement (:func:`labkit.collectives.regimes.add_fit`:
α–β where it applies, the floor below it)
and, with a ``store``, are upserted into that results file under
:data:`labkit.collectives.report.KEY`; with a ``trace_dir``, each launch's timed calls are
written as a Chrome trace (:mod:`labkit.collectives.trace`).
"""

from __future__ import annotations

from labkit.collectives.config import CollectivesConfig
from labkit.launch import LaunchOptions


def run(config: CollectivesConfig, launch: LaunchOptions | None = None, store=None):
    """Run the sweep; return its rows as a DataFrame (one row per op x world size x size;
    columns in :data:`labkit.collectives.report.COLUMNS`).

    ``launch``: ranks per node and the rest (:class:`~labkit.launch.LaunchOptions`; default 2
    ranks; its ``trace_dir``: each launch's timed calls as a Chrome trace there,
    :mod:`labkit.collectives.trace`, the paths in ``df.attrs["trace_paths"]``); ``store``: a
    results file to upsert into. Everything is checked before the first launch. ``wrong`` is
    None unless ``config.check``; a 1-rank world moves nothing, so its fit columns are NaN.
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.collectives.regimes import add_fit
    from labkit.collectives.report import KEY
    from labkit.collectives.trace import trace_events
    from labkit.launch import launch_lab

    launch = launch if launch is not None else LaunchOptions(nprocs=(2,))
    launches = launch_lab("collectives", config, launch, store, traced=True)
    rows = add_fit([row for res in launches for row in res.rows()],
                   min_fit_bytes=config.fit_min_bytes)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's timed calls as a Chrome trace, from the rows as stored (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "collectives", rows, trace_events)]
    return df
