"""Rank side: the same model under DDP, under a hand-written ZeRO-1 optimizer, and under FSDP2;
and the bytes each rank really holds.

* :func:`wrap_ddp` -- ``DistributedDataParallel``: every rank holds all weights, gradients and
  Adam states; backward all-reduces the gradients.
* :class:`ZeRO1` -- **the teaching version** of ZeRO stage 1 (the sharded optimizer of
  CS336's assignment): the parameters live in one flat buffer, rank r owns the r-th 1/N of it;
  a step reduce-scatters the flat gradients (each rank gets the average of its slice), runs
  Adam on its slice with its slice of the moments, and all-gathers the updated slices. Adam's
  moments, 8 of the 16 bytes a parameter, are 1/N per rank; weights and gradients stay whole.
* :func:`wrap_fsdp` -- FSDP2: ``torch.distributed.fsdp.fully_shard`` on every layer (a unit:
  one all-gather before its forward, one before its backward, one reduce-scatter after) and
  on the stack; weights, gradients and Adam states are ``Shard(0)`` DTensors, 1/N per rank.
  Works on CPU with gloo (torch 2.13, 2 ranks checked) and on GPUs with nccl.
* :func:`collectives_alone` -- a step's collectives with nothing around them, to time them;
* :func:`held_bytes` -- weights, gradients and optimizer states this rank holds, summed over
  its local tensors (DTensors count their local shard only).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from labkit.tp.models import local_tensor

# torch 2.13 renamed the tensor forms (the old names warn); the same operators underneath
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP with its defaults; one rank per GPU on CUDA, none on CPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def wrap_fsdp(model, mesh, *, reshard_after_forward: bool = True):
    """FSDP2 in place: ``fully_shard`` every layer of a :class:`labkit.tp.models.Stack`, then
    the stack (the root, which holds no parameters of its own here)."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


class ZeRO1:
    """Adam with its moments sharded over the ranks (ZeRO stage 1), written out.

    Arithmetic is ``torch.optim.Adam``'s (defaults: betas 0.9, 0.999, eps 1e-8), element by
    element, so the model trains exactly as under DDP + Adam. ``keep_grad_shard`` keeps the last
    averaged gradient slice (``last_grad_shard``) for checks; off, nothing but the moments
    outlives a step.
    """

    def __init__(self, model: nn.Module, *, lr: float, rank: int, world_size: int,
                 betas=(0.9, 0.999), eps: float = 1e-8, group=None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.rank, self.world_size, self.group = rank, world_size, group
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / world_size)
        first = self.params[0]
        # one flat buffer holds every parameter (they become views into it), padded to N slices
        self.flat = torch.zeros(self.shard_size * world_size, dtype=first.dtype,
                                device=first.device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.flat[offset:offset + n].view_as(p)
                offset += n
        lo = rank * self.shard_size
        self.shard = self.flat[lo:lo + self.shard_size]  # a view: this rank's parameters
        self.exp_avg = torch.zeros_like(self.shard)
        self.exp_avg_sq = torch.zeros_like(self.shard)
        self.steps = 0
        self.keep_grad_shard = False
        self.last_grad_shard: torch.Tensor | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _grad_shard(self) -> torch.Tensor:
        """Reduce-scatter the flat gradients: this rank's slice of their average."""
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None
                          else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                          for p in self.params])
        pad = self.flat.numel() - flat.numel()
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        if self.world_size == 1:
            return flat
        out = torch.empty(self.shard_size, dtype=flat.dtype, device=flat.device)
        _reduce_scatter(out, flat, op=dist.ReduceOp.SUM, group=self.group)
        return out.div_(self.world_size)

    @torch.no_grad()
    def step(self) -> None:
        g = self._grad_shard()
        if self.keep_grad_shard:
            self.last_grad_shard = g.clone()
        self.steps += 1
        b1, b2 = self.betas
        self.exp_avg.lerp_(g, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        step_size = self.lr / (1 - b1 ** self.steps)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - b2 ** self.steps)).add_(self.eps)
        self.shard.addcdiv_(self.exp_avg, denom, value=-step_size)
        if self.world_size > 1:  # every rank gets every updated slice: the parameters again
            _all_gather(self.flat, self.shard.clone(), group=self.group)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: its slice of m and v."""
        return sum(t.numel() * t.element_size() for t in (self.exp_avg, self.exp_avg_sq))


def collectives_alone(collectives, device: torch.device):
    """A closure running the ``(op, S)`` collectives of a step one after the other on buffers of
    their sizes (S: the all-reduce buffer, the all-gather output, the reduce-scatter input) and
    nothing else: what a step's collectives cost with no compute around them. Collective."""
    n = dist.get_world_size()
    bufs = []
    for op, size in collectives:
        full = torch.zeros(max(n, int(size) // 4 // n * n), dtype=torch.float32, device=device)
        bufs.append((op, full, torch.zeros(full.numel() // n, dtype=torch.float32,
                                           device=device)))

    def run():
        for op, full, part in bufs:
            if op == "all_reduce":
                dist.all_reduce(full)
            elif op == "all_gather":
                _all_gather(full, part)
            else:
                _reduce_scatter(part, full, op=dist.ReduceOp.SUM)

    return run


def _bytes(t) -> int:
    if t is None:
        return 0
    t = local_tensor(t)
    return t.numel() * t.element_size()


def held_bytes(model: nn.Module, opt) -> dict:
    """Weights, gradients and optimizer states this rank holds now (bytes), from its local
    tensors: ``params``, ``gradients``, ``optimizer``, ``total``."""
    params = list(model.parameters())
    out = {"params": sum(_bytes(p) for p in params),
           "gradients": sum(_bytes(p.grad) for p in params)}
    if isinstance(opt, ZeRO1):
        out["optimizer"] = opt.state_bytes()
    else:
        out["optimizer"] = sum(_bytes(v) for state in opt.state.values() for v in state.values()
                               if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["gradients"] + out["optimizer"]
    return out
