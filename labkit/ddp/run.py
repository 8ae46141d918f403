"""Host side: run the DDP lab over world sizes and get one DataFrame of rows back.

:func:`ddp_scaling` is what notebooks and ``labkit ddp`` call. It validates everything first
(the config, the launch options, the results path) so bad input fails with a one-line
:class:`~labkit.errors.UsageError` before a rank starts or a byte is written; then it makes one
torchrun launch per world size (``labkit.workers.ddp``), adds each launch's placement table and
the speedup / efficiency columns, and upserts the rows into ``json_path`` keyed by
:data:`labkit.ddp.config.ROW_KEY` (model and sizes, variant, world size, batch, DDP flags).
"""

from __future__ import annotations

import dataclasses
import warnings

from ..config import to_dict
from ..errors import UsageError
from . import analysis
from .config import ROW_KEY, DDPConfig

LAUNCH_OPTIONS = ("timeout_s", "threads_per_rank", "backend", "nnodes", "node_rank",
                  "rdzv_endpoint", "rdzv_id", "echo")


class PlacementWarning(UserWarning):
    """Two ranks share one GPU: every DDP number of that launch is wrong."""


def split_options(options: dict) -> tuple[DDPConfig, dict]:
    """Split flat keyword options into a validated :class:`DDPConfig` and launch options."""
    fields = {f.name for f in dataclasses.fields(DDPConfig)}
    unknown = sorted(set(options) - fields - set(LAUNCH_OPTIONS))
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; config: {', '.join(sorted(fields))}"
                         f"; launch: {', '.join(LAUNCH_OPTIONS)}")
    cfg = DDPConfig(**{k: v for k, v in options.items() if k in fields})
    return cfg, {k: v for k, v in options.items() if k in LAUNCH_OPTIONS}


def ddp_scaling(nprocs=(1, 2), *, json_path: str | None = None, progress: bool = True,
                **options):
    """Baseline + DDP at each ``nprocs`` (ranks per node, one launch each); rows as a DataFrame.

    ``options`` are :class:`~labkit.ddp.config.DDPConfig` fields (``model``, ``batch_size``,
    ``steps``, ``warmup``, ``bucket_cap_mb``, ``broadcast_buffers``, ``static_graph``,
    ``gradient_as_bucket_view``, ``baseline``, sizes...) and launch options (``timeout_s``,
    ``threads_per_rank``, ``backend``, multi-node). The no-DDP baseline runs inside the 1-rank
    launch; without 1 in ``nprocs`` there is no baseline and no speedup (a warning says so).

    Returns one row per (variant, world size): ``variant`` is ``no_ddp`` or ``ddp``; step-time
    percentiles ``step_time_p50_s`` ... ``_p95_s`` over the slowest rank, ``step_times_s`` (every
    timed step), ``samples_per_s`` (aggregate) and ``samples_per_s_per_replica``, ``speedup`` and
    ``scaling_efficiency`` against 1-rank DDP, ``speedup_vs_no_ddp``, the breakdown columns
    (``nosync_step_time_*``, ``allreduce_time_*``, ``exposed_comm_s``, ``overlap_fraction``,
    ``allreduce_busbw_gb_per_s``), ``placement`` (one dict per rank) and the launch fields.
    """
    import pandas as pd

    from ..launch import launch_many
    from ..results import check_writable, record

    cfg, launch_kw = split_options(options)
    nprocs = _check_nprocs(nprocs)
    if json_path is not None:
        check_writable(json_path)
    nnodes = launch_kw.get("nnodes", 1)
    if cfg.baseline and 1 not in [n * nnodes for n in nprocs]:
        warnings.warn("no 1-rank launch: the no-DDP baseline and the speedup against 1 rank "
                      "need one (add 1 to nprocs)", stacklevel=2)
    launches = launch_many("ddp", nprocs, to_dict(cfg), progress=progress, **launch_kw)
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
    rows = analysis.add_scaling_columns(rows)
    if json_path is not None:
        record(json_path, rows, key=ROW_KEY)
    return pd.DataFrame(rows)


def _check_nprocs(nprocs) -> list[int]:
    if isinstance(nprocs, int):
        nprocs = [nprocs]
    nprocs = list(nprocs)
    if not nprocs or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in nprocs):
        raise UsageError(f"nprocs must be a non-empty list of integers >= 1, got {nprocs!r}")
    if len(set(nprocs)) != len(nprocs):
        raise UsageError(f"nprocs has repeats: {nprocs!r}")
    return nprocs
