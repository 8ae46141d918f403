"""Rank side: one optimizer step, and DistributedDataParallel with the lab's four knobs.

The step is the thing measured, so it is plain: zero the gradients, forward, cross-entropy,
backward (under DDP the gradient all-reduce runs *inside* backward, bucket by bucket, as soon as
a bucket's gradients are ready), optimizer step. No clock reads here: callers time the step with
:func:`labkit.timing.repeat_timed`, and ``benchmarks/ddp_bench.py`` checks that this costs
nothing against a bare loop.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.ddp.config import DDPConfig


def make_optimizer(model: nn.Module, cfg: DDPConfig) -> torch.optim.Optimizer:
    """SGD with momentum: cheap next to forward/backward, and deterministic."""
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)


def wrap_ddp(model: nn.Module, cfg: DDPConfig, device: torch.device) -> DDP:
    """DDP with the config's knobs. One rank per GPU on CUDA (``device_ids``), none on CPU.

    ``broadcast_buffers`` (rank 0's buffers sent to all ranks before every forward) is spelled
    ``forward_sync_buffers`` from torch 2.13 on, where the old name warns; both are accepted.
    The lab's ranks build identical buffers from one seed, so the initial sync the new
    spelling always does changes nothing.
    """
    buffers = ({"forward_sync_buffers": cfg.broadcast_buffers} if _HAS_FORWARD_SYNC
               else {"broadcast_buffers": cfg.broadcast_buffers})
    return DDP(model,
               device_ids=[device.index] if device.type == "cuda" else None,
               bucket_cap_mb=cfg.bucket_cap_mb,
               static_graph=cfg.static_graph,
               gradient_as_bucket_view=cfg.gradient_as_bucket_view,
               **buffers)


_HAS_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters


def make_step(model: nn.Module, opt: torch.optim.Optimizer, batches, *,
              no_sync: bool = False, set_to_none: bool = True) -> Callable[[], float]:
    """A closure doing one training step on the next batch (cycling); returns nothing useful.

    ``no_sync`` (DDP only) runs the step inside ``model.no_sync()``: forward and backward are the
    same but the gradient all-reduce is skipped, so its time is the step's compute alone.
    ``set_to_none=False`` zeroes gradients in place: with ``gradient_as_bucket_view`` the
    gradients *are* views into DDP's buckets, and dropping them would undo that.
    """
    loss_fn = nn.CrossEntropyLoss()
    state = {"i": 0}

    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.zero_grad(set_to_none=set_to_none)
        with model.no_sync() if no_sync else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()

    return step


def flat_params(model: nn.Module) -> torch.Tensor:
    """Every parameter, flattened into one detached float64 vector (comparisons, not training)."""
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def replica_drift(model: nn.Module) -> float:
    """Largest |difference| of any parameter between any two ranks (0 when in sync).

    Collective: every rank calls it. max over ranks minus min over ranks, element-wise.
    """
    hi = flat_params(model)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0.0
    lo = hi.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).abs().max())


def gather_params(model: nn.Module) -> list[list[float]]:
    """Every rank's flat parameters (rank order), on every rank. For small test models only."""
    mine = flat_params(model)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine.tolist()]
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]
