"""Rank side: the ring over torch.distributed, with every byte it sends counted.

:class:`Ring` passes a K/V block one rank on (r sends to r+1, receives from r-1) with
``dist.batch_isend_irecv``; every send goes through :meth:`Ring._send`, which counts its
tensor's bytes and the call, per phase (``forward``: the blocks; ``backward``: their
gradients, going back the other way). As an ``exchange`` of
:func:`labkit.cp.ring.ring_attention` it is differentiable: the gradient of "pass my block on"
is "pass the gradient of the block I received back to the rank it came from".
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.cp.timeline import NO_CLOCK


class _Pending:
    def __init__(self, ring, reqs, kv):
        self.ring, self.reqs, self.kv = ring, reqs, kv

    def wait(self):
        for req in self.reqs:
            req.wait()
        return self.kv


class _Pass(torch.autograd.Function):
    """Forward: start sending (k, v) on, return the buffers the previous rank's block arrives
    in (filled once the caller waits). Backward: send their gradients back, receive ours."""

    @staticmethod
    def forward(ctx, ring, k, v, step):
        ctx.ring, ctx.step = ring, step
        reqs, out = ring.start((k, v), to=ring.next, frm=ring.prev, phase="forward")
        ring.pending = reqs
        return tuple(out)  # a tuple: autograd takes a list for one non-tensor output

    @staticmethod
    def backward(ctx, gk, gv):
        ring = ctx.ring
        t0 = ring.clock.stamp()
        reqs, out = ring.start((gk.contiguous(), gv.contiguous()), to=ring.prev, frm=ring.next,
                               phase="backward")
        for req in reqs:
            req.wait()
        ring.clock.gradient_exchange(ctx.step, t0, ring.clock.stamp())
        return None, *out, None


class Ring:
    """The ring of this rank: ``next`` and ``prev`` neighbours, the counts of what it sent
    (``bytes`` and ``sends``, per phase) and, as an ``exchange``, a differentiable pass;
    ``clock`` (a :class:`labkit.cp.timeline.RingClock`) records the backward's exchanges."""

    def __init__(self, rank: int, world_size: int):
        self.next, self.prev = (rank + 1) % world_size, (rank - 1) % world_size
        self.pending = None
        self.clock = NO_CLOCK
        self.reset()

    def reset(self) -> None:
        self.bytes = {"forward": 0, "backward": 0}
        self.sends = {"forward": 0, "backward": 0}

    def _send(self, tensor, peer: int, phase: str):
        """The one place a send is made: counted here."""
        self.bytes[phase] += tensor.numel() * tensor.element_size()
        self.sends[phase] += 1
        return dist.P2POp(dist.isend, tensor, peer)

    def start(self, tensors, *, to: int, frm: int, phase: str):
        """Send ``tensors`` to ``to``, receive as many of the same shapes from ``frm``: the
        requests and the receive buffers (on the tensors' device)."""
        out = [torch.empty_like(t) for t in tensors]
        ops = [self._send(t, to, phase) for t in tensors]
        ops += [dist.P2POp(dist.irecv, o, frm) for o in out]
        return dist.batch_isend_irecv(ops), out

    def __call__(self, k, v, step: int):
        kv = _Pass.apply(self, k.contiguous(), v.contiguous(), step)
        return _Pending(self, self.pending, kv)

    def exchange_alone(self, k, v) -> None:
        """One exchange of a block with nothing else (the message time), not counted."""
        out = [torch.empty_like(t) for t in (k, v)]
        ops = [dist.P2POp(dist.isend, t, self.next) for t in (k, v)]
        ops += [dist.P2POp(dist.irecv, o, self.prev) for o in out]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
