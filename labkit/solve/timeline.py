"""Rank side: when each phase of a solve's iterations started and ended, for its trace.

The operator charges every piece of work to a bucket of its stopwatch (``spmv``, ``halo``,
``allreduce``, ``vector``: :mod:`labkit.solve.operator`), and the rows hold the buckets'
totals. For the last timed solve of each point the worker gives the operator a
:class:`PhaseRecorder` instead: the same totals, and also each piece's start and end for the
first :data:`FIRST` and the last :data:`LAST` iterations (memory and row size bounded whatever
the iteration count, and the last ones known without knowing the count in advance). The Krylov
methods mark where each pass of their loop starts (:func:`marker`); an iteration runs from its
mark to the next one, the last to the solve's end. Recording costs no clock read per piece
beyond the stopwatch's own, and one per iteration.

Iterations are the passes of a method's loop, numbered from 1: CG and pipelined CG make one
more pass than their iteration count (the last one's SpMV and all-reduce give the residual that
ends the solve), BiCGSTAB, GMRES (its inner steps) and MINRES as many.

The ranks' records are gathered to every rank and put on one clock (:func:`one_clock`): on one
host ``time.perf_counter`` is the machine's monotonic clock, the same in every process, so each
rank's times are shifted by how much later than the first rank it started the solve; across
hosts the barrier before the solve is the common start.
"""

from __future__ import annotations

import socket
import time
from collections import deque

from labkit import trace
from labkit.runtime import sync
from labkit.timing import Stopwatch

#: iterations recorded from the start of a solve, and before its end
FIRST, LAST = 2, 3


def _nothing() -> None:
    return None


def marker(sw):
    """What a Krylov method calls at the start of each pass of its loop: the ``iteration``
    of a :class:`PhaseRecorder`, nothing for a plain stopwatch (no clock read, no record)."""
    return getattr(sw, "iteration", _nothing)


class PhaseRecorder(Stopwatch):
    """A :class:`~labkit.timing.Stopwatch` (the same totals, read the same way) that also keeps
    each piece of the first :data:`FIRST` and the last :data:`LAST` iterations of one solve.

    >>> rec = PhaseRecorder()
    >>> for _ in range(7):
    ...     rec.iteration()
    ...     with rec("spmv"):
    ...         pass
    >>> [it["iteration"] for it in rec.iterations(start_s=0.0, end_s=time.perf_counter())]
    [1, 2, 5, 6, 7]
    """

    def __init__(self, device=None):
        super().__init__(device)
        self._cuda = self._device().type == "cuda"
        self._first: list = []
        self._last: deque = deque(maxlen=LAST)
        self._open: list | None = None  # [number, start, end, pieces] of the current iteration
        self._count = 0

    def iteration(self) -> None:
        """A new iteration starts now (on CUDA after a synchronisation, as every read)."""
        if self._cuda:
            sync(self.device)
        now = time.perf_counter()
        if self._open is not None:
            self._open[2] = now
        self._count += 1
        self._open = [self._count, now, None, []]
        (self._first if self._count <= FIRST else self._last).append(self._open)

    def __exit__(self, *exc) -> None:
        # Stopwatch.__exit__, written out so that one clock read ends the total and the piece
        # (a call to it and a subtraction cost a fifth of a microsecond per piece more)
        if self.enabled:
            sync(self._device())
            t1 = time.perf_counter()
            name = self._name or "total"
            self.totals[name] = self.totals.get(name, 0.0) + t1 - self._t0
            if self._open is not None:
                self._open[3].append((name, self._t0, t1))

    def iterations(self, *, start_s: float, end_s: float) -> list[dict]:
        """The recorded iterations in order, each ``{iteration, start_s, end_s, pieces}``
        (pieces: ``(bucket, start_s, end_s)``), in seconds from ``start_s`` (the solve's start
        on this rank's clock); the last iteration ends at ``end_s``, the solve's end."""
        out = []
        for number, a, b, pieces in [*self._first, *self._last]:
            out.append({"iteration": number, "start_s": a - start_s,
                        "end_s": (end_s if b is None else b) - start_s,
                        "pieces": [(name, p0 - start_s, p1 - start_s) for name, p0, p1 in pieces]})
        return out


def one_clock(gathered) -> dict:
    """Every rank's recorded iterations on one clock, as a row's columns: ``gathered[r]`` =
    rank r's (host, solve start on its monotonic clock, :meth:`PhaseRecorder.iterations`).
    On one host the times shift by each rank's start after the first rank's; across hosts the
    barrier before the solve is the common start (:func:`labkit.trace.start_offsets`).

    Rank 1 started its solve 1 ms after rank 0, on the same host:

    >>> it = {"iteration": 1, "start_s": 0.0, "end_s": 0.004, "pieces": [("spmv", 0.001, 0.003)]}
    >>> cols = one_clock([("h", 10.0, [it]), ("h", 10.001, [it])])
    >>> cols["timeline_iterations"], [(p["rank"], p["phase"], round(p["start_s"], 6)) for p in cols["timeline_s"]]
    ([1], [(0, 'spmv', 0.001), (1, 'spmv', 0.002)])
    >>> [(s["rank"], round(s["end_s"], 6)) for s in cols["timeline_iterations_s"]]
    [(0, 0.004), (1, 0.005)]
    """
    offsets = trace.start_offsets([g[1] for g in gathered], [g[0] for g in gathered])
    pieces, spans = [], []
    for rank, ((_, _, its), shift) in enumerate(zip(gathered, offsets)):
        for it in its:
            spans.append({"rank": rank, "iteration": it["iteration"],
                          "start_s": it["start_s"] + shift, "end_s": it["end_s"] + shift})
            pieces += [{"rank": rank, "iteration": it["iteration"], "phase": name,
                        "start_s": a + shift, "end_s": b + shift} for name, a, b in it["pieces"]]
    return {"timeline_iterations": sorted({s["iteration"] for s in spans}),
            "timeline_s": pieces, "timeline_iterations_s": spans}


def gather(rt, recorder: PhaseRecorder | None, start: float, end: float) -> dict:
    """The columns of :func:`one_clock` on every rank, from each rank's ``recorder`` of the
    solve that ran from ``start`` to ``end`` on its clock (None: the engine records nothing,
    and every rank passes None). Collective: every rank calls it."""
    import torch.distributed as dist

    if recorder is None:
        return {}
    mine = (socket.gethostname(), start, recorder.iterations(start_s=start, end_s=end))
    gathered = [None] * rt.world_size
    if rt.world_size > 1:
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    return one_clock(gathered)
