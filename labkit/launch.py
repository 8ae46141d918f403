"""Host side: run a worker module on ranks, as a subprocess, and get a typed result back.

The command it builds is the one you would type, with ``torchrun`` for ``python -m labkit.launch``::

    python -m labkit.launch --standalone --nproc-per-node=2 \\
        --log-dir DIR --redirects 3 -m labkit.checks.placement_worker --out DIR/payload.json

and for clusters ``--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT``.
``python -m labkit.launch`` takes torchrun's arguments and runs the agent (:mod:`labkit.agent`).
What a launch is asked for and how it is checked lives in :mod:`labkit.launchspec`; process
facts in :mod:`labkit.procs`; killing a launch in :mod:`labkit.orphans`; reading its remains
in :mod:`labkit.diagnose`.

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
* **Backend.** nccl when CUDA devices >= ranks per node, else gloo; overridable
  (:func:`labkit.devices.choose_backend`: nccl with more ranks than GPUs is refused before
  launch, gloo chosen on a node whose GPUs are too few is warned about and its rows are marked
  ``gloo_fallback``). A sweep whose small launches would run on the GPUs and its large ones
  on gloo runs all of them on gloo (:func:`labkit.devices.sweep_backend`): its world sizes are
  compared with each other. On nccl the lab's memory estimate is checked against the GPU's memory.
* **No orphans.** Every process of a launch carries ``LABKIT_LAUNCH_ID`` in its environment.
  The agent puts each rank in a session of its own, so killing the agent's process group is
  not enough: on timeout, Ctrl-C or any error the launcher terminates the agent's group, then
  finds every process carrying the launch id and kills its process group
  (:func:`labkit.orphans.kill_launch`). Every rank also watches its launcher and exits once it
  is gone (:mod:`labkit.harness`).
* **Readable failures.** A failing rank raises :class:`~labkit.errors.RankFailed` naming the rank,
  its exit code or signal, the exception it raised and the last lines of its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

from labkit.config import to_dict
from labkit.devices import check_device_memory, choose_backend, sweep_backend
from labkit.diagnose import (
    collect_logs,
    echo_rank0,
    failure,
    peak_rss,
    rank0_host,
    stalled_ranks,
    tail_note,
)
from labkit.errors import LaunchError, LaunchTimeout, RowsOnAnotherNode, UsageError
from labkit.launchspec import (
    WORKERS,
    LaunchOptions,
    LaunchResult,
    LaunchSpec,
    MemoryWarning,
    OversubscribedWarning,
    check_memory,
    check_worker,
    default_threads,
    list_workers,
    slurm_job_id,
)
from labkit.orphans import (
    LAUNCH_ENV,
    Terminated,
    die_with_parent,
    kill_launch,
    terminate_as_interrupt,
)
from labkit.procs import alive, allocated_cores, process_start
from labkit.results import LAUNCH_COLUMNS

__all__ = ["LAUNCH_COLUMNS", "LAUNCH_ENV", "WORKERS", "LaunchOptions", "LaunchResult",
           "LaunchSpec", "MemoryWarning", "OversubscribedWarning", "Terminated",
           "allocated_cores", "check_memory", "check_worker", "clean_stale_workdirs",
           "default_threads", "launch", "launch_lab", "list_workers",
           "rows_on_another_node", "run_spec", "slurm_job_id", "torchrun_command"]

_REPO_ROOT = Path(__file__).resolve().parent.parent


def launch(worker: str, nproc: int, config: dict | None = None, **kwargs) -> LaunchResult:
    """Run the module of ``worker`` (:data:`WORKERS`) on ``nproc`` ranks per node; see :class:`LaunchSpec`.

    ``echo=True`` streams rank 0's output to this process's stderr while it runs.
    """
    echo = kwargs.pop("echo", False)
    spec = LaunchSpec(worker=worker, nproc=nproc, config=dict(config or {}), **kwargs)
    return run_spec(spec, echo=echo)


def _run_specs(specs: list[LaunchSpec], *, progress: bool, echo: bool) -> list[LaunchResult]:
    from tqdm.auto import tqdm

    results = []
    desc = f"{specs[0].worker} launches" if specs else "launches"
    for spec in tqdm(specs, desc=desc, unit="launch", disable=not progress):
        results.append(run_spec(spec, echo=echo))
    return results


def launch_lab(worker: str, config, launch: LaunchOptions | None = None,
               store=None, *, traced: bool = False) -> list[LaunchResult]:
    """The launching half of every lab's ``run(config, launch=..., store=...)``.

    Checks everything before the first launch: the config against each world size of the
    sweep (its ``check_world_size(n)``, where it has one), the launch options, and the results
    file ``store`` (writable; absent or a labkit results file). Then one launch per world size.
    ``traced``: the lab writes ``launch.trace_dir``'s traces from its rows; a lab that does not
    refuses a ``trace_dir`` here rather than ignore it.
    """
    from labkit.results import check_writable

    launch = launch if launch is not None else LaunchOptions()
    if not isinstance(launch, LaunchOptions):
        raise UsageError(f"launch must be a LaunchOptions, got {type(launch).__name__}")
    if launch.trace_dir is not None and not traced:
        raise UsageError(f"trace_dir: the {worker} lab's rows hold no timeline to trace")
    check = getattr(config, "check_world_size", None)
    check_backend = getattr(config, "check_backend", None)
    estimate = getattr(config, "memory_bytes_per_rank", None)
    specs = []
    # one backend for the whole sweep: its world sizes are compared with each other
    together, forced = sweep_backend(launch.nprocs, launch.backend)
    settings = {**launch.settings(), "backend": together}
    for nproc, n in zip(launch.nprocs, launch.world_sizes):
        if check is not None:
            check(n)
        backend, _ = choose_backend(nproc, together, warn=False)
        if check_backend is not None:
            check_backend(backend)
        need = float(estimate(n)) if estimate is not None else None
        if need is not None and backend == "nccl":  # the data lives on the GPU
            check_device_memory(need, world_size=n)
        elif need is not None:
            check_memory(need, nproc, world_size=n)
        specs.append(LaunchSpec(worker=worker, nproc=nproc, config=to_dict(config),
                                memory_estimate_bytes_per_rank=need, **settings))
    if store is not None:
        check_writable(store)
    results = _run_specs(specs, progress=launch.progress, echo=launch.echo)
    if forced:
        results = [dataclasses.replace(r, gloo_fallback=True) for r in results]
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


def run_spec(spec: LaunchSpec, *, echo: bool = False) -> LaunchResult:
    backend, gloo_fallback = choose_backend(spec.nproc, spec.backend)
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
        with terminate_as_interrupt():
            result = _run(spec, backend, threads, oversubscribed, workdir, echo)
            return dataclasses.replace(result, gloo_fallback=True) if gloo_fallback else result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def clean_stale_workdirs(folder: str | None = None) -> list[Path]:
    """Remove the temporary folders of launches whose launcher died without cleaning up
    (SIGKILL skips ``finally``); a folder whose owner still runs, or may (its facts cannot be
    read), is left alone."""
    removed = []
    for owner in Path(folder or tempfile.gettempdir()).glob("labkit-*/owner"):
        with contextlib.suppress(OSError, ValueError):
            pid, start = owner.read_text().split()
            if not alive(int(pid), start):
                shutil.rmtree(owner.parent, ignore_errors=True)
                removed.append(owner.parent)
    return removed


def torchrun_command(spec: LaunchSpec, log_dir: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "labkit.launch", f"--nproc-per-node={spec.nproc}"]
    if spec.nnodes == 1 and not spec.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        # the first node hosts the rendezvous store because it is told so: torch's own guess
        # compares the endpoint with this host's names and misses where the endpoint is another
        # interface's address (a cluster's NodeAddr, Debian's 127.0.1.1), and then no node hosts it
        cmd += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rdzv_endpoint}",
                f"--rdzv-id={spec.rdzv_id}", f"--rdzv-conf=is_host={int(spec.node_rank == 0)}"]
    cmd += [f"--log-dir={log_dir}", "--redirects=3", "--max-restarts=0",
            "-m", WORKERS[check_worker(spec.worker)],
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
                                preexec_fn=die_with_parent(os.getpid()))
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
    agent_text = agent_log.read_text(errors="replace") if rc != 0 else ""
    logs = collect_logs(log_dir, status_dir, agent_text)
    if rc != 0:
        raise failure(spec, rc, agent_text, logs, status_dir)
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
                        peak_rss_bytes_per_rank=peak_rss(status_dir),
                        rank0_host=rank0_host(status_dir))


if __name__ == "__main__":  # the command torchrun_command builds, and the one users type
    from labkit.agent import agent_main

    agent_main()
