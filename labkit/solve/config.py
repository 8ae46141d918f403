"""What a solve-scaling sweep asks for, validated on the host before anything launches (pure)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from ..errors import UsageError

METHODS = ("cg", "pipecg", "pcg", "bicgstab", "gmres", "minres")
PARTITIONERS = ("simple", "coordinate", "metis")
MODES = ("weak", "strong", "throughput")
RHS_KINDS = ("random", "ones", "manufactured")
ENGINES = ("labkit", "torch-sla")
#: how labkit's operator moves halos and all-reduces (labkit.solve.transport); auto: shm where
#: every rank is on one CPU host, else torch.distributed
TRANSPORTS = ("auto", "torch", "shm")
#: modes that hold the DOF per rank fixed (they need --dof-per-rank); strong needs --total-dof
PER_RANK_MODES = ("weak", "throughput")


def _one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise UsageError(f"unknown {name} {value!r} (choose from {', '.join(allowed)})")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class SolveConfig:
    """One launch's worth of solves: every (mode, partitioner, method) point at one world size.

    ``world_sizes`` lists every world size of the sweep so that "fewer rows than ranks" is caught
    before the first launch; the worker checks that it runs at one of them.
    ``gate_factor``: a point passes when the true relative residual ||b - A x|| / ||b||,
    recomputed with a fresh SpMV, is <= gate_factor * rtol (the recursive residual a method
    stops on drifts from the true one by rounding; a factor of 2 leaves room for that drift,
    not for a solve that stopped early).
    """

    modes: tuple = ("strong",)
    world_sizes: tuple = (1,)
    dim: int = 2
    dof_per_rank: int | None = None
    total_dof: int | None = None
    methods: tuple = ("cg",)
    partitioners: tuple = ("simple",)
    rhs: str = "random"
    rtol: float = 1e-8
    maxiter: int | None = None  # None: 10 x the global DOF, as scipy
    restart: int = 30  # GMRES(m)
    warmup: int = 1
    repeat: int = 3
    seed: int = 0
    engine: str = "labkit"
    transport: str = "auto"
    gate_factor: float = 2.0
    keep_solution: bool = False  # tests: rank 0's payload carries each point's global x

    def __post_init__(self):
        for name in ("modes", "world_sizes", "methods", "partitioners"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise UsageError(f"{name} must be a non-empty tuple, got {getattr(self, name)!r}")
        for m in self.modes:
            _one_of("mode", m, MODES)
        for m in self.methods:
            _one_of("method", m, METHODS)
        for p in self.partitioners:
            _one_of("partitioner", p, PARTITIONERS)
        _one_of("rhs", self.rhs, RHS_KINDS)
        _one_of("engine", self.engine, ENGINES)
        _one_of("transport", self.transport, TRANSPORTS)
        if self.dim not in (2, 3):
            raise UsageError(f"dim must be 2 or 3, got {self.dim!r}")
        for n in self.world_sizes:
            _positive_int("world size", n)
        for name in ("restart", "repeat"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UsageError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if self.maxiter is not None:
            _positive_int("maxiter", self.maxiter)
        if not (isinstance(self.gate_factor, (int, float)) and self.gate_factor >= 1):
            raise UsageError(f"gate_factor must be >= 1, got {self.gate_factor!r}")
        if not (isinstance(self.rtol, (int, float)) and 0 < self.rtol < 1):
            raise UsageError(f"rtol must be in (0, 1), got {self.rtol!r}")
        self._check_sizes()
        if "metis" in self.partitioners and importlib.util.find_spec("pymetis") is None:
            raise UsageError("partitioner metis needs pymetis: pip install 'labkit[metis]' "
                             "(or use --partitioner simple or coordinate)")
        if self.engine == "torch-sla" and "pipecg" in self.methods:
            raise UsageError("--engine torch-sla has no pipelined CG: use --method cg with it")
        if self.engine == "torch-sla" and importlib.util.find_spec("torch_sla") is None:
            raise UsageError("--engine torch-sla needs torch-sla: "
                             "pip install torch-sla -c constraints.txt")

    def _check_sizes(self) -> None:
        per_rank = any(m in PER_RANK_MODES for m in self.modes)
        strong = "strong" in self.modes
        for name, value in (("dof_per_rank", self.dof_per_rank), ("total_dof", self.total_dof)):
            if value is not None:
                _positive_int(name, value)
        if self.dof_per_rank is not None and not per_rank:
            raise UsageError("--dof-per-rank is for weak and throughput modes; "
                             "strong mode holds --total-dof fixed")
        if self.total_dof is not None and not strong:
            raise UsageError("--total-dof is for strong mode; weak and throughput modes hold "
                             "--dof-per-rank fixed")
        if per_rank and self.dof_per_rank is None:
            raise UsageError("weak and throughput modes need --dof-per-rank N")
        if strong and self.total_dof is None:
            raise UsageError("strong mode needs --total-dof N")
        for mode in self.modes:
            for p in self.world_sizes:
                n = math.prod(grid_for(self, mode, p))
                if n < p:
                    raise UsageError(f"{mode} mode at {p} ranks: the grid has {n} rows, fewer "
                                     f"than {p} ranks")

    def dof_requested(self, mode: str) -> int:
        return self.total_dof if mode == "strong" else self.dof_per_rank


def grid_for(cfg: SolveConfig, mode: str, world_size: int) -> tuple[int, ...]:
    """The grid a mode solves at ``world_size`` ranks (see :func:`closest_grid`)."""
    if mode == "strong":
        return closest_grid(cfg.total_dof, cfg.dim)
    return closest_grid(cfg.dof_per_rank * world_size, cfg.dim)


def closest_grid(target: int, dim: int) -> tuple[int, ...]:
    """Interior grid (nx, ny[, nz]) whose point count is closest to ``target``.

    All sides equal to s (s or s + 1 around target^(1/dim)) except the last, which is chosen to
    land closest; ties go to the squarer grid. Weak mode records the DOF it really got.

    >>> closest_grid(20_000, 2), 141 * 142
    ((141, 142), 20022)
    >>> closest_grid(10_000, 2)
    (100, 100)
    >>> closest_grid(1000, 3)
    (10, 10, 10)
    """
    if target < 1:
        raise UsageError(f"need at least one DOF, got {target}")
    root = target ** (1.0 / dim)
    best = None
    for s in {max(1, math.floor(root)), max(1, math.ceil(root))}:
        base = s ** (dim - 1)
        for last in {max(1, math.floor(target / base)), max(1, math.ceil(target / base))}:
            dims = (s,) * (dim - 1) + (last,)
            score = (abs(math.prod(dims) - target), abs(last - s))
            if best is None or score < best[0]:
                best = (score, dims)
    return best[1]
