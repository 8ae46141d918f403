"""Rank side: the same model under DDP, under hand-written ZeRO-1 and ZeRO-2 optimizers, and
under FSDP2; and the bytes each rank really holds.

* :func:`wrap_ddp` -- ``DistributedDataParallel``: every rank holds all weights, gradients and
  Adam states; backward all-reduces the gradients.
* :class:`ZeRO1` -- **the teaching version** of ZeRO stage 1 (the sharded optimizer of
  CS336's assignment): the parameters live in one flat buffer, rank r owns the r-th 1/N of it;
  a step reduce-scatters the flat gradients (each rank gets the average of its slice), runs
  Adam on its slice with its slice of the moments, and all-gathers the updated slices. Adam's
  moments, 8 of the 16 bytes a parameter, are 1/N per rank; weights and gradients stay whole.
* :class:`ZeRO2` -- ZeRO stage 2 by hand: ZeRO-1, and each layer's gradients reduce-scattered
  in backward as soon as they are ready, the rank keeping only its slice (1/N).
* :func:`wrap_fsdp` -- FSDP2: ``torch.distributed.fsdp.fully_shard`` on every layer (a unit:
  one all-gather before its forward, one before its backward, one reduce-scatter after) and
  on the stack; weights, gradients and Adam states are ``Shard(0)`` DTensors, 1/N per rank.
  Works on CPU with gloo (torch 2.13, 2 ranks checked) and on GPUs with nccl.
* :func:`collectives_alone` -- a step's collectives with nothing around them, to time them;
* :func:`held_bytes` -- weights, gradients and optimizer states this rank holds, summed over
  its local tensors (DTensors count their local shard only).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
from torch import nn

from labkit.tp.comm import all_gather_tensor as _all_gather
from labkit.tp.comm import reduce_scatter_tensor as _reduce_scatter
from labkit.tp.models import local_tensor


def _collective(opt, name: str, op: str, run) -> None:
    """``run()``, a collective of a hand-written ZeRO optimizer, through its ``recorder``
    (:class:`labkit.fsdp.record.StepRecorder`: stamped for the trace) where it has one."""
    if opt.recorder is None:
        run()
    else:
        opt.recorder.collective(name, op, run)


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


#: torch.optim.Adam's defaults, the hand-written ZeRO optimizers' too
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


def adam_update(param, grad, exp_avg, exp_avg_sq, *, step: int, lr: float, betas, eps: float):
    """One Adam step on ``param`` in place, ``torch.optim.Adam``'s arithmetic element by
    element (the hand-written ZeRO optimizers train exactly as DDP + Adam does)."""
    b1, b2 = betas
    exp_avg.lerp_(grad, 1 - b1)
    exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - b1 ** step))


class ZeRO1:
    """Adam with its moments sharded over the ranks (ZeRO stage 1), written out.

    Arithmetic is ``torch.optim.Adam``'s (defaults: betas 0.9, 0.999, eps 1e-8), element by
    element, so the model trains exactly as under DDP + Adam. ``keep_grad_shard`` keeps the last
    averaged gradient slice (``last_grad_shard``) for checks; off, nothing but the moments
    outlives a step.
    """

    def __init__(self, model: nn.Module, *, lr: float, rank: int, world_size: int,
                 betas=ADAM_BETAS, eps: float = ADAM_EPS, group=None):
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
        #: called as ``probe(label, tensors)`` with the transient buffers of a reduce-scatter,
        #: at the moment they are all alive (:class:`labkit.fsdp.peak.StepMemory` counts them)
        self.probe = None
        #: stamps each collective for the trace (:class:`labkit.fsdp.record.StepRecorder`)
        self.recorder = None

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
            if self.probe is not None:
                self.probe("zero1 reduce-scatter", (flat,))
            return flat
        out = torch.empty(self.shard_size, dtype=flat.dtype, device=flat.device)
        _collective(self, "RS all layers", "reduce_scatter", functools.partial(
            _reduce_scatter, out, flat, op=dist.ReduceOp.SUM, group=self.group))
        if self.probe is not None:
            self.probe("zero1 reduce-scatter", (flat, out))
        return out.div_(self.world_size)

    @torch.no_grad()
    def step(self) -> None:
        g = self._grad_shard()
        if self.keep_grad_shard:
            self.last_grad_shard = g.clone()
        self.steps += 1
        adam_update(self.shard, g, self.exp_avg, self.exp_avg_sq, step=self.steps, lr=self.lr,
                    betas=self.betas, eps=self.eps)
        if self.world_size > 1:  # every rank gets every updated slice: the parameters again
            _collective(self, "AG all layers", "all_gather", functools.partial(
                _all_gather, self.flat, self.shard.clone(), group=self.group))

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: its slice of m and v."""
        return sum(t.numel() * t.element_size() for t in (self.exp_avg, self.exp_avg_sq))


