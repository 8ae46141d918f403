"""Host side: run a worker module under torchrun, as a subprocess, and get a typed result back.

The command it builds is the one you would type, with ``torchrun`` for ``python -m labkit.launch``::

    python -m labkit.launch --standalone --nproc-per-node=2 \\
        --log-dir DIR --redirects 3 -m labkit.checks.placement_worker --out DIR/payload.json

and for clusters ``--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT``.
``python -m labkit.launch`` takes torchrun's arguments (:func:`agent_main`): one node runs
under :func:`light_agent`, which starts the ranks with torchrun's environment without importing
torch itself (~2 s less per launch on 2 cores); several nodes run under torchrun's own main
(:func:`torchrun_main`), and ``LABKIT_AGENT=torchrun`` sends one node there too.

Guarantees:

* **One launch per world size.** A launch costs seconds (mostly importing torch in every rank),
  so a worker does every point of a sweep inside one launch.
* **Threads.** ``OMP_NUM_THREADS`` = allocated cores // ranks per node (at least 1) unless
  given; recorded. Allocated cores: those this process may run on, and no more than a SLURM
  job step gives each task (``SLURM_CPUS_PER_TASK``). More rank-threads than that is allowed,
  marked ``oversubscribed: true`` and warned about.
* **Multi-node.** Only the node that hosts global rank 0 gets rows back; the others get
  ``payload=None`` and, through :func:`launch_lab`, an empty sweep or
  :class:`~labkit.errors.RowsOnAnotherNode` naming that node (``LaunchOptions.rows_elsewhere``).
* **Backend.** nccl when CUDA devices >= ranks per node, else gloo; overridable.
* **No orphans.** Every process of a launch carries ``LABKIT_LAUNCH_ID`` in its environment.
  The agent (torchrun or the light one) puts each rank in a session of its own, so killing the
  agent's process group is not enough: on timeout, Ctrl-C or any error the launcher terminates
  the agent's group, then finds every process carrying the launch id (``/proc/*/environ``) and
  kills its process group.
* **Readable failures.** A failing rank raises :class:`~labkit.errors.RankFailed` naming the rank,
  its exit code or signal, the exception it raised and the last lines of its log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from labkit.config import positive_int, to_dict
from labkit.diagnose import collect_logs, echo_rank0, failure, tail_note
from labkit.errors import LaunchError, LaunchTimeout, RowsOnAnotherNode, UsageError
from labkit.orphans import LAUNCH_ENV, kill_launch
from labkit.results import Column, allocated_cores

_REPO_ROOT = Path(__file__).resolve().parent.parent


class OversubscribedWarning(UserWarning):
    """More rank-threads than cores: fine for correctness, not for timings."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides a launch. Validated on construction (UsageError)."""

    worker: str
    nproc: int
    config: dict = field(default_factory=dict)
    timeout_s: float = 600.0
    threads_per_rank: int | None = None
    backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "labkit"
    #: what the lab estimated one rank needs (bytes), checked against the machine before launch
    memory_estimate_bytes_per_rank: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "worker", check_worker(self.worker))
        for name in ("nproc", "nnodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank!r}")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise UsageError(f"timeout must be > 0 seconds, got {self.timeout_s!r}")
        if self.threads_per_rank is not None and (
                not isinstance(self.threads_per_rank, int) or self.threads_per_rank < 1):
            raise UsageError(f"threads_per_rank must be an integer >= 1, got {self.threads_per_rank!r}")
        # one rank cannot use more cores than there are; more ranks x threads than cores is
        # allowed (marked oversubscribed at launch)
        if self.threads_per_rank is not None and self.threads_per_rank > allocated_cores():
            raise UsageError(f"threads_per_rank {self.threads_per_rank} is more than the "
                             f"{allocated_cores()} cores this machine allocates to a launch")
        if self.backend not in (None, "gloo", "nccl"):
            raise UsageError(f"backend must be gloo or nccl, got {self.backend!r}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError("a multi-node launch needs rdzv_endpoint HOST:PORT (the first node)")
        if self.rdzv_endpoint and not re.fullmatch(r"[\w.\-\[\]:]+:\d+", self.rdzv_endpoint):
            raise UsageError(f"rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")
        try:
            json.dumps(self.config)
        except TypeError as e:
            raise UsageError(f"worker config must be JSON-serialisable: {e}") from None

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


@dataclass(frozen=True)
class LaunchOptions:
    """How a lab's sweep is launched: the one set of launch keywords every lab's ``run`` takes.

    ``nprocs``: ranks per node, one launch per value (world size = nprocs x nnodes). The rest
    go to every :class:`LaunchSpec` of the sweep. Validated on construction (UsageError).

    >>> LaunchOptions(nprocs=(1, 2)).world_sizes
    (1, 2)
    >>> LaunchOptions(nprocs=2, nnodes=2, rdzv_endpoint="node1:29500").world_sizes
    (4,)

    ``rows_elsewhere``: what :func:`launch_lab` does on a node of a multi-node sweep that did not
    host global rank 0 (so has no rows): ``"empty"`` returns the launches without payloads (a
    lab's ``run`` gives an empty DataFrame), ``"raise"`` raises
    :class:`~labkit.errors.RowsOnAnotherNode` naming the node that has them (the CLI's choice:
    it prints that one line and exits 0).
    """

    nprocs: tuple = (1, 2)
    timeout_s: float = 600.0
    threads_per_rank: int | None = None
    backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "labkit"
    progress: bool = True
    echo: bool = False
    rows_elsewhere: str = "empty"

    def __post_init__(self):
        if self.rows_elsewhere not in ("empty", "raise"):
            raise UsageError(f"rows_elsewhere must be 'empty' or 'raise', got {self.rows_elsewhere!r}")
        nprocs = (self.nprocs,) if isinstance(self.nprocs, int) else tuple(self.nprocs)
        object.__setattr__(self, "nprocs", nprocs)
        if not nprocs:
            raise UsageError("need at least one rank count")
        for n in nprocs:
            positive_int("ranks per node (--nproc)", n)
        if len(set(nprocs)) != len(nprocs):
            raise UsageError(f"rank counts repeat: {list(nprocs)}")
        # the per-launch checks, once, before anything starts
        LaunchSpec(worker="placement", nproc=nprocs[0], **self.spec_kwargs())

    @property
    def world_sizes(self) -> tuple:
        return tuple(n * self.nnodes for n in self.nprocs)

    def spec_kwargs(self) -> dict:
        """The keywords of :class:`LaunchSpec` (all but ``nprocs``, progress, echo, rows_elsewhere)."""
        return {"timeout_s": self.timeout_s, "threads_per_rank": self.threads_per_rank,
                "backend": self.backend, "nnodes": self.nnodes, "node_rank": self.node_rank,
                "rdzv_endpoint": self.rdzv_endpoint, "rdzv_id": self.rdzv_id}


#: the fields every row of a launch carries (:meth:`LaunchResult.launch_fields`)
LAUNCH_COLUMNS = (
    Column("world_size", "", "ranks in the world (nproc_per_node x nnodes)"),
    Column("nproc_per_node", "", "ranks per node"),
    Column("nnodes", "", "nodes"),
    Column("backend", "", "torch.distributed backend: gloo or nccl"),
    Column("device", "", "cpu or cuda"),
    Column("device_name", "", "the CPU or GPU model"),
    Column("threads_per_rank", "", "OMP_NUM_THREADS of each rank"),
    Column("oversubscribed", "", "more rank-threads than cores: timings not representative"),
    Column("launch_wall_time_s", "s", "the whole launch, torch import and start included"),
    Column("slurm_job_id", "", "the SLURM job the launch ran in (SLURM_JOB_ID); empty outside SLURM"),
    Column("memory_estimate_bytes_per_rank", "bytes",
           "what the lab estimated one rank needs, checked against the machine before launch"),
    Column("peak_rss_bytes_per_rank", "bytes", "the largest peak resident set of a rank (measured)"),
)


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
        }

    def rows(self) -> list[dict]:
        """The worker's rows, each with the launch fields added (worker fields win)."""
        base = self.launch_fields()
        return [{**base, **row} for row in (self.payload or {}).get("rows", [])]

    @property
    def placement(self) -> list[dict]:
        return (self.payload or {}).get("placement", [])


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


