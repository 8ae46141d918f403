"""Process and machine facts, the portable way (Linux and macOS, as a normal user): through
psutil, never by reading the kernel's process files by hand.

Process facts: :func:`process_start` (a token naming one process, even after its pid is reused),
:func:`alive`, :func:`processes_of` (the processes whose environment carries a mark),
:func:`descendants`. Machine facts: :func:`available_cores`, :func:`allocated_cores`,
:func:`available_memory_bytes`, :func:`cpu_model`; and :func:`peak_rss_bytes` of this process.

A platform may withhold a fact: macOS answers AccessDenied about other users' processes and has
no CPU affinity; a container may hide its memory limit. Then the fact is unknown (``None``, or
the safe side named in each function), and no caller decides "dead" from a missing fact: a
launch is only ever ended on proof.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

#: how far two reads of one process's start time may differ (seconds): psutil adds the boot time
#: to the kernel's count since boot, and the boot time moves when the wall clock is stepped
START_SLACK_S = 1.0

#: the memory limit of this cgroup (v2, then v1): a batch job's allocation, a container's
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


# -- processes --------------------------------------------------------------------------------
def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (seconds since the epoch) as a token: with the pid it
    names one process, even after the pid is reused. None where there is no such process or
    its start cannot be read.

    >>> float(process_start(os.getpid())) > 0, process_start(2**31)
    (True, None)
    """
    try:
        return f"{_started(psutil.Process(pid)):.3f}"
    except (psutil.Error, ValueError, OverflowError):
        return None


def age_s(pid: int | None = None) -> float | None:
    """Seconds since process ``pid`` (default: this one) started, on the wall clock; None
    where its start cannot be read. What a rank reports as the time it took to get going
    (import torch, the rendezvous), beside the launch's wall time.

    >>> 0 <= age_s() < 3600
    True
    """
    try:
        proc = psutil.Process(pid or os.getpid())
        # Linux: the start in seconds since boot against the boot-time clock (psutil's epoch
        # start adds a boot time read to the whole second: up to a second off)
        now = (time.clock_gettime(time.CLOCK_BOOTTIME) if sys.platform.startswith("linux")
               else time.time())
        return max(0.0, now - _started(proc))
    except (psutil.Error, ValueError, OverflowError, OSError):
        return None


def _started(proc: psutil.Process) -> float:
    # Linux: seconds since boot. psutil adds the boot time, which it re-reads and which moves
    # when the wall clock is stepped (a resumed laptop, NTP): a live launcher would then look
    # like another process. macOS fixes a process's start time when it starts.
    if sys.platform.startswith("linux"):
        return proc.create_time() - psutil.boot_time()
    return proc.create_time()


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie has ended) and, given ``start`` (a
    :func:`process_start` token), is still the process that token named. A fact that cannot be
    read (AccessDenied, an unreadable token) counts as alive: only proof of an end is an end.

    >>> me = os.getpid()
    >>> alive(me, process_start(me)), alive(me, "12.000"), alive(2**31)
    (True, False, False)
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except (psutil.NoSuchProcess, ValueError, OverflowError):  # ZombieProcess is one too
        return False
    except psutil.AccessDenied:
        pass  # it exists: psutil found it
    if start is None:
        return True
    try:
        then = float(start)
    except ValueError:
        return True  # a token that cannot be read: judged by the pid alone
    try:
        return abs(_started(proc) - then) <= START_SLACK_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def processes_of(value: str, var: str) -> list[int]:
    """PIDs of the live processes whose environment has ``var=value`` (every process of a launch
    inherits the launch's mark). Processes whose environment cannot be read (another user's, on
    macOS) are not this user's launches: skipped."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(var) == value:
                found.append(proc.pid)
        except (psutil.Error, OSError):  # AccessDenied, NoSuchProcess, ZombieProcess
            continue
    return found


def descendants(pid: int) -> dict[int, str | None]:
    """The processes below ``pid`` (children, theirs, ...), each pid with its
    :func:`process_start` token; empty where ``pid`` is gone or cannot be read."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except (psutil.Error, ValueError, OverflowError):
        return {}
    return {p.pid: process_start(p.pid) for p in below}


def peak_rss_bytes() -> int | None:
    """The largest resident set this process has had, in bytes: ``getrusage``'s ``ru_maxrss``,
    which Linux counts in KiB and macOS in bytes. None where there is no ``resource`` module.

    >>> peak_rss_bytes() > 1 << 20
    True
    """
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


