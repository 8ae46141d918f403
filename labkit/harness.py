"""The shared ``main`` of every worker: parse, join the world, run, write rank 0's payload.

A worker module defines ``Config`` (a frozen dataclass, usually from a pure module) and
``on_rank(rt, cfg) -> dict`` (named for the side it runs on: a lab's host-side ``run`` launches
it) returning at least ``{"rows": [...]}``; its ``__main__`` calls
``worker_main(on_rank, Config)``. Rank 0 writes ``{"rows", "placement", "meta", ...}`` atomically to
``--out``. A rank that raises leaves a one-line ``rank<R>.error`` for the launcher, prints its
traceback to its own log and exits 1 at once (a peer may be stuck in a collective with it, so
tearing the process group down politely could hang).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from labkit import procs, runtime
from labkit.config import from_dict


def _status(name: str, text: str) -> None:
    folder = os.environ.get("LABKIT_STATUS_DIR")
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, name).write_text(text)


def _load_config(raw: str | None) -> dict:
    if not raw:
        return {}
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    return json.loads(raw)


def write_json_atomic(path: str | os.PathLike, doc: dict) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, default=_default))
    os.replace(tmp, path)


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def _refuse(message: str) -> NoReturn:
    """A worker started with an environment it cannot use (by hand, most likely): one line on
    stderr and exit code 2, before the rank joins anything."""
    print(f"labkit worker: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        _refuse(f"{name} must be a non-negative integer, got {raw!r}")
    return int(raw)


def _watched_host() -> tuple[int | None, str | None]:
    """The launcher this rank watches (``LABKIT_HOST_PID``, ``LABKIT_HOST_START``: a
    :func:`labkit.procs.process_start` token), checked once: a worker started by hand with a
    launcher's environment left over gets one line, not a rank that exits a second later."""
    host = _env_int("LABKIT_HOST_PID", None)
    start = os.environ.get("LABKIT_HOST_START", "").strip() or None
    if start is not None:
        try:
            float(start)
        except ValueError:
            _refuse(f"LABKIT_HOST_START must be the launcher's start time, got {start!r}")
    if host is not None and not procs.alive(host, start):
        _refuse(f"LABKIT_HOST_PID={host} names no running launcher (a launcher's variable left "
                "in the environment? unset LABKIT_HOST_PID to run this worker by hand)")
    return host, start


def _heartbeat(rank: int, host: int | None, start: str | None, period_s: float = 1.0) -> None:
    """A daemon thread of every rank: writes ``rank<R>.beat`` (now, and when the rank last made
    progress) for the launcher's timeout message, and ends the rank once its launcher ``host``
    is gone (a SIGKILLed host, an OOM-killed notebook kernel): nothing outlives its launcher.
    "Gone" needs proof (:func:`labkit.procs.alive`): a fact the platform withholds keeps the
    rank running."""

    def beat():
        while True:
            try:
                _status(f"rank{rank}.beat", json.dumps({"time": time.time(),
                                                        "progress": runtime.LAST_PROGRESS[0]}))
                launcher_alive = host is None or procs.alive(host, start)
            except Exception:  # noqa: BLE001 - a beat lost is better than a watch lost
                launcher_alive = True
            if not launcher_alive:
                gone = f"launcher (pid {host}) is gone: rank exits"
                _status(f"rank{rank}.error", json.dumps({"time": time.time(), "error": gone}))
                print(f"labkit worker: {gone}", file=sys.stderr, flush=True)
                os._exit(1)
            time.sleep(period_s)

    threading.Thread(target=beat, name="labkit-heartbeat", daemon=True).start()


def worker_main(on_rank, config_cls=None, argv=None) -> None:
    parser = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").split("\n")[0])
    parser.add_argument("--config", help="JSON object, or @FILE holding one")
    parser.add_argument("--out", help="where rank 0 writes its JSON payload")
    args = parser.parse_args(argv)
    rank = _env_int("RANK", 0)
    _heartbeat(rank, *_watched_host())
    try:
        data = _load_config(args.config)
        cfg = from_dict(config_cls, data) if config_cls is not None else data
        rt = runtime.init()
        _status(f"local{rt.local_rank}.json", json.dumps({"rank": rt.rank, "local_rank": rt.local_rank}))
        placement = runtime.placement(rt)
        where = runtime.rank0_host(rt)  # multi-node: the launcher of another node names it
        if where is not None and rt.local_rank == 0:
            _status("rank0_host.json", json.dumps(where))
        payload = on_rank(rt, cfg) or {}
        if rt.rank == 0:
            payload.setdefault("rows", [])
            payload["placement"] = placement
            payload["meta"] = runtime.run_meta(rt)
            if args.out:
                write_json_atomic(args.out, payload)
            else:
                print(json.dumps(payload, default=_default, indent=1))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher
        if isinstance(e, SystemExit) and not e.code:
            raise
        # the time lets the launcher tell the root cause from peers that failed because of it
        _status(f"rank{rank}.error", json.dumps({
            "time": time.time(), "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}))
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # Free DDP reducers and the like while the process group still exists, then leave without
    # running interpreter teardown: torch/gloo's C++ destructors at exit can meet a worker
    # thread still joinable and abort ("terminate called without an active exception",
    # SIGABRT; seen in about 1 of 30 two-rank DDP launches with 1 MB buckets), turning a
    # finished run into a failed one. The payload is already written and every rank has
    # destroyed the group, so there is nothing left to clean up.
    gc.collect()
    peak = procs.peak_rss_bytes()  # the measured peak, beside the lab's estimate
    if peak is not None:
        _status(f"rank{rank}.peak", str(peak))
    runtime.finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
