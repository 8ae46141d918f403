"""Rank side: FSDP2's own work in a step, with nothing on the wire.

:class:`LocalCollectives` swaps every ``fully_shard`` layer's all-gather and reduce-scatter
for a local stand-in (FSDP2's public ``set_custom_all_gather`` / ``set_custom_reduce_scatter``)
while it is entered: an all-gather fills every rank's slot of its output with this rank's
shard, a reduce-scatter keeps this rank's part of its input. What FSDP2 does around its
collectives stays as it was: the copies into and out of the flat buffers, the division of the
gradients, the hooks, the optimizer on DTensors. A step timed so, every rank at once, less the
plain model's step timed the same way, is FSDP2's own work: a term the step model adds where a
1-rank run cannot show it (on one rank FSDP2 skips its copies). The numbers it computes are
wrong (each rank sees its own shard everywhere): it times, it never trains a model kept.
"""

from __future__ import annotations

from labkit.fsdp.record import fsdp_collectives


class _LocalAllGather:
    """An all-gather that moves nothing: every slot of the output gets this rank's shard (a
    write of the whole output, as the collective's own, and no uninitialised values that
    could slow the compute that reads them)."""

    def __init__(self, inner):
        self.inner = inner

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, output_tensor, input_tensor, group=None, async_op=False, **_):
        n = output_tensor.numel() // input_tensor.numel()
        output_tensor.view(n, -1).copy_(input_tensor.reshape(1, -1).expand(n, -1))


class _LocalReduceScatter:
    """A reduce-scatter that moves nothing: this rank's part of the input, as it is."""

    def __init__(self, inner, rank: int):
        self.inner, self.rank = inner, rank

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, output_tensor, input_tensor, group=None, op=None, async_op=False, **_):
        k = output_tensor.numel()
        output_tensor.copy_(input_tensor.reshape(-1)[self.rank * k:(self.rank + 1) * k]
                            .view_as(output_tensor))


class LocalCollectives:
    """While entered, ``model``'s FSDP2 layers run their collectives locally (see the module);
    on exit their own are back. ``active``: whether every layer's were found (torch 2.13's
    internals); where they were not, nothing is changed and a step timed inside is FSDP2's
    ordinary one, so a caller reads ``active`` before using the time."""

    def __init__(self, model, rank: int):
        self.model, self.rank = model, rank
        self.active = False
        self._saved: list = []

    def __enter__(self) -> LocalCollectives:
        found = [(layer, fsdp_collectives(layer)) for layer in self.model.layers]
        if not found or any(comm is None for _, comm in found):
            return self
        for layer, (ag, rs) in found:
            layer.set_custom_all_gather(_LocalAllGather(ag))
            layer.set_custom_reduce_scatter(_LocalReduceScatter(rs, self.rank))
            self._saved.append((layer, ag, rs))
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        for layer, ag, rs in self._saved:
            layer.set_custom_all_gather(ag)
            layer.set_custom_reduce_scatter(rs)
        self._saved.clear()
