"""What a launch is asked for and what it gives back: :class:`LaunchSpec` (one launch),
:class:`LaunchOptions` (a lab's sweep of launches), the workers a launch may start
(:data:`WORKERS`), the threads and backend it gets, whether its ranks fit in this machine's
memory (:func:`check_memory`), and :class:`LaunchResult` with the fields every row of a launch
carries (:data:`labkit.results.LAUNCH_COLUMNS`). Every check raises
:class:`~labkit.errors.UsageError` before a process is started or a file written.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import warnings
from dataclasses import dataclass, field

from labkit.config import distinct_positive_ints, positive_int
from labkit.errors import UsageError
from labkit.procs import allocated_cores, available_memory_bytes


class OversubscribedWarning(UserWarning):
    """More rank-threads than cores: fine for correctness, not for timings."""


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """How every launch of a sweep starts, whatever its worker and size: declared once, shared
    by :class:`LaunchSpec` (one launch) and :class:`LaunchOptions` (a lab's sweep)."""

    timeout_s: float = 600.0
    threads_per_rank: int | None = None
    backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "labkit"

    def settings(self) -> dict:
        """These fields' values, as keywords of either class."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(LaunchSettings)}

    def _check_settings(self) -> None:
        positive_int("nnodes", self.nnodes)
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank!r}")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise UsageError(f"timeout must be > 0 seconds, got {self.timeout_s!r}")
        if self.threads_per_rank is not None:
            positive_int("threads_per_rank", self.threads_per_rank)
            # one rank cannot use more cores than there are; more ranks x threads than cores
            # is allowed (marked oversubscribed at launch)
            if self.threads_per_rank > allocated_cores():
                raise UsageError(f"threads_per_rank {self.threads_per_rank} is more than the "
                                 f"{allocated_cores()} cores this machine allocates to a launch")
        if self.backend not in (None, "gloo", "nccl"):
            raise UsageError(f"backend must be gloo or nccl, got {self.backend!r}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError("a multi-node launch needs rdzv_endpoint HOST:PORT (the first node)")
        if self.rdzv_endpoint and not re.fullmatch(r"[\w.\-\[\]:]+:\d+", self.rdzv_endpoint):
            raise UsageError(f"rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")


@dataclass(frozen=True)
class LaunchSpec(LaunchSettings):
    """Everything that decides one launch. Validated on construction (UsageError)."""

    worker: str
    nproc: int
    config: dict = field(default_factory=dict)
    #: what the lab estimated one rank needs (bytes), checked against the machine before launch
    memory_estimate_bytes_per_rank: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "worker", check_worker(self.worker))
        positive_int("nproc", self.nproc)
        self._check_settings()
        try:
            json.dumps(self.config)
        except TypeError as e:
            raise UsageError(f"worker config must be JSON-serialisable: {e}") from None

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


@dataclass(frozen=True)
class LaunchOptions(LaunchSettings):
    """How a lab's sweep is launched: the one set of launch keywords every lab's ``run`` takes.

    ``nprocs``: ranks per node, one launch per value (world size = nprocs x nnodes). The
    :class:`LaunchSettings` go to every :class:`LaunchSpec` of the sweep. Validated on
    construction (UsageError).

    >>> LaunchOptions(nprocs=(1, 2)).world_sizes
    (1, 2)
    >>> LaunchOptions(nprocs=2, nnodes=2, rdzv_endpoint="node1:29500").world_sizes
    (4,)

    ``rows_elsewhere``: what :func:`launch_lab` does on a node of a multi-node sweep that did not
    host global rank 0 (so has no rows): ``"empty"`` returns the launches without payloads (a
    lab's ``run`` gives an empty DataFrame), ``"raise"`` raises
    :class:`~labkit.errors.RowsOnAnotherNode` naming the node that has them (the CLI's choice:
    it prints that one line and exits 0).

    ``trace_dir``: a folder where a lab whose rows hold a timeline writes each launch's as a
    Chrome trace (:func:`labkit.trace.write_launches`); another lab refuses it before launching.
    """

    nprocs: tuple = (1, 2)
    progress: bool = True
    echo: bool = False
    rows_elsewhere: str = "empty"
    trace_dir: str | None = None

    def __post_init__(self):
        if self.rows_elsewhere not in ("empty", "raise"):
            raise UsageError(f"rows_elsewhere must be 'empty' or 'raise', got {self.rows_elsewhere!r}")
        if self.trace_dir is not None:
            from labkit.trace import check_folder

            check_folder(self.trace_dir)  # before anything launches, not after the sweep
        object.__setattr__(self, "nprocs",
                           distinct_positive_ints("ranks per node (--nproc)", self.nprocs))
        self._check_settings()  # once, before anything starts

    @property
    def world_sizes(self) -> tuple:
        return tuple(n * self.nnodes for n in self.nprocs)


@dataclass(frozen=True)
class LaunchResult:
    """What a finished launch gives back."""

    spec: LaunchSpec
    backend: str
    threads_per_rank: int
    oversubscribed: bool
    payload: dict | None  # None on a node that did not host global rank 0
    logs: dict  # global rank -> that rank's stdout + stderr
    wall_time_s: float
    command: tuple
    peak_rss_bytes_per_rank: int | None = None  # the largest resident set of a rank on this node
    rank0_host: dict | None = None  # multi-node: where global rank 0 ran ({"host", "node"})
    gloo_fallback: bool = False  # the node had GPUs, too few for its ranks: gloo on the CPU

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def launch_fields(self) -> dict:
        """Fields every row of this launch carries."""
        meta = (self.payload or {}).get("meta", {})
        return {
            "world_size": self.world_size,
            "nproc_per_node": self.spec.nproc,
            "nnodes": self.spec.nnodes,
            "backend": self.backend,
            "device": meta.get("device"),
            "device_name": meta.get("device_name"),
            "threads_per_rank": self.threads_per_rank,
            "oversubscribed": self.oversubscribed,
            "launch_wall_time_s": self.wall_time_s,
            "slurm_job_id": slurm_job_id(),
            "memory_estimate_bytes_per_rank": self.spec.memory_estimate_bytes_per_rank,
            "peak_rss_bytes_per_rank": self.peak_rss_bytes_per_rank,
            "gloo_fallback": self.gloo_fallback,
        }

    def rows(self) -> list[dict]:
        """The worker's rows, each with the launch fields added (worker fields win)."""
        base = self.launch_fields()
        return [{**base, **row} for row in (self.payload or {}).get("rows", [])]

    @property
    def placement(self) -> list[dict]:
        return (self.payload or {}).get("placement", [])


def slurm_job_id() -> int | str | None:
    """The SLURM job this process runs in (``SLURM_JOB_ID``), None outside SLURM."""
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    return int(job) if job.isdigit() else (job or None)


#: every worker a launch may start: a short name -> the rank-side module run under torchrun.
#: Each lab's worker lives in its own package (``labkit.<lab>.worker``); the checks lab has three.
WORKERS = {
    "solve": "labkit.solve.worker",
    "ddp": "labkit.ddp.worker",
    "collectives": "labkit.collectives.worker",
    "pipeline": "labkit.pipeline.worker",
    "workshare": "labkit.speedup.worker",
    "placement": "labkit.checks.placement_worker",
    "selftest": "labkit.checks.selftest_worker",
    "transport": "labkit.checks.transport_worker",
    "tp": "labkit.tp.worker",
    "fsdp": "labkit.fsdp.worker",
    "machine": "labkit.machine.worker",
    "moe": "labkit.moe.worker",
    "cp": "labkit.cp.worker",
}


def check_worker(name: str) -> str:
    """A worker is a name in :data:`WORKERS` (or its module path); anything else is refused.

    >>> check_worker("solve"), check_worker("labkit.solve.worker")
    ('solve', 'solve')
    """
    if isinstance(name, str):
        by_module = {m: n for n, m in WORKERS.items()}
        name = by_module.get(name, name)
    if not isinstance(name, str) or name not in WORKERS:
        raise UsageError(f"unknown worker {name!r} (known: {', '.join(list_workers())})")
    if importlib.util.find_spec(WORKERS[name]) is None:  # a broken install
        raise UsageError(f"worker {name!r}: module {WORKERS[name]} is missing")
    return name


def list_workers() -> list[str]:
    return sorted(WORKERS)


def default_threads(nproc_per_node: int) -> int:
    """OMP threads per rank when none are given: allocated cores // ranks per node, at least 1."""
    return max(1, allocated_cores() // nproc_per_node)


class MemoryWarning(UserWarning):
    """A launch that should fit, but close to the memory this machine has."""


def check_memory(bytes_per_rank: float, ranks_per_node: int, *, world_size: int,
                 available: int | None = None) -> None:
    """Refuse a launch whose ranks on this node cannot fit in the memory available now; warn
    above 80% of it. ``available`` defaults to :func:`labkit.procs.available_memory_bytes`;
    where this machine will not tell, the check is skipped with a :class:`MemoryWarning`
    saying so (an unknown is no reason to refuse a launch).

    >>> check_memory(1e9, 2, world_size=2, available=16 << 30)
    >>> check_memory(1e12, 2, world_size=2, available=16 << 30)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: 2 ranks need about 2000.0 GB (1000.0 GB per rank at world size 2); this machine has 17.2 GB available: use a smaller size or more nodes
    """
    available = available_memory_bytes() if available is None else available
    need = bytes_per_rank * ranks_per_node
    if not available:
        warnings.warn(f"this machine does not tell the memory it has available: not checked "
                      f"whether {ranks_per_node} rank(s) of about {bytes_per_rank / 1e9:.1f} GB "
                      "each fit", MemoryWarning, stacklevel=3)
        return
    if need > available:
        ranks = f"{ranks_per_node} ranks need" if ranks_per_node > 1 else "1 rank needs"
        raise UsageError(f"{ranks} about "
                         f"{need / 1e9:.1f} GB ({bytes_per_rank / 1e9:.1f} GB per rank at world "
                         f"size {world_size}); this machine has {available / 1e9:.1f} GB "
                         "available: use a smaller size or more nodes")
    if need > 0.8 * available:
        warnings.warn(f"{ranks_per_node} ranks need about {need / 1e9:.1f} GB of the "
                      f"{available / 1e9:.1f} GB available: close to the limit", MemoryWarning,
                      stacklevel=3)