# -- the machine ------------------------------------------------------------------------------
def available_cores() -> int:
    """Cores this process may run on: its affinity mask where the platform has one
    (``os.sched_getaffinity`` on Linux, psutil's ``cpu_affinity`` where that exists), else every
    logical core (macOS has no affinity mask)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        with contextlib.suppress(OSError):
            return max(1, len(getaffinity(0)))
    if hasattr(psutil.Process, "cpu_affinity"):
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            return max(1, len(psutil.Process().cpu_affinity()))
    return psutil.cpu_count(logical=True) or os.cpu_count() or 1


def bind_to_cores(local_rank: int, local_world_size: int) -> list[int] | None:
    """Bind the calling thread (a rank's compute: the threads it starts later inherit the
    binding, those started before keep theirs) to its share of the cores this process may run
    on, as ``srun --cpu-bind=cores`` binds tasks: the allowed cores split into
    ``local_world_size`` equal runs, run ``local_rank`` for this rank. The cores it gets, or
    None where it is left to the operating system: a platform without an affinity mask
    (macOS), fewer allowed cores than local ranks (oversubscribed), ``LABKIT_BIND_CORES=0``.

    Why, measured on a 2-core VM with gloo (2 ranks, 150 all-reduces after a barrier, p10 /
    p50 of the slower rank and the share of calls 1.5 ms over the p10): left free, the ranks
    met on one core now and then, and 30-50 % of calls waited for the scheduler's next turn
    (about 4 ms: 2 MiB p10 0.73 / p50 1.15-1.47 ms); with every thread of a rank on its one
    core, 70 % did (p50 3.8 ms); with the compute thread bound and gloo's threads (started
    before) left free, 0-4 % did at 64 KiB and 2 MiB (p50 0.96 ms).
    """
    if os.environ.get("LABKIT_BIND_CORES", "1") == "0" or not hasattr(psutil.Process,
                                                                       "cpu_affinity"):
        return None
    try:
        proc = psutil.Process()
        allowed = sorted(proc.cpu_affinity())
        if local_world_size < 1 or len(allowed) < local_world_size:
            return None
        per = len(allowed) // local_world_size
        mine = allowed[local_rank * per:(local_rank + 1) * per]
        proc.cpu_affinity(mine)
        return mine
    except (psutil.Error, OSError, ValueError):
        return None


def bound_cores() -> list[int] | None:
    """The cores this process may run on (its affinity mask; None where there is none)."""
    if not hasattr(psutil.Process, "cpu_affinity"):
        return None
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        return sorted(psutil.Process().cpu_affinity())
    return None


def allocated_cores() -> int:
    """The cores this launcher's ranks may use: :func:`available_cores`, and within a SLURM
    job no more than ``SLURM_CPUS_PER_TASK`` (a cluster without CPU binding leaves the whole node
    in the mask; the allocation is the share the job paid for). The default threads per rank
    and ``oversubscribed`` are judged against it.
    """
    cores = available_cores()
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if os.environ.get("SLURM_JOB_ID") and per_task.isdigit() and int(per_task) > 0:
        cores = min(cores, int(per_task))
    return cores


def available_memory_bytes() -> int | None:
    """Memory a launch may use now: what the system has available (psutil), capped by this
    cgroup's limit where one is readable; None where neither is known."""
    avail = None
    with contextlib.suppress(psutil.Error, OSError, RuntimeError, AttributeError, ValueError):
        avail = int(psutil.virtual_memory().available) or None
    for limit_file in CGROUP_MEMORY_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            limit = int(Path(limit_file).read_text().strip())  # "max" (no limit) is a ValueError
            if 0 < limit < (1 << 60):
                avail = limit if avail is None else min(avail, limit)
    return avail


def cpu_model() -> str | None:
    """The CPU's model name (``"AMD EPYC 7763"``), None where nothing tells it. Sources, the
    first that answers: torch's own CPU probe (``torch.cpu.get_capabilities()``: the cpuinfo
    library torch picks its kernels with, CPUID on x86), only where torch is already imported
    (a rank: importing it costs a second); ``sysctl machdep.cpu.brand_string`` on macOS;
    ``platform.processor()`` where it says more than the architecture (Windows)."""
    torch = sys.modules.get("torch")
    caps = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if caps is not None:
        with contextlib.suppress(Exception):  # a private probe's failure must not fail a rank
            name = str(caps().get("cpu_name") or "").strip()
            if name:
                return name
    if sys.platform == "darwin":
        name = _sysctl_brand()
        if name:
            return name
    name = platform.processor().strip()
    return name if name and name not in ("unknown", platform.machine()) else None


@functools.lru_cache(maxsize=1)
def _sysctl_brand() -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None