def slurm_job_id() -> int | str | None:
    """The SLURM job this process runs in (``SLURM_JOB_ID``), None outside SLURM."""
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    return int(job) if job.isdigit() else (job or None)


def default_threads(nproc_per_node: int) -> int:
    """OMP threads per rank when none are given: allocated cores // ranks per node, at least 1."""
    return max(1, allocated_cores() // nproc_per_node)


def detect_backend(nproc_per_node: int) -> str:
    """nccl when there are at least as many CUDA devices as ranks per node, else gloo."""
    if shutil.which("nvidia-smi") is None and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return "gloo"  # no driver tools: skip importing torch (over a second)
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc_per_node else "gloo"


def launch(worker: str, nproc: int, config: dict | None = None, **kwargs) -> LaunchResult:
    """Run the module of ``worker`` (:data:`WORKERS`) on ``nproc`` ranks per node; see :class:`LaunchSpec`.

    ``echo=True`` streams rank 0's output to this process's stderr while it runs.
    """
    echo = kwargs.pop("echo", False)
    spec = LaunchSpec(worker=worker, nproc=nproc, config=dict(config or {}), **kwargs)
    return run_spec(spec, echo=echo)


def launch_many(worker: str, nprocs, config: dict | None = None, *, progress: bool = True,
                **kwargs) -> list[LaunchResult]:
    """One launch per world size (``nprocs`` ranks per node each), with a progress bar.

    Everything is validated before the first launch, so a bad entry late in ``nprocs`` cannot
    waste the launches before it.
    """
    echo = kwargs.pop("echo", False)
    nprocs = list(nprocs)
    if not nprocs:
        raise UsageError("need at least one rank count")
    specs = [LaunchSpec(worker=worker, nproc=n, config=dict(config or {}), **kwargs) for n in nprocs]
    return _run_specs(specs, progress=progress, echo=echo)


def _run_specs(specs: list[LaunchSpec], *, progress: bool, echo: bool) -> list[LaunchResult]:
    from tqdm.auto import tqdm

    results = []
    desc = f"{specs[0].worker} launches" if specs else "launches"
    for spec in tqdm(specs, desc=desc, unit="launch", disable=not progress):
        results.append(run_spec(spec, echo=echo))
    return results


def launch_lab(worker: str, config, launch: LaunchOptions | None = None,
               store=None) -> list[LaunchResult]:
    """The launching half of every lab's ``run(config, launch=..., store=...)``.

    Checks everything before the first launch: the config against each world size of the
    sweep (its ``check_world_size(n)``, where it has one), the launch options, and the results
    file ``store`` (writable; absent or a labkit results file). Then one launch per world size.
    """
    from labkit.results import check_writable

    launch = launch if launch is not None else LaunchOptions()
    if not isinstance(launch, LaunchOptions):
        raise UsageError(f"launch must be a LaunchOptions, got {type(launch).__name__}")
    check = getattr(config, "check_world_size", None)
    estimate = getattr(config, "memory_bytes_per_rank", None)
    specs = []
    for nproc, n in zip(launch.nprocs, launch.world_sizes):
        if check is not None:
            check(n)
        need = float(estimate(n)) if estimate is not None else None
        if need is not None:
            check_memory(need, nproc, world_size=n)
        specs.append(LaunchSpec(worker=worker, nproc=nproc, config=to_dict(config),
                                memory_estimate_bytes_per_rank=need, **launch.spec_kwargs()))
    if store is not None:
        check_writable(store)
    results = _run_specs(specs, progress=launch.progress, echo=launch.echo)
    if launch.rows_elsewhere == "raise" and results and all(r.payload is None for r in results):
        raise rows_on_another_node(results)
    return results


def rows_on_another_node(results: list[LaunchResult]):
    """The :class:`~labkit.errors.RowsOnAnotherNode` of a sweep none of whose launches hosted
    global rank 0 here: it names rank 0's node (SLURM node name) and host, as the ranks told it."""
    where = next((r.rank0_host for r in results if r.rank0_host), None) or {}
    host, node = where.get("host"), where.get("node")
    place = (f"node {node} (host {host})" if node else
             f"host {host}" if host else "the node that hosted global rank 0")
    return RowsOnAnotherNode(f"results are on {place}; this node has none",
                             node=node, host=host)


class MemoryWarning(UserWarning):
    """A launch that should fit, but close to the memory this machine has."""


def check_memory(bytes_per_rank: float, ranks_per_node: int, *, world_size: int,
                 available: int | None = None) -> None:
    """Refuse a launch whose ranks on this node cannot fit in the memory available now; warn
    above 80% of it. ``available`` defaults to :func:`labkit.results.available_memory_bytes`.

    >>> check_memory(1e9, 2, world_size=2, available=16 << 30)
    >>> check_memory(1e12, 2, world_size=2, available=16 << 30)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: 2 ranks need about 2000.0 GB (1000.0 GB per rank at world size 2); this machine has 17.2 GB available: use a smaller size or more nodes
    """
    from labkit.results import available_memory_bytes

    available = available_memory_bytes() if available is None else available
    if not available:
        return
    need = bytes_per_rank * ranks_per_node
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


def run_spec(spec: LaunchSpec, *, echo: bool = False) -> LaunchResult:
    backend = spec.backend or detect_backend(spec.nproc)
    threads = spec.threads_per_rank or default_threads(spec.nproc)
    cores = allocated_cores()
    oversubscribed = spec.nproc * threads > cores
    if oversubscribed:
        warnings.warn(
            f"{spec.nproc} ranks x {threads} threads on {cores} allocated cores: oversubscribed. "
            "Results are right but timings are not representative (ranks take turns on cores).",
            OversubscribedWarning, stacklevel=3)
    clean_stale_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=f"labkit-{spec.worker}-"))
    (workdir / "owner").write_text(f"{os.getpid()} {process_start(os.getpid())}")
    try:
        with _terminate_as_interrupt():
            return _run(spec, backend, threads, oversubscribed, workdir, echo)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def clean_stale_workdirs(folder: str | None = None) -> list[Path]:
    """Remove the temporary folders of launches whose launcher died without cleaning up
    (SIGKILL skips ``finally``); a folder whose owner still runs is left alone."""
    removed = []
    for owner in Path(folder or tempfile.gettempdir()).glob("labkit-*/owner"):
        with contextlib.suppress(OSError, ValueError):
            pid, start = owner.read_text().split()
            if process_start(int(pid)) != start:
                shutil.rmtree(owner.parent, ignore_errors=True)
                removed.append(owner.parent)
    return removed


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the launching process (``timeout``, a batch system, a closed
    terminal): handled like Ctrl-C, so the launch is killed before this process goes."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    # Python's default SIGTERM action ends the process at once, without unwinding: the
    # launch's ranks (each in a session of its own) would run on. Only the main thread may
    # install handlers; elsewhere the caller's own handling stands.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        exc = Terminated(f"received {signal.Signals(signum).name}")
        exc.signum = signum  # the CLI exits 128 + signum, as a shell expects
        raise exc

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def torchrun_command(spec: LaunchSpec, log_dir: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "labkit.launch", f"--nproc-per-node={spec.nproc}"]
    if spec.nnodes == 1 and not spec.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rdzv_endpoint}",
                f"--rdzv-id={spec.rdzv_id}"]
    cmd += [f"--log-dir={log_dir}", "--redirects=3", "--max-restarts=0",
            "-m", WORKERS[check_worker(spec.worker)],
            "--config", json.dumps(spec.config), "--out", str(out)]
    return cmd


