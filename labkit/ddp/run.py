"""Host side: :func:`run`, the call behind ``labkit ddp`` and notebook 05.

One torchrun launch per world size (:mod:`labkit.ddp.worker`) runs every batch size of the
config: the no-DDP baseline (1-rank launch only), DDP, and the breakdown of where a step's time
goes. The rows come back with the launch's placement table, with speedup and efficiency
against the 1-rank DDP run (:func:`labkit.ddp.formulas.add_scaling_columns`), with the model's
step time and speedup beside the measured ones, given the run's machine profile
(:func:`labkit.ddp.predict.add_prediction_columns`) and, with a ``store``, are upserted into
that results file under :data:`labkit.ddp.report.KEY`.
"""

from __future__ import annotations

import warnings

from labkit.config import expect_config
from labkit.ddp.config import DDPConfig
from labkit.launch import LaunchOptions


class PlacementWarning(UserWarning):
    """Two ranks share one GPU: every DDP number of that launch is wrong."""


def run(config: DDPConfig, launch: LaunchOptions | None = None, store=None, *, profile=None,
        alone=None):
    """Baseline + DDP at each world size; one row per (batch size, variant, world size).

    ``launch``: ranks per node, one launch per value, and the rest
    (:class:`~labkit.launch.LaunchOptions`); ``store``: a results file to upsert into;
    ``profile``: this run's machine profile (:func:`labkit.machine.profile`), from which the
    model of every DDP row of more than one rank is built (:mod:`labkit.ddp.predict`; None: no
    model columns); ``alone``: rows of an earlier run to take the no-DDP step from (a config
    with ``baseline=False``).
    Everything is checked before the first launch. The no-DDP baseline runs inside the 1-rank
    launch; without a world size of 1 there is no baseline and no speedup (a warning says so).

    ``variant`` is ``no_ddp``, ``no_ddp_all_cores`` (``all_cores_batches``) or ``ddp``;
    step-time percentiles ``step_time_p50_s`` ...
    ``_p95_s`` over the slowest rank, ``samples_per_s`` (aggregate), ``speedup`` and
    ``scaling_efficiency`` against 1-rank DDP, ``speedup_vs_no_ddp``, the breakdown columns,
    the model's ``predicted_step_time_s`` and ``predicted_speedup_vs_no_ddp``,
    ``placement`` (one dict per rank) and the launch fields: every column is declared in
    :data:`labkit.ddp.report.COLUMNS`. With ``launch.trace_dir``, rank 0's timed steps of each
    launch as a Chrome trace there (:mod:`labkit.ddp.trace`; paths in
    ``df.attrs["trace_paths"]``). A launch whose ranks share a GPU warns
    (:class:`PlacementWarning`) and its rows carry ``placement_ok == False``.
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.ddp.formulas import add_scaling_columns
    from labkit.ddp.predict import add_prediction_columns
    from labkit.ddp.report import KEY
    from labkit.ddp.trace import trace_events
    from labkit.launch import launch_lab

    expect_config(config, DDPConfig)
    launch = launch if launch is not None else LaunchOptions()
    if config.baseline and isinstance(launch, LaunchOptions) and 1 not in launch.world_sizes:
        warnings.warn("no 1-rank launch: the no-DDP baseline and the speedup against 1 rank "
                      "need one (add 1 to nprocs)", stacklevel=2)
    launches = launch_lab("ddp", config, launch, store, traced=True)
    rows = []
    for res in launches:
        table = res.placement
        problems = [p for p in table if p.get("problem")]
        if problems:
            warnings.warn(f"{len(problems)} of {res.world_size} ranks share a GPU with another "
                          f"rank: {problems[0]['problem']} (rank {problems[0]['rank']})",
                          PlacementWarning, stacklevel=2)
        for row in res.rows():
            row["placement"] = table
            row["placement_ok"] = not problems
            rows.append(row)
    rows = add_scaling_columns(rows)
    if profile is not None:
        extra = alone.to_dict("records") if hasattr(alone, "to_dict") else list(alone or [])
        rows = add_prediction_columns(rows, profile=profile, alone=extra)
        rows = _with_mfu(rows, config, profile)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # rank 0's timed steps as a Chrome trace per launch, from the rows (launch.trace_dir)
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "ddp", rows, trace_events)]
    return df


def _with_mfu(rows: list[dict], config: DDPConfig, profile) -> list[dict]:
    """Rows with their model FLOPs utilisation against the profile's measured peak of one rank
    (:mod:`labkit.machine.roofline`) and, on a GPU the accelerator catalogue lists, against
    its datasheet's fp32 peak (the lab trains in fp32)."""
    from labkit.ddp.budget import flop_per_sample
    from labkit.ddp.formulas import add_mfu_columns
    from labkit.ddp.report import on_gpu
    from labkit.errors import UsageError
    from labkit.machine.roofline import catalog_key, from_profile
    from labkit.perfmodel import catalog

    if not any(r.get("measurement") == "matmul" for r in getattr(profile, "rows", ())):
        return rows  # a profile without measured products (a synthetic one): no peak to use
    catalog_peak = None
    gpu = next((r for r in rows if on_gpu(r)), None)
    if gpu is not None:
        try:
            entries = catalog.load_catalog("accelerators")
            key = catalog_key(gpu.get("device_name") or "", entries)
            catalog_peak = entries[key].peak("fp32") if key is not None else None
        except UsageError:  # no catalogue, or no fp32 peak in it: the measured peak alone
            catalog_peak = None
    return add_mfu_columns(rows, flop_per_sample=flop_per_sample(config),
                           peak_flop_per_s=from_profile(profile).peak_flop_per_s,
                           catalog_peak_flop_per_s=catalog_peak)
