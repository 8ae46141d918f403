"""Measured timelines as Chrome trace files, which Perfetto (ui.perfetto.dev) and
chrome://tracing open: one JSON object ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

Every rank is a process named ``rank R`` (pid R); a thread (tid) is one timeline of that rank,
named by what it shows (a lab's row: ``gpipe M=4``). A slice is a complete event (``"ph": "X"``,
``ts`` and ``dur`` in microseconds), a moment an instant event (``"i"``), a value over time a
counter (``"C"``); names of processes and threads are metadata events (``"M"``). Builders take
seconds (the rows' unit) and write microseconds, the format's: :func:`event`, :func:`instant`,
:func:`counter`, :func:`names`. :func:`check` validates a document's required fields,
:func:`overlaps` finds slices of one thread that overlap (a rank that did one thing at a time
has none), :func:`write` writes a file atomically and :func:`write_launches` one file per launch
of a lab's rows, ``DIR/<lab>-<P>ranks-<timestamp>.trace.json``.

Each lab builds its events from the rows it already returns, in ``labkit.<lab>.trace`` (pure):
a trace shows what was measured and never a time the rows do not hold. The pipeline lab's rows
hold a timeline (each rank's forward and backward blocks of a step on one clock), the DDP lab's
rank 0's (each timed step's backward and its buckets' all-reduces), the collectives lab's
every rank's timed calls of each (op, size) on one clock, the solve lab's every rank's phases
of the first and last iterations of each point's last timed solve, the speedup lab's every
rank's timed runs of the workshare job (serial part, share, waits); the other labs' rows (machine)
hold durations (phase totals, per-step times,
percentiles) without the moments they started, so they have no trace.

The TP lab's rows hold the hand-written versions' timed step of median length, every rank's
compute, waits and messages on one clock; the FSDP lab's that step of ZeRO-1, ZeRO-2 and FSDP,
every rank's layers (forward, backward) and collectives (DDP's run in its C++ reducer).

The MoE lab's rows hold the median timed step of every rank, its phases on one clock; the
CP lab's the median timed pass of every rank, its ring steps (blocks, waits, messages).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from labkit.errors import UsageError

#: the category of the slices that show a rank idle (drawn apart from work by :func:`figure`)
IDLE = "idle"

#: required fields by phase: complete, instant, counter, metadata
_REQUIRED = {"X": ("name", "cat", "ts", "dur", "pid", "tid"),
             "i": ("name", "ts", "pid", "tid", "s"),
             "C": ("name", "ts", "pid", "args"),
             "M": ("name", "pid", "args")}
_METADATA = ("process_name", "thread_name", "process_sort_index", "thread_sort_index")


def _us(seconds: float) -> float:
    """Microseconds to the nanosecond: no clock of a row is finer, and 1e-9 s of rounding
    noise would read as a duration of its own."""
    return round(float(seconds) * 1e6, 3)


def _clean(args: dict | None) -> dict:
    """Args JSON can hold: NaN and infinities (a missing measurement) become None."""
    out = {}
    for k, v in (args or {}).items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[str(k)] = v
    return out


def event(name: str, *, cat: str, start_s: float, end_s: float, pid: int, tid: int = 0,
          args: dict | None = None) -> dict:
    """A slice (complete event) from ``start_s`` to ``end_s``, seconds on the trace's clock.

    >>> event("F0", cat="forward", start_s=0.5, end_s=0.75, pid=1, args={"microbatch": 0})
    {'name': 'F0', 'cat': 'forward', 'ph': 'X', 'ts': 500000.0, 'dur': 250000.0, 'pid': 1, 'tid': 0, 'args': {'microbatch': 0}}
    """
    if not end_s >= start_s:
        raise UsageError(f"slice {name!r}: end_s {end_s} is before start_s {start_s}")
    ts = _us(start_s)
    return {"name": str(name), "cat": str(cat), "ph": "X", "ts": ts, "dur": round(_us(end_s) - ts, 3),
            "pid": int(pid), "tid": int(tid), "args": _clean(args)}


def instant(name: str, *, at_s: float, pid: int, tid: int = 0, cat: str = "",
            args: dict | None = None) -> dict:
    """A moment on one thread (``"s": "t"``).

    >>> instant("end of step", at_s=2e-3, pid=0)["ts"]
    2000.0
    """
    return {"name": str(name), "cat": str(cat), "ph": "i", "s": "t", "ts": _us(at_s),
            "pid": int(pid), "tid": int(tid), "args": _clean(args)}


def counter(name: str, *, at_s: float, pid: int, values: dict) -> dict:
    """Values of a counter from ``at_s`` on (a viewer draws them as a stepped area).

    >>> counter("busy ranks", at_s=1.0, pid=0, values={"ranks": 2})
    {'name': 'busy ranks', 'ph': 'C', 'ts': 1000000.0, 'pid': 0, 'args': {'ranks': 2.0}}
    """
    return {"name": str(name), "ph": "C", "ts": _us(at_s), "pid": int(pid),
            "args": {str(k): float(v) for k, v in values.items()}}


def names(ranks: Iterable[int], threads: dict | None = None) -> list[dict]:
    """Metadata that names each rank's process ``rank R`` and orders them by rank, and names
    the threads ``threads`` = {tid: name} of every rank (ordered by tid).

    >>> [(e["name"], e["pid"], e["args"]) for e in names([0], {1: "gpipe M=2"})]
    [('process_name', 0, {'name': 'rank 0'}), ('process_sort_index', 0, {'sort_index': 0}), ('thread_name', 0, {'name': 'gpipe M=2'}), ('thread_sort_index', 0, {'sort_index': 1})]
    """
    out = []
    for r in ranks:
        r = int(r)
        out += [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}},
                {"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}}]
        for tid, label in (threads or {}).items():
            out += [{"name": "thread_name", "ph": "M", "pid": r, "tid": int(tid),
                     "args": {"name": str(label)}},
                    {"name": "thread_sort_index", "ph": "M", "pid": r, "tid": int(tid),
                     "args": {"sort_index": int(tid)}}]
    return out


def timed_rows(rows, field: str | None = None) -> list[dict]:
    """A lab's rows as dicts (a DataFrame's records, or copies of the dicts given), only those
    whose ``field`` holds a timeline (a non-empty list) where ``field`` is given: the rows a
    trace is drawn from.

    >>> [r["n"] for r in timed_rows([{"n": 1, "timeline_s": [{}]}, {"n": 2, "timeline_s": None},
    ...                              {"n": 3, "timeline_s": []}], "timeline_s")]
    [1]
    """
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    if field is None:
        return rows
    return [r for r in rows if isinstance(r.get(field), list) and r[field]]


def start_offsets(starts, hosts) -> list[float]:
    """Where each rank's start lies on one clock whose 0 is the first rank's start: add it to
    a rank's readings counted from its own start to put every rank on that clock. ``starts``:
    each rank's start on its own monotonic clock, ``hosts``: its host. On one host the ranks
    read one clock (``time.perf_counter`` is the machine's monotonic clock, the same in every
    process), so the offset is how much later the rank started; across hosts no clock is
    shared, and the barrier that starts the step is the one moment the ranks share: 0 each.

    >>> start_offsets([10.5, 10.25], ["a", "a"])
    [0.25, 0.0]
    >>> start_offsets([10.5, 3.0], ["a", "b"])
    [0.0, 0.0]
    """
    starts = [float(s) for s in starts]
    if len(set(hosts)) != 1:
        return [0.0] * len(starts)
    first = min(starts)
    return [s - first for s in starts]


def on_one_clock(slices_per_rank, *, starts, hosts) -> list[dict]:
    """Every rank's slices (dicts whose ``start_s`` and ``end_s`` count from that rank's own
    start) on one clock from the first rank's start (:func:`start_offsets`), each with its
    ``rank`` first.

    >>> on_one_clock([[{"name": "F", "start_s": 0.0, "end_s": 1.0}],
    ...               [{"name": "F", "start_s": 0.5, "end_s": 1.5}]],
    ...              starts=[10.0, 10.25], hosts=["h", "h"])
    [{'rank': 0, 'name': 'F', 'start_s': 0.0, 'end_s': 1.0}, {'rank': 1, 'name': 'F', 'start_s': 0.75, 'end_s': 1.75}]
    """
    offsets = start_offsets(starts, hosts)
    return [{"rank": rank, **s, "start_s": s["start_s"] + offsets[rank],
             "end_s": s["end_s"] + offsets[rank]}
            for rank, mine in enumerate(slices_per_rank) for s in mine]


def lanes(spans) -> list[int]:
    """For each ``(start, end)``, the first lane (0, 1, ...) whose spans so far all end by its
    start: spans that overlap (a message launched while another is in flight) go on lanes of
    their own, so that a thread per lane never holds two at once.

    >>> lanes([(2, 4), (0, 2), (1, 3), (3.5, 5)])
    [0, 0, 1, 1]
    """
    spans = [(float(a), float(b)) for a, b in spans]
    ends: list[float] = []  # per lane, where its last span ends
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):  # in time order
        a, b = spans[i]
        lane = next((k for k, end in enumerate(ends) if end <= a), len(ends))
        if lane == len(ends):
            ends.append(b)
        ends[lane] = b
        out[i] = lane
    return out


def document(events: list[dict], *, other: dict | None = None) -> dict:
    """The trace file's object: the events, milliseconds as the viewer's unit and ``other``
    (what the trace is of) as ``otherData``."""
    doc = {"traceEvents": list(events), "displayTimeUnit": "ms"}
    if other:
        doc["otherData"] = _clean(other)
    return doc


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check(doc: dict) -> dict:
    """``doc`` if it is a trace document whose events have their phase's required fields
    (slices: name, cat, ts and dur >= 0 in microseconds, integer pid and tid; metadata: a known
    name and its args); UsageError naming the first event that does not.

    >>> check(document(names([0]) + [event("F0", cat="forward", start_s=0, end_s=1, pid=0)]))["displayTimeUnit"]
    'ms'
    >>> check({"traceEvents": [{"ph": "X", "name": "F0", "ts": 0, "pid": 0, "tid": 0}]})
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: trace event 0 ('F0', ph X) lacks cat, dur
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise UsageError("a trace is a JSON object with a traceEvents list")
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        raise UsageError(f"displayTimeUnit must be ms or ns, got {doc['displayTimeUnit']!r}")
    for k, e in enumerate(doc["traceEvents"]):
        where = f"trace event {k}"
        if not isinstance(e, dict) or e.get("ph") not in _REQUIRED:
            raise UsageError(f"{where}: ph must be one of {', '.join(_REQUIRED)}")
        where = f"{where} ({e.get('name')!r}, ph {e['ph']})"
        missing = [f for f in _REQUIRED[e["ph"]] if f not in e]
        if missing:
            raise UsageError(f"{where} lacks {', '.join(missing)}")
        if not isinstance(e["name"], str) or not isinstance(e["pid"], int):
            raise UsageError(f"{where}: name must be a string and pid an integer")
        if "tid" in e and not isinstance(e["tid"], int):
            raise UsageError(f"{where}: tid must be an integer")
        if e["ph"] != "M" and not (_number(e["ts"]) and e["ts"] >= 0):
            raise UsageError(f"{where}: ts must be microseconds >= 0, got {e['ts']!r}")
        if e["ph"] == "X" and not (_number(e["dur"]) and e["dur"] >= 0):
            raise UsageError(f"{where}: dur must be microseconds >= 0, got {e['dur']!r}")
        if e["ph"] == "C" and not all(_number(v) for v in e["args"].values()):
            raise UsageError(f"{where}: a counter's args must be numbers")
        if e["ph"] == "M" and (e["name"] not in _METADATA or not isinstance(e["args"], dict)):
            raise UsageError(f"{where}: metadata must be one of {', '.join(_METADATA)}")
    return doc


