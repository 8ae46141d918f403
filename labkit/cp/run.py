"""Host side: :func:`run`, the call behind ``labkit cp`` and the notebook's CP section.

One torchrun launch per world size (:mod:`labkit.cp.worker`) runs every variant of the config;
with a ``store`` the rows are upserted into that results file under
:data:`labkit.cp.report.KEY`.
"""

from __future__ import annotations

import dataclasses

from labkit.cp.config import CPConfig
from labkit.launch import LaunchOptions


class MismatchWarning(UserWarning):
    """Ring attention differs from one process's: its timings are of a wrong computation."""


def run(config: CPConfig, launch: LaunchOptions | None = None, store=None):
    """Every variant at each world size; one row per (variant, world size) (a DataFrame,
    columns in :data:`labkit.cp.report.COLUMNS`).

    ``launch``: ranks per node, one launch per value; one that leaves ``threads_per_rank``
    unset gets 1 (every rank one core, as every GPU rank one GPU). Everything is checked
    before the first launch: the config at every world size (the sequence cut into P equal
    blocks, 2P for the balanced split), the memory, the launch options and the results file.
    A run whose ring does not match one process warns (:class:`MismatchWarning`). With
    ``launch.trace_dir``, each launch's median timed pass of every variant (every rank's ring
    steps, compute and messages) as a Chrome trace there (:mod:`labkit.cp.trace`; the paths in
    ``df.attrs["trace_paths"]``).
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.config import expect_config
    from labkit.cp.report import KEY
    from labkit.cp.trace import trace_events
    from labkit.launch import launch_lab
    from labkit.tp.run import warn_mismatches

    expect_config(config, CPConfig)
    if isinstance(launch, LaunchOptions) and launch.threads_per_rank is None:
        launch = dataclasses.replace(launch, threads_per_rank=1)
    elif launch is None:
        launch = LaunchOptions(threads_per_rank=1)
    rows = [row for res in launch_lab("cp", config, launch, store, traced=True)
            for row in res.rows()]
    warn_mismatches(rows, MismatchWarning)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's median pass of every variant as a Chrome trace (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "cp", rows, trace_events)]
    return df
