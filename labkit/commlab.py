"""Host side of the collectives and pipeline labs: the functions notebooks call.

``collectives(...)`` and ``pipeline(...)`` validate everything, launch once per world size
(:func:`labkit.launch.launch_many`) and return the rows as a DataFrame; ``labkit collectives``
and ``labkit pipeline`` (:mod:`labkit.commands.comm`) print them nccl-tests style. The pure
formulas live in :mod:`labkit.comm` and :mod:`labkit.bubbles`; the rank side in
:mod:`labkit.workers.collectives` and :mod:`labkit.workers.pipeline`.
"""

from __future__ import annotations

COLLECTIVES_KEY = ("op", "world_size", "size_bytes", "dtype", "backend", "nnodes")
PIPELINE_KEY = ("schedule", "num_stages", "num_microbatches", "virtual_stages", "layers",
                "hidden", "batch", "backend", "nnodes")


def collectives(nprocs=(2,), *, ops=("all_reduce",), min_bytes=8, max_bytes="64M",
                factor: float = 2.0, iters: int = 20, warmup: int = 5, dtype: str = "float32",
                check: bool = True, min_fit_bytes: int = 0, progress: bool = True, **launch_kw):
    """Sweep each op over sizes on each world size; rows with nccl-tests columns and the α–β fit.

    Columns: op, world_size, size_bytes, count, dtype, time_p50_s, time_p10_s, time_p90_s,
    algbw_gb_per_s, busbw_gb_per_s, wrong (None without ``check``), and from
    :func:`labkit.comm.add_fit`: alpha_s, beta_gb_per_s, model_time_s, model_busbw_gb_per_s,
    model_error_pct, crossover_bytes; plus the launch fields (oversubscribed, ...).
    """
    import pandas as pd

    from .comm import CollectivesConfig, add_fit
    from .config import to_dict
    from .launch import launch_many

    cfg = CollectivesConfig(ops=tuple(ops) if not isinstance(ops, str) else ops,
                            min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, iters=iters,
                            warmup=warmup, dtype=dtype, check=check)
    rows = []
    for res in launch_many("collectives", nprocs, to_dict(cfg), progress=progress, **launch_kw):
        rows += res.rows()
    return pd.DataFrame(add_fit(rows, min_fit_bytes=min_fit_bytes))


def pipeline(nprocs=(2,), *, schedules=("gpipe", "1f1b"), microbatches=(2, 4, 8), layers: int = 8,
             hidden: int = 512, batch: int = 128, steps: int = 5, warmup: int = 2,
             virtual_stages: int = 2, seed: int = 0, check: bool = True,
             skip_invalid: bool = False, progress: bool = True, **launch_kw):
    """Measure each (schedule, M) on P = each world size; one row per (P, schedule, M).

    Columns: schedule, num_stages, num_microbatches, step_time_s (slowest rank, median),
    busy_time_s (sum over ranks), busy_per_microbatch_s, bubble_measured, bubble_formula,
    matches_single_process, blocks (per-microbatch F/B start/end per rank, last step), and the
    launch fields. Everything is validated for every P before the first launch; 1F1B with
    M < P is refused, or with ``skip_invalid`` left out of the grid (GPipe keeps its M = 1).
    """
    import pandas as pd

    from .bubbles import PipelineConfig
    from .config import to_dict
    from .launch import launch_many

    cfg = PipelineConfig(schedules=tuple([schedules] if isinstance(schedules, str) else schedules),
                         microbatches=tuple([microbatches] if isinstance(microbatches, int)
                                            else microbatches),
                         layers=layers, hidden=hidden, batch=batch, steps=steps, warmup=warmup,
                         virtual_stages=virtual_stages, seed=seed, check=check,
                         skip_invalid=skip_invalid)
    nnodes = launch_kw.get("nnodes", 1)
    for n in nprocs:
        cfg.validate_for(n * nnodes)
    launch_kw.setdefault("timeout_s", 300.0)  # pipelining on gloo can hang: never wait forever
    rows = []
    for res in launch_many("pipeline", nprocs, to_dict(cfg), progress=progress, **launch_kw):
        rows += res.rows()
    df = pd.DataFrame(rows)
    if len(df):
        df["bubble_error"] = df.bubble_measured - df.bubble_formula
    return df


def schedule_blocks(df, schedule: str, num_stages: int, num_microbatches: int):
    """The F/B blocks of one (schedule, P, M) row as a DataFrame (rank, stage, kind,
    microbatch, start_s, end_s), for :func:`labkit.plots.comm.schedule_diagram`."""
    import pandas as pd

    from .errors import UsageError

    sel = df[(df.schedule == schedule) & (df.num_stages == num_stages)
             & (df.num_microbatches == num_microbatches)]
    if sel.empty:
        have = sorted({(r.schedule, r.num_stages, r.num_microbatches) for r in df.itertuples()})
        raise UsageError(f"no row for {schedule} P={num_stages} M={num_microbatches} (have {have})")
    return pd.DataFrame(sel.iloc[-1]["blocks"])
