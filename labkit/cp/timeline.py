"""Rank side: the moments of one ring pass on this rank, for its trace (torch, no
torch.distributed): :class:`RingClock`.

A pass of :func:`labkit.cp.ring.ring_attention` with a clock records, per ring step of the
forward, when this rank posted its K/V block's send and receive, computed its score blocks,
and waited for the next block; in the backward, when autograd ran each ring step's blocks
(tensor hooks: from the first gradient reaching the step's merged results to the last one
reaching the K chunks it used) and each exchange of the blocks' gradients
(:mod:`labkit.cp.comm`). Each moment is seconds since the pass's start (after the barrier that
starts it). Recording costs a clock read per moment and a hook per result and K chunk of a
step: about 50 µs a pass of 2 ring steps on one core here, against 0.8 ms (S = 64) to 2 ms
(S = 256) of the pass's own compute.

On a CPU a stamp is the host's monotonic clock. On CUDA it is an event queued on the current
stream, read once the pass is over and the device synchronised: a synchronisation inside the
ring would wait for the messages in flight and remove the overlap the trace is to show.
"""

from __future__ import annotations

import time

import torch

from labkit import timing
from labkit.trace import IDLE

#: the threads of a pass: what the rank's own thread did (compute, posting, waiting), and the
#: ring's messages in flight beside it
COMPUTE, RING = "compute", "ring"


class RingClock:
    """Stamps of ring passes on this rank: :meth:`start` begins a pass (the device idle, after
    the barrier), the ring records into it, :meth:`spans` gives one pass's slices in seconds.
    ``device``: where the pass runs (events on CUDA). During a pass the clock only keeps
    stamps (a clock read and an append each); the slices are made afterwards."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.passes: list[dict] = []

    def stamp(self):
        """Now, on the pass's device (:func:`labkit.timing.stamp`)."""
        return timing.stamp(self.device)

    def start(self) -> None:
        """A new pass from now, on this machine's monotonic clock (``origin_s``)."""
        self.passes.append({"origin_s": time.perf_counter(), "origin": self.stamp(),
                            "forward": [], "exchanges": [], "marks": []})

    def forward_step(self, step: int, posted, computed, received=None) -> None:
        """Ring step ``step`` of the forward: stamps where it posted the K/V exchange, where
        its score blocks started and ended, and where the next block was in (None where
        nothing travels): the blocks from ``posted`` to ``computed``, the wait from there."""
        self.passes[-1]["forward"].append((step, posted, computed, received))

    def gradient_exchange(self, step: int, start, end) -> None:
        """The backward's exchange of the gradients of the block passed at ring step ``step``,
        from ``start`` to ``end``: sent and received before autograd goes on, so the rank
        waits through it."""
        self.passes[-1]["exchanges"].append((step, start, end))

    def backward_marks(self, step: int, *, outputs, inputs) -> None:
        """Hooks that stamp where the backward of ring step ``step``'s blocks starts (a gradient
        reaches one of its ``outputs``, the merged results) and ends (the gradients of its
        ``inputs`` are complete: the K chunks it used, which the last product of a block's
        backward reaches). A hook adds no node to the graph: autograd runs the same backward
        in the same order."""
        marks, stamp = self.passes[-1]["marks"], self.stamp
        for edge, tensors in (("start", outputs), ("end", inputs)):
            key = (step, edge)
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(lambda grad, key=key: marks.append((*key, stamp())))

    def spans(self, k: int) -> tuple[float, list[dict]]:
        """Pass ``k``'s (start on this machine's monotonic clock, slices): each a dict of
        ``name, cat, thread, start_s, end_s`` (seconds since the pass's start), ``ring_step``
        and ``direction``. Per forward ring step ``post K/V``, ``F<t>`` and ``wait K/V`` on the
        rank's thread and ``K/V block <t>`` on the ring's; per gradient exchange ``wait grad
        K/V <t>`` and ``grad K/V block <t>``; each ring step's backward blocks as one slice
        ``B<t>`` from the step's first mark to its last. On CUDA only once the device is idle.
        """
        one = self.passes[k]
        origin = one["origin"]

        def s(stamp) -> float:
            return timing.seconds_between(origin, stamp)

        def span(name, cat, thread, a, b, step, direction):
            return {"name": name, "cat": cat, "thread": thread, "start_s": a, "end_s": b,
                    "ring_step": step, "direction": direction}

        out = []
        for step, posted, computed, received in one["forward"]:
            t0, t1, t2 = s(posted), s(computed[0]), s(computed[1])
            out.append(span(f"F{step}", "forward", COMPUTE, t1, t2, step, "forward"))
            if received is not None:
                t3 = s(received)
                out += [span("post K/V", "ring", COMPUTE, t0, t1, step, "forward"),
                        span("wait K/V", IDLE, COMPUTE, t2, t3, step, "forward"),
                        span(f"K/V block {step}", "ring", RING, t0, t3, step, "forward")]
        for step, a, b in one["exchanges"]:
            out += [span(f"wait grad K/V {step}", IDLE, COMPUTE, s(a), s(b), step, "backward"),
                    span(f"grad K/V block {step}", "ring", RING, s(a), s(b), step, "backward")]
        steps: dict = {}
        for step, edge, stamp in one["marks"]:
            steps.setdefault(step, {}).setdefault(edge, []).append(s(stamp))
        for step, edges in steps.items():
            if "start" in edges and "end" in edges:
                out.append(span(f"B{step}", "backward", COMPUTE, min(edges["start"]),
                                max(edges["end"]), step, "backward"))
        return one["origin_s"], sorted(out, key=lambda x: (x["thread"], x["start_s"]))


class NoClock:
    """The clock of an untraced pass: no stamps, nothing marked."""

    def stamp(self):
        return None

    def forward_step(self, step, posted, computed, received=None) -> None:
        pass

    def gradient_exchange(self, step, start, end) -> None:
        pass

    def backward_marks(self, step, *, outputs, inputs) -> None:
        pass


NO_CLOCK = NoClock()