def slices(events: Iterable[dict]) -> list[dict]:
    """The complete events (slices) among ``events``."""
    return [e for e in events if e.get("ph") == "X"]


def overlaps(events: Iterable[dict], *, tolerance_us: float = 1e-3) -> list[tuple[dict, dict]]:
    """Pairs of slices of one (pid, tid) that overlap by more than ``tolerance_us`` (the
    rounding of seconds into microseconds), each pair in time order. A slice nested in another
    overlaps it too: a rank that did one thing at a time gives ``[]``.

    >>> a = event("F0", cat="forward", start_s=0, end_s=2e-3, pid=0)
    >>> b = event("B0", cat="backward", start_s=1e-3, end_s=3e-3, pid=0)
    >>> c = event("F1", cat="forward", start_s=2e-3, end_s=4e-3, pid=0, tid=1)
    >>> [(x["name"], y["name"]) for x, y in overlaps([a, b, c])]
    [('F0', 'B0')]
    """
    by_thread: dict = {}
    for e in slices(events):
        by_thread.setdefault((e["pid"], e.get("tid", 0)), []).append(e)
    out = []
    for mine in by_thread.values():
        mine.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_: list[dict] = []  # slices not yet ended at the current start
        for e in mine:
            open_ = [o for o in open_ if o["ts"] + o["dur"] > e["ts"] + tolerance_us]
            out += [(o, e) for o in open_]
            open_.append(e)
    return out


