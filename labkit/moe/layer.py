"""Rank side: the MoE layer, routed, dispatched, computed and combined, and the one-process
reference it is checked against (torch; the all-to-all is handed in, so this module never
touches torch.distributed and runs in one process as it is).

* :func:`route` -- the linear router's softmax, the top k, the gates (renormalised over the k
  chosen, or the softmax probabilities as they are), and the capacity: each expert keeps the
  first ``capacity`` (token, expert) pairs in token order (a token's k choices in the order
  top-k gives them) and drops the rest;
* :class:`ExpertLayer` -- one rank's part: the router (every rank holds it whole) and its
  E/P experts; :meth:`ExpertLayer.step` runs one forward and backward in four phases (routing,
  dispatch, expert compute, combine), each timed with its backward;
* :func:`reference` -- one process, every expert on every token (dense): each rank's tokens
  weighted by the same routing, nothing dispatched.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Routing:
    """Where one rank's kept (token, expert) pairs go, in dispatch order (by expert, then
    token): ``token`` and ``expert`` of each, ``slot`` its index in the flattened (T, k) gates;
    ``routed`` and ``kept`` count the pairs per expert before and after the capacity."""

    token: torch.Tensor
    expert: torch.Tensor
    slot: torch.Tensor
    routed: torch.Tensor
    kept: torch.Tensor

    @property
    def dropped(self) -> int:
        return int((self.routed - self.kept).sum())


def route(logits: torch.Tensor, *, top_k: int, capacity: int, renormalize: bool):
    """``(gates, routing)`` of a rank's tokens from their router ``logits`` (T, E): ``gates``
    (T, k), differentiable, and the :class:`Routing` of the pairs kept within ``capacity``."""
    num_tokens, num_experts = logits.shape
    probs = torch.softmax(logits, dim=-1)
    top, chosen = probs.topk(top_k, dim=-1)
    gates = top / top.sum(dim=-1, keepdim=True) if renormalize else top
    flat = chosen.reshape(-1)  # token-major: token 0's k choices, then token 1's, ...
    onehot = F.one_hot(flat, num_experts)
    # a pair's place in its expert's queue: the pairs before it, in token order, that chose it
    place = (onehot.cumsum(dim=0) - 1).gather(1, flat[:, None]).squeeze(1)
    keep = place < capacity
    slots = keep.nonzero().squeeze(1)
    order = torch.argsort(flat[slots] * flat.numel() + slots)  # by expert, then token
    slots = slots[order]
    return gates, Routing(token=slots // top_k, expert=flat[slots], slot=slots,
                          routed=onehot.sum(dim=0),
                          kept=torch.bincount(flat[slots], minlength=num_experts))


def combine_weights(gates: torch.Tensor, routing: Routing, num_experts: int) -> torch.Tensor:
    """The dense (T, E) weights of each expert's output in each token's: the gate of a kept
    pair, 0 elsewhere (a dropped pair adds nothing)."""
    w = gates.new_zeros(gates.shape[0], num_experts)
    return w.index_put((routing.token, routing.expert), gates.reshape(-1)[routing.slot],
                       accumulate=True)


def init_weights(*, num_experts: int, hidden: int, ffn: int, seed: int,
                 dtype=torch.float64) -> dict:
    """The whole layer's weights from ``seed`` (on the host; every rank draws the same):
    ``router`` (E, h), ``w1`` (E, h, f), ``b1`` (E, f), ``w2`` (E, f, h), ``b2`` (E, h)."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape, fan_in):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / fan_in ** 0.5).to(dtype)

    return {"router": draw(num_experts, hidden, fan_in=hidden),
            "w1": draw(num_experts, hidden, ffn, fan_in=hidden),
            "b1": draw(num_experts, ffn, fan_in=ffn),
            "w2": draw(num_experts, ffn, hidden, fan_in=ffn),
            "b2": draw(num_experts, hidden, fan_in=hidden)}


def expert_mlp(x, w1, b1, w2, b2):
    """One expert on its rows: h -> f (GELU) -> h."""
    return F.gelu(x @ w1 + b1) @ w2 + b2


