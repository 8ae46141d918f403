"""Host side: run a worker module under torchrun, as a subprocess, and get a typed result back.

The command it builds is the one you would type::

    python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        --log-dir DIR --redirects 3 -m labkit.workers.placement --out DIR/payload.json

and for clusters ``--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT``.

Guarantees:

* **One launch per world size.** A launch costs seconds (mostly importing torch in every rank),
  so a worker does every point of a sweep inside one launch.
* **Threads.** ``OMP_NUM_THREADS`` = cores // ranks per node (at least 1) unless given; recorded.
  More rank-threads than cores is allowed, marked ``oversubscribed: true`` and warned about.
* **Backend.** nccl when CUDA devices >= ranks per node, else gloo; overridable.
* **No orphans.** Every process of a launch carries ``LABKIT_LAUNCH_ID`` in its environment.
  torchrun puts each rank in a session of its own, so killing torchrun's process group is not
  enough: on timeout, Ctrl-C or any error the launcher terminates torchrun's group, then finds
  every process carrying the launch id (``/proc/*/environ``) and kills its process group.
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

from .diagnose import collect_logs, echo_rank0, failure, tail_note
from .errors import LaunchError, LaunchTimeout, UsageError
from .orphans import LAUNCH_ENV, kill_launch
from .results import available_cores

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

    def __post_init__(self):
        check_worker(self.worker)
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
        }

    def rows(self) -> list[dict]:
        """The worker's rows, each with the launch fields added (worker fields win)."""
        base = self.launch_fields()
        return [{**base, **row} for row in (self.payload or {}).get("rows", [])]

    @property
    def placement(self) -> list[dict]:
        return (self.payload or {}).get("placement", [])


def check_worker(name: str) -> str:
    """A worker is a module ``labkit.workers.NAME`` with a ``main``; anything else is refused."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name.startswith("_"):
        raise UsageError(f"unknown worker {name!r}")
    if importlib.util.find_spec(f"labkit.workers.{name}") is None:
        known = ", ".join(list_workers())
        raise UsageError(f"unknown worker {name!r} (known: {known})")
    return name


def list_workers() -> list[str]:
    folder = Path(__file__).parent / "workers"
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def default_threads(nproc_per_node: int) -> int:
    return max(1, available_cores() // nproc_per_node)


def detect_backend(nproc_per_node: int) -> str:
    """nccl when there are at least as many CUDA devices as ranks per node, else gloo."""
    if shutil.which("nvidia-smi") is None and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return "gloo"  # no driver tools: skip importing torch (over a second)
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc_per_node else "gloo"


def launch(worker: str, nproc: int, config: dict | None = None, **kwargs) -> LaunchResult:
    """Run ``labkit.workers.<worker>`` on ``nproc`` ranks per node; see :class:`LaunchSpec`.

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
    from tqdm.auto import tqdm

    echo = kwargs.pop("echo", False)
    nprocs = list(nprocs)
    if not nprocs:
        raise UsageError("need at least one rank count")
    specs = [LaunchSpec(worker=worker, nproc=n, config=dict(config or {}), **kwargs) for n in nprocs]
    results = []
    for spec in tqdm(specs, desc=f"{worker} launches", unit="launch", disable=not progress):
        results.append(run_spec(spec, echo=echo))
    return results


def run_spec(spec: LaunchSpec, *, echo: bool = False) -> LaunchResult:
    backend = spec.backend or detect_backend(spec.nproc)
    threads = spec.threads_per_rank or default_threads(spec.nproc)
    cores = available_cores()
    oversubscribed = spec.nproc * threads > cores
    if oversubscribed:
        warnings.warn(
            f"{spec.nproc} ranks x {threads} threads on {cores} cores: oversubscribed. "
            "Results are right but timings are not representative (ranks take turns on cores).",
            OversubscribedWarning, stacklevel=3)
    workdir = Path(tempfile.mkdtemp(prefix=f"labkit-{spec.worker}-"))
    try:
        with _terminate_as_interrupt():
            return _run(spec, backend, threads, oversubscribed, workdir, echo)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
        raise Terminated(f"received {signal.Signals(signum).name}")

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def torchrun_command(spec: LaunchSpec, log_dir: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={spec.nproc}"]
    if spec.nnodes == 1 and not spec.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rdzv_endpoint}",
                f"--rdzv-id={spec.rdzv_id}"]
    cmd += [f"--log-dir={log_dir}", "--redirects=3", "--max-restarts=0",
            "-m", f"labkit.workers.{spec.worker}",
            "--config", json.dumps(spec.config), "--out", str(out)]
    return cmd


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
    })
    agent_log = workdir / "agent.log"
    t0 = time.perf_counter()
    stop_echo = threading.Event()
    with open(agent_log, "wb") as agent_out:
        proc = subprocess.Popen(cmd, stdout=agent_out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL)
        echo_thread = None
        if echo:
            echo_thread = threading.Thread(target=echo_rank0, args=(log_dir, stop_echo), daemon=True)
            echo_thread.start()
        try:
            rc = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            kill_launch(proc, launch_id)
            logs = collect_logs(log_dir, status_dir)
            raise LaunchTimeout(
                f"{spec.worker} on {spec.world_size} ranks ran past its timeout of "
                f"{spec.timeout_s:g} s; every process of the launch was killed."
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
                        wall_time_s=wall, command=tuple(cmd))
