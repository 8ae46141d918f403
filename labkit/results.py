"""The result store: a JSON file of rows that accumulates across launches.

File format::

    {"format": "labkit-results", "version": 1, "rows": [{...}, ...]}

* **Upsert by a key the caller names**: a new row replaces the stored row with the same values in
  the key fields (for the solve lab: mode, world_size, dof_per_rank, partitioner, method, dim,
  rhs, engine, transport).
* **Atomic and locked**: writers take an exclusive ``flock`` on ``PATH.lock`` for the whole
  read-modify-write, write a temporary file in the same folder, ``fsync`` it and ``os.replace``
  it over the old file. A writer killed mid-write (even by SIGKILL) leaves either the old file or
  the new one, never a torn one; the kernel drops the lock of a dead process.
* **Never silently replaced**: a corrupt file, or JSON that is not a labkit results file, is a
  :class:`~labkit.errors.ResultsFileError` naming the file.
* **Provenance** on every row (:func:`provenance`): timestamp, labkit and torch versions,
  hostname, cores, git commit when available. Backend, device name, threads per rank and
  ``oversubscribed`` come from the launch (see :meth:`labkit.launch.LaunchResult.rows`).

Pure: no torch import (versions are read from package metadata).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import functools
import json
import math
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import ResultsFileError, UsageError

FORMAT = "labkit-results"
VERSION = 1


def _jsonable(value):
    """JSON has no NaN/inf: store them as null so every reader can parse the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a results file; a missing file has none. Corrupt or foreign -> error."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_text()
    except OSError as e:
        raise ResultsFileError(f"{path}: cannot read results file ({e.strerror})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); "
                               "refusing to touch it") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ResultsFileError(f"{path}: not a labkit results file (no \"format\": \"{FORMAT}\"); "
                               "refusing to touch it")
    if doc.get("version") != VERSION or not isinstance(doc.get("rows"), list):
        raise ResultsFileError(f"{path}: unsupported labkit results version {doc.get('version')!r}")
    return doc["rows"]


def check_writable(path: str | os.PathLike) -> Path:
    """Validate a results path before a launch: parent exists, file absent or a labkit file."""
    path = Path(path)
    if path.is_dir():
        raise ResultsFileError(f"{path}: is a directory, not a results file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ResultsFileError(f"{path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ResultsFileError(f"{path}: folder {parent} is not writable")
    read_rows(path)
    return path


@contextlib.contextmanager
def _locked(path: Path):
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _atomic_write(path: Path, doc: dict) -> None:
    data = json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _key_of(row: dict, key: Sequence[str]) -> tuple:
    return tuple(json.dumps(row.get(k), sort_keys=True) for k in key)


def upsert(path: str | os.PathLike, rows: Iterable[dict], key: Sequence[str] = ()) -> list[dict]:
    """Insert ``rows`` into the file at ``path``, replacing stored rows with the same ``key``.

    With an empty ``key`` every row is appended. Missing key fields are an error (the row could
    never be replaced). Returns all rows now in the file.
    """
    path = Path(path)
    new = [_jsonable(dict(r)) for r in rows]
    for r in new:
        missing = [k for k in key if k not in r]
        if missing:
            raise UsageError(f"row lacks upsert key field(s) {missing}: {sorted(r)[:8]}...")
    check_writable(path)
    with _locked(path):
        old = read_rows(path)
        if key:
            incoming = {_key_of(r, key) for r in new}
            kept = [r for r in old if _key_of(r, key) not in incoming]
        else:
            kept = old
        merged = kept + new
        _atomic_write(path, {"format": FORMAT, "version": VERSION, "rows": merged})
    return merged


def record(path: str | os.PathLike, rows: Iterable[dict], key: Sequence[str] = ()) -> list[dict]:
    """:func:`upsert` with :func:`provenance` added to every row (row fields win)."""
    prov = provenance()
    return upsert(path, [{**prov, **row} for row in rows], key)


def load(path: str | os.PathLike):
    """The rows of a results file as a pandas DataFrame; a missing file is an error."""
    import pandas as pd

    if not Path(path).exists():
        raise ResultsFileError(f"{path}: no such results file")
    return pd.DataFrame(read_rows(path))


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def available_cores() -> int:
    """Cores this process may run on (affinity-aware, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def provenance() -> dict:
    """Fields every stored row carries about where and when it was measured."""
    from . import __version__

    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "labkit_version": __version__,
        "torch_version": _version("torch"),
        "hostname": socket.gethostname(),
        "cores": available_cores(),
        "git_commit": _git_commit(),
    }
