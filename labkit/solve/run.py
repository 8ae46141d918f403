"""Host side: :func:`solve_scaling`, the call behind ``labkit solve`` and the notebook.

One torchrun launch per world size does every (mode, partitioner, method) point of that world
size (:mod:`labkit.workers.solve`); the rows come back with speedup and efficiency against the
1-rank row of their series (:func:`labkit.solve.measure.add_scaling_columns`) and, with
``json_path``, are upserted into a results file under :data:`KEY`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import to_dict
from .config import SolveConfig

#: the issue's key plus what else makes a different measurement of the same point: the problem's
#: dimension and right-hand side, the engine (labkit or torch-sla) and the transport
KEY = ("mode", "world_size", "dof_per_rank", "partitioner", "method", "dim", "rhs", "engine",
       "transport")

#: the table ``labkit solve`` prints (the seed's columns plus iterations and time/iteration)
TABLE_COLUMNS = ("world_size", "dof_global", "dof_per_rank", "partitioner", "method",
                 "solve_time_s", "iterations", "time_per_iteration_s", "rel_residual",
                 "throughput_dof_per_s", "efficiency", "bandwidth_fraction", "gate_passed")


def make_config(world_sizes: Sequence[int], *, modes=("strong",), dim: int = 2,
                dof_per_rank: int | None = None, total_dof: int | None = None,
                methods=("cg",), partitioners=("simple",), rhs: str = "random",
                rtol: float = 1e-8, maxiter: int | None = None, restart: int = 30,
                warmup: int = 1, repeat: int = 3, seed: int = 0, engine: str = "labkit",
                transport: str = "auto", nnodes: int = 1) -> SolveConfig:
    """A validated :class:`SolveConfig` (UsageError on bad input, before any launch)."""
    def tup(v):
        return (v,) if isinstance(v, (str, int)) else tuple(v)

    return SolveConfig(
        modes=tup(modes), world_sizes=tuple(int(n) * nnodes for n in tup(world_sizes)), dim=dim,
        dof_per_rank=dof_per_rank, total_dof=total_dof, methods=tup(methods),
        partitioners=tup(partitioners), rhs=rhs, rtol=rtol, maxiter=maxiter, restart=restart,
        warmup=warmup, repeat=repeat, seed=seed, engine=engine, transport=transport)


def solve_scaling(world_sizes: Sequence[int] = (1, 2), *, modes=("strong",), dim: int = 2,
                  dof_per_rank: int | None = None, total_dof: int | None = None,
                  methods=("cg",), partitioners=("simple",), rhs: str = "random",
                  rtol: float = 1e-8, maxiter: int | None = None, restart: int = 30,
                  warmup: int = 1, repeat: int = 3, seed: int = 0, engine: str = "labkit",
                  transport: str = "auto", json_path: str | None = None, progress: bool = True, **launch_kw):
    """Run the sweep; return its rows as a DataFrame (one row per mode x world size x
    partitioner x method). ``launch_kw`` goes to :func:`labkit.launch.launch_many` (timeout_s,
    threads_per_rank, backend, nnodes, ...). ``transport``: how labkit's operator moves halos and
    all-reduces, ``auto`` (shared memory when every rank is on one CPU host), ``shm`` or
    ``torch`` (torch.distributed: gloo / nccl); see :mod:`labkit.solve.transport`. Rows with ``gate_passed == False`` are kept but get
    no speedup or efficiency; :func:`gate_failures` lists them.
    """
    import pandas as pd

    from .. import results
    from ..launch import launch_many
    from .measure import add_scaling_columns

    cfg = make_config(world_sizes, modes=modes, dim=dim, dof_per_rank=dof_per_rank,
                      total_dof=total_dof, methods=methods, partitioners=partitioners, rhs=rhs,
                      rtol=rtol, maxiter=maxiter, restart=restart, warmup=warmup, repeat=repeat,
                      seed=seed, engine=engine, transport=transport,
                      nnodes=launch_kw.get("nnodes", 1))
    if json_path:
        results.check_writable(json_path)
    launches = launch_many("solve", list(world_sizes), to_dict(cfg), progress=progress,
                           **launch_kw)
    rows = [row for res in launches for row in res.rows()]
    old = results.read_rows(json_path) if json_path else []
    rows = add_scaling_columns(rows, baselines=old)
    if json_path:
        results.record(json_path, rows, key=KEY)
    return pd.DataFrame(rows)


def gate_failures(df):
    """Rows whose fresh residual ||b - A x|| / ||b|| was over the gate (``gate_passed`` false)."""
    if df.empty or "gate_passed" not in df:
        return df
    return df[~df["gate_passed"].astype(bool)]


def passed(df):
    """Rows that passed the gate: the only ones efficiency and the figure use."""
    if df.empty or "gate_passed" not in df:
        return df
    return df[df["gate_passed"].astype(bool)]


def transport_check(nproc: int = 2, *, transports=("shm", "torch"), rounds: int = 300,
                    values: int = 700, jitter_us: float = 200.0, repeat: int = 300,
                    **launch_kw):
    """Check and time the operator's transports in one launch (``labkit.workers.transport``);
    one row per transport: ``errors`` (messages that arrived wrong: must be 0), and the p50
    over the slowest rank of one ring exchange of ``values`` doubles
    (``exchange_time_p50_s``) and of one 3-value all-reduce (``allreduce_time_p50_s``)."""
    import pandas as pd

    from ..checks import TransportCheckConfig
    from ..launch import launch

    cfg = TransportCheckConfig(transports=tuple(transports), rounds=rounds, values=values,
                               jitter_us=jitter_us, repeat=repeat)
    return pd.DataFrame(launch("transport", nproc, to_dict(cfg), **launch_kw).rows())
