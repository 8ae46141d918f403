"""The profile as the models read it: :class:`Profile`, and :func:`profile`, which finds this
run's (or measures it) and says visibly when it describes another machine (pure once stored).

Where :func:`profile` looks, in order: the file ``$LABKIT_MACHINE_PROFILE`` names (``labkit
lab`` measures the profile first and sets it for every notebook of the run), then
``results_dir/machine_profile.json`` (a notebook run by hand: notebook 01 stores it there). A
missing profile is measured, never guessed.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.machine import formulas

ENV = "LABKIT_MACHINE_PROFILE"
FILE = "machine_profile.json"
#: a profile older than this (by hand, outside a lab run) is flagged
STALE_AFTER_S = 12 * 3600


def _pairs(rows, measurement: str, context: str, x: str, y: str) -> tuple[list, list]:
    pts = sorted((r[x], r[y]) for r in rows
                 if r.get("measurement") == measurement and r.get("context") == context)
    return [p[0] for p in pts], [p[1] for p in pts]


@dataclass(frozen=True)
class Profile:
    """This machine, as one launch of :mod:`labkit.machine.worker` measured it."""

    rows: tuple
    source: str = ""
    warnings: tuple = field(default=())

    @classmethod
    def from_rows(cls, rows, source: str = "", warnings=()) -> Profile:
        rows = tuple(dict(r) for r in rows)
        need = {"matmul", "step", "copy", "allreduce", "message"}
        have = {r.get("measurement") for r in rows}
        if not need <= have:
            from labkit.errors import UsageError
            raise UsageError(f"{source or 'profile'}: not a machine profile (lacks "
                             f"{', '.join(sorted(need - have))} rows); measure one with "
                             "`labkit calibrate`")
        return cls(rows=rows, source=str(source), warnings=tuple(warnings))

    # -- where and when ---------------------------------------------------------------------
    def _first(self, key, default=None):
        return next((r[key] for r in self.rows if r.get(key) is not None), default)

    @property
    def host(self) -> str:
        return self._first("hostname", "?")

    @property
    def cores(self) -> int:
        return int(self._first("cores", 1))

    @property
    def torch_version(self) -> str:
        return self._first("torch_version", "?")

    @property
    def world_size(self) -> int:
        return int(self._first("world_size", 2))

    @property
    def measured_at(self) -> str:
        return self._first("timestamp", "?")

    # -- compute and memory -----------------------------------------------------------------
    def matmul_flop_per_s(self, n: float, *, together: bool = False) -> float:
        """The n x n @ n x n rate of one rank, alone or with every rank computing at once."""
        xs, ys = _pairs(self.rows, "matmul", "together" if together else "alone", "n",
                        "flop_per_s")
        # a rate is not extrapolated: outside the sizes measured, the nearest one's
        return formulas.loglog_interp(min(max(n, xs[0]), xs[-1]), xs, ys)

    def _steps(self, context: str) -> dict:
        """{batch: (p50 seconds, flop/s)} of the training-step rows (a profile written before
        several batches were timed holds one, batch 0)."""
        return {int(r.get("batch") or 0): (r["time_p50_s"], r["flop_per_s"]) for r in self.rows
                if r.get("measurement") == "step" and r.get("context") == context}

    @property
    def co_run_slowdown(self) -> float:
        """t_together / t_alone of the miniature training step (an MLP's forward and backward:
        products, elementwise ops, autograd's memory traffic), the slowdown the step models
        carry: the median of every round's together over that round's alone (``paired_slowdowns``,
        each pair a second apart), over every batch timed. Paired, a burst of a neighbour's
        that falls on some rounds moves the median less than it moves a ratio of two medians:
        in six profiles back to back on the 2-vCPU VM the paired median read 1.06-1.23, the
        ratio of the p50s 1.06-1.36. A profile without the pairs (written before they were
        kept): the median over the batches of their p50s' ratios."""
        paired = [x for r in self.rows if r.get("measurement") == "step"
                  and r.get("context") == "together" for x in (r.get("paired_slowdowns") or [])]
        if paired:
            return formulas.median(paired)
        alone, together = self._steps("alone"), self._steps("together")
        return statistics.median(formulas.slowdown(t_together_s=together[b][0],
                                                   t_alone_s=alone[b][0])
                                 for b in sorted(alone) if b in together)

    def step_flop_per_s(self, *, together: bool = False, batch: float | None = None) -> float:
        """The miniature training step's rate, alone or with every rank at it at once, at a
        batch of ``batch`` rows (read log-log between the batches timed; outside them, the
        nearest one's); None: the largest batch's."""
        got = self._steps("together" if together else "alone")
        xs = sorted(got)
        if batch is None or len(xs) == 1:
            return got[xs[-1]][1]
        return formulas.loglog_interp(min(max(batch, xs[0]), xs[-1]), xs,
                                      [got[x][1] for x in xs])

    def compute_slowdown(self, ranks: int, *, n: float | None = None) -> float:
        """One rank's compute with ``ranks`` ranks at it at once, over alone (1.0 for one rank):
        the training step's co-run slowdown, or the n x n matrix product's when ``n`` is given;
        beyond the cores, times ranks/cores."""
        co = self.co_run_slowdown if n is None else (
            self.matmul_flop_per_s(n) / self.matmul_flop_per_s(n, together=True))
        return formulas.compute_slowdown(ranks, co_run=co, measured_ranks=self.world_size,
                                         cores=self.cores)

    @property
    def copy_sizes(self) -> list:
        """The sizes (bytes per rank) of the copies the profile timed, smallest first."""
        return _pairs(self.rows, "copy", "alone", "size_bytes", "bytes_per_s")[0]

    def copy_bytes_per_s(self, *, together: bool = False,
                         size_bytes: float | None = None) -> float:
        """Memory copy rate of one rank (bytes read + written per second), alone or together,
        for a copy of ``size_bytes`` per rank: read log-log between the sizes measured (outside
        them, the nearest one's: a rate is not extrapolated). None: the largest copy measured,
        the memory's bandwidth beyond the caches."""
        xs, ys = _pairs(self.rows, "copy", "together" if together else "alone", "size_bytes",
                        "bytes_per_s")
        if size_bytes is None:
            return ys[-1]
        return formulas.loglog_interp(min(max(size_bytes, xs[0]), xs[-1]), xs, ys)

    def copy_slowdown_at(self, size_bytes: float | None = None) -> float:
        """t_together / t_alone of a copy of ``size_bytes`` per rank (:meth:`copy_bytes_per_s`
        read at that size); None: the largest copy's. Copies that fit the shared cache side by
        side barely slow each other; those that stream from the memory share its bandwidth."""
        return (self.copy_bytes_per_s(size_bytes=size_bytes)
                / self.copy_bytes_per_s(together=True, size_bytes=size_bytes))

    @property
    def copy_slowdown(self) -> float:
        """The largest copy's co-run slowdown (:meth:`copy_slowdown_at` at its default)."""
        return self.copy_slowdown_at()

    # -- messages: the two kinds of call (labkit.machine.formulas.waits) --------------------
    def _transfers(self, measurement: str, busy: bool) -> tuple[list, list]:
        # a row that keeps no transfer apart (a profile written before they were) counts its
        # 10th percentile, else its median, as its transfer, with no waits
        rows = [{**r, "transfer_s": next((r[k] for k in ("transfer_s", "time_p10_s",
                                                         "time_p50_s") if r.get(k) is not None),
                                         None)} for r in self.rows]
        return _pairs([r for r in rows if r["transfer_s"] is not None], measurement,
                      "busy" if busy else "idle", "size_bytes", "transfer_s")

    def measured(self, measurement: str) -> bool:
        """Whether the profile timed ``measurement`` (a profile of an older labkit may lack
        the reduce-scatter and the all-gather)."""
        return any(r.get("measurement") == measurement for r in self.rows)

    def _alpha_beta(self, busy: bool) -> tuple[float, float]:
        from labkit.collectives.formulas import fit_alpha_beta

        xs, ys = self._transfers("allreduce", busy)
        return fit_alpha_beta("all_reduce", self.world_size, sizes=xs, times=ys)

    @property
    def alpha_s(self) -> float:
        """α of the α–β line fitted to the idle all-reduces' transfers (relative least
        squares)."""
        return self._alpha_beta(False)[0]

    @property
    def beta_bytes_per_s(self) -> float:
        return self._alpha_beta(False)[1]

    def transfer_s(self, size_bytes: float, *, measurement: str = "allreduce",
                   ranks: int | None = None, busy: bool = False,
                   one_buffer: bool = False, steady: bool = False) -> float:
        """An all-reduce (or a point-to-point ``message``, one way, a ``reduce_scatter`` or an
        ``all_gather`` of ``size_bytes`` in nccl-tests' sense) that waited for nothing: the
        sweep's transfers (:func:`labkit.machine.formulas.transfer_of`) read at that size (log-log between sizes) at the profile's
        world size; an all-reduce at another rank count, the ring α–β line fitted to them.
        ``busy``: while every rank's core also computes. ``one_buffer``: an idle all-reduce
        called again and again on one buffer (as notebook 01 times its own), read off the
        profile's ``allreduce_repeated`` calls up to their largest size; beyond it, or in a
        profile without them, the sweep's (whose sizes take turns, each call on another buffer
        than the last). ``steady``: an all-reduce called back to back, no barrier between
        calls (as the collectives lab times its own), idle or busy, off the profile's
        ``allreduce_steady`` calls (a profile without them: the sweep's)."""
        ranks = self.world_size if ranks is None else int(ranks)
        if ranks < 2:
            return 0.0
        if steady and measurement == "allreduce" and ranks == self.world_size:
            sizes, times = self._transfers("allreduce_steady", busy)
            if sizes:
                return formulas.sweep_time(size_bytes, sizes, times)
        if one_buffer and measurement == "allreduce" and not busy and ranks == self.world_size:
            sizes, times = self._transfers("allreduce_repeated", False)
            if sizes and size_bytes <= max(sizes):
                return formulas.sweep_time(size_bytes, sizes, times)
        if ranks == self.world_size or measurement != "allreduce":
            return formulas.sweep_time(size_bytes, *self._transfers(measurement, busy))
        from labkit.collectives.formulas import allreduce_time

        alpha, beta = self._alpha_beta(busy)
        return allreduce_time(size_bytes=size_bytes, ranks=ranks, alpha_s=alpha,
                              beta_bytes_per_s=beta)

    @property
    def scheduler_wait_s(self) -> float:
        """What a call that waited for the scheduler took beyond its transfer: the median over
        every such call of the profile, all-reduces and messages, idle and busy (0 where none
        waited). On a machine whose cores are all computing it is about a scheduler tick."""
        excess = self._wait_excesses()
        return formulas.median(excess) if excess else 0.0

    def scheduler_wait_in_s(self, *, busy: bool) -> float:
        """:attr:`scheduler_wait_s` over the calls of one context, the peers idle or busy (the
        pooled one where that context has none): what a wait costs a collective that every
        rank has entered while no compute shares their cores is its idle calls' (``busy=False``);
        the pooled one also holds the busy calls' longer waits."""
        excess = self._wait_excesses("busy" if busy else "idle")
        return formulas.median(excess) if excess else self.scheduler_wait_s

    def steady_wait_s(self, *, busy: bool = False) -> float:
        """:attr:`scheduler_wait_s` over the all-reduces called back to back
        (``allreduce_steady``, as the collectives lab times its own) of one context: what a
        wait costs a call whose peer is already in the next one. On the 2-vCPU VM 06's idle
        sweep's waits read 3.2-3.7 ms in 24 lab runs; these 3.2-3.8 ms, the pooled median
        3.4-5.4 and the idle sweep's (each call after a barrier) 2.1-3.2. A profile without
        them (:meth:`steady_waited` False): the pooled :attr:`scheduler_wait_s`."""
        excess = self._steady_excesses(busy)
        return formulas.median(excess) if excess else self.scheduler_wait_s

    def steady_waited(self, *, busy: bool = False) -> bool:
        """Whether :meth:`steady_wait_s` reads calls called back to back (some of them waited)."""
        return bool(self._steady_excesses(busy))

    def _steady_excesses(self, busy: bool) -> list[float]:
        """:meth:`_wait_excesses` of the all-reduces called back to back, of one context."""
        return self._wait_excesses("busy" if busy else "idle", ("allreduce_steady",))

    def _wait_excesses(self, context: str | None = None,
                       measurements: tuple = ("allreduce", "message")) -> list[float]:
        """What each of the profile's calls of ``measurements`` (the sweep's all-reduces and
        messages) that waited for the scheduler took beyond its transfer, of one ``context``
        (None: both)."""
        return [x for r in self.rows if r.get("measurement") in measurements
                and context in (None, r.get("context")) for x in (r.get("wait_excess_s") or [])]

    def wait_share(self, *, busy: bool = False) -> float:
        """The share of the profile's messages and all-reduces that waited for the scheduler,
        with the peers idle or busy: the median over its sizes (one size's few calls say
        little; this machine's state when it was measured, which changes from second to
        second)."""
        rows = [r for r in self.rows if r.get("measurement") in ("allreduce", "message")
                and r.get("context") == ("busy" if busy else "idle")
                and r.get("wait_share") is not None]
        return formulas.median([r["wait_share"] for r in rows]) if rows else 0.0

    def allreduce_s(self, size_bytes: float, *, ranks: int | None = None,
                    busy: bool = False) -> float:
        """An all-reduce of ``size_bytes`` in context, what it costs on average: its transfer
        (:meth:`transfer_s`) and, as often as the profile's calls in that context did
        (:meth:`wait_share`), one scheduler wait (:meth:`scheduler_wait_s`)."""
        if (self.world_size if ranks is None else int(ranks)) < 2:
            return 0.0
        return (self.transfer_s(size_bytes, ranks=ranks, busy=busy)
                + self.wait_share(busy=busy) * self.scheduler_wait_s)

    def message_s(self, size_bytes: float, *, busy: bool = False) -> float:
        """One point-to-point message of ``size_bytes``, one way (half a ping-pong), what it
        costs on average: its transfer and its share of scheduler waits, as
        :meth:`allreduce_s`."""
        return (self.transfer_s(size_bytes, measurement="message", busy=busy)
                + self.wait_share(busy=busy) * self.scheduler_wait_s)

    # -- showing it -------------------------------------------------------------------------
    def table(self):
        """The measured rows (what, context, size, p50 time, rate) as a DataFrame."""
        import pandas as pd

        cols = ["measurement", "context", "n", "size_bytes", "time_p50_s", "transfer_s",
                "wait_share", "flop_per_s", "bytes_per_s"]
        df = pd.DataFrame(self.rows)
        return df[[c for c in cols if c in df]]

    def describe(self) -> str:
        """Where and when it was measured, in one line."""
        where = ""
        if self.source:  # relative to here: a page shows no folder of the machine that built it
            where = f", from {os.path.relpath(self.source)}" if os.path.isabs(self.source) \
                else f", from {self.source}"
        return (f"machine profile of {self.host} ({self.cores} cores, torch "
                f"{self.torch_version}, {self.world_size} ranks), measured {self.measured_at}"
                + where)


def foreign(rows, *, host: str, cores: int, torch_version: str | None,
            now: float | None = None, in_run: bool = False) -> list[str]:
    """Why a stored profile may not describe this machine (empty: it does).

    >>> rows = [{"hostname": "a", "cores": 2, "torch_version": "2.13.0",
    ...          "timestamp": "2026-11-25T03:00:00+00:00"}]
    >>> foreign(rows, host="a", cores=2, torch_version="2.13.0", in_run=True)
    []
    >>> foreign(rows, host="b", cores=8, torch_version="2.13.0", in_run=True)
    ['measured on host a, this is b', 'measured with 2 cores, this process has 8']
    """
    first = rows[0] if rows else {}
    out = []
    if first.get("hostname") != host:
        out.append(f"measured on host {first.get('hostname')}, this is {host}")
    if first.get("cores") != cores:
        out.append(f"measured with {first.get('cores')} cores, this process has {cores}")
    if torch_version and first.get("torch_version") not in (None, torch_version):
        out.append(f"measured with torch {first.get('torch_version')}, this is {torch_version}")
    if not in_run and first.get("timestamp"):
        from datetime import datetime

        when = datetime.fromisoformat(first["timestamp"]).timestamp()
        age = (time.time() if now is None else now) - when
        if age > STALE_AFTER_S:
            out.append(f"measured {age / 3600:.0f} h ago, by an older run")
    return out


def _torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def profile(results_dir: str | os.PathLike = "results", *, measure: bool = True,
            nproc: int = 2, quiet: bool = False) -> Profile:
    """This run's machine profile: the one ``labkit lab`` measured (``$LABKIT_MACHINE_PROFILE``),
    else ``results_dir/machine_profile.json``, else measured now (one ``nproc``-rank launch, a
    few seconds) and stored there. A profile of another host, core count or torch, or an old one
    outside a lab run, is used with a printed warning naming where it came from."""
    from labkit import results
    from labkit.procs import available_cores

    env = os.environ.get(ENV)
    path = Path(env) if env else Path(results_dir) / FILE
    if not path.exists():
        if not measure:
            from labkit.errors import UsageError
            raise UsageError(f"{path}: no machine profile (measure one: labkit calibrate "
                             f"--json {path})")
        from labkit.machine.config import MachineConfig
        from labkit.machine.run import run

        if not quiet:
            print(f"no machine profile for this run yet: measuring it now ({nproc} ranks, a few "
                  f"seconds) into {path}", flush=True)
        from labkit.launch import LaunchOptions

        path.parent.mkdir(parents=True, exist_ok=True)
        run(MachineConfig(), launch=LaunchOptions(nprocs=(nproc,)), store=path)
    rows = results.read_rows(path)
    why = foreign(rows, host=socket.gethostname(), cores=available_cores(),
                  torch_version=_torch_version(), in_run=bool(env))
    prof = Profile.from_rows(rows, source=str(path), warnings=why)
    if why and not quiet:
        print(f"WARNING: the machine profile in {path} may not describe this machine: "
              f"{'; '.join(why)}. Its numbers are used as they are; measure this machine's with "
              f"`labkit calibrate --json {path}` (or delete the file and run again).", flush=True)
    if not all(math.isfinite(r.get("time_p50_s", 1.0)) for r in prof.rows):
        raise ValueError(f"{path}: a profile row has no finite time")
    return prof
