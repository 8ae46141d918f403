"""What a workshare run asks for, validated on the host before anything launches (pure).

The job is ``total_work`` matrix products of size ``matrix_size``; a share ``serial_fraction``
of them runs on rank 0 alone while the other ranks wait at a barrier (the serial part), the
rest is split evenly over the ranks (:meth:`WorkshareConfig.split`).
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import option, positive_int
from labkit.errors import UsageError

#: the largest matrix side: one product of 8192 x 8192 already takes seconds on one core
MAX_MATRIX_SIZE = 8192


@dataclass(frozen=True)
class WorkshareConfig:
    """One workshare job, the same at every world size (strong scaling: the work is fixed).

    Built by ``labkit workshare`` (from its flags, which come from these fields), by notebook 02
    (from its parameters) and by each rank (from the JSON the launcher passes on). The command
    line's ``--repeat`` defaults to 5, a notebook's to its own parameter.
    """

    total_work: int = option(400, "matrix products in the whole job (fixed: strong scaling)")
    serial_fraction: float = option(0.1, "share of the products rank 0 does alone, in [0, 1]")
    matrix_size: int = option(192, f"side of the square matrices, 8 to {MAX_MATRIX_SIZE}")
    warmup: int = option(1, "untimed runs per launch", cli=False)
    repeat: int = option(3, "timed runs (the p50 is reported)")

    def __post_init__(self):
        positive_int("total_work", self.total_work)
        if (isinstance(self.serial_fraction, bool)
                or not isinstance(self.serial_fraction, (int, float))
                or not 0 <= self.serial_fraction <= 1):
            raise UsageError(f"serial_fraction must be in [0, 1], got {self.serial_fraction!r}")
        positive_int("matrix_size", self.matrix_size, minimum=8)
        if self.matrix_size > MAX_MATRIX_SIZE:
            raise UsageError(f"matrix_size must be <= {MAX_MATRIX_SIZE}, got {self.matrix_size!r}")
        positive_int("warmup", self.warmup, minimum=0)
        positive_int("repeat", self.repeat)

    def split(self, world_size: int, rank: int) -> tuple[int, int]:
        """(serial products this rank does, parallel products this rank does).

        >>> WorkshareConfig(total_work=100, serial_fraction=0.1).split(4, 0)
        (10, 23)
        >>> WorkshareConfig(total_work=100).split(4, 3)
        (0, 22)
        """
        serial = round(self.total_work * self.serial_fraction)
        parallel = self.total_work - serial
        share = parallel // world_size + (1 if rank < parallel % world_size else 0)
        return (serial if rank == 0 else 0), share
