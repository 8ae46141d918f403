"""Rank side: the lab's transformer layer, whole and split across tensor-parallel ranks.

* :class:`Layer` -- Megatron's layer, ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``, with
  separate q, k, v, o projections and an MLP h → 4h → h. :func:`build_model` stacks
  ``num_layers`` of them from a seed, so every rank builds the same weights; the whole stack is
  also the single-process reference every split is checked against.
* **The teaching version** (:class:`NaiveTPLayer`, :func:`naive_tp_model`): each rank keeps
  its slice of the weights (q, k, v and the MLP's first layer by output rows, i.e. by heads
  and by the 4h units; o and the MLP's second layer by input columns) and two autograd
  functions do all the communication: :class:`CopyToTP` (Megatron's **f**: identity forward,
  all-reduce of the gradient backward) before each block, :class:`ReduceFromTP` (**g**:
  all-reduce of the partial outputs forward, identity backward) after it. They count every
  call, byte and second in a :class:`Comm`.
* **The library version** (:func:`library_tp_model`): the same split by
  ``torch.distributed.tensor.parallel.parallelize_module`` on a 1-D ``DeviceMesh``:
  ``ColwiseParallel`` for q, k, v and the MLP's first layer, ``RowwiseParallel`` for o and the
  MLP's second layer, and ``PrepareModuleInput`` on the attention block so that its input
  becomes one replicated DTensor shared by q, k and v: then the three input gradients add up
  before a single all-reduce, as Megatron's f does (without it each of q, k, v reduces its own,
  6 all-reduces per layer instead of 4).

Both run on CPU with gloo (checked at 2 ranks with torch 2.13) and on GPUs with nccl.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

#: which dimension of a parameter the TP split cuts (``None``: every rank keeps it whole)
SHARD_DIM = {
    "attn.q.weight": 0, "attn.q.bias": 0, "attn.k.weight": 0, "attn.k.bias": 0,
    "attn.v.weight": 0, "attn.v.bias": 0, "attn.o.weight": 1,
    "mlp.fc1.weight": 0, "mlp.fc1.bias": 0, "mlp.fc2.weight": 1,
}


class Attention(nn.Module):
    """Causal multi-head self-attention; with ``world_size`` P > 1 it holds 1/P of the heads."""

    def __init__(self, hidden: int, num_heads: int, world_size: int = 1):
        super().__init__()
        self.head_dim = hidden // num_heads
        width = hidden // world_size
        self.q = nn.Linear(hidden, width)
        self.k = nn.Linear(hidden, width)
        self.v = nn.Linear(hidden, width)
        self.o = nn.Linear(width, hidden)

    def forward(self, x, out_bias: bool = True):
        b, s, _ = x.shape
        # -1 heads: a split module holds num_heads / P of them, the library's local tensors too
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, -1)
        return self.o(y) if out_bias else F.linear(y, self.o.weight)


class MLP(nn.Module):
    """h → 4h → h with GELU; with ``world_size`` P > 1 it holds 1/P of the 4h units."""

    def __init__(self, hidden: int, world_size: int = 1):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden // world_size)
        self.fc2 = nn.Linear(4 * hidden // world_size, hidden)

    def forward(self, x, out_bias: bool = True):
        y = F.gelu(self.fc1(x))
        return self.fc2(y) if out_bias else F.linear(y, self.fc2.weight)


class Layer(nn.Module):
    """One transformer layer, pre-LayerNorm, no dropout."""

    def __init__(self, hidden: int, num_heads: int, world_size: int = 1):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, num_heads, world_size)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, world_size)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Stack(nn.Module):
    """``num_layers`` layers, one after the other. ``checkpoint = True`` (activation
    checkpointing): each layer keeps only its input for backward and runs its forward again
    there (``torch.utils.checkpoint``, non-reentrant: FSDP2 and DDP compose with it)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.checkpoint = False

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpoint else layer(x)
        return x


def build_model(*, hidden: int, num_heads: int, num_layers: int, seed: int,
                device: torch.device | str = "cpu") -> Stack:
    """The whole model from ``seed``: every rank building it holds the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Stack([Layer(hidden, num_heads) for _ in range(num_layers)])
    return model.to(device)


def synthetic_batch(*, batch_size: int, seq_len: int, hidden: int, seed: int, rank: int = 0,
                    device: torch.device | str = "cpu"):
    """(inputs, targets) of shape (b, s, h), seeded by (seed, rank). The inputs stand for the
    output of the layers below (an embedding): they require a gradient, so the first layer's
    f all-reduces one, as every other layer's does."""
    g = torch.Generator(device="cpu")
    g.manual_seed(1_000_003 * seed + 7_919 * rank + 17)
    x = torch.randn(batch_size, seq_len, hidden, generator=g)
    y = torch.randn(batch_size, seq_len, hidden, generator=g)
    return x.to(device), y.to(device)


def loss_fn(out, target):
    return F.mse_loss(out, target)


# ---------------------------------------------------------------- the teaching version

