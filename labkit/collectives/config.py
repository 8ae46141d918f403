"""What a collectives sweep asks for, validated on the host before anything launches (pure).

Sizes are nccl-tests' ``-b``/``-e``: a byte count or text with K, M, G suffixes (powers of
1024); they are held as whole bytes once the config is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.collectives.formulas import DTYPE_BYTES, OPS, parse_size
from labkit.config import distinct_choices, one_of, option, positive_int
from labkit.errors import UsageError


@dataclass(frozen=True)
class CollectivesConfig:
    """A size sweep of each op, nccl-tests style, one launch per world size.

    The same object is built by ``labkit collectives`` (from its flags, which come from these
    fields), by a notebook and by each rank (from the JSON the launcher passes on).
    ``check`` runs every size once more on known inputs and counts the wrong elements (on by
    default here; ``labkit collectives`` turns it on with ``--check``, as nccl-tests' ``-c``).
    ``fit_min_bytes``: fit α and β on sizes >= this only (0 or None: every size); every size is
    still predicted.

    >>> CollectivesConfig(max_bytes="64K").max_bytes
    65536
    >>> CollectivesConfig(ops="all_gather").ops
    ('all_gather',)
    """

    ops: tuple = option(("all_reduce",), "all_reduce all_gather reduce_scatter broadcast all_to_all",
                        flag="--op", metavar="OP")
    min_bytes: int | str = option(8, "smallest size, K/M/G suffixes", short="-b", parse=str)
    max_bytes: int | str = option("64M", "largest size", short="-e", parse=str)
    factor: float = option(2.0, "size multiplier", short="-f")
    iters: int = option(20, "timed calls per size", short="-n")
    warmup: int = option(5, "untimed calls per size", short="-w")
    dtype: str = option("float32", "float32 float64 int32 int64")
    check: bool = option(True, "count wrong elements (#wrong)", cli=False)
    fit_min_bytes: int | str | None = option(
        None, "fit α, β on sizes >= this (default: all)", parse=str)

    def __post_init__(self):
        object.__setattr__(self, "ops", distinct_choices("op", self.ops, OPS))
        object.__setattr__(self, "min_bytes", parse_size(self.min_bytes))
        object.__setattr__(self, "max_bytes", parse_size(self.max_bytes))
        if self.min_bytes > self.max_bytes:
            raise UsageError(f"min bytes {self.min_bytes} > max bytes {self.max_bytes}")
        if (isinstance(self.factor, bool) or not isinstance(self.factor, (int, float))
                or not self.factor > 1):
            raise UsageError(f"factor must be > 1 (sizes grow by it), got {self.factor!r}")
        positive_int("iters", self.iters)
        positive_int("warmup", self.warmup, minimum=0)
        one_of("dtype", self.dtype, DTYPE_BYTES)
        fit_min = self.fit_min_bytes
        object.__setattr__(self, "fit_min_bytes",
                           0 if fit_min in (None, 0, "0") else parse_size(fit_min))
