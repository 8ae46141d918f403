"""No orphans: find and kill every process of a launch, wherever its agent put it.

The agent (torchrun or labkit's light one) starts each rank in a session of its own
(``start_new_session``), so killing the agent's process group leaves the ranks running. Every
process of a launch inherits ``LABKIT_LAUNCH_ID`` from the launcher's environment;
:func:`kill_launch` terminates the agent's group (the agent then forwards the signal to its
ranks), waits a grace period, then SIGKILLs the process group of every process still carrying
the id, and of every process that was below the agent. Processes are found through
:mod:`labkit.procs` (psutil), so this works wherever psutil does (Linux, macOS).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from labkit.procs import alive, descendants, processes_of

LAUNCH_ENV = "LABKIT_LAUNCH_ID"


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the process group of ``pid`` (never to this process's own group) and to
    ``pid`` itself; a process already gone, or not ours, is passed over."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        pgid = os.getpgid(pid)
        if pgid != os.getpgrp():
            os.killpg(pgid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_launch(proc: subprocess.Popen, launch_id: str, grace_s: float = 3.0) -> None:
    """Terminate the agent's group (it forwards to ranks), then SIGKILL anything left: every
    process carrying the launch id, and every process that was below the agent (where a
    platform will not show another process's environment, the family tree still does).
    A Ctrl-C or SIGTERM that arrives meanwhile waits until the kill is done (:func:`deferred`):
    a second Ctrl-C must not stop the first one's cleaning half-way."""
    with deferred():
        _kill_launch(proc, launch_id, grace_s)


@contextlib.contextmanager
def deferred(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """Hold ``signals`` back for the block, then deliver the first that came, once, to the
    handlers that were there before (the main thread only: elsewhere nothing is changed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
             for sig in signals}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
        if came:
            signal.raise_signal(came[0])


def _kill_launch(proc: subprocess.Popen, launch_id: str, grace_s: float) -> None:
    me = os.getpid()
    # read before the agent goes (its ranks then belong to init), and only while it is not
    # reaped: until then its pid cannot name another process
    family = ({p: s for p, s in descendants(proc.pid).items() if s is not None and p != me}
              if proc.poll() is None else {})
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    for _ in range(50):
        left = [p for p in processes_of(launch_id, LAUNCH_ENV) if p != me]
        left += [p for p, start in family.items() if p not in left and alive(p, start)]
        if not left and proc.poll() is not None:
            return
        for pid in left:
            _signal(pid, signal.SIGKILL)
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
        for pid in (p for p in processes_of(value, var) if p != me):
            _signal(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and [p for p in processes_of(value, var) if p != me]:
            time.sleep(0.05)
    return found


def die_with_parent(parent: int):
    """A ``preexec_fn`` for an agent or a rank: SIGTERM it when ``parent`` dies, however it
    dies (SIGKILL, the OOM killer, a dead notebook kernel). Linux only (``prctl``); elsewhere,
    and as a second line everywhere, each rank's heartbeat (:mod:`labkit.harness`) ends the rank
    once its launcher is gone, and the agent follows its ranks."""
    if not sys.platform.startswith("linux"):
        # no prctl; and Python run between fork and exec in a threaded process (a notebook
        # kernel) can deadlock on macOS: no preexec_fn at all, the heartbeat covers it
        return None
    prctl = None
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child

    def preexec():
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the launching process (``timeout``, a batch system, a closed
    terminal): handled like Ctrl-C, so the launch is killed before this process goes."""


@contextlib.contextmanager
def terminate_as_interrupt():
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