class ZeRO2:
    """ZeRO stage 2 written out: ZeRO-1's sharded Adam, the gradients sharded too.

    Each layer of ``buckets`` (a bucket) keeps its parameters in one flat buffer padded to N
    equal slices (they become views into it); rank r owns the r-th slice of every bucket. As
    soon as backward has produced every gradient of a bucket (a post-accumulate-grad hook on
    each parameter), the rank reduce-scatters the bucket's flat gradient, keeps the average of
    its slice (``grad_shards``) and drops the full gradients: the whole gradient never exists,
    at most one bucket's beside 4Ψ/N of slices. The step runs Adam on every slice (the moments
    are 1/N too) and all-gathers every bucket: 2 collectives per bucket, 2 x 4Ψ as ZeRO-1.
    Adam's arithmetic is ``torch.optim.Adam``'s (:func:`adam_update`).
    """

    def __init__(self, buckets, *, lr: float, rank: int, world_size: int,
                 betas=ADAM_BETAS, eps: float = ADAM_EPS, group=None):
        self.buckets = [[p for p in m.parameters() if p.requires_grad] for m in buckets]
        self.params = [p for bucket in self.buckets for p in bucket]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.rank, self.world_size, self.group = rank, world_size, group
        self.flats, self.shards, self.sizes = [], [], []
        with torch.no_grad():
            for bucket in self.buckets:
                k = math.ceil(sum(p.numel() for p in bucket) / world_size)
                flat = torch.zeros(k * world_size, dtype=bucket[0].dtype,
                                   device=bucket[0].device)
                offset = 0
                for p in bucket:
                    n = p.numel()
                    flat[offset:offset + n].copy_(p.reshape(-1))
                    p.data = flat[offset:offset + n].view_as(p)
                    offset += n
                self.flats.append(flat)
                self.shards.append(flat[rank * k:(rank + 1) * k])  # a view: this rank's slice
                self.sizes.append(k)
        self.exp_avg = [torch.zeros_like(s) for s in self.shards]
        self.exp_avg_sq = [torch.zeros_like(s) for s in self.shards]
        self.steps = 0
        self.probe = None  # as ZeRO1's: the transient buffers of each reduce-scatter
        self.recorder = None  # as ZeRO1's: stamps each collective for the trace
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.zero_grad()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient and slice (ZeRO-2 keeps no full gradient to zero)."""
        for p in self.params:
            p.grad = None
        self.grad_shards: list = [None] * len(self.buckets)
        self._pending = [len(b) for b in self.buckets]

    def _ready(self, p) -> None:
        i = self._bucket_of[id(p)]
        self._pending[i] -= 1
        if self._pending[i] == 0:  # the bucket's last gradient: reduce it now, in backward
            self._pending[i] = len(self.buckets[i])
            self._reduce(i)

    @torch.no_grad()
    def _reduce(self, i: int) -> None:
        bucket, k = self.buckets[i], self.sizes[i]
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        if flat.numel() < k * self.world_size:
            flat = torch.cat([flat, flat.new_zeros(k * self.world_size - flat.numel())])
        out = flat
        if self.world_size > 1:
            out = torch.empty(k, dtype=flat.dtype, device=flat.device)
            _collective(self, f"RS L{i}", "reduce_scatter", functools.partial(
                _reduce_scatter, out, flat, op=dist.ReduceOp.SUM, group=self.group))
            out.div_(self.world_size)
        if self.probe is not None:
            self.probe(f"zero2 reduce-scatter {i}", (flat, out))
        # accumulate across backwards (gradient accumulation) as .grad would
        self.grad_shards[i] = out if self.grad_shards[i] is None else self.grad_shards[i] + out
        for p in bucket:
            p.grad = None  # the full gradient is gone

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        for i, shard in enumerate(self.shards):
            adam_update(shard, self.grad_shards[i], self.exp_avg[i], self.exp_avg_sq[i],
                        step=self.steps, lr=self.lr, betas=self.betas, eps=self.eps)
            if self.world_size > 1:
                _collective(self, f"AG L{i}", "all_gather", functools.partial(
                    _all_gather, self.flats[i], shard.clone(), group=self.group))

    def grad_shard(self) -> torch.Tensor:
        """This rank's averaged gradient slices, bucket after bucket."""
        return torch.cat(list(self.grad_shards))

    def shard_of(self, full) -> torch.Tensor:
        """This rank's slices of whole per-parameter tensors ``full`` (in :attr:`params`'
        order), laid out as :meth:`grad_shard`: what the checks compare it with."""
        it, out = iter(full), []
        for bucket, k in zip(self.buckets, self.sizes):
            flat = torch.cat([next(it).reshape(-1) for _ in bucket])
            out.append(flat[self.rank * k:(self.rank + 1) * k])
        return torch.cat(out)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: its slices of m and v."""
        return sum(t.numel() * t.element_size() for t in (*self.exp_avg, *self.exp_avg_sq))


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
    if isinstance(opt, ZeRO2):  # its gradients are the slices it keeps
        out["gradients"] += sum(_bytes(g) for g in opt.grad_shards)
    if isinstance(opt, (ZeRO1, ZeRO2)):
        out["optimizer"] = opt.state_bytes()
    else:
        out["optimizer"] = sum(_bytes(v) for state in opt.state.values() for v in state.values()
                               if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["gradients"] + out["optimizer"]
    return out
