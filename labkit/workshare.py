"""A job with a serial part you choose: Amdahl's law, measured (pure config + host function).

The job is ``total_work`` matrix products of size ``matrix_size``. A share ``serial_fraction`` of
them runs on rank 0 alone while the other ranks wait at a barrier (the serial part: input
reading, a setup step, a reduction nobody parallelised); the rest is split evenly over the
ranks. Every rank uses one thread (``threads_per_rank=1``) so that N ranks use N cores and
"speedup over one rank" means "over one core".

Because you set the serial fraction, you can check the fit: :func:`labkit.metrics.fit_amdahl` on
the measured times should give back about ``serial_fraction`` while the ranks have cores of their
own, and more than that once they share cores (oversubscription adds a serial part you did not
write). Notebook ``02_speedup`` uses it; ``labkit workshare --nproc 1 2 4`` is the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Config:
    total_work: int = 400  # matrix products in the whole job (fixed: this is strong scaling)
    serial_fraction: float = 0.1  # share of them done by rank 0 alone
    matrix_size: int = 192
    warmup: int = 1
    repeat: int = 3

    def __post_init__(self):
        if isinstance(self.total_work, bool) or not isinstance(self.total_work, int) or self.total_work < 1:
            raise UsageError(f"total_work must be an integer >= 1, got {self.total_work!r}")
        if not isinstance(self.serial_fraction, (int, float)) or not 0 <= self.serial_fraction <= 1:
            raise UsageError(f"serial_fraction must be in [0, 1], got {self.serial_fraction!r}")
        if not isinstance(self.matrix_size, int) or not 8 <= self.matrix_size <= 8192:
            raise UsageError(f"matrix_size must be an integer in [8, 8192], got {self.matrix_size!r}")
        if self.warmup < 0 or self.repeat < 1:
            raise UsageError(f"need warmup >= 0 and repeat >= 1, got {self.warmup}, {self.repeat}")

    def split(self, world_size: int, rank: int) -> tuple[int, int]:
        """(serial products this rank does, parallel products this rank does).

        >>> Config(total_work=100, serial_fraction=0.1).split(4, 0), Config(total_work=100).split(4, 3)
        ((10, 23), (0, 22))
        """
        serial = round(self.total_work * self.serial_fraction)
        parallel = self.total_work - serial
        share = parallel // world_size + (1 if rank < parallel % world_size else 0)
        return (serial if rank == 0 else 0), share


def measure(world_sizes=(1, 2), *, progress: bool = True, threads_per_rank: int = 1,
            timeout_s: float = 300.0, **config):
    """Launch the job once per world size; one row per world size (a DataFrame).

    Columns: ``world_size``, ``time_s`` (p50 of the slowest rank over ``repeat`` runs, launch
    excluded), ``time_min_s``, ``time_cv``, the config, and the launch fields
    (``launch_wall_time_s``, ``oversubscribed``, ...).
    """
    import pandas as pd

    from .config import to_dict
    from .launch import launch_many

    cfg = Config(**config)
    results = launch_many("workshare", list(world_sizes), to_dict(cfg), progress=progress,
                          threads_per_rank=threads_per_rank, timeout_s=timeout_s)
    return pd.DataFrame([row for res in results for row in res.rows()])
