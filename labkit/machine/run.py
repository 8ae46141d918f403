"""Host side: :func:`run`, the call behind ``labkit calibrate``, ``labkit lab``'s first step
and :func:`labkit.machine.profile` when no profile exists yet.

One launch of :mod:`labkit.machine.worker` (2 ranks by default); the rows are upserted into
``store`` under :data:`labkit.machine.report.KEY`.
"""

from __future__ import annotations

from labkit.launch import LaunchOptions
from labkit.machine.config import MachineConfig


def run(config: MachineConfig, launch: LaunchOptions | None = None, store=None):
    """Measure the profile; its rows as a DataFrame (columns in
    :data:`labkit.machine.report.COLUMNS`)."""
    import pandas as pd

    from labkit import results
    from labkit.config import expect_config
    from labkit.launch import launch_lab
    from labkit.machine.report import KEY

    expect_config(config, MachineConfig)
    launch = launch if launch is not None else LaunchOptions(nprocs=(2,))
    launches = launch_lab("machine", config, launch, store)
    prov = results.provenance()  # where and when, also on rows that are not stored
    rows = [{**prov, **row} for res in launches for row in res.rows()]
    results.store_rows(store, rows, KEY)
    return pd.DataFrame(rows)
