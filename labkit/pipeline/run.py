"""Host side: :func:`run`, the call behind ``labkit pipeline`` and notebook 07.

One torchrun launch per P (= world size) runs every (schedule, M) of the grid
(:mod:`labkit.pipeline.worker`); the rows come back with the measured bubbles beside the
formula's (``bubble_error``, ``bubble_fill_drain_error``), the predicted step beside the
measured one (``step_time_error_pct``) and, with a ``store``, are upserted into that results
file under :data:`labkit.pipeline.report.KEY`.
"""

from __future__ import annotations

from labkit.launch import LaunchOptions
from labkit.pipeline.config import PipelineConfig

#: pipelining on gloo can hang: without launch options, a launch is ended after this long
DEFAULT_TIMEOUT_S = 300.0


def run(config: PipelineConfig, launch: LaunchOptions | None = None, store=None):
    """Measure each (schedule, M) on P = each world size; return one row per (P, schedule, M)
    as a DataFrame (columns in :data:`labkit.pipeline.report.COLUMNS`).

    ``launch``: ranks per node and the rest (:class:`~labkit.launch.LaunchOptions`; default 2
    ranks and a :data:`DEFAULT_TIMEOUT_S` timeout); ``store``: a results file to upsert into.
    Everything is validated for every P before the first launch
    (:meth:`~labkit.pipeline.config.PipelineConfig.check_world_size`): 1F1B with M < P is
    refused or, with ``config.skip_invalid``, left out of the grid (GPipe keeps its M = 1).
    """
    import pandas as pd

    from labkit import results
    from labkit.launch import launch_lab
    from labkit.metrics import model_error_pct
    from labkit.pipeline.report import KEY

    if launch is None:
        launch = LaunchOptions(nprocs=(2,), timeout_s=DEFAULT_TIMEOUT_S)
    launches = launch_lab("pipeline", config, launch, store)
    rows = [row for res in launches for row in res.rows()]
    for row in rows:
        row["bubble_error"] = row["bubble_measured"] - row["bubble_formula"]
        row["bubble_fill_drain_error"] = row["bubble_fill_drain"] - row["bubble_formula"]
        row["step_time_error_pct"] = model_error_pct(model_s=row["step_time_predicted_s"],
                                                     measured_s=row["step_time_s"])
    results.store_rows(store, rows, KEY)
    return pd.DataFrame(rows)