def process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the pid it names one process, even after pids are reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _die_with_parent(parent: int):
    """``preexec_fn`` of the torchrun agent: SIGTERM it when this process dies, however it dies
    (SIGKILL, the OOM killer, a dead notebook kernel); torchrun then stops its ranks, and each
    rank's own watchdog (labkit.harness) is the second line."""
    def preexec():
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def stalled_ranks(status_dir: Path, now: float | None = None) -> str:
    """Which ranks stopped making progress, from their heartbeat files (labkit.harness):
    a rank with no heartbeat for seconds is stopped or stuck outside Python; otherwise the
    ranks whose last progress is oldest are the stuck ones (the others wait for them).

    >>> import json, tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "rank0.beat").write_text(json.dumps({"time": 100.0, "progress": 99.0}))
    >>> _ = (d / "rank1.beat").write_text(json.dumps({"time": 70.0, "progress": 60.0}))
    >>> stalled_ranks(d, now=100.5)
    'rank 1 stopped (no heartbeat for 30 s, no progress for 40 s)'
    >>> _ = (d / "rank1.beat").write_text(json.dumps({"time": 100.0, "progress": 60.0}))
    >>> stalled_ranks(d, now=100.2)
    'rank 1 made no progress for 40 s (rank 0 last progressed 1 s ago)'
    """
    now = time.time() if now is None else now
    beats = {}
    for f in status_dir.glob("rank*.beat"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            d = json.loads(f.read_text())
            beats[int(f.name[4:-5])] = (float(d["time"]), float(d["progress"]))
    if not beats:
        return "no rank reported a heartbeat (stuck before it started)"
    dead = {r: b for r, b in beats.items() if now - b[0] > 5.0}
    if dead:
        return "; ".join(f"rank {r} stopped (no heartbeat for {now - t:.0f} s, no progress for "
                         f"{now - pr:.0f} s)" for r, (t, pr) in sorted(dead.items()))
    oldest = min(pr for _, pr in beats.values())
    stuck = sorted(r for r, (_, pr) in beats.items() if pr - oldest < 1.0)
    others = sorted(set(beats) - set(stuck))
    text = (f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} made no progress "
            f"for {now - oldest:.0f} s")
    if others:
        latest = max(beats[r][1] for r in others)
        text += (f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} last "
                 f"progressed {now - latest:.0f} s ago)")
    return text


