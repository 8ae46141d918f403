"""A stand-in machine profile for the tensor-parallel lab's examples and tests (pure), with the
methods the lab's models read off a :class:`labkit.machine.Profile`; the FSDP lab's examples use
it too."""

from __future__ import annotations


class FakeProfile:
    """A stand-in machine profile for examples and tests: co-run slowdown ``slowdown`` at two
    ranks or more, every all-reduce's transfer ``allreduce_s`` (busy: ``busy_factor`` times
    that; a reduce-scatter or an all-gather in ``ops``: its factor times that), a scheduler
    wait ``wait_s``, which ``wait_share`` of the calls also take (so an all-reduce in context
    costs ``allreduce_s`` + ``wait_share`` x ``wait_s``)."""

    world_size = 2

    def __init__(self, slowdown: float = 1.25, allreduce_s: float = 8e-4,
                 busy_factor: float = 1.5, wait_s: float = 3.6e-3, wait_share: float = 0.0,
                 ops: dict | None = None):
        self.slowdown, self.ar, self.busy_factor = slowdown, allreduce_s, busy_factor
        self.scheduler_wait_s, self.share = wait_s, wait_share
        # the reduce-scatter and the all-gather it timed, each x an all-reduce of the buffer:
        # about what gloo does here ({}: timed none)
        self.ops = {"all_gather": 1.0, "reduce_scatter": 2.0} if ops is None else dict(ops)

    def measured(self, measurement):
        return measurement in self.ops

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.slowdown

    def transfer_s(self, size_bytes, *, measurement="allreduce", ranks=None, busy=False):
        return self.ar * (self.busy_factor if busy else 1.0) * self.ops.get(measurement, 1.0)

    def wait_share(self, *, busy=False):
        return self.share

    def scheduler_wait_in_s(self, *, busy):
        return self.scheduler_wait_s

    def allreduce_s(self, size_bytes, *, ranks=None, busy=False):
        return (self.transfer_s(size_bytes, ranks=ranks, busy=busy)
                + self.share * self.scheduler_wait_s)

    def matmul_flop_per_s(self, n, *, together=False):
        """n x n products at 40 GFLOP/s x n / (n + 64), ``slowdown`` slower together."""
        return 40e9 * n / (n + 64) / (self.slowdown if together else 1.0)
