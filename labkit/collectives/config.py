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
    ``fit_min_bytes``: fit α and β on sizes >= this only (0 or None: on the bandwidth regime the
    sweep shows, :mod:`labkit.collectives.regimes`); every size is still predicted. ``busy``
    times each all-reduce size a second time while every rank's core also computes (the
    situation of an all-reduce overlapping backward).

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
    dense_top: bool = option(False, "sweep the top factor step at factor 2 (the bandwidth "
                                    "regime's line on three sizes past the caches)")
    iters: int = option(20, "timed calls per size", short="-n")
    warmup: int = option(5, "untimed calls per size", short="-w")
    dtype: str = option("float32", "float32 float64 int32 int64")
    check: bool = option(True, "count wrong elements (#wrong)", cli=False)
    fit_min_bytes: int | str | None = option(
        None, "fit α, β on sizes >= this (default: the bandwidth regime the sweep shows)",
        parse=str)
    busy: bool = option(False, "time every all-reduce size once more while a thread in every "
                               "rank keeps its core computing", cli=False)

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


#: the passes over an op's sizes that share each size's timed calls
#: (:mod:`labkit.collectives.worker` says why)
PASSES = 2
#: the busy all-reduce's timed calls per size, as a multiple of ``iters``: a busy call's time
#: spreads wide (8 MiB on the 2-vCPU VM: p10 7-10 ms, p90 19-33 ms), so its p50 needs more
#: calls than an idle one for the same spread
BUSY_CALLS_PER_ITER = 2


def pass_iters(iters: int, passes: int = PASSES) -> list[int]:
    """The timed calls of each pass: ``iters`` shared out, the first passes taking the
    remainder; fewer passes where there are fewer calls than passes.

    >>> pass_iters(8), pass_iters(5), pass_iters(1)
    ([4, 4], [3, 2], [1])
    """
    n = max(1, min(int(passes), int(iters)))
    return [iters // n + (1 if k < iters % n else 0) for k in range(n)]


#: rough costs on a small CPU machine (gloo), for the estimate made before a launch: the
#: notebook's own start, imports and figure; one launch of 2 ranks (start, import torch,
#: rendezvous); one collective call's latency and copy bandwidth on a loaded core
OVERHEAD_S = 5.0
LAUNCH_S = 3.5
CALL_ALPHA_S = 5e-4
CALL_BETA_BYTES_PER_S = 1e9


def estimate_s(config: CollectivesConfig, world_sizes, *, cores: int) -> float:
    """Seconds a notebook running this sweep takes, estimated before anything launches.

    Per world size: a launch (longer when ranks outnumber cores), then per op and size
    ``iters`` calls and ``warmup`` more in each pass (:func:`pass_iters`; one more with
    ``check``; with ``busy`` the all-reduce once more, :data:`BUSY_CALLS_PER_ITER` times the
    calls, each twice as slow), each
    ``α + S/β``; with more ranks than cores every call takes ranks/cores times longer. The
    defaults of notebook 06 on 2 cores:

    >>> from labkit.collectives.formulas import OPS
    >>> round(estimate_s(CollectivesConfig(ops=OPS, max_bytes="8M", factor=4, dense_top=True,
    ...                                    iters=16, warmup=2, busy=True), [2], cores=2), 1)
    12.3
    >>> round(estimate_s(CollectivesConfig(max_bytes="8M", factor=4), [2, 4], cores=2), 1)
    24.1
    """
    from labkit.collectives.formulas import size_sweep

    total = OVERHEAD_S
    for n in world_sizes:
        over = max(1.0, n / max(1, cores))
        total += LAUNCH_S * max(1.0, n / 2) * over
        warm = config.warmup * len(pass_iters(config.iters))
        idle = warm + config.iters + (1 if config.check else 0)
        busy = 2 * (warm + BUSY_CALLS_PER_ITER * config.iters)  # twice as slow
        for op in config.ops:
            calls = idle + (busy if (config.busy and op == "all_reduce") else 0)
            for size, _ in size_sweep(op, n, config.min_bytes, config.max_bytes, config.factor,
                                      config.dtype, dense_top=config.dense_top):
                total += calls * over * (CALL_ALPHA_S + size / CALL_BETA_BYTES_PER_S)
    return total


def check_budget(config: CollectivesConfig, world_sizes, *, budget_s: float, cores: int) -> float:
    """The estimate (:func:`estimate_s`), or a one-line :class:`UsageError` before any launch
    when it is over ``budget_s``, saying what to change.

    >>> check_budget(CollectivesConfig(max_bytes="64M"), [2, 4], budget_s=10, cores=2)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: this sweep is estimated at 36 s on 2 cores, over this notebook's budget of 10 s: sweep world size 2 only (4 ranks share 2 cores: run `labkit collectives --nproc 2 4` in a terminal) and lower max_bytes (64M) or iters (20), raise factor (2)
    """
    est = estimate_s(config, world_sizes, cores=cores)
    if est <= budget_s:
        return est
    fixes = []
    if len(world_sizes) > 1 or any(n > cores for n in world_sizes):
        ok = [n for n in world_sizes if n <= cores][:1] or [min(2, cores)]
        why = (f"{max(world_sizes)} ranks share {cores} cores" if max(world_sizes) > cores
               else "each world size is a launch")
        fixes.append(f"sweep world size {ok[0]} only ({why}: run `labkit collectives --nproc "
                     f"{' '.join(map(str, world_sizes))}` in a terminal)")
    fixes.append(f"lower max_bytes ({_size_text(config.max_bytes)}) or iters ({config.iters}), "
                 f"raise factor ({config.factor:g})"
                 + (" or sweep fewer ops" if len(config.ops) > 1 else ""))
    raise UsageError(f"this sweep is estimated at {est:.0f} s on {cores} cores, over this "
                     f"notebook's budget of {budget_s:g} s: {' and '.join(fixes)}")


def _size_text(size: int) -> str:
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << k and size % (1 << k) == 0:
            return f"{size >> k}{unit}"
    return str(size)
