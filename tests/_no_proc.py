"""A machine without the Linux-only facts, for the portability tests (tests/test_portable.py).

:func:`sitecustomize` writes a ``sitecustomize.py`` that calls :func:`install` in every Python
process started with its folder on ``PYTHONPATH`` (a launch passes ``PYTHONPATH`` on to its
agent and ranks). :func:`install` then takes away what macOS does not have:

* labkit reading the kernel's process files by hand: an ``open``, ``os.listdir`` or
  ``os.scandir`` of a path under ``/proc`` whose nearest caller outside the standard library is
  labkit itself raises PermissionError (and is logged to ``LABKIT_NO_PROC_LOG``); psutil's own
  reads stay allowed, psutil being the portable API;
* ``os.sched_getaffinity`` and psutil's ``Process.cpu_affinity`` (no affinity masks);
* ``prctl`` (no parent-death signal: only the ranks' heartbeat ends them when the host dies).

Importing this module changes nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABKIT = str(ROOT / "labkit") + os.sep
_LIBRARIES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_EVENTS = ("open", "os.listdir", "os.scandir")


def _under_proc(path) -> bool:
    if isinstance(path, int) or path is None:
        return False
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    return path == "/proc" or path.startswith("/proc/")


def _caller_is_labkit() -> bool:
    """Whether the nearest caller outside the standard library is labkit (not a library)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(LABKIT):
            return True
        if any(lib in name for lib in _LIBRARIES):
            return False
        frame = frame.f_back
    return False


def _hook(event: str, args: tuple) -> None:
    if event == "ctypes.dlsym" and len(args) > 1 and args[1] == "prctl":
        raise AttributeError("prctl: not on this platform (labkit's portability test)")
    if event not in _EVENTS or not args or not _under_proc(args[0]) or not _caller_is_labkit():
        return
    log = os.environ.get("LABKIT_NO_PROC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {event} {os.fsdecode(args[0])}\n")
    raise PermissionError(13, "labkit read /proc by hand (portability test)", os.fsdecode(args[0]))


def install() -> None:
    sys.addaudithook(_hook)
    if hasattr(os, "sched_getaffinity"):
        del os.sched_getaffinity
    import psutil

    if hasattr(psutil.Process, "cpu_affinity"):
        del psutil.Process.cpu_affinity


def sitecustomize(folder: Path) -> Path:
    """Write ``folder/sitecustomize.py`` calling :func:`install`; put ``folder`` and the
    repository on ``PYTHONPATH`` to use it."""
    path = folder / "sitecustomize.py"
    path.write_text("from tests._no_proc import install\n\ninstall()\n")
    return path