def write(path: str | os.PathLike, events: list[dict], *, other: dict | None = None) -> Path:
    """Check ``events`` (:func:`check`) and write them as a trace file at ``path`` through a
    temporary file (a reader never sees half a trace). The path."""
    from labkit.results import _atomic_write

    path = Path(path)
    doc = check(document(events, other=other))
    _atomic_write(path, doc)
    return path


def load(path: str | os.PathLike) -> dict:
    """A trace file's document, checked (:func:`check`)."""
    import json

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable trace file ({e})") from None
    return check(doc)


def check_folder(folder: str | os.PathLike) -> Path:
    """A folder traces can be written to: an existing writable folder, or one that can be
    made (its nearest existing parent is a writable folder). UsageError else; nothing made.

    >>> check_folder("/dev/null/traces")
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: trace folder /dev/null/traces: /dev/null is not a folder
    """
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise UsageError(f"trace folder must be a path, got {folder!r}")
    folder = Path(folder)
    there = folder
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise UsageError(f"trace folder {folder}: {there} is not a folder")
    if not os.access(there, os.W_OK):
        raise UsageError(f"trace folder {folder}: {there} is not writable")
    return folder


def launch_path(folder: str | os.PathLike, *, lab: str, world_size: int, stamp: str) -> Path:
    """Where the trace of a launch goes, ``<folder>/<lab>-<P>ranks-<stamp>.trace.json``, with
    ``-2``, ``-3``, ... before the suffix where that file exists already.

    >>> launch_path("traces", lab="pipeline", world_size=2, stamp="20250101T120000").name
    'pipeline-2ranks-20250101T120000.trace.json'
    """
    base = Path(folder) / f"{lab}-{int(world_size)}ranks-{stamp}"
    path, k = base.with_name(base.name + ".trace.json"), 2
    while path.exists():
        path, k = base.with_name(f"{base.name}-{k}.trace.json"), k + 1
    return path


