"""Ring attention, the arithmetic (rank side; torch, no torch.distributed): a rank's query
chunks against every K/V block that passes it, merged by the online softmax.

A block's scores give, per query, a partial output ``o_j = softmax(s_j) V_j`` and the
log-sum-exp ``lse_j`` of its scores (the running max and the sum of exponentials in one
number). Two partial results merge exactly::

    lse = log(e^lse_a + e^lse_b),  o = o_a e^(lse_a - lse) + o_b e^(lse_b - lse)

so the blocks may come in any order and nothing of size S x S is ever held. How the blocks
travel is the caller's: ``exchange(k, v, step)`` starts passing the block held at ``step``
on and returns something whose ``wait()`` gives the next one (:mod:`labkit.cp.comm` over
torch.distributed; :class:`LocalRing` here, every rank simulated in one process). The
backward is autograd's through this code (the teaching version: a production ring writes its
own backward, re-circulating K and V instead of keeping every block).
"""

from __future__ import annotations

import math

import torch

from labkit.cp.formulas import chunk_count, chunks_of, kv_source, work_items
from labkit.cp.timeline import NO_CLOCK


def local_chunks(x: torch.Tensor, rank: int, world_size: int, variant: str) -> torch.Tensor:
    """Rank ``rank``'s share of ``x`` (b, H, S, d) along the sequence: its chunks, in order."""
    c = x.shape[2] // chunk_count(world_size, variant)
    return torch.cat([x[:, :, k * c:(k + 1) * c] for k in chunks_of(rank, world_size, variant)],
                     dim=2)


def gather_chunks(parts: list, world_size: int, variant: str) -> torch.Tensor:
    """Every rank's share (``parts[r]``) put back in sequence order: :func:`local_chunks` undone."""
    pieces = {}
    for r, part in enumerate(parts):
        mine = chunks_of(r, world_size, variant)
        for i, piece in enumerate(part.chunk(len(mine), dim=2)):
            pieces[mine[i]] = piece
    return torch.cat([pieces[k] for k in sorted(pieces)], dim=2)


_MASKS: dict = {}


def _upper(c: int, device) -> torch.Tensor:
    """The c x c mask of keys after their query (True: hidden), one per size and device."""
    key = (c, str(device))
    if key not in _MASKS:
        _MASKS[key] = torch.ones(c, c, dtype=torch.bool, device=device).triu(1)
    return _MASKS[key]


def block_attention(q, k, v, *, causal: bool):
    """One block: (softmax(q k^T) v, logsumexp(q k^T)) per query (q already scaled by
    1/sqrt(d)); ``causal``: q and k are the same chunk, keys after their query hidden."""
    s = q @ k.transpose(-2, -1)
    if causal:
        s = s.masked_fill(_upper(s.shape[-1], s.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse) @ v, lse


def merge(acc, o_j, lse_j):
    """The online-softmax merge of a running (o, lse) (None: nothing yet) with a block's."""
    if acc is None:
        return o_j, lse_j
    o, lse = acc
    new = torch.logaddexp(lse, lse_j)
    return o * torch.exp(lse - new) + o_j * torch.exp(lse_j - new), new


class _Join(torch.autograd.Function):
    """The output, made to depend on the last block received: every rank then runs the
    backward of every ring step (a rank with no work from a block still passes its gradient,
    zeros, back), or its neighbours would wait for it forever."""

    @staticmethod
    def forward(ctx, out, k, v):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def ring_attention(q, k, v, *, rank: int, world_size: int, variant: str, exchange,
                   clock=NO_CLOCK):
    """This rank's attention output for its chunks ``q`` (b, H, n, d) against the whole
    sequence's keys and values, which arrive block by block: ``k``, ``v`` are this rank's,
    ``exchange(k, v, step)`` passes the block held at ``step`` on and returns a handle whose
    ``wait()`` gives the block of the next step (started before this step's blocks are
    computed, so the message can hide behind them). ``clock``: a
    :class:`labkit.cp.timeline.RingClock` that records each ring step's moments (its trace)."""
    q = q * (q.shape[-1] ** -0.5)
    nq = len(chunks_of(rank, world_size, variant))
    qs = q.chunk(nq, dim=2)
    acc = [None] * nq
    for step in range(world_size):
        t0 = clock.stamp()
        pending = exchange(k, v, step) if step < world_size - 1 else None
        t1 = clock.stamp()
        nk = len(chunks_of(kv_source(rank, step, world_size), world_size, variant))
        ks, vs = k.chunk(nk, dim=2), v.chunk(nk, dim=2)
        items = work_items(rank, step, world_size, variant)
        for i, j, kind in items:
            acc[i] = merge(acc[i], *block_attention(qs[i], ks[j], vs[j], causal=kind == "causal"))
        t2 = clock.stamp()
        # a block's backward ends with its scores' product, whose gradient reaches q and k
        clock.backward_marks(step, outputs=[acc[i][0] for i in {i for i, _, _ in items}],
                             inputs=[ks[j] for j in {j for _, j, _ in items}])
        if pending is not None:
            k, v = pending.wait()
            clock.forward_step(step, t0, (t1, t2), clock.stamp())
        else:
            clock.forward_step(step, t0, (t1, t2))
    out = torch.cat([a[0] for a in acc], dim=2)
    return _Join.apply(out, k, v) if world_size > 1 else out


class _Ready:
    def __init__(self, k, v):
        self.kv = (k, v)

    def wait(self):
        return self.kv


class LocalRing:
    """Every rank in one process: ``exchange`` hands rank ``rank`` the block of rank
    (r - step - 1) from the whole sequence's ``k``, ``v``, as the ring would (the simulation
    of the tests; gradients flow straight back to the whole K and V)."""

    def __init__(self, k, v, *, rank: int, world_size: int, variant: str):
        self.k, self.v, self.rank, self.p, self.variant = k, v, rank, world_size, variant

    def __call__(self, k, v, step: int):
        src = kv_source(self.rank, step + 1, self.p)
        return _Ready(local_chunks(self.k, src, self.p, self.variant),
                      local_chunks(self.v, src, self.p, self.variant))


def loopback(k, v, step: int):
    """An ``exchange`` that passes nothing: the rank meets its own block again, the same
    arithmetic without a message (the compute-only step)."""
    return _Ready(k, v)


def simulate(q, k, v, *, world_size: int, variant: str) -> torch.Tensor:
    """Ring attention over ``world_size`` simulated ranks in one process: the whole output
    (b, H, S, d), each rank's share computed from its chunks and the blocks it would receive."""
    parts = []
    for r in range(world_size):
        ring = LocalRing(k, v, rank=r, world_size=world_size, variant=variant)
        parts.append(ring_attention(local_chunks(q, r, world_size, variant),
                                    local_chunks(k, r, world_size, variant),
                                    local_chunks(v, r, world_size, variant),
                                    rank=r, world_size=world_size, variant=variant,
                                    exchange=ring))
    return gather_chunks(parts, world_size, variant)


def reference(q, k, v, *, variant: str) -> torch.Tensor:
    """One process's attention: ``torch.nn.functional.scaled_dot_product_attention``."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                            is_causal=variant != "full")
