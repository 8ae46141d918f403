"""Host side: :func:`run`, the call behind ``labkit fsdp`` and notebook 09.

One torchrun launch per world size (:mod:`labkit.fsdp.worker`) runs every variant of the
config (DDP, the hand-written ZeRO-1, FSDP2); the rows come back with DDP's bytes beside each
and, with a ``store``, are upserted into that results file under :data:`labkit.fsdp.report.KEY`.
"""

from __future__ import annotations

from labkit.fsdp.config import FSDPConfig
from labkit.launch import LaunchOptions
from labkit.tp.run import warn_mismatches


class MismatchWarning(UserWarning):
    """A sharded model's outputs, gradients or parameters differ from one process's."""


def run(config: FSDPConfig, launch: LaunchOptions | None = None, store=None):
    """Every variant at each world size; one row per (variant, world size) (a DataFrame,
    columns in :data:`labkit.fsdp.report.COLUMNS`).

    ``launch``: ranks per node, one launch per value (:class:`~labkit.launch.LaunchOptions`);
    ``store``: a results file to upsert into. Everything is checked before the first launch:
    the config at every world size (a model big enough to give every rank a share, tensors that
    split evenly), the memory it needs, the launch options and the results file. A run that does
    not match one process warns (:class:`MismatchWarning`); its row says so. With
    ``launch.trace_dir``, each launch's recorded steps (ZeRO-1, ZeRO-2, FSDP: layers and
    collectives, every rank) as a Chrome trace there (:mod:`labkit.fsdp.trace`; the paths in
    ``df.attrs["trace_paths"]``).
    """
    import pandas as pd

    from labkit import results, trace
    from labkit.errors import UsageError
    from labkit.fsdp.report import KEY
    from labkit.fsdp.trace import trace_events
    from labkit.launch import launch_lab

    if not isinstance(config, FSDPConfig):
        raise UsageError(f"config must be an FSDPConfig, got {type(config).__name__}")
    launch = launch if launch is not None else LaunchOptions()
    launches = launch_lab("fsdp", config, launch, store, traced=True)
    rows = [row for res in launches for row in res.rows()]
    warn_mismatches(rows, MismatchWarning)
    results.store_rows(store, rows, KEY)
    df = pd.DataFrame(rows)
    # each launch's recorded steps as a Chrome trace, from the rows as stored
    df.attrs["trace_paths"] = [str(p) for p in trace.write_launches(
        launch.trace_dir, "fsdp", rows, trace_events)]
    return df