class Comm:
    """What the f and g functions of one model did: all-reduce calls, bytes (the buffers,
    nccl-tests' S) and :attr:`seconds` spent inside ``dist.all_reduce``. ``enabled=False``
    turns f and g into identities: the same arithmetic on the local shards, no communication
    (the compute-only step; its results are wrong on purpose).

    On a CPU each call is timed on the host clock. On CUDA (``device``) a pair of events on
    the current stream brackets it, read when :attr:`seconds` is asked for (once the device is
    idle): a synchronisation around every all-reduce would stall the step it sits in.
    :meth:`timeline` gives every call's entry and exit on this rank's clock, so that the time
    inside can be split into the message and the wait for a later rank
    (:func:`labkit.tp.timeline.split_waits`)."""

    def __init__(self, world_size: int, device: torch.device | None = None, group=None):
        self.enabled = world_size > 1
        self.device = device
        self.group = group
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.bytes = 0
        self._host: list = []  # (entry, exit) on the host clock
        self._events: list = []
        self._anchor = None

    @property
    def seconds(self) -> float:
        """Seconds inside the all-reduces since :meth:`reset`."""
        return sum(b - a for a, b in self.timeline())

    def timeline(self) -> list[tuple[float, float]]:
        """(entry, exit) of every all-reduce since :meth:`reset`, seconds on this rank's clock
        (CUDA: from an event recorded at the first call; read once the device is idle)."""
        if self._events:
            a0 = self._anchor
            return [(a0.elapsed_time(a) / 1e3, a0.elapsed_time(b) / 1e3)
                    for a, b in self._events]
        return list(self._host)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return t
        self.calls += 1
        self.bytes += t.numel() * t.element_size()
        if self.device is not None and self.device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            if self._anchor is None:
                self._anchor = start
            dist.all_reduce(t, group=self.group)
            end.record()
            self._events.append((start, end))
            return t
        t0 = time.perf_counter()
        dist.all_reduce(t, group=self.group)
        self._host.append((t0, time.perf_counter()))
        return t


class CopyToTP(torch.autograd.Function):
    """Megatron's **f**: the block's input goes to every rank as it is (identity forward); each
    rank's slice of q, k, v (or of the MLP's first layer) sends back a partial input gradient,
    so backward all-reduces it."""

    @staticmethod
    def forward(ctx, x, comm: Comm):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.contiguous()), None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's **g**: each rank's slice of o (or of the MLP's second layer) gives a partial
    sum of the block's output, so forward all-reduces it; the gradient of a sum reaches every
    term unchanged (identity backward)."""

    @staticmethod
    def forward(ctx, x, comm: Comm):
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class NaiveTPLayer(Layer):
    """The teaching version of a TP layer: local slices, f before and g after each block; the
    row-parallel biases are added once, after g (added on every rank before it, they would be
    summed P times)."""

    def __init__(self, hidden: int, num_heads: int, world_size: int, comm: Comm):
        super().__init__(hidden, num_heads, world_size)
        self.comm = comm

    def forward(self, x):
        a = self.attn(CopyToTP.apply(self.ln1(x), self.comm), out_bias=False)
        x = x + ReduceFromTP.apply(a, self.comm) + self.attn.o.bias
        m = self.mlp(CopyToTP.apply(self.ln2(x), self.comm), out_bias=False)
        return x + ReduceFromTP.apply(m, self.comm) + self.mlp.fc2.bias


def shard_dim(name: str) -> int | None:
    """The dimension TP cuts parameter ``name`` along (``layers.0.attn.q.weight`` -> 0)."""
    return SHARD_DIM.get(name.split(".", 2)[-1] if name.startswith("layers.") else name)


def local_slice(full: torch.Tensor, dim: int | None, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``full`` along ``dim`` (contiguous equal chunks; all of it for
    ``None``)."""
    return full if dim is None or world_size == 1 else full.chunk(world_size, dim=dim)[rank]


def naive_tp_model(full: Stack, rank: int, world_size: int, comm: Comm) -> Stack:
    """The teaching version of ``full``: every layer a :class:`NaiveTPLayer` holding this
    rank's slices (copies) of ``full``'s weights."""
    first = full.layers[0]
    hidden, num_heads = first.ln1.normalized_shape[0], hidden_heads(first)
    device = first.ln1.weight.device
    model = Stack([NaiveTPLayer(hidden, num_heads, world_size, comm)
                   for _ in full.layers]).to(device)
    state = {name: local_slice(t, shard_dim(name), rank, world_size).clone()
             for name, t in full.state_dict().items()}
    model.load_state_dict(state)
    return model


def hidden_heads(layer: Layer) -> int:
    """The number of heads of a whole layer."""
    return layer.ln1.normalized_shape[0] // layer.attn.head_dim


# ---------------------------------------------------------------- the library version

def library_tp_model(full: Stack, mesh) -> Stack:
    """A copy of ``full`` split by ``torch.distributed.tensor.parallel`` over ``mesh``
    (1-D). Split weights become DTensors (``Shard(0)`` for column-parallel, ``Shard(1)`` for
    row-parallel weights, ``Replicate()`` for the row-parallel biases); the LayerNorms stay plain
    tensors, computed whole on every rank as in the teaching version."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    model = copy.deepcopy(full)
    plan = {
        # one replicated DTensor input shared by q, k and v: their input gradients add up
        # (Partial) and are all-reduced once, as Megatron's f does
        "attn": PrepareModuleInput(input_layouts=(Replicate(),),
                                   desired_input_layouts=(Replicate(),), use_local_output=False),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)
    return model


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds: a DTensor's local shard, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum, the split weights (DTensors) in one parameter group and the plain
    tensors (the LayerNorms) in another: on CUDA the optimizer's multi-tensor (foreach) path
    refuses to mix the two kinds in one call."""
    split = [p for p in model.parameters() if hasattr(p, "to_local")]
    plain = [p for p in model.parameters() if not hasattr(p, "to_local")]
    groups = [{"params": g} for g in (split, plain) if g]
    return torch.optim.SGD(groups, lr=lr, momentum=0.9)


def make_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
              target: torch.Tensor):
    """A closure doing one training step: zero the gradients, forward (the input requiring a
    gradient, as the output of an embedding would), MSE loss, backward, optimizer step. No
    clock reads: callers time it (``benchmarks/split_bench.py`` checks that this costs nothing
    against a bare loop)."""

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x.detach().requires_grad_(True)), target).backward()
        opt.step()

    return step