def _run(spec, backend, threads, oversubscribed, workdir: Path, echo: bool) -> LaunchResult:
    launch_id = uuid.uuid4().hex
    log_dir, out, status_dir = workdir / "logs", workdir / "payload.json", workdir / "status"
    status_dir.mkdir()
    cmd = torchrun_command(spec, log_dir, out)
    env = dict(os.environ)
    env.update({
        LAUNCH_ENV: launch_id,
        "OMP_NUM_THREADS": str(threads),
        "LABKIT_BACKEND": backend,
        "LABKIT_STATUS_DIR": str(status_dir),
        "LABKIT_THREADS_PER_RANK": str(threads),
        "LABKIT_OVERSUBSCRIBED": "1" if oversubscribed else "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p),
        # every rank watches this process and exits when it is gone (labkit.harness)
        "LABKIT_HOST_PID": str(os.getpid()),
        "LABKIT_HOST_START": process_start(os.getpid()) or "",
    })
    agent_log = workdir / "agent.log"
    t0 = time.perf_counter()
    stop_echo = threading.Event()
    with open(agent_log, "wb") as agent_out:
        proc = subprocess.Popen(cmd, stdout=agent_out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent(os.getpid()))
        echo_thread = None
        if echo:
            echo_thread = threading.Thread(target=echo_rank0, args=(log_dir, stop_echo), daemon=True)
            echo_thread.start()
        try:
            rc = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            stalled = stalled_ranks(status_dir)  # read before the kill stops the heartbeats
            kill_launch(proc, launch_id)
            logs = collect_logs(log_dir, status_dir)
            raise LaunchTimeout(
                f"{spec.worker} on {spec.world_size} ranks ran past its timeout of "
                f"{spec.timeout_s:g} s; {stalled}; every process of the launch was killed."
                + tail_note(logs)) from None
        except BaseException:  # Ctrl-C or anything else: leave nothing behind
            kill_launch(proc, launch_id)
            raise
        finally:
            stop_echo.set()
            if echo_thread is not None:
                echo_thread.join(timeout=2)
            kill_launch(proc, launch_id)  # a no-op after a clean exit; catches stragglers
    wall = time.perf_counter() - t0
    logs = collect_logs(log_dir, status_dir)
    if rc != 0:
        raise failure(spec, rc, agent_log.read_text(errors="replace"), logs, status_dir)
    payload = None
    if out.exists():
        try:
            payload = json.loads(out.read_text())
        except json.JSONDecodeError as e:
            raise LaunchError(f"{spec.worker}: rank 0 wrote an unreadable payload ({e})") from None
    elif spec.nnodes == 1:
        raise LaunchError(f"{spec.worker}: the launch exited 0 but rank 0 wrote no payload"
                          + tail_note(logs))
    return LaunchResult(spec=spec, backend=backend, threads_per_rank=threads,
                        oversubscribed=oversubscribed, payload=payload, logs=logs,
                        wall_time_s=wall, command=tuple(cmd),
                        peak_rss_bytes_per_rank=_peak_rss(status_dir),
                        rank0_host=_rank0_host(status_dir))


