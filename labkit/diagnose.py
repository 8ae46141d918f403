"""Reading a launch's remains: per-rank logs, rank 0's live output, who caused a failure, which
ranks stalled, and what the ranks reported (peak memory, where global rank 0 ran)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from labkit.errors import RankFailed


def echo_rank0(log_dir: Path, stop: threading.Event) -> None:
    """Copy rank 0's log files to stderr as they grow (tqdm bars included)."""
    offsets: dict[Path, int] = {}
    while True:
        done = stop.is_set()
        for path in sorted(log_dir.glob("*/attempt_*/0/*.log")):
            with contextlib.suppress(OSError), open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                chunk = f.read()
                offsets[path] = f.tell()
            if chunk:
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
        if done:
            return
        stop.wait(0.2)


#: the agent's failure summary names each failed rank as "rank : GLOBAL (local_rank: LOCAL)"
_RANK_NAMES = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")


def collect_logs(log_dir: Path, status_dir: Path, agent_text: str = "") -> dict[int, str]:
    """Per-rank stdout + stderr, keyed by global rank: from the rank's status file, else from
    the agent's failure summary (``agent_text``; a rank that died before it joined the world
    wrote no status file), else by its local rank (one node: the same number).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "logs/x/attempt_0/1").mkdir(parents=True)
    >>> _ = (d / "logs/x/attempt_0/1/stderr.log").write_text("boom")
    >>> collect_logs(d / "logs", d, "  rank      : 5 (local_rank: 1)")
    {5: 'boom'}
    """
    local_to_global = {int(local): int(rank) for rank, local in _RANK_NAMES.findall(agent_text)}
    for f in status_dir.glob("local*.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError, KeyError):
            info = json.loads(f.read_text())
            local_to_global[int(info["local_rank"])] = int(info["rank"])
    logs: dict[int, str] = {}
    for rank_dir in sorted(log_dir.glob("*/attempt_*/*")):
        if not rank_dir.name.isdigit():
            continue
        local = int(rank_dir.name)
        text = ""
        for name in ("stdout.log", "stderr.log"):
            with contextlib.suppress(OSError):
                text += (rank_dir / name).read_text(errors="replace")
        logs[local_to_global.get(local, local)] = text
    return logs


#: the project's folder: paths inside it are shown relative to it (a traceback in a notebook
#: page names ``labkit/harness.py``, not the machine's layout)
_PROJECT = str(Path(__file__).resolve().parent.parent) + os.sep


def _tail(text: str, n: int = 12) -> str:
    lines = [ln.replace(_PROJECT, "") for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def tail_note(logs: dict[int, str]) -> str:
    parts = [f"\n--- rank {r}, last lines ---\n{_tail(t, 6)}" for r, t in sorted(logs.items()) if t.strip()]
    return "".join(parts)


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def failure(spec, rc: int, agent_text: str, logs: dict[int, str], status_dir: Path) -> RankFailed:
    """Name the rank that caused a failed launch.

    torchrun's "Root Cause (first observed failure)" is often a victim: when rank 1 dies, rank 0
    fails next in a collective with "connection reset", and torchrun may observe rank 0 first.
    So: a rank that died hard (a signal other than torchrun's own SIGTERM, ``os._exit``, a crash:
    no ``rank<R>.error`` left by the harness) is the cause; otherwise the rank whose exception was
    caught earliest is.
    """
    errors: dict[int, tuple[float, str]] = {}
    for f in status_dir.glob("rank*.error"):
        with contextlib.suppress(OSError, ValueError, KeyError, json.JSONDecodeError):
            info = json.loads(f.read_text())
            errors[int(f.stem[4:])] = (float(info["time"]), str(info["error"]))
    exits = {int(r): int(c) for r, c in _FAILURE.findall(agent_text)}
    # torchrun SIGTERMs the surviving ranks once one fails: a SIGTERM is a consequence
    hard = [r for r in exits if r not in errors and exits[r] != -signal.SIGTERM]
    if hard:
        rank = hard[0]
    elif errors:
        rank = min(errors, key=lambda r: errors[r][0])
    else:
        rank = next(iter(exits), None)
    exitcode = exits.get(rank, 1 if rank in errors else rc)
    signal_name = None
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            signal_name = signal.Signals(-exitcode).name
    how = f"killed by {signal_name}" if signal_name else f"exit code {exitcode}"
    who = f"rank {rank}" if rank is not None else "a rank"
    log_tail = _tail(logs.get(rank, "") if rank is not None else agent_text)
    msg = f"{spec.worker} on {spec.world_size} ranks: {who} failed ({how})"
    if rank in errors:
        msg += f": {errors[rank][1]}"
    others = sorted(r for r in set(errors) | set(exits) if r != rank)
    if others:
        msg += f"\n(rank(s) {', '.join(map(str, others))} failed too, as a consequence)"
    msg += f"\n--- last lines of {who}'s log ---\n{log_tail or '(empty: it printed nothing before it died)'}"
    return RankFailed(msg, rank=rank, exitcode=exitcode, signal_name=signal_name, log_tail=log_tail)


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


def rank0_host(status_dir: Path) -> dict | None:
    """Where global rank 0 ran, as this node's ranks heard it (multi-node; labkit.harness)."""
    with contextlib.suppress(OSError, ValueError):
        where = json.loads((status_dir / "rank0_host.json").read_text())
        return where if isinstance(where, dict) else None
    return None


def peak_rss(status_dir: Path) -> int | None:
    """The largest peak resident set (bytes) any rank of this node reported (labkit.harness)."""
    peaks = []
    for f in status_dir.glob("rank*.peak"):
        with contextlib.suppress(OSError, ValueError):
            peaks.append(int(f.read_text()))
    return max(peaks) if peaks else None
