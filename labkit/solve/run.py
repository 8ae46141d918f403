"""Host side: :func:`run`, the call behind ``labkit solve`` and notebooks 03 and 04.

One torchrun launch per world size does every (mode, partitioner, method) point of that world
size (:mod:`labkit.solve.worker`); the rows come back with speedup and efficiency against the
1-rank row of their series (:func:`labkit.solve.formulas.add_scaling_columns`) and, with a
``store``, are upserted into that results file under :data:`labkit.solve.report.KEY`.
"""

from __future__ import annotations

from labkit.launch import LaunchOptions
from labkit.solve.config import SolveConfig


def run(config: SolveConfig, launch: LaunchOptions | None = None, store=None):
    """Run the sweep; return its rows as a DataFrame (one row per mode x world size x
    partitioner x method; columns in :data:`labkit.solve.report.COLUMNS`).

    ``launch``: ranks per node and the rest (:class:`~labkit.launch.LaunchOptions`; its
    ``trace_dir``: each launch's recorded iterations as a Chrome trace there,
    :mod:`labkit.solve.trace`, the paths in ``df.attrs["trace_paths"]``); ``store``:
    a results file to upsert into (the 1-rank baselines of earlier runs in it count). Rows with
    ``gate_passed == False`` are kept but get no speedup or efficiency
    (:func:`labkit.solve.report.gate_failures` lists them). Everything is checked before the
    first launch.
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.errors import ResultsFileError
    from labkit.launch import launch_lab
    from labkit.solve.formulas import add_scaling_columns
    from labkit.solve.report import KEY
    from labkit.solve.trace import trace_events

    launches = launch_lab("solve", config, launch, store, traced=True)
    rows = [row for res in launches for row in res.rows()]
    try:  # earlier 1-rank baselines; a file broken since the check is handled by store_rows
        old = results.read_rows(store) if store is not None else []
    except ResultsFileError:
        old = []
    rows = add_scaling_columns(rows, baselines=old)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's recorded iterations as a Chrome trace, from the rows (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir if launch is not None else None, "solve", rows, trace_events)]
    return df