def _rank0_host(status_dir: Path) -> dict | None:
    """Where global rank 0 ran, as this node's ranks heard it (multi-node; labkit.harness)."""
    with contextlib.suppress(OSError, ValueError):
        where = json.loads((status_dir / "rank0_host.json").read_text())
        return where if isinstance(where, dict) else None
    return None


def _peak_rss(status_dir: Path) -> int | None:
    """The largest peak resident set any rank of this node reported (labkit.harness)."""
    peaks = []
    for f in status_dir.glob("rank*.peak"):
        with contextlib.suppress(OSError, ValueError):
            peaks.append(int(f.read_text()))
    return max(peaks) if peaks else None


def torchrun_main(argv: list[str] | None = None) -> None:
    """Several nodes (or ``LABKIT_AGENT=torchrun``): ``python -m labkit.launch ARGS`` is
    ``torchrun ARGS``, the same ``torch.distributed.run`` main, arguments and exit codes,
    except that once every rank has finished and torchrun has shut its agent down, it leaves with ``os._exit(0)`` instead of letting Python tear down the torch
    it imported (0.2-0.7 s of every launch on a 2-core machine; the lab launches a few dozen
    times). A failure takes torchrun's normal path (its error report, exit code 1). The ranks
    leave the same way (:func:`labkit.harness.worker_main`)."""
    from torch.distributed.run import main

    main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: the only form of ``python -m labkit.launch`` the light agent takes (what
#: :func:`torchrun_command` builds for one node): anything else goes to torchrun
_LIGHT_ARGS = re.compile(r"--(nproc-per-node=\d+|standalone|log-dir=.+|redirects=3|max-restarts=0)")


def agent_main(argv: list[str] | None = None) -> None:
    """``python -m labkit.launch ARGS``: torchrun's arguments. A one-node ``--standalone`` launch
    in the form :func:`torchrun_command` builds runs under :func:`light_agent`; every other form
    (several nodes, a rendezvous endpoint, options typed by hand) and any launch with
    ``LABKIT_AGENT=torchrun`` in the environment runs under torchrun (:func:`torchrun_main`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    head = argv[: argv.index("-m")] if "-m" in argv else argv
    opts = dict(a[2:].split("=", 1) for a in head if "=" in a)
    # anything else, a hand-typed form included: torchrun's own defaults and checks
    if (os.environ.get("LABKIT_AGENT") == "torchrun" or "--standalone" not in head
            or "-m" not in argv or not all(_LIGHT_ARGS.fullmatch(a) for a in head)
            or "log-dir" not in opts or int(opts.get("nproc-per-node", "0")) < 1):
        torchrun_main(argv)
    sys.exit(light_agent(int(opts["nproc-per-node"]), Path(opts["log-dir"]),
                         argv[len(head) + 1:]))


def light_agent(nproc: int, log_dir: Path, module_args: list[str]) -> int:
    """Start ``nproc`` ranks of ``python -m MODULE ARGS`` on this node and wait for them, the way
    ``torchrun --standalone`` does, without importing torch: the agent's own import of torch
    was ~2 s of every launch on a 2-core machine (4.3 s for a trivial 2-rank launch).

    Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK, MASTER_ADDR, MASTER_PORT: rank 0 hosts the store), a session of its own, its
    stdout and stderr in ``log_dir/labkit/attempt_0/<rank>/`` (torchrun's layout) and SIGTERM
    when the agent dies. When a rank fails, the others get SIGTERM (SIGKILL 5 s later) and
    the agent prints torchrun's lines ``rank : R (local_rank: R)`` / ``exitcode : C``, the
    first failure first, and returns 1; a SIGTERM, SIGINT or SIGHUP to the agent ends every
    rank the same way."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(nproc):
        folder = log_dir / "labkit" / "attempt_0" / str(rank)
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
               "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        # the rank writes through its own copies of the two files: the agent closes its own
        with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", *module_args], env=env,
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True,
                                          preexec_fn=_die_with_parent(os.getpid())))

    def stop_all(grace_s: float = 5.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + wait
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.02)

    def on_signal(signum, frame):
        stop_all()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    failed: list[int] = []
    while True:
        codes = [p.poll() for p in procs]
        failed += [r for r, c in enumerate(codes) if c not in (None, 0) and r not in failed]
        if failed or all(c == 0 for c in codes):
            break
        time.sleep(0.02)
    if not failed:
        return 0
    stop_all()
    failed += [r for r, p in enumerate(procs) if p.returncode != 0 and r not in failed]
    print("labkit.launch: the launch failed (first observed failure first)", file=sys.stderr)
    for r in failed:
        print(f"  rank      : {r} (local_rank: {r})\n  exitcode  : {procs[r].returncode} "
              f"(pid: {procs[r].pid})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    agent_main()
