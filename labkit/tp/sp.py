"""Rank side: sequence parallelism by hand, Megatron's (Korthikanti et al. 2022), the ``sp``
variant of the tensor-parallel lab.

Tensor parallelism leaves the LayerNorms, the residual adds and the loss whole on every rank:
their activations are not split. Sequence parallelism splits them along the sequence: between
the blocks, rank r holds only its s/P tokens (``seq_shard``). Each block then starts with an
**all-gather** along the sequence (the column-parallel linears need every token) instead of f,
and ends with a **reduce-scatter** along the sequence (each rank keeps the sum of the partial
outputs for its own tokens) instead of g's all-reduce:

* :class:`ColumnSP` -- all-gather the LayerNorm's sharded output, then the column-parallel
  linears (q, k, v; the MLP's first). It saves the **sharded** input, not the gathered one,
  and all-gathers it again in backward (Megatron's choice: the s x b x h input would
  otherwise be kept whole on every rank); backward reduce-scatters the input gradient.
* :class:`ScatterSP` -- reduce-scatter the row-parallel linear's partial output (o; the MLP's
  second); backward all-gathers the gradient.

The LayerNorms' weights and the row-parallel biases act on the rank's tokens only, so their
gradients are partial: :func:`sync_replicated_grads` all-reduces them once a step (Megatron's
all-reduce of the sequence-parallel parameters). Per layer and step: 6 all-gathers (2 forward,
2 again in backward, 2 of gradients) and 4 reduce-scatters of b·s·h values, and one
all-reduce of 6h values a layer in all (:func:`labkit.tp.formulas.sp_collectives`). Every
call goes through :class:`labkit.tp.comm.Comm`: counted, timed, named for the trace.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.tp.comm import Comm, all_gather_tensor, reduce_scatter_tensor
from labkit.tp.models import Layer, local_slice, local_tensor, loss_fn, shard_dim

#: the compute after sequence parallelism's last collective (the gradients' all-reduce)
SP_TAIL = "optimizer"


def seq_shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s tokens of a (b, s, h) tensor, a copy of its own (a view would keep, and
    count, the whole tensor's storage)."""
    return local_slice(t, 1, rank, world_size).contiguous()


def seq_gather(t: torch.Tensor, comm: Comm, **label) -> torch.Tensor:
    """Every rank's (b, s/P, h) tokens as one (b, s, h) tensor, in rank order."""
    if not comm.enabled:
        return t
    p, (b, s, h) = comm.world_size, t.shape
    out = t.new_empty(p * b, s, h)  # rank after rank along dim 0: the collective's layout
    src = t.contiguous()
    comm.collective("all_gather", out.numel() * out.element_size(),
                    lambda: all_gather_tensor(out, src, group=comm.group), **label)
    return out.view(p, b, s, h).permute(1, 0, 2, 3).reshape(b, p * s, h)


