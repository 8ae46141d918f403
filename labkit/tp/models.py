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
  call, byte and second in a :class:`labkit.tp.comm.Comm`.
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

import torch
import torch.nn.functional as F
from torch import nn

from labkit.tp.comm import Comm

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
        y = self.core(self.q(x), self.k(x), self.v(x))
        return self.o(y) if out_bias else F.linear(y, self.o.weight)

    def core(self, q, k, v):
        """The attention of projected q, k, v (b, s, width): causal softmax(q kᵀ/√d) v per
        head, heads side by side again (b, s, width)."""
        b, s, _ = q.shape
        # -1 heads: a split module holds num_heads / P of them, the library's local tensors too
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, -1)


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

class CopyToTP(torch.autograd.Function):
    """Megatron's **f**: the block's input goes to every rank as it is (identity forward); each
    rank's slice of q, k, v (or of the MLP's first layer) sends back a partial input gradient,
    so backward all-reduces it. ``name`` and ``before`` label the all-reduce in the trace
    (:meth:`labkit.tp.comm.Comm.collective`)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, name: str = "f", before: str = "compute"):
        ctx.comm, ctx.name, ctx.before = comm, name, before
        return x

    @staticmethod
    def backward(ctx, grad):
        return (ctx.comm.all_reduce(grad.contiguous(), name=ctx.name, before=ctx.before,
                                    phase="backward"), None, None, None)


class ReduceFromTP(torch.autograd.Function):
    """Megatron's **g**: each rank's slice of o (or of the MLP's second layer) gives a partial
    sum of the block's output, so forward all-reduces it; the gradient of a sum reaches every
    term unchanged (identity backward)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, name: str = "g", before: str = "compute"):
        return comm.all_reduce(x, name=name, before=before, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


class NaiveTPLayer(Layer):
    """The teaching version of a TP layer: local slices, f before and g after each block; the
    row-parallel biases are added once, after g (added on every rank before it, they would be
    summed P times). ``index`` and ``num_layers`` name its collectives and the compute between
    them in the trace (``g L0 attn``: g after layer 0's attention)."""

    def __init__(self, hidden: int, num_heads: int, world_size: int, comm: Comm, *,
                 index: int = 0, num_layers: int = 1):
        super().__init__(hidden, num_heads, world_size)
        self.comm, self.index, self.num_layers = comm, index, num_layers

    def forward(self, x):
        i, comm = self.index, self.comm
        # backward reaches this layer's MLP after the loss (the last layer) or after the
        # LayerNorm of the layer above
        mlp_bwd = f"{'loss + ' if i == self.num_layers - 1 else ''}L{i} mlp bwd"
        a = self.attn(CopyToTP.apply(self.ln1(x), comm, f"f L{i} attn", f"L{i} attn bwd"),
                      out_bias=False)
        x = x + ReduceFromTP.apply(a, comm, f"g L{i} attn", f"L{i} attn fwd") + self.attn.o.bias
        m = self.mlp(CopyToTP.apply(self.ln2(x), comm, f"f L{i} mlp", mlp_bwd), out_bias=False)
        return x + ReduceFromTP.apply(m, comm, f"g L{i} mlp", f"L{i} mlp fwd") + self.mlp.fc2.bias


#: the compute after the teaching version's last collective (f before layer 0's attention)
NAIVE_TAIL = "L0 ln1 bwd + optimizer"


def shard_dim(name: str) -> int | None:
    """The dimension TP cuts parameter ``name`` along (``layers.0.attn.q.weight`` -> 0)."""
    return SHARD_DIM.get(name.split(".", 2)[-1] if name.startswith("layers.") else name)


def local_slice(full: torch.Tensor, dim: int | None, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``full`` along ``dim`` (contiguous equal chunks; all of it for
    ``None``)."""
    return full if dim is None or world_size == 1 else full.chunk(world_size, dim=dim)[rank]


def naive_tp_model(full: Stack, rank: int, world_size: int, comm: Comm, *,
                   layer=None) -> Stack:
    """The teaching version of ``full``: every layer a :class:`NaiveTPLayer` (or ``layer``,
    a class of the same signature: :class:`labkit.tp.sp.SPLayer`) holding this rank's slices
    (copies) of ``full``'s weights."""
    first = full.layers[0]
    hidden, num_heads = first.ln1.normalized_shape[0], hidden_heads(first)
    device = first.ln1.weight.device
    kind = NaiveTPLayer if layer is None else layer
    n = len(full.layers)
    model = Stack([kind(hidden, num_heads, world_size, comm, index=i, num_layers=n)
                   for i in range(n)]).to(device)
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
