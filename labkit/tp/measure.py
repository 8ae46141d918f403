"""Rank side: what the TP and FSDP labs measure besides step times.

* :class:`CommCounter` -- counts the collectives torch issues while it is active, with their
  bytes: a ``TorchDispatchMode`` that sees the ``c10d`` and ``_c10d_functional`` operators
  through which ``torch.distributed``, DTensor (tensor parallelism), FSDP2 and DDP all
  communicate, as ``torch.distributed.tensor.debug.CommDebugMode`` does (which counts calls
  only). Python sees every operator while it is on, so the labs count one step under it and
  time the others without it.
* :func:`fit_link` -- α and β from a quick all-reduce size sweep in the same launch
  (:func:`labkit.collectives.formulas.fit_alpha_beta`).
* :func:`compute_rate` -- FLOP/s of forward + backward of one layer of the model (whole, or a
  TP rank's share of it) on this rank alone, the slowest rank's.
* :func:`max_rel_error` -- how far a split model's tensors are from the single-process ones.
* :func:`timed_steps` -- the timed steps of a variant, the slowest rank's.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from labkit import timing

#: operator name -> the collective it is (buffer convention of nccl-tests: the all-reduce
#: buffer, the all-gather output, the reduce-scatter input)
_COLLECTIVES = {
    "_c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce_": "all_reduce",
    "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional.broadcast": "broadcast",
    "_c10d_functional.all_to_all_single": "all_to_all",
    "c10d.allreduce_": "all_reduce",
    "c10d.allreduce_coalesced_": "all_reduce",
    "c10d._allgather_base_": "all_gather",
    "c10d.allgather_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.reduce_scatter_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d.broadcast_": "broadcast",
    "c10d.alltoall_": "all_to_all",
    "c10d.alltoall_base_": "all_to_all",
}


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _buffer_bytes(name: str, op: str, args) -> int:
    """S of one collective call, nccl-tests' convention, from its operator's arguments."""
    if name.startswith("_c10d_functional."):
        first = _nbytes(args[0])
        if op == "all_gather":  # (input, group_size, group): the output is group_size inputs
            return first * int(args[1])
        return first
    if name in ("c10d._reduce_scatter_base_",):  # (output, input, ...)
        return _nbytes(args[1])
    if name in ("c10d.reduce_scatter_",):  # (outputs, [inputs per rank], ...)
        return _nbytes(args[1])
    if name == "c10d.allgather_":  # ([[outputs per rank]], [inputs], ...)
        return _nbytes(args[0])
    if name == "c10d.reduce_scatter_tensor_coalesced_":
        return _nbytes(args[1])
    return _nbytes(args[0])


class CommCounter(TorchDispatchMode):
    """Counts collective calls and their buffer bytes per op while active (``with``).

    ``calls`` and ``bytes`` are Counters keyed by ``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ... The bytes follow nccl-tests: the all-reduce buffer, the all-gather
    output and the reduce-scatter input (S), so an all-gather of S and a reduce-scatter of S
    each move (N−1)/N·S per rank, an all-reduce of S twice that.
    """

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()
        self.bytes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        # let DTensor turn its op into local ops and collectives first; those come back here
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        name = str(func._overloadpacket)
        op = _COLLECTIVES.get(name)
        if op is not None:
            self.calls[op] += 1
            self.bytes[op] += _buffer_bytes(name, op, args)
        return out

    def volume_bytes(self) -> int:
        """Communication volume in the ZeRO paper's convention: an all-reduce of S counts 2S
        (a reduce-scatter then an all-gather), an all-gather or reduce-scatter of S counts S."""
        return sum((2 if op == "all_reduce" else 1) * b for op, b in self.bytes.items())


def fit_link(rt, *, max_bytes: int, min_bytes: int = 4096, factor: int = 4, iters: int = 3,
             warmup: int = 1) -> dict:
    """α (s) and β (B/s) of this launch's all-reduce, from a size sweep ``min_bytes`` ..
    ``max_bytes`` (× ``factor``; at least up to 4 MiB, where the bandwidth term dominates), p50
    of the slowest rank. Collective: every rank calls it. A sweep the α–β law cannot fit (no
    bandwidth term: a busy machine's noise) is measured once more with twice the iterations;
    a world of one, or a second failure, gives NaN (no prediction then)."""
    from labkit.collectives.formulas import fit_alpha_beta
    from labkit.errors import UsageError

    if rt.world_size == 1:
        return {"alpha_s": math.nan, "beta_bytes_per_s": math.nan, "sweep": []}
    max_bytes = max(max_bytes, 4 << 20)
    for attempt in range(2):
        sizes, times = [], []
        size = min_bytes
        while True:
            buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=rt.device)
            local = timing.repeat_timed(lambda b=buf: dist.all_reduce(b), warmup=warmup,
                                        repeat=iters * (attempt + 1), device=rt.device)
            sizes.append(buf.numel() * 4)
            times.append(timing.summarize(local, prefix="t")["t_p50_s"])
            if size >= max_bytes:
                break
            size = min(size * factor, max_bytes)
        try:  # every rank holds the same times (the slowest rank's): the same outcome
            alpha, beta = fit_alpha_beta("all_reduce", rt.world_size, sizes=sizes, times=times)
            break
        except UsageError:
            alpha = beta = math.nan
    return {"alpha_s": alpha, "beta_bytes_per_s": beta,
            "sweep": [{"size_bytes": s, "time_p50_s": t} for s, t in zip(sizes, times)]}


def layer_seconds(*, hidden: int, num_heads: int, batch_size: int, seq_len: int,
                  device, split: int = 1, repeat: int = 3, warmup: int = 1) -> float:
    """Median seconds of forward + backward of one layer of the lab's model
    (:class:`labkit.tp.models.Layer`) on this rank, ``split`` ways (``1/split`` of the heads
    and of the 4h units: a TP rank's share), on ``batch_size`` x ``seq_len`` tokens. Not
    collective: the caller decides who computes meanwhile."""
    import statistics

    from labkit.tp.models import Layer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        layer = Layer(hidden, num_heads, split).to(device)
        x = torch.randn(batch_size, seq_len, hidden, device=device, requires_grad=True)
    go = torch.ones_like(x)

    def fwd_bwd():
        layer(x).backward(go)

    return statistics.median(timing.repeat_timed(fwd_bwd, warmup=warmup, repeat=repeat,
                                                 device=device, barrier=False))


def compute_rate(rt, *, hidden: int, num_heads: int, batch_size: int, seq_len: int,
                 split: int = 1) -> float:
    """FLOP/s of forward + backward of one layer of the lab's model as one rank computes it,
    ``split`` ways (:func:`layer_seconds`): its ``3 (24 b s h² + 4 b s² h) / split`` FLOPs over
    its median time, **alone**: the ranks take turns while the others wait in a barrier (a
    step model multiplies by the machine's co-run slowdown where ranks compute at once). The
    slowest rank's rate. A rate of the model's own layer, so LayerNorm, softmax and GELU,
    which the FLOP count leaves out, are in it. Collective."""
    from labkit.tp.formulas import flops_per_rank

    slowest = timing.in_turns(rt, lambda: layer_seconds(
        hidden=hidden, num_heads=num_heads, batch_size=batch_size, seq_len=seq_len,
        device=rt.device, split=split))
    return flops_per_rank(batch_size=batch_size, seq_len=seq_len, hidden=hidden, num_layers=1,
                          world_size=split) / slowest


def max_rel_error(pairs, scale: float | None = None) -> float:
    """Largest ``max|a − b| / scale`` over (got, expected) tensor pairs: 0 for identical.

    ``scale`` defaults to each expected tensor's own ``max|b|``. Give one scale to a group of
    tensors (every weight gradient of a model): a gradient that is zero in exact arithmetic
    (the key bias's: softmax ignores a shift shared by a query's scores) holds rounding noise
    only, and measured against its own size that noise would look like a 100% error.
    """
    worst = 0.0
    for got, want in pairs:
        got, want = got.detach().double(), want.detach().double()
        if got.shape != want.shape:
            return math.inf
        if not want.numel():
            continue
        norm = float(want.abs().max()) if scale is None else scale
        err = float((got - want).abs().max())
        worst = max(worst, err / norm if norm > 0 else err)
    return worst


def timed_steps(step, rt, *, repeat: int, prefix: str = "step_time",
                rank_p50: bool = False) -> tuple[dict, list]:
    """``repeat`` timed calls of ``step`` on every rank, no warm-up (the caller's steps before
    were it): the summary of the slowest rank's times (:func:`labkit.timing.summarize`) and
    the slowest rank's time of every step; with ``rank_p50`` also every rank's own median
    (``{prefix}_rank_p50_s``, a list by rank). Collective."""
    import numpy as np

    local = timing.repeat_timed(step, warmup=0, repeat=repeat, device=rt.device)
    slowest, every = timing.slowest_step_times(local)
    stats = timing.summarize(local, prefix=prefix)
    if rank_p50:
        stats[f"{prefix}_rank_p50_s"] = [float(np.median(r)) for r in every]
    return stats, [float(t) for t in slowest]
