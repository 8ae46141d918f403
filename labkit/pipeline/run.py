"""Host side: :func:`run`, the call behind ``labkit pipeline`` and notebook 07.

One torchrun launch per P (= world size) runs every (schedule, M) of the grid
(:mod:`labkit.pipeline.worker`); the rows come back with the measured bubbles beside the
formula's (``bubble_error``, ``bubble_fill_drain_error``), the predicted step beside the
measured one (``step_time_error_pct``), stage 0's measured peak of saved activations beside
what its schedule implies (``peak_activation_bytes_formula``) and, with a ``store``, are
upserted into that results file under :data:`labkit.pipeline.report.KEY`.
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
    ranks and a :data:`DEFAULT_TIMEOUT_S` timeout; its ``trace_dir``: each launch's blocks as a
    Chrome trace there, :mod:`labkit.pipeline.trace`, the paths in ``df.attrs["trace_paths"]``);
    ``store``: a results file to upsert into.
    Everything is validated for every P before the first launch
    (:meth:`~labkit.pipeline.config.PipelineConfig.check_world_size`): 1F1B with M < P is
    refused or, with ``config.skip_invalid``, left out of the grid (GPipe keeps its M = 1).
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.launch import launch_lab
    from labkit.metrics import model_error_pct
    from labkit.pipeline.activations import peak_activation_formula
    from labkit.pipeline.report import KEY
    from labkit.pipeline.trace import trace_events

    if launch is None:
        launch = LaunchOptions(nprocs=(2,), timeout_s=DEFAULT_TIMEOUT_S)
    launches = launch_lab("pipeline", config, launch, store, traced=True)
    rows = [row for res in launches for row in res.rows()]
    for row in rows:
        row["bubble_error"] = row["bubble_measured"] - row["bubble_formula"]
        row["bubble_fill_drain_error"] = row["bubble_fill_drain"] - row["bubble_formula"]
        row["step_time_error_pct"] = model_error_pct(model_s=row["step_time_predicted_s"],
                                                     measured_s=row["step_time_s"])
        row["peak_activation_bytes_formula"] = peak_activation_formula(
            row["schedule"], num_stages=row["num_stages"], num_microbatches=row["num_microbatches"],
            layers=row["layers"], hidden=row["hidden"], batch=row["batch"],
            virtual_stages=row["virtual_stages"])
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's blocks as a Chrome trace, from the rows as stored (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "pipeline", rows, trace_events)]
    return df
