"""No orphans: find and kill every process of a launch, wherever torchrun put it.

torchrun starts each rank in a session of its own (``start_new_session``), so killing torchrun's
process group leaves the ranks running. Every process of a launch inherits ``LABKIT_LAUNCH_ID``
from the launcher's environment; :func:`kill_launch` terminates torchrun's group (torchrun then
forwards the signal to its ranks), waits a grace period, then SIGKILLs the process group of every
process still carrying the id. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

LAUNCH_ENV = "LABKIT_LAUNCH_ID"


def processes_of(launch_id: str, var: str = LAUNCH_ENV) -> list[int]:
    """PIDs of live processes whose environment has ``var=launch_id`` (Linux /proc)."""
    needle = f"{var}={launch_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_launch(proc: subprocess.Popen, launch_id: str, grace_s: float = 3.0) -> None:
    """Terminate torchrun's group (it forwards to ranks), then SIGKILL anything left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    for _ in range(50):
        left = [p for p in processes_of(launch_id) if p != os.getpid()]
        if not left and proc.poll() is not None:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
        time.sleep(0.05)


def kill_marked(value: str, var: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM, then SIGKILL, the process group of every process (but this one) whose
    environment has ``var=value``; the pids found. A notebook run marks its kernel this way, so
    launches of a kernel that died are ended before the next run starts."""
    me = os.getpid()
    found = [p for p in processes_of(value, var) if p != me]
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        left = [p for p in processes_of(value, var) if p != me]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                pgid = os.getpgid(pid)
                if pgid != os.getpgid(me):
                    os.killpg(pgid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and [p for p in processes_of(value, var) if p != me]:
            time.sleep(0.05)
    return found
