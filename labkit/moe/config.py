"""The expert-parallel lab's configuration (pure: no torch), validated on the host before launch.

One :class:`MoEConfig` describes one benchmark: a mixture-of-experts layer of ``num_experts``
experts (each an MLP h -> f -> h, f = 4h unless ``ffn`` says otherwise) behind a linear router
that sends each token to its ``top_k`` experts; each rank holds ``tokens`` tokens of its own (the
layer is data parallel outside its experts) and ``num_experts / P`` of the experts. Each expert
takes at most ``capacity_factor · tokens · k / E`` tokens from each rank; the rest are dropped
and counted. Checks that need the world size are in :meth:`MoEConfig.check_world_size`, which
:func:`labkit.launch.launch_lab` calls for every world size before the first launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import between_0_and_1, check_steps, option, positive_int, positive_number
from labkit.errors import UsageError


@dataclass(frozen=True)
class MoEConfig:
    """One expert-parallel benchmark; invalid values raise :class:`~labkit.errors.UsageError`.

    ``steps`` counts every step (one forward and backward of the layer), warm-up included (the
    first ``warmup`` are not timed). The fields are ``labkit moe``'s flags.

    >>> MoEConfig(num_experts=4, top_k=2).expert_width
    1024
    >>> MoEConfig(num_experts=4, top_k=5)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: top_k 5 is more than the 4 experts: a token cannot go to more experts than there are
    >>> MoEConfig(capacity_factor=0)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: capacity_factor must be a positive finite number, got 0
    >>> MoEConfig(num_experts=6).check_world_size(4)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: 6 experts are not divisible by 4 ranks: each rank holds E/P whole experts
    """

    num_experts: int = option(4, "experts E (E/P on each rank)")
    top_k: int = option(2, "experts each token goes to (k <= E)")
    hidden: int = option(256, "hidden size h of a token")
    ffn: int | None = option(None, "inner width f of each expert's MLP h -> f -> h "
                             "(default: 4h)")
    tokens: int = option(256, "tokens per rank (each rank routes its own)")
    capacity_factor: float = option(1.25, "an expert takes at most ceil(factor x tokens x k / E) "
                                    "tokens from each rank; the rest are dropped and counted")
    renormalize: bool = option(True, "renormalise the k chosen gates to sum to 1 "
                               "(--no-renormalize: the softmax probabilities as they are)")
    # 5 timed, an odd count: the p50 is one timed step, the one whose timeline the split reads
    steps: int = option(7, "steps (forward + backward of the layer), warm-up included")
    warmup: int = option(2, "untimed first steps")
    seed: int = option(0, "weights and tokens")
    tolerance: float = option(1e-5, "largest |EP - one process| / max|one process| (float64) "
                              "that matches", cli=False)

    def __post_init__(self):
        for name in ("num_experts", "top_k", "hidden", "tokens"):
            positive_int(name, getattr(self, name))
        if self.ffn is not None:
            positive_int("ffn", self.ffn)
        if self.top_k > self.num_experts:
            raise UsageError(f"top_k {self.top_k} is more than the {self.num_experts} experts: "
                             "a token cannot go to more experts than there are")
        positive_number("capacity_factor", self.capacity_factor)
        if not isinstance(self.renormalize, bool):
            raise UsageError(f"renormalize must be true or false, got {self.renormalize!r}")
        check_steps(self.warmup, self.steps)
        positive_int("seed", self.seed, minimum=0)
        between_0_and_1("tolerance", self.tolerance)

    def check_world_size(self, world_size: int) -> None:
        """Refuse, before any launch, experts that cannot be shared out whole among the ranks."""
        positive_int("world size", world_size)
        if self.num_experts % world_size:
            raise UsageError(f"{self.num_experts} experts are not divisible by {world_size} "
                             "ranks: each rank holds E/P whole experts")

    @property
    def expert_width(self) -> int:
        """f: the expert MLP's inner width."""
        return 4 * self.hidden if self.ffn is None else self.ffn

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """What one rank needs (checked against the machine before launch): every expert in
        float64 and float32 with gradients (every rank builds the whole layer from the seed for
        the one-process reference) and the dense reference's activations over every rank's
        tokens (each expert on each token, float64)."""
        e, h, f = self.num_experts, self.hidden, self.expert_width
        params = e * (2 * h * f + f + h) + e * h
        all_tokens = world_size * self.tokens
        return 0.4e9 + 2 * (8 + 4) * params + 8 * 3 * e * all_tokens * (f + h)

    def describe(self) -> dict:
        """The fields a row carries about the workload."""
        return {"num_experts": self.num_experts, "top_k": self.top_k, "hidden": self.hidden,
                "ffn": self.expert_width, "tokens_per_rank": self.tokens,
                "capacity_factor": self.capacity_factor, "renormalize": self.renormalize,
                "steps": self.steps, "warmup": self.warmup,
                "measured_steps": self.measured_steps, "seed": self.seed,
                "tolerance": self.tolerance}
