"""Host side: :func:`run`, the call behind ``labkit moe`` and the notebook's MoE section.

One torchrun launch per world size (:mod:`labkit.moe.worker`); one row per launch, upserted
with a ``store`` into that results file under :data:`labkit.moe.report.KEY`.
"""

from __future__ import annotations

import dataclasses
import warnings

from labkit.launch import LaunchOptions
from labkit.moe.config import MoEConfig


class MismatchWarning(UserWarning):
    """The expert-parallel layer's output or gradients differ from one process's: its timings
    are of a wrong computation."""


def run(config: MoEConfig, launch: LaunchOptions | None = None, store=None):
    """The layer at each world size; one row per world size (a DataFrame, columns in
    :data:`labkit.moe.report.COLUMNS`).

    ``launch``: ranks per node, one launch per value (:class:`~labkit.launch.LaunchOptions`);
    one that leaves ``threads_per_rank`` unset gets 1 (every rank brings one core, as every
    GPU rank brings one GPU). ``store``: a results file to upsert into. Everything is checked
    before the first launch: the experts divisible by every world size, the memory, the launch
    options and the results file. A run that does not match one process warns
    (:class:`MismatchWarning`); its row says so. With ``launch.trace_dir``, each launch's
    median timed step (every rank's phases) as a Chrome trace there (:mod:`labkit.moe.trace`;
    the paths in ``df.attrs["trace_paths"]``).
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.config import expect_config
    from labkit.launch import launch_lab
    from labkit.moe.report import KEY
    from labkit.moe.trace import trace_events

    expect_config(config, MoEConfig)
    if isinstance(launch, LaunchOptions) and launch.threads_per_rank is None:
        launch = dataclasses.replace(launch, threads_per_rank=1)
    elif launch is None:
        launch = LaunchOptions(threads_per_rank=1)
    rows = [row for res in launch_lab("moe", config, launch, store, traced=True)
            for row in res.rows()]
    bad = [r for r in rows if not r.get("matches_single_process")]
    if bad:  # stacklevel 2: the line that called run
        warnings.warn(f"{len(bad)} run(s) differ from one process: " + ", ".join(
            f"{r['world_size']} ranks (error {r['max_rel_error']:.2e})" for r in bad),
            MismatchWarning, stacklevel=2)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's median step as a Chrome trace, from the rows (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "moe", rows, trace_events)]
    return df
