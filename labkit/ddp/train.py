"""Rank side: one optimizer step, and DistributedDataParallel with the lab's four knobs.

The step is the thing measured, so it is plain: zero the gradients, forward, cross-entropy,
backward (under DDP the gradient all-reduce runs *inside* backward, bucket by bucket, as soon as
a bucket's gradients are ready), optimizer step. No clock reads here: callers time the step with
:func:`labkit.timing.repeat_timed`, and ``benchmarks/ddp_bench.py`` checks that this costs
nothing against a bare loop. The one exception is opt-in: a :class:`CommTimeline` handed to
:func:`make_step` records when backward and each bucket's all-reduce ran.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import timing
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


class CommTimeline:
    """When a DDP model's backward and its buckets' all-reduces ran, step by step (rank side).

    Registers on ``ddp`` (before its first step) a comm hook that does what DDP's default
    does, divide the bucket by N and all-reduce it, and notes when each all-reduce was
    launched and when its future completed, and a hook on every parameter that notes when
    its gradient was accumulated: the last of them is the end of backward's computing
    (``loss.backward()`` itself returns only after DDP has waited for every all-reduce).
    :func:`make_step` marks the step's start, backward's start and the step's end.

    On a CPU the marks are ``time.perf_counter()`` read where they happen (the completion
    in the future's callback, on gloo's thread); on CUDA they are events recorded on the
    current stream (the completion's in the callback, whose stream waits for the
    all-reduce), turned into times by :meth:`records` after a synchronisation.
    """

    def __init__(self, ddp: DDP, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.world = dist.get_world_size()
        self._steps: list[dict] = []
        self._now: dict | None = None
        ddp.register_comm_hook(self, _timed_allreduce)
        for p in ddp.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _mark(self):
        return timing.stamp("cuda" if self.cuda else "cpu")

    def begin(self, *, nosync: bool) -> None:
        self._now = {"nosync": nosync, "start": self._mark(), "comm": {}}

    def backward_start(self) -> None:
        if self._now is not None:
            self._now["backward_start"] = self._mark()

    def end(self) -> None:
        if self._now is not None:
            self._now["end"] = self._mark()
            self._steps.append(self._now)
            self._now = None

    def _grad_ready(self, _param) -> None:
        if self._now is not None:
            self._now["backward_end"] = self._mark()

    def launched(self, index: int):
        """A bucket's all-reduce is launched now: the slot its completion fills."""
        slot = [self._mark(), None]
        if self._now is not None:
            self._now["comm"][index] = slot
        return slot

    def records(self, *, nosync: bool, last: int) -> list[dict]:
        """The ``last`` recorded steps of one kind (``no_sync`` or DDP), times in seconds from
        each step's start: ``backward_start_s``, ``backward_end_s``, ``step_end_s`` and
        ``comm_intervals_s`` (one ``[launched, completed]`` per bucket, by bucket index)."""
        if self.cuda:
            torch.cuda.synchronize()
        chosen = [s for s in self._steps if s["nosync"] == nosync][-last:] if last > 0 else []
        return [self._seconds(s) for s in chosen]

    def _seconds(self, s: dict) -> dict:
        t0 = s["start"]

        def since(mark) -> float:
            return timing.seconds_between(t0, mark)

        return {"backward_start_s": since(s["backward_start"]),
                "backward_end_s": since(s["backward_end"]),
                "step_end_s": since(s["end"]),
                "comm_intervals_s": [[since(a), since(b)]
                                     for _, (a, b) in sorted(s["comm"].items())]}


def _timed_allreduce(timeline, bucket):
    """DDP's default comm hook (divide by N, all-reduce), with its launch and completion
    noted in ``timeline``. Unannotated: DDP refuses the string annotations of this module."""
    tensor = bucket.buffer()
    tensor.div_(timeline.world)
    slot = timeline.launched(bucket.index())
    fut = dist.all_reduce(tensor, async_op=True).get_future()

    def done(f):
        slot[1] = timeline._mark()
        return f.value()[0]

    return fut.then(done)


def make_step(model: nn.Module, opt: torch.optim.Optimizer, batches, *,
              no_sync: bool = False, set_to_none: bool = True,
              timeline: CommTimeline | None = None) -> Callable[[], float]:
    """A closure doing one training step on the next batch (cycling); returns nothing useful.

    ``no_sync`` (DDP only) runs the step inside ``model.no_sync()``: forward and backward are the
    same but the gradient all-reduce is skipped, so its time is the step's compute alone.
    ``set_to_none=False`` zeroes gradients in place: with ``gradient_as_bucket_view`` the
    gradients *are* views into DDP's buckets, and dropping them would undo that.
    ``timeline``: the model's :class:`CommTimeline`, marked at the step's start, backward's
    start and the step's end.
    """
    loss_fn = nn.CrossEntropyLoss()
    state = {"i": 0}
    mark = timeline if timeline is not None else _NO_TIMELINE

    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        mark.begin(nosync=no_sync)
        opt.zero_grad(set_to_none=set_to_none)
        with model.no_sync() if no_sync else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
            mark.backward_start()
            loss.backward()
        opt.step()
        mark.end()

    return step


class _NoTimeline:
    """What :func:`make_step` marks when nothing records: nothing."""

    def begin(self, *, nosync: bool) -> None:
        pass

    def backward_start(self) -> None:
        pass

    def end(self) -> None:
        pass


_NO_TIMELINE = _NoTimeline()


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
