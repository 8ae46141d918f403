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
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from labkit.errors import ResultsFileError, ResultsNotStored, UsageError
from labkit.procs import available_cores

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
    """The rows of a results file; a missing file has none. Anything else that is not a labkit
    results file (not UTF-8, not JSON, another format, rows that are not objects) is a
    :class:`~labkit.errors.ResultsFileError` naming the file, and the file is left alone."""
    path = Path(path)
    if not path.exists():
        return []
    if path.is_dir():
        raise ResultsFileError(f"{path}: is a directory, not a results file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ResultsFileError(f"{path}: cannot read results file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ResultsFileError(f"{path}: not a text file (not UTF-8): not a labkit results "
                               "file; refusing to touch it") from None
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
    bad = next((i for i, r in enumerate(doc["rows"]) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ResultsFileError(f"{path}: row {bad} is a {type(doc['rows'][bad]).__name__}, not an "
                               "object: not a labkit results file; refusing to touch it")
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


#: a temporary file of a write older than this was left by a killed writer: removed
STALE_TMP_S = 600.0


def _atomic_write(path: Path, doc: dict) -> None:
    data = json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n"
    try:
        mode = path.stat().st_mode & 0o7777  # a shared results file stays shared
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
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


def _clean_stale_tmp(path: Path) -> None:
    """Temporary files of writers killed mid-write (SIGKILL skips their clean-up); called under
    the lock, so no live writer of this file owns one younger than a few seconds."""
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()


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
        _clean_stale_tmp(path)
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


def provenance() -> dict:
    """Fields every stored row carries about where and when it was measured."""
    from labkit import __version__

    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "labkit_version": __version__,
        "torch_version": _version("torch"),
        "hostname": socket.gethostname(),
        "cores": available_cores(),
        "git_commit": _git_commit(),
    }


# -- column schemas -------------------------------------------------------------------------
# Each lab declares the columns of its rows once (``labkit.<lab>.report.COLUMNS``): name, unit
# (also in the name: ``_s``, ``_bytes``, ``_gb_per_s``), meaning. Reports, plots, notebooks and
# ``labkit table --describe`` use those names; the tests check every row field is declared.

class Column(tuple):
    """A declared column: ``Column(name, unit, meaning)`` (``unit`` "" for counts and labels)."""

    __slots__ = ()

    def __new__(cls, name: str, unit: str, meaning: str):
        return super().__new__(cls, (name, unit, meaning))

    name = property(lambda self: self[0])
    unit = property(lambda self: self[1])
    meaning = property(lambda self: self[2])


#: where and when a stored row was measured (:func:`provenance`)
PROVENANCE_COLUMNS = (
    Column("timestamp", "", "when the row was stored (UTC, ISO 8601)"),
    Column("labkit_version", "", "labkit's version"),
    Column("torch_version", "", "torch's version"),
    Column("hostname", "", "the host that stored the row"),
    Column("cores", "", "cores this process could run on"),
    Column("git_commit", "", "the project's commit, when run from a git checkout"),
)

#: the fields every row of a launch carries (:meth:`labkit.launch.LaunchResult.launch_fields`)
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
    Column("gloo_fallback", "",
           "the node had GPUs, but fewer than ranks per node: the launch ran on gloo on the CPU"),
)


#: the labs whose report declares ``COLUMNS`` (pure modules: importing them is cheap)
SCHEMA_MODULES = ("labkit.solve.report", "labkit.ddp.report", "labkit.collectives.report",
                  "labkit.pipeline.report", "labkit.speedup.report", "labkit.checks.report",
                  "labkit.tp.report", "labkit.fsdp.report", "labkit.machine.report",
                  "labkit.cp.report", "labkit.moe.report")


def declared_columns() -> dict[str, Column]:
    """Every declared column of every lab, the launch fields and provenance, by name."""
    import importlib

    out = {c.name: c for c in PROVENANCE_COLUMNS + LAUNCH_COLUMNS}
    for mod in SCHEMA_MODULES:
        for c in getattr(importlib.import_module(mod), "COLUMNS", ()):
            out.setdefault(c.name, c)
    return out


def undeclared(rows: Iterable[dict], columns: Iterable[Column]) -> list[str]:
    """Fields of ``rows`` that ``columns``, the launch fields and provenance do not declare.

    >>> undeclared([{"world_size": 2, "x_s": 1.0}], [Column("x_s", "s", "a time")])
    []
    >>> undeclared([{"y": 1}], [])
    ['y']
    """
    known = {c.name for c in tuple(columns) + PROVENANCE_COLUMNS + LAUNCH_COLUMNS}
    return sorted({k for r in rows for k in r} - known)


def describe(names: Iterable[str], context: Iterable[str] = ()):
    """A DataFrame (column, unit, meaning) for ``names``; undeclared names say so.

    A name several labs declare (``speedup``, ``efficiency``) takes the meaning of the lab whose
    schema covers the most of ``names`` and ``context`` (all the file's columns): a results file
    is one lab's rows.
    """
    import importlib

    import pandas as pd

    names = list(names)
    schemas = [{c.name: c for c in getattr(importlib.import_module(m), "COLUMNS", ())}
               for m in SCHEMA_MODULES]
    seen = set(names) | set(context)  # every column of the file, when the caller has them
    schemas.sort(key=lambda sc: -len(seen & set(sc)))  # the best-matching lab first
    known = {c.name: c for c in PROVENANCE_COLUMNS + LAUNCH_COLUMNS}
    for sc in schemas:
        for name, c in sc.items():
            known.setdefault(name, c)
    return pd.DataFrame([{"column": n, "unit": known[n].unit if n in known else "",
                          "meaning": known[n].meaning if n in known else "(not declared)"}
                         for n in names])


#: the percentiles :func:`labkit.metrics.summarize_times` reports
TIMED_PCTS = (50, 75, 90, 95)

#: the device memory peak of a measured point (:func:`labkit.runtime.max_device_peak_bytes`),
#: declared by every lab whose worker records it
DEVICE_MEMORY_COLUMNS = (
    Column("device_memory_peak_bytes", "bytes",
           "the most device memory a rank held during the point, what the launch still holds "
           "from earlier points included (CUDA; empty on CPU)"),
)


def timed_columns(prefix: str, what: str, *, each: str = "step") -> tuple:
    """The declared columns of one timed thing, as :func:`labkit.timing.summarize` names them
    (``{prefix}_p50_s`` ... ``{prefix}_rank_spread``); ``what`` says what was timed, ``each``
    what one timing is (a training step; a repeat of a check).

    >>> [c.name for c in timed_columns("step_time", "training step")][:2]
    ['step_time_p50_s', 'step_time_p75_s']
    >>> len(timed_columns("step_time", "training step"))
    9
    >>> timed_columns("allreduce_time", "one all-reduce", each="repeat")[4].meaning
    'one all-reduce: fastest timed repeat, slowest rank'
    """
    return (*(Column(f"{prefix}_p{q}_s", "s", f"{what}: p{q} over timed {each}s, slowest rank")
              for q in TIMED_PCTS),
            Column(f"{prefix}_min_s", "s", f"{what}: fastest timed {each}, slowest rank"),
            Column(f"{prefix}_mean_s", "s", f"{what}: mean over timed {each}s, slowest rank"),
            Column(f"{prefix}_cv", "", f"{what}: std / mean over timed {each}s"),
            Column(f"{prefix}_count", "", f"{what}: timed {each}s"),
            Column(f"{prefix}_rank_spread", "",
                   f"{what}: mean over {each}s of (slowest - fastest rank) / slowest"))


# -- selections and cells of a lab's tables ----------------------------------------------------

def select_rows(df, **equal):
    """The rows of ``df`` whose column equals each ``column=value`` given, in ``df``'s order.
    A value None leaves its column free; a tuple, list or set matches any of its values.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"variant": ["a", "b", "a"], "world_size": [1, 1, 2]})
    >>> select_rows(df, variant="a", world_size=2).index.tolist()
    [2]
    >>> select_rows(df, variant=("a", "b"), world_size=1).index.tolist()
    [0, 1]
    >>> len(select_rows(df, variant=None))
    3
    """
    sel = df
    for col, value in equal.items():
        if value is None:
            continue
        if isinstance(value, (tuple, list, set, frozenset)):
            sel = sel[sel[col].isin(value)]
        else:
            sel = sel[sel[col] == value]
    return sel


def one_row(df, **equal):
    """The one row of ``df`` with the given ``column=value``s (:func:`select_rows`), as a
    pandas Series; none or several such rows: UsageError naming the selection.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"variant": ["a", "b", "a"], "world_size": [1, 1, 2]})
    >>> int(one_row(df, variant="a", world_size=2)["world_size"])
    2
    >>> one_row(df, variant="a")
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: 2 rows with variant='a': expected exactly one
    """
    sel = select_rows(df, **equal)
    if len(sel) != 1:
        what = ", ".join(f"{k}={v!r}" for k, v in equal.items())
        raise UsageError(f"{len(sel)} rows with {what}: expected exactly one")
    return sel.reset_index(drop=True).iloc[0]


def mismatches(df):
    """The rows whose model differs from one process (``matches_single_process`` false); rows
    that were not checked (no such column, or None there) are not among them.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"variant": ["a", "b", "c"], "matches_single_process": [True, False, None]})
    >>> mismatches(df).variant.tolist()
    ['b']
    >>> len(mismatches(df.drop(columns="matches_single_process")))
    0
    """
    if df.empty or "matches_single_process" not in df:
        return df.iloc[:0]
    return df[~df["matches_single_process"].fillna(True).astype(bool)]


def ms(seconds) -> float:
    """A time in seconds as milliseconds for a table; NaN for a missing or non-finite one.

    >>> ms(0.0125), ms(None)
    (12.5, nan)
    """
    return (seconds * 1e3 if isinstance(seconds, (int, float)) and math.isfinite(seconds)
            else math.nan)


def store_rows(store, rows: list[dict], key: Sequence[str]) -> None:
    """Upsert ``rows`` (with provenance) into ``store`` when a store is given.

    A measurement is never lost: when the file cannot be written (disk full, permissions, the
    file changed under us into something else), the rows go to stdout as JSON and to a fallback
    file, and :class:`~labkit.errors.ResultsNotStored` names both (the old file is untouched).
    """
    if store is None:
        return
    try:
        record(store, rows, key)
    except (OSError, ResultsFileError) as e:
        reason = f"{e.strerror} ({e.filename or store})" if isinstance(e, OSError) else str(e)
        raise ResultsNotStored(f"{store}: rows not stored: {reason}; "
                               + rescue_rows(rows, store)) from None


def rescue_rows(rows: list[dict], store) -> str:
    """Print ``rows`` to stdout as one JSON document and write them to a fallback file; the
    sentence saying where they are."""

    doc = {"format": FORMAT, "version": VERSION, "rows": [_jsonable(dict(r)) for r in rows]}
    text = json.dumps(doc, allow_nan=False)
    print(text, flush=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"labkit-unsaved-{Path(store).stem}-{stamp}-{os.getpid()}.json"
    for folder in (Path(tempfile.gettempdir()), Path.home()):
        target = folder / name
        try:
            target.write_text(text + "\n")
        except OSError:
            continue
        return (f"the {len(rows)} row(s) were printed above as JSON and saved to {target} "
                f"(`labkit table {target}`)")
    return f"the {len(rows)} row(s) were printed above as JSON (no fallback file could be written)"