def seq_scatter(t: torch.Tensor, comm: Comm, **label) -> torch.Tensor:
    """The sum over the ranks of a (b, s, h) tensor, this rank's s/P tokens of it."""
    if not comm.enabled:
        return t
    p, (b, s, h) = comm.world_size, t.shape
    src = t.reshape(b, p, s // p, h).permute(1, 0, 2, 3).reshape(p * b, s // p, h)
    out = t.new_empty(b, s // p, h)
    comm.collective("reduce_scatter", src.numel() * src.element_size(),
                    lambda: reduce_scatter_tensor(out, src, op=dist.ReduceOp.SUM,
                                                  group=comm.group), **label)
    return out


class ColumnSP(torch.autograd.Function):
    """All-gather the sharded input along the sequence, then the column-parallel linears
    ``(w, b)`` pairs given flat after the labels; one output each. Saves the shard; backward
    gathers it again for the weight gradients and reduce-scatters the input gradient."""

    @staticmethod
    def forward(ctx, x, comm: Comm, names: dict, *params):
        ctx.comm, ctx.names = comm, names
        full = seq_gather(x, comm, **names["gather"])
        weights = params[0::2]
        ctx.save_for_backward(x, *weights)
        return tuple(F.linear(full, w, b) for w, b in zip(weights, params[1::2]))

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        full = seq_gather(x, ctx.comm, **ctx.names["regather"])
        tokens = full.reshape(-1, full.shape[-1])
        gx = sum(g @ w for g, w in zip(grads, weights))
        out = []
        for g in grads:
            g2 = g.reshape(-1, g.shape[-1])
            out += [g2.t() @ tokens, g2.sum(0)]
        return (seq_scatter(gx, ctx.comm, **ctx.names["scatter"]), None, None, *out)


class ScatterSP(torch.autograd.Function):
    """Reduce-scatter partial sums along the sequence; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x, comm: Comm, names: dict):
        ctx.comm, ctx.names = comm, names
        return seq_scatter(x, comm, **names["scatter"])

    @staticmethod
    def backward(ctx, grad):
        return seq_gather(grad.contiguous(), ctx.comm, **ctx.names["gather"]), None, None


def _names(i: int, block: str, *, last: bool) -> tuple[dict, dict]:
    """The labels of one block's collectives (:meth:`labkit.tp.comm.Comm.collective`): each
    names itself and the compute that ran before it (``before``), in the order they run."""
    ln = "ln1" if block == "attn" else "ln2"
    first, second = ("qkv", "attn") if block == "attn" else ("fc1", "fc2")
    # backward enters a block through its output's gradient: after the loss (the last
    # layer's MLP), the LayerNorm above (any other MLP) or the MLP's LayerNorm (attention)
    above = ("loss" if last else f"L{i + 1} ln1 bwd") if block == "mlp" else f"L{i} ln2 bwd"
    column = {"gather": dict(name=f"AG L{i} {block}", before=f"L{i} {ln} fwd",
                             phase="forward"),
              "regather": dict(name=f"AG L{i} {block} input again",
                               before=f"L{i} {second} bwd", phase="backward"),
              "scatter": dict(name=f"RS L{i} {block} grad", before=f"L{i} {first} bwd",
                              phase="backward")}
    row = {"scatter": dict(name=f"RS L{i} {block}", before=f"L{i} {block} fwd", phase="forward"),
           "gather": dict(name=f"AG L{i} {block} grad", before=above, phase="backward")}
    return column, row


class SPLayer(Layer):
    """A TP layer with sequence parallelism: input and output are this rank's s/P tokens;
    LayerNorms, residual adds and the row-parallel biases act on them alone."""

    def __init__(self, hidden: int, num_heads: int, world_size: int, comm: Comm, *,
                 index: int = 0, num_layers: int = 1):
        super().__init__(hidden, num_heads, world_size)
        self.comm = comm
        last = index == num_layers - 1
        self.attn_names = _names(index, "attn", last=last)
        self.mlp_names = _names(index, "mlp", last=last)

    def forward(self, x):
        at, mlp, comm = self.attn, self.mlp, self.comm
        q, k, v = ColumnSP.apply(self.ln1(x), comm, self.attn_names[0], at.q.weight, at.q.bias,
                                 at.k.weight, at.k.bias, at.v.weight, at.v.bias)
        a = F.linear(at.core(q, k, v), at.o.weight)
        x = x + ScatterSP.apply(a, comm, self.attn_names[1]) + at.o.bias
        (u,) = ColumnSP.apply(self.ln2(x), comm, self.mlp_names[0], mlp.fc1.weight, mlp.fc1.bias)
        m = F.linear(F.gelu(u), mlp.fc2.weight)
        return x + ScatterSP.apply(m, comm, self.mlp_names[1]) + mlp.fc2.bias


def sync_replicated_grads(model, comm: Comm) -> None:
    """All-reduce, in one buffer, the gradients of the parameters every rank keeps whole (the
    LayerNorms', the row-parallel biases): each rank's are the sum over its tokens only."""
    if not comm.enabled:
        return
    ps = [p for n, p in model.named_parameters() if shard_dim(n) is None and p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in ps])
    comm.all_reduce(flat, name="AR LN + bias grads", before="L0 ln1 bwd", phase="backward")
    offset = 0
    for p in ps:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def sp_loss(out, target, world_size: int):
    """The rank's share of the whole batch's mean loss: its tokens' mean over P (equal shards),
    so that the ranks' losses add up to one process's."""
    return loss_fn(out, target) / world_size


def make_sp_step(model, opt, x, target, comm: Comm):
    """One training step of this rank's tokens ``x``, ``target`` (:func:`seq_shard`): forward,
    its share of the loss, backward, the replicated gradients all-reduced, optimizer step."""

    def step():
        opt.zero_grad(set_to_none=True)
        sp_loss(model(x.detach().requires_grad_(True)), target, comm.world_size).backward()
        sync_replicated_grads(model, comm)
        opt.step()

    return step


def check_sp(model, ref: dict, x, y, rank: int, world_size: int, comm: Comm) -> float:
    """Largest relative difference between the sequence-parallel ``model`` and one process:
    this rank's tokens of the output and of the input gradient, and every weight gradient
    (its slice of the split ones, the replicated ones whole once all-reduced), weight gradients
    against the largest of them (:func:`labkit.tp.measure.max_rel_error`)."""
    from labkit.tp.measure import max_rel_error

    xv = seq_shard(x, rank, world_size).requires_grad_(True)
    out = model(xv)
    sp_loss(out, seq_shard(y, rank, world_size), world_size).backward()
    sync_replicated_grads(model, comm)
    grads = [(local_tensor(p.grad), local_slice(ref["grads"][n], shard_dim(n), rank, world_size))
             for n, p in model.named_parameters()]
    model.zero_grad(set_to_none=True)
    scale = max(float(g.abs().max()) for g in ref["grads"].values())
    mine = [(out, seq_shard(ref["out"], rank, world_size)),
            (xv.grad, seq_shard(ref["x_grad"], rank, world_size))]
    return max(max_rel_error(mine), max_rel_error(grads, scale=scale))
