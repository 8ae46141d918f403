"""The context-parallel lab's configuration (pure: no torch), validated on the host before launch.

One :class:`CPConfig` describes one benchmark: the attention core of one layer (Q, K, V given:
the projections act token by token and split with the sequence at no cost) on ``batch_size``
sequences of ``seq_len`` tokens, ``hidden`` = ``num_heads`` x head size, split along the
sequence over the ranks, and the variants to run (:data:`labkit.cp.formulas.VARIANTS`).
Checks that need the world size are in :meth:`CPConfig.check_world_size`, which
:func:`labkit.launch.launch_lab` calls for every world size before the first launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.config import check_steps, distinct_choices, option, positive_int
from labkit.cp.formulas import VARIANTS, chunk_count
from labkit.errors import UsageError

#: a rank's work alone is timed over rounds that span at least ALONE_SPAN_S, up to ALONE_ROUNDS
#: of them (never fewer than the steps): a pass alone takes a few ms, and the same work on two
#: ranks gave medians of 5 rounds up to 1.5x apart (the first variant of a launch), of 15
#: within 1.11x; a long pass averages the machine's noise inside each sample
ALONE_SPAN_S, ALONE_ROUNDS = 0.1, 15


@dataclass(frozen=True)
class CPConfig:
    """One context-parallel benchmark; invalid values raise :class:`~labkit.errors.UsageError`.

    ``steps`` counts every timed forward + backward of a variant, warm-up included. The
    fields are ``labkit cp``'s flags.

    >>> CPConfig().variants
    ('full', 'causal', 'causal_balanced')
    >>> CPConfig(hidden=30, num_heads=4)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: hidden size 30 is not divisible by num_heads 4
    >>> CPConfig(seq_len=100).check_world_size(4)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: seq_len 100 is not divisible by 2 x 4 = 8 chunks: the balanced causal split gives every rank 2 chunks of equal length
    """

    variants: tuple = option(VARIANTS, "full (no mask), causal (contiguous split) and/or "
                             "causal_balanced (2P chunks, rank r holds r and 2P-1-r)",
                             flag="--variant", metavar="V")
    seq_len: int = option(512, "tokens per sequence S (split over the ranks)")
    hidden: int = option(64, "hidden size h = heads x head size")
    num_heads: int = option(4, "attention heads (every rank holds all of them)")
    batch_size: int = option(2, "sequences b")
    # 8: the pass law compares the median pass, and of 5 timed passes (twelve lab runs on the
    # 2-vCPU VM) the median stood 1.02-1.47x above the fastest and the slowest up to 2.1x
    steps: int = option(8, "timed forward + backward passes per variant, warm-up included")
    warmup: int = option(1, "untimed first passes")
    seed: int = option(0, "Q, K, V and the output gradient")
    tolerance: float = option(1e-5, "largest |ring - one process| / max|one process| (float64) "
                              "that matches", cli=False)

    def __post_init__(self):
        object.__setattr__(self, "variants", distinct_choices("variant", self.variants, VARIANTS))
        for name in ("seq_len", "hidden", "num_heads", "batch_size"):
            positive_int(name, getattr(self, name))
        if self.hidden % self.num_heads:
            raise UsageError(f"hidden size {self.hidden} is not divisible by num_heads "
                             f"{self.num_heads}")
        check_steps(self.warmup, self.steps)
        positive_int("seed", self.seed, minimum=0)
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) \
                or not 0 < self.tolerance < 1:
            raise UsageError(f"tolerance must be a number in (0, 1), got {self.tolerance!r}")

    def check_world_size(self, world_size: int) -> None:
        """Refuse, before any launch, a sequence that does not cut into equal chunks: P of
        them, 2P for the balanced causal split."""
        positive_int("world size", world_size)
        for variant in self.variants:
            n = chunk_count(world_size, variant)
            if self.seq_len % n:
                if variant == "causal_balanced":
                    raise UsageError(f"seq_len {self.seq_len} is not divisible by 2 x "
                                     f"{world_size} = {n} chunks: the balanced causal split "
                                     "gives every rank 2 chunks of equal length")
                raise UsageError(f"seq_len {self.seq_len} is not divisible by {world_size} "
                                 "ranks: each rank holds an equal block of the sequence")

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    @property
    def alone_warmup(self) -> int:
        """Untimed rounds of a rank's work alone: the warm-up steps, at least one (whose time
        sets :meth:`alone_rounds`)."""
        return max(self.warmup, 1)

    def alone_rounds(self, seconds: float) -> int:
        """Timed rounds of a rank's work alone (the ranks in turn) that takes ``seconds`` a
        call: enough to span :data:`ALONE_SPAN_S`, between the timed steps and
        :data:`ALONE_ROUNDS`.

        >>> cfg = CPConfig()  # 7 timed steps
        >>> cfg.alone_rounds(0.004), cfg.alone_rounds(0.012), cfg.alone_rounds(0.5)
        (15, 9, 7)
        """
        want = math.ceil(ALONE_SPAN_S / seconds) if seconds > 0 else ALONE_ROUNDS
        return max(self.measured_steps, min(ALONE_ROUNDS, want))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """What one rank needs (checked before launch): the interpreter and torch, and the
        one-process reference in float64 every rank computes (its S x S scores, a few copies)."""
        return 0.4e9 + 4 * self.batch_size * self.num_heads * self.seq_len ** 2 * 8

    def describe(self) -> dict:
        """The fields a row carries about the workload."""
        return {name: getattr(self, name) for name in
                ("seq_len", "hidden", "num_heads", "batch_size", "steps", "warmup",
                 "measured_steps", "seed", "tolerance")}