def reference(weights: dict, x: torch.Tensor, grad_out: torch.Tensor, *, top_k: int,
              capacity: int, renormalize: bool) -> dict:
    """One process, every rank's tokens ``x`` (P, T, h): each expert on every token, the
    outputs weighted by each rank's routing (:func:`route`, the capacity per rank), then one
    backward with ``grad_out``. The output, the input gradient and every weight gradient."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    xr = x.detach().clone().requires_grad_(True)
    num_experts = params["router"].shape[0]
    outs = []
    for chunk in xr:  # the capacity is each rank's, so the routing is too
        gates, routing = route(chunk @ params["router"].T, top_k=top_k, capacity=capacity,
                               renormalize=renormalize)
        w = combine_weights(gates, routing, num_experts)
        every = torch.stack([expert_mlp(chunk, params["w1"][e], params["b1"][e], params["w2"][e],
                                        params["b2"][e]) for e in range(num_experts)], dim=1)
        outs.append((w[:, :, None] * every).sum(dim=1))
    out = torch.stack(outs)
    out.backward(grad_out)
    return {"out": out.detach(), "x_grad": xr.grad.detach(),
            "grads": {k: p.grad.detach() for k, p in params.items()}}


class _AllToAll(torch.autograd.Function):
    """Rows out by ``send`` counts per rank, rows in by ``recv``; backward, the gradients go
    the way back (the two swapped)."""

    @staticmethod
    def forward(ctx, x, exchange, send, recv, tag):
        ctx.exchange, ctx.send, ctx.recv, ctx.tag = exchange, send, recv, tag
        return exchange(x, send, recv, tag)

    @staticmethod
    def backward(ctx, grad):
        return ctx.exchange(grad.contiguous(), ctx.recv, ctx.send, ctx.tag + "_grad"), \
            None, None, None, None


def local_exchange(x, send, recv, tag):
    """The all-to-all of one rank: its rows stay where they are."""
    return x


#: the phases :meth:`ExpertLayer.step` times, in the order it runs them: each phase forward,
#: then (the combine's backward run inside its own phase) the others' backward in reverse
STEP_ORDER = (("routing", "forward"), ("dispatch", "forward"), ("experts", "forward"),
              ("combine", "forward + backward"), ("experts", "backward"),
              ("dispatch", "backward"), ("routing", "backward"))


class ExpertLayer:
    """Rank ``rank`` of ``world_size``: the router whole and experts ``rank·E/P ..`` of
    ``weights`` (:func:`init_weights`), as leaf tensors of ``dtype`` on ``device``.

    ``exchange(x, send, recv, tag)`` is the all-to-all of rows (``send[d]`` rows to rank d,
    ``recv[s]`` from rank s; ``tag`` names the call) and ``exchange_counts(counts)`` the
    all-to-all of the split sizes (``counts`` (P, E/P): the rows for each expert of each rank;
    what every rank sends this one comes back). On one rank both are the identity."""

    def __init__(self, weights: dict, *, rank: int, world_size: int, top_k: int, capacity: int,
                 renormalize: bool, device, dtype=torch.float32, exchange=local_exchange,
                 exchange_counts=None):
        num_experts = weights["router"].shape[0]
        self.rank, self.world_size = rank, world_size
        self.local = num_experts // world_size
        self.first = rank * self.local
        self.top_k, self.capacity, self.renormalize = top_k, capacity, renormalize
        part = slice(self.first, self.first + self.local)
        self.params = {k: (v if k == "router" else v[part]).detach().to(device=device,
                                                                         dtype=dtype).clone()
                       .requires_grad_(True) for k, v in weights.items()}
        self.exchange = exchange
        self.exchange_counts = exchange_counts or (lambda counts: counts)
        self.last: Routing | None = None

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def _experts(self, xr, counts):
        """Each local expert on its rows: ``xr`` arrives by source rank, then expert
        (``counts`` (P, E/P)); gathered by expert, computed, put back in arrival order."""
        p = self.params
        sizes = counts.reshape(-1).tolist()
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        outs = []
        order = []
        for j in range(self.local):
            idx = [torch.arange(starts[s * self.local + j], starts[s * self.local + j + 1],
                                device=xr.device) for s in range(self.world_size)]
            idx = torch.cat(idx)
            order.append(idx)
            outs.append(expert_mlp(xr[idx], p["w1"][j], p["b1"][j], p["w2"][j], p["b2"][j]))
        order = torch.cat(order)
        return torch.empty_like(xr).index_copy(0, order, torch.cat(outs))

    def step(self, x: torch.Tensor, grad_out: torch.Tensor, clock=None) -> torch.Tensor:
        """One forward and backward of the layer on this rank's tokens ``x`` (T, h), backward
        from ``grad_out``: phase by phase, each phase's backward run by hand after the next
        one's, so that ``clock(phase)`` (a context manager, e.g. a
        :class:`labkit.timing.Stopwatch`) times each phase forward and backward, in the order of
        :data:`STEP_ORDER`. The gradients land in ``x.grad`` (when ``x`` requires it) and
        :attr:`params`; the output is returned.
        """
        clock = clock or (lambda name: contextlib.nullcontext())
        p = self.params
        with clock("routing"):
            gates, r = route(x @ p["router"].T, top_k=self.top_k, capacity=self.capacity,
                             renormalize=self.renormalize)
            xs, g = x[r.token], gates.reshape(-1)[r.slot]
            xs_in, g_in = _leaf(xs), _leaf(g)
        self.last = r
        with clock("dispatch"):
            counts = self.exchange_counts(r.kept.reshape(self.world_size, self.local))
            send = r.kept.reshape(self.world_size, self.local).sum(dim=1).tolist()
            recv = counts.sum(dim=1).tolist()
            xr = _AllToAll.apply(xs_in, self.exchange, send, recv, "dispatch")
            xr_in = _leaf(xr)
        with clock("experts"):
            yr = self._experts(xr_in, counts)
            yr_in = _leaf(yr)
        with clock("combine"):
            ys = _AllToAll.apply(yr_in, self.exchange, recv, send, "combine")
            out = x.new_zeros(x.shape).index_add(0, r.token, g_in[:, None] * ys)
            out.backward(grad_out)
        with clock("experts"):
            yr.backward(_grad(yr_in))
        with clock("dispatch"):
            xr.backward(_grad(xr_in))
        with clock("routing"):
            pairs = [(t, _grad(leaf)) for t, leaf in ((xs, xs_in), (g, g_in)) if t.requires_grad]
            torch.autograd.backward([t for t, _ in pairs], [d for _, d in pairs])
        return out.detach()


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """Where one phase ends and the next begins: the next phase's input, a leaf of its own."""
    return t.detach().requires_grad_(True)


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