def write_launches(folder: str | os.PathLike | None, lab: str, rows: list[dict],
                   build: Callable[[list[dict]], list[dict]]) -> list[Path]:
    """One trace file per launch of a lab's sweep in ``folder`` (none where ``folder`` is
    None): the rows of each world size (one launch each) made events by ``build`` (the lab's
    ``trace_events``), named by :func:`launch_path` with this moment's time. The paths."""
    if folder is None:
        return []
    folder = check_folder(folder)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    by_size: dict = {}
    for row in rows:
        by_size.setdefault(int(row["world_size"]), []).append(row)
    paths = []
    for p, mine in sorted(by_size.items()):
        events = build(mine)
        if not slices(events):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(write(launch_path(folder, lab=lab, world_size=p, stamp=stamp), events,
                           other={"lab": lab, "world_size": p, "rows": len(mine)}))
    return paths


def threads(doc: dict) -> dict:
    """{thread name: {pid: that thread's slices in time order}} of a trace document, the
    threads in their sort order (a thread without a name is ``thread <tid>``). Threads of one
    name are one timeline across the ranks (a lab's row)."""
    named, order = {}, {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "thread_name":
            named[(e["pid"], e.get("tid", 0))] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_sort_index":
            order[(e["pid"], e.get("tid", 0))] = e["args"]["sort_index"]
    out: dict = {}
    for e in sorted(slices(doc["traceEvents"]),
                    key=lambda e: (order.get((e["pid"], e["tid"]), e["tid"]), e["pid"], e["ts"])):
        name = named.get((e["pid"], e["tid"]), f"thread {e['tid']}")
        out.setdefault(name, {}).setdefault(e["pid"], []).append(e)
    return {name: dict(sorted(by_pid.items())) for name, by_pid in out.items()}


def timeline(doc: dict, thread: str | None = None) -> tuple[str, dict]:
    """(name, {pid: slices}) of one thread of ``doc`` (:func:`threads`): ``thread``, or the
    first one. UsageError naming the threads there are when it has no such thread."""
    every = threads(doc)
    if not every:
        raise UsageError("the trace holds no slices")
    if thread is None:
        thread = next(iter(every))
    if thread not in every:
        raise UsageError(f"no thread {thread!r} in the trace (threads: {', '.join(every)})")
    return thread, every[thread]


def describe(doc: dict, thread: str | None = None) -> str:
    """One thread of ``doc`` in words, computed from its slices (a figure's alt text): its
    span, and per rank the time in slices by category, idle ones by name.

    >>> doc = document(names([0, 1], {1: "gpipe M=1"}) + [
    ...     event("F0", cat="forward", start_s=0, end_s=1e-3, pid=0, tid=1),
    ...     event("bubble", cat=IDLE, start_s=1e-3, end_s=4e-3, pid=0, tid=1),
    ...     event("B0", cat="backward", start_s=4e-3, end_s=6e-3, pid=0, tid=1),
    ...     event("bubble", cat=IDLE, start_s=0, end_s=1e-3, pid=1, tid=1),
    ...     event("F0", cat="forward", start_s=1e-3, end_s=2e-3, pid=1, tid=1),
    ...     event("B0", cat="backward", start_s=2e-3, end_s=4e-3, pid=1, tid=1)])
    >>> print(describe(doc))
    Timeline of gpipe M=1 on 2 ranks over 6.00 ms, one bar per slice. rank 0: forward 1.00 ms (1 slice), backward 2.00 ms (1 slice), idle 3.00 ms (bubble 3.00 ms). rank 1: forward 1.00 ms (1 slice), backward 2.00 ms (1 slice), idle 1.00 ms (bubble 1.00 ms).
    """
    thread, by_pid = timeline(doc, thread)
    every = [e for mine in by_pid.values() for e in mine]
    span = (max(e["ts"] + e["dur"] for e in every) - min(e["ts"] for e in every)) / 1e3
    parts = []
    for pid, mine in by_pid.items():
        cats: dict = {}
        for e in mine:
            total, n = cats.get(e["cat"], (0.0, 0))
            cats[e["cat"]] = (total + e["dur"] / 1e3, n + 1)
        work = [f"{c} {t:.2f} ms ({n} slice{'s' if n > 1 else ''})"
                for c, (t, n) in cats.items() if c != IDLE]
        if IDLE in cats:
            idle: dict = {}
            for e in mine:
                if e["cat"] == IDLE:
                    idle[e["name"]] = idle.get(e["name"], 0.0) + e["dur"] / 1e3
            work.append(f"idle {cats[IDLE][0]:.2f} ms ("
                        + ", ".join(f"{k} {t:.2f} ms" for k, t in idle.items()) + ")")
        parts.append(f"rank {pid}: " + ", ".join(work) + ".")
    return (f"Timeline of {thread} on {len(by_pid)} rank{'s' if len(by_pid) > 1 else ''} over "
            f"{span:.2f} ms, one bar per slice. " + " ".join(parts))


def download_html(path: str | os.PathLike, *, limit_bytes: int = 2 << 20) -> str:
    """A link that downloads the trace file from the page itself (a data URL: the website has
    no server-side copy of a run's files), with where to open it; a trace over ``limit_bytes``
    is named, not embedded."""
    import base64
    import html

    path = Path(path)
    data = path.read_bytes()
    if len(data) > limit_bytes:
        return (f"<p>The trace <code>{html.escape(path.name)}</code> ({len(data) / 2**20:.1f} "
                "MiB) is in the run's results folder; open it in ui.perfetto.dev.</p>")
    href = "data:application/json;base64," + base64.b64encode(data).decode()
    return (f'<p><a download="{html.escape(path.name)}" href="{href}">Download '
            f"{html.escape(path.name)}</a> ({len(data) / 1024:.0f} KiB), then open it in "
            "ui.perfetto.dev or chrome://tracing to zoom into every block.</p>")
