"""The profile's config (pure: validated on the host before the launch)."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import distinct_positive_ints, option, positive_int
from labkit.errors import UsageError

#: the smallest reduce-scatter and all-gather the profile times: sharded data parallelism's
#: buffers (a layer's gradients or weights), where the two differ from an all-reduce
SHARDED_FROM_BYTES = 256 << 10
#: the largest all-reduce the profile also times one size at a time on one buffer, as notebook
#: 01 times its own (``allreduce_repeated``): where a call's fixed cost outweighs its bytes
REPEATED_MAX_BYTES = 32 << 10


@dataclass(frozen=True)
class MachineConfig:
    """``labkit calibrate``: what the profile measures and how often."""

    matmul_sizes: tuple = option((64, 256, 512), "n of the n x n matrix products timed")
    step_width: int = option(512, "width of the two-layer MLP whose training step is timed")
    step_batches: tuple = option((16, 64, 128),
                                 "batches of that training step (small batches run at a lower "
                                 "rate: a pipeline's microbatches are small)")
    copy_bytes: tuple = option((1 << 20, 4 << 20, 16 << 20, 32 << 20),
                               "bytes of each memory copy timed, per rank (sizes from within the "
                               "shared cache to beyond it: its co-run slowdown changes between "
                               "them; the largest is the memory's bandwidth)")
    min_bytes: int = option(8, "smallest all-reduce and message")
    max_bytes: int = option(16 << 20, "largest all-reduce and message")
    factor: int = option(8, "size step of the sweep")
    iters: int = option(11, "timed repeats per size (the p50 of the slowest rank is kept)")
    warmup: int = option(2, "untimed repeats per size", cli=False)
    sample_s: float = option(0.02, "seconds one compute or copy sample lasts", cli=False)
    busy_n: int = option(256, "n of the matrix products that keep every core busy", cli=False)

    def __post_init__(self):
        object.__setattr__(self, "matmul_sizes",
                           tuple(distinct_positive_ints("matmul_sizes", self.matmul_sizes)))
        positive_int("step_width", self.step_width)
        object.__setattr__(self, "step_batches",
                           tuple(sorted(distinct_positive_ints("step_batches", self.step_batches))))
        object.__setattr__(self, "copy_bytes",
                           tuple(sorted(distinct_positive_ints("copy_bytes", self.copy_bytes,
                                                               minimum=4))))
        positive_int("min_bytes", self.min_bytes, minimum=4)
        positive_int("max_bytes", self.max_bytes, minimum=self.min_bytes)
        positive_int("factor", self.factor, minimum=2)
        positive_int("iters", self.iters)
        positive_int("warmup", self.warmup, minimum=0)
        positive_int("busy_n", self.busy_n, minimum=8)
        if not 0 < self.sample_s <= 1:
            raise UsageError(f"sample_s must be in (0, 1] s, got {self.sample_s}")

    def sizes(self) -> list[int]:
        """The sweep's message sizes: ``min_bytes`` times powers of ``factor`` (4-byte aligned),
        and every power of 2 from :data:`SHARDED_FROM_BYTES` up: where the labs' messages are,
        the transfer's curve bends between sizes a factor 8 apart (on the 2-core VM 0.33 ms at
        256 KiB, 0.49 at 1 MiB, 0.98 at 2 MiB: read in log-log from its neighbours, 1 MiB would
        be 0.7 ms).

        >>> MachineConfig(min_bytes=8, max_bytes=4096, factor=8).sizes()
        [8, 64, 512, 4096]
        >>> MachineConfig(min_bytes=8, max_bytes=2 << 20, factor=8).sizes()[-5:]
        [32768, 262144, 524288, 1048576, 2097152]
        """
        out, s = set(), self.min_bytes
        while s <= self.max_bytes:
            out.add(s - s % 4)
            s *= self.factor
        s = SHARDED_FROM_BYTES
        while s <= self.max_bytes:
            out.add(s)
            s *= 2
        return sorted(out)

    def check_world_size(self, n: int) -> None:
        if n < 2:
            raise UsageError("the machine profile needs 2 ranks or more (a co-run and a peer)")
