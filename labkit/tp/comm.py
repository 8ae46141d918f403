"""Rank side: the collectives the hand-written TP layers call, counted and timed (:class:`Comm`).

Every call of the teaching versions (f and g's all-reduces, sequence parallelism's all-gathers
and reduce-scatters, :mod:`labkit.tp.sp`) goes through :meth:`Comm.collective`, which counts it
and its buffer's bytes (nccl-tests' S: the all-reduce buffer, the all-gather output, the
reduce-scatter input) per operation and stamps its entry and exit. :meth:`Comm.timed` wraps a
training step so that its start and end are stamped too: :meth:`Comm.step_record` gives one
step's collectives on the step's clock (the Chrome trace of the lab, :mod:`labkit.tp.trace`).
A stamp is one ``time.perf_counter()`` read on a CPU and one CUDA event on the current stream
on a GPU, read once the device is idle: a synchronisation around every collective would stall
the step it sits in.
"""

from __future__ import annotations

import time
from collections import Counter

import torch
import torch.distributed as dist

from labkit import timing

# torch 2.13 renamed the tensor forms (the old names warn); the same operators underneath
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Comm:
    """What the f and g functions (and sequence parallelism's) of one model did: collective
    calls, bytes (the buffers, nccl-tests' S) and seconds, in total (:attr:`calls`,
    :attr:`bytes`) and per operation (:attr:`calls_by_op`, :attr:`bytes_by_op`: ``all_reduce``,
    ``all_gather``, ``reduce_scatter``). ``enabled=False`` (a world of one) turns them into
    identities: the same arithmetic on the local shards, no communication (the compute-only
    step; at P > 1 its results are wrong on purpose).

    :meth:`timeline` gives every call's entry and exit on this rank's clock, so that the time
    inside can be split into the message and the wait for a later rank
    (:func:`labkit.tp.timeline.split_waits`); :meth:`step_record` one timed step's calls with
    their names, from the step's start."""

    def __init__(self, world_size: int, device: torch.device | None = None, group=None):
        self.world_size = int(world_size)
        self.enabled = self.world_size > 1
        self.device = device
        # decided once: a stamp is taken inside every timed collective
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.group = group
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.bytes = 0
        self.calls_by_op: Counter = Counter()
        self.bytes_by_op: Counter = Counter()
        self._calls: list = []  # (op, name, before, phase, entry stamp, exit stamp)
        self._steps: list = []  # (start stamp, end stamp, first call, one past the last call)
        self._anchor = None

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = timing.stamp("cuda")
        if self._anchor is None:
            self._anchor = event
        return event

    @staticmethod
    def _since(origin, stamp) -> float:
        return timing.seconds_between(origin, stamp)

    @property
    def seconds(self) -> float:
        """Seconds inside the collectives since :meth:`reset`."""
        return sum(b - a for a, b in self.timeline())

    def timeline(self) -> list[tuple[float, float]]:
        """(entry, exit) of every collective since :meth:`reset`, seconds on this rank's clock
        (CUDA: from the first event recorded; read once the device is idle)."""
        if self.cuda:
            return [(self._since(self._anchor, a), self._since(self._anchor, b))
                    for *_, a, b in self._calls]
        return [(a, b) for *_, a, b in self._calls]

    def ops(self) -> list[str]:
        """The operation of every collective since :meth:`reset`, in :meth:`timeline`'s order."""
        return [op for op, *_ in self._calls]

    def collective(self, op: str, nbytes: int, run, *, name: str, before: str,
                   phase: str) -> None:
        """Count and time ``run()``, one synchronous collective ``op`` of ``nbytes`` (its
        buffer): ``name`` it in the trace, ``before`` names the compute that ran since the
        previous collective, ``phase`` is forward or backward."""
        self.calls += 1
        self.bytes += int(nbytes)
        self.calls_by_op[op] += 1
        self.bytes_by_op[op] += int(nbytes)
        entry = self._stamp()
        run()
        self._calls.append((op, name, before, phase, entry, self._stamp()))

    def all_reduce(self, t: torch.Tensor, *, name: str = "all-reduce", before: str = "compute",
                   phase: str = "forward") -> torch.Tensor:
        """``t`` summed over the ranks, in place (``t`` itself on one rank)."""
        if self.enabled:
            self.collective("all_reduce", t.numel() * t.element_size(),
                            lambda: dist.all_reduce(t, group=self.group),
                            name=name, before=before, phase=phase)
        return t

    def timed(self, step, *, tail: str):
        """``step`` with its start and end stamped (two clock reads): each call is one step of
        :meth:`step_record`; ``tail`` names the compute after the step's last collective."""
        def run():
            start, first = self._stamp(), len(self._calls)
            step()
            self._steps.append((start, self._stamp(), first, len(self._calls), tail))
        return run

    def step_record(self, k: int) -> dict:
        """The ``k``-th timed step since :meth:`reset` (on CUDA once the device is idle):
        ``origin_s`` (its start on the host's monotonic clock; 0 on CUDA, whose events have no
        common clock), ``end_s`` and ``calls`` (``op, name, before, phase, entry_s, exit_s``),
        seconds from the step's start, and ``tail`` (:meth:`timed`)."""
        start, end, first, last, tail = self._steps[k]
        calls = [{"op": op, "name": name, "before": before, "phase": phase,
                  "entry_s": self._since(start, a), "exit_s": self._since(start, b)}
                 for op, name, before, phase, a, b in self._calls[first:last]]
        return {"origin_s": start if isinstance(start, float) else 0.0,
                "end_s": self._since(start, end), "calls": calls, "tail": tail}
