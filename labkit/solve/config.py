"""What a solve-scaling sweep asks for, validated on the host before anything launches (pure)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from labkit.config import as_tuple, one_of, option, positive_int
from labkit.errors import UsageError

METHODS = ("cg", "pipecg", "pcg", "bicgstab", "gmres", "minres")
PARTITIONERS = ("simple", "coordinate", "metis")
MODES = ("weak", "strong", "throughput")
RHS_KINDS = ("random", "ones", "manufactured")
ENGINES = ("labkit", "torch-sla")
#: how labkit's operator moves halos and all-reduces (labkit.solve.transport); auto: shm where
#: every rank is on one CPU host, else torch.distributed
TRANSPORTS = ("auto", "torch", "shm")
#: how CG's vector updates run (labkit.solve.fused)
KERNELS = ("plain", "fused")
#: where strong mode's t1 comes from (see SolveConfig.baseline)
BASELINES = ("launch", "inline")
#: modes that hold the DOF per rank fixed (they need --dof-per-rank); strong needs --total-dof
PER_RANK_MODES = ("weak", "throughput")


def transport_refused(kind: str, backend: str) -> str | None:
    """Why transport ``kind`` cannot carry the messages of a launch on ``backend``, as far as
    the host knows before launching (the ranks check the rest, such as one host:
    :func:`labkit.solve.transport.shm_possible`); None where it may.

    >>> transport_refused("shm", "nccl")
    'transport shm copies CPU memory, and nccl ranks hold their tensors on GPUs: use torch'
    >>> transport_refused("shm", "gloo") is None, transport_refused("auto", "nccl") is None
    (True, True)
    """
    if kind == "shm" and backend == "nccl":
        return ("transport shm copies CPU memory, and nccl ranks hold their tensors on GPUs: "
                "use torch")
    return None


#: at most this many times ``repeat`` timed solves a point, however short its solves
MAX_REPEAT = 5


def timed_solves(repeat: int, first_s: float, *, min_timed_s: float) -> int:
    """How many timed solves a point gets: ``repeat``, or more where its first timed solve
    (``first_s`` seconds) is short, until they span ``min_timed_s`` (at most
    :data:`MAX_REPEAT` x ``repeat``). A 2-rank CG solve of 2,000 DOF takes about 25 ms here: one
    of them read 173 to 292 us an iteration from one run of the lab to the next, and the
    crossover's fixed cost is read off it.

    >>> timed_solves(1, 0.025, min_timed_s=0.1), timed_solves(1, 0.3, min_timed_s=0.1)
    (4, 1)
    >>> timed_solves(3, 1e-4, min_timed_s=0.1), timed_solves(3, 0.01, min_timed_s=0.0)
    (15, 3)
    """
    if first_s <= 0:
        return MAX_REPEAT * repeat
    return max(repeat, min(MAX_REPEAT * repeat, math.ceil(min_timed_s / first_s - 1e-9)))


@dataclass(frozen=True)
class SolveConfig:
    """One launch's worth of solves: every (mode, partitioner, method) point at one world size.

    The same object is built by ``labkit solve`` (from its flags, which come from these fields),
    by a notebook (from its parameters) and by each rank (from the JSON the launcher passes on).
    ``gate_factor``: a point passes when the true relative residual ||b - A x|| / ||b||,
    recomputed with a fresh SpMV, is <= gate_factor * rtol (the recursive residual a method
    stops on drifts from the true one by rounding; a factor of 2 leaves room for that drift,
    not for a solve that stopped early).
    """

    modes: tuple = option(("strong",), "weak, strong and/or throughput", flag="--mode",
                          metavar="MODE")
    dim: int = option(2, "2 (5-point) or 3 (7-point) Poisson")
    dof_per_rank: tuple[int, ...] | None = option(
        None, "weak/throughput: unknowns per rank (the grid closest to N x ranks); several "
        "values: one series each", metavar="N")
    total_dof: tuple[int, ...] | None = option(
        None, "strong: total unknowns (the grid closest to N); several values: one series "
        "each, e.g. to find the size where more ranks start to pay", metavar="N")
    methods: tuple = option(("cg",), "cg, pipecg, pcg, bicgstab, gmres, minres", flag="--method",
                            metavar="M")
    partitioners: tuple = option(("simple",), "simple, coordinate, metis", flag="--partitioner",
                                 metavar="P")
    rhs: str = option("random", "right-hand side: random, ones, manufactured")
    rtol: float = option(1e-8, "stop at relative residual rtol")
    maxiter: int | None = option(None, "iteration cap (default: 10 x DOF, as scipy)")
    restart: int = option(30, "GMRES restart length m")
    warmup: int = option(1, "untimed solves per point")
    repeat: int = option(3, "timed solves per point (the median is reported)")
    min_timed_s: float = option(0.1, "a point whose timed solves are short gets more of them, "
                                "until they span this many seconds (at most "
                                f"{MAX_REPEAT} x repeat): a median, not one solve's burst")
    seed: int = option(0, "seed of the random right-hand side")
    engine: str = option("labkit", "labkit or torch-sla")
    transport: str = option(
        "auto", "how halos and all-reduces travel: auto (shared memory when all ranks are on one "
        "CPU host, else torch.distributed), shm, torch")
    kernels: str = option(
        "plain", "vector updates: plain (one torch operation each: the textbook loop) or fused "
        "(CG's four updates in one pass: a C loop on the CPU, where the dots also ride on the "
        "SpMV's pass, torch.compile on a GPU; compiled before timing; plain, with a notice, "
        "where they cannot compile)")
    baseline: str = option(
        "launch", "strong mode's 1-rank time t1: launch (the 1-rank launch's row of the same "
        "series) or inline (in every launch of more ranks, rank 0 also solves the whole problem "
        "alone while the others wait, each timed solve of the ranks right after one of rank 0 "
        "alone: t1 and tP measured side by side, so a machine that slows down between launches "
        "does not read as a speedup or a loss)")
    iterations: int | None = option(
        None, "run exactly N iterations per solve, HPCG-style, to time large sizes quickly; "
        "such rows are marked (fixed_iterations) and make no convergence claim: their gate "
        "checks the true residual against the method's own", metavar="N")
    shares: bool = option(
        False, "with an inline baseline, also time each rank's share (its rows, no messages) "
        "alone, the ranks in turn, and with every rank at it: the co-run slowdown of the "
        "solve's own compute (labkit.solve.shares; notebook 04)")
    gate_factor: float = option(2.0, "pass when ||b - Ax|| / ||b|| <= gate_factor x rtol",
                                cli=False)
    keep_solution: bool = option(False, "rank 0's payload carries each point's global x (tests)",
                                 cli=False)

    def __post_init__(self):
        for name in ("modes", "methods", "partitioners"):
            object.__setattr__(self, name, as_tuple(getattr(self, name)))
            if not getattr(self, name):
                raise UsageError(f"{name} must not be empty")
        for m in self.modes:
            one_of("mode", m, MODES)
        for m in self.methods:
            one_of("method", m, METHODS)
        for p in self.partitioners:
            one_of("partitioner", p, PARTITIONERS)
        one_of("rhs", self.rhs, RHS_KINDS)
        one_of("engine", self.engine, ENGINES)
        one_of("transport", self.transport, TRANSPORTS)
        one_of("kernels", self.kernels, KERNELS)
        one_of("baseline", self.baseline, BASELINES)
        if self.baseline == "inline" and self.engine != "labkit":
            raise UsageError("--baseline inline needs --engine labkit (rank 0's solve alone is "
                             "labkit's)")
        if self.iterations is not None:
            positive_int("iterations", self.iterations)
        if self.dim not in (2, 3):
            raise UsageError(f"dim must be 2 or 3, got {self.dim!r}")
        for name in ("restart", "repeat"):
            positive_int(name, getattr(self, name))
        positive_int("warmup", self.warmup, minimum=0)
        if not (isinstance(self.min_timed_s, (int, float)) and 0 <= self.min_timed_s <= 60):
            raise UsageError(f"min_timed_s must be between 0 and 60 seconds, got "
                             f"{self.min_timed_s!r}")
        if self.maxiter is not None:
            positive_int("maxiter", self.maxiter)
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
        for name in ("dof_per_rank", "total_dof"):
            value = getattr(self, name)
            if value is None:
                continue
            value = as_tuple(value)
            if not value:
                raise UsageError(f"{name} needs at least one size")
            for v in value:
                positive_int(name, v)
            if len(set(value)) != len(value):
                raise UsageError(f"{name} repeats a size: {list(value)}")
            object.__setattr__(self, name, value)
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

    def check_world_size(self, world_size: int) -> None:
        """Refuse, before any launch, a world size that some mode's grid cannot feed."""
        positive_int("world size", world_size)
        for mode, _, dims in points(self, world_size):
            n = math.prod(dims)
            if n < world_size:
                raise UsageError(f"{mode} mode at {world_size} ranks: the grid has {n} rows, "
                                 f"fewer than {world_size} ranks")

    def check_backend(self, backend: str) -> None:
        """Refuse, before any launch, a transport that ranks on ``backend`` cannot use."""
        why = transport_refused(self.transport, backend)
        if why is not None:
            raise UsageError(why)

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """The most one rank needs over this sweep's modes (checked before any launch)."""
        from labkit.solve.formulas import memory_bytes_per_rank

        vectors = 12 + (self.restart + 1 if "gmres" in self.methods else 0)
        partitioned = any(p != "simple" for p in self.partitioners)
        def need(mode, dims):
            n = math.prod(dims)
            own = memory_bytes_per_rank(n, world_size, dim=self.dim, partitioned=partitioned,
                                        krylov_vectors=vectors)
            if self.inline_baseline(mode, world_size):  # rank 0 also holds the whole problem
                own += memory_bytes_per_rank(n, 1, dim=self.dim, krylov_vectors=vectors)
            if any(self.time_shares(mode, world_size, m) for m in self.methods):
                # the shares' one-rank copy of each rank's rows (labkit.solve.shares)
                own += memory_bytes_per_rank(n, world_size, dim=self.dim,
                                             partitioned=partitioned, krylov_vectors=vectors)
            return own

        return max(need(mode, dims) for mode, _, dims in points(self, world_size))

    def inline_baseline(self, mode: str, world_size: int) -> bool:
        """Whether rank 0 times the whole problem alone beside this point's solves."""
        return self.baseline == "inline" and mode == "strong" and world_size > 1

    def time_shares(self, mode: str, world_size: int, method: str) -> bool:
        """Whether this point's shares are timed alone and together (:attr:`shares`, beside an
        inline baseline; not GMRES, whose work per iteration grows with its iterations)."""
        return self.shares and self.inline_baseline(mode, world_size) and method != "gmres"


def points(cfg: SolveConfig, world_size: int) -> list[tuple[str, int, tuple[int, ...]]]:
    """(mode, size requested, grid) of every series the sweep solves at ``world_size`` ranks:
    strong mode solves each ``total_dof`` whatever the ranks; weak and throughput solve
    ``dof_per_rank x world_size`` (see :func:`closest_grid`).

    >>> points(SolveConfig(total_dof=(100, 400)), 2)
    [('strong', 100, (10, 10)), ('strong', 400, (20, 20))]
    >>> points(SolveConfig(modes=("weak",), dof_per_rank=50), 2)
    [('weak', 50, (10, 10))]
    """
    out = []
    for mode in cfg.modes:
        for size in (cfg.total_dof if mode == "strong" else cfg.dof_per_rank):
            total = size if mode == "strong" else size * world_size
            out.append((mode, size, closest_grid(total, cfg.dim)))
    return out


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
