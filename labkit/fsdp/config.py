"""The sharded-data-parallel lab's configuration (pure: no torch), validated before launch.

One :class:`FSDPConfig` describes one benchmark: the tensor-parallel lab's model (a stack of
``num_layers`` transformer layers of width ``hidden``, :mod:`labkit.tp.models`), trained with
Adam on ``batch_size`` sequences per rank (data parallelism: every rank its own batch), under
the variants asked for: ``ddp`` (every rank holds everything, gradients all-reduced),
``zero1`` (a hand-written sharded optimizer: the teaching version of ZeRO stage 1),
``zero2`` (the same with the gradients reduce-scattered in backward, by hand: stage 2) and
``fsdp`` (FSDP2's ``fully_shard``: parameters, gradients and optimizer states sharded, ZeRO
stage 3). Checks that need the world size are in :meth:`FSDPConfig.check_world_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import option, positive_int
from labkit.errors import UsageError
from labkit.tp.config import check_training, training_fields

VARIANTS = ("ddp", "zero1", "zero2", "fsdp")
#: what a config runs unless told (zero2 on demand: notebook 09 asks for it)
DEFAULT_VARIANTS = ("ddp", "zero1", "fsdp")

#: the ZeRO stage each variant is
STAGE = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "fsdp": "zero3"}


@dataclass(frozen=True)
class FSDPConfig:
    """One sharded-data-parallel benchmark; invalid values raise
    :class:`~labkit.errors.UsageError`. The fields are ``labkit fsdp``'s flags.

    >>> FSDPConfig().variants
    ('ddp', 'zero1', 'fsdp')
    >>> FSDPConfig(variants=("fsdp", "zero4"))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: unknown variant 'zero4' (choose from ddp, zero1, zero2, fsdp)
    >>> FSDPConfig(hidden=4, num_heads=2).check_world_size(8)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: a model of hidden size 4 is too small to shard over 8 ranks: its smallest tensors (biases, norms) have 4 values, fewer than one per rank
    """

    variants: tuple = option(DEFAULT_VARIANTS, "ddp, zero1 (sharded optimizer, by hand), zero2 "
                             "(and sharded gradients, by hand) and/or fsdp (FSDP2 fully_shard, "
                             "ZeRO-3)", flag="--variant", metavar="V")
    hidden: int = option(256, "hidden size h (d_model); the MLP is 4h wide")
    num_heads: int = option(4, "attention heads")
    seq_len: int = option(32, "tokens per sequence s")
    batch_size: int = option(4, "sequences per rank per step")
    num_layers: int = option(2, "transformer layers (one FSDP unit each)")
    steps: int = option(8, "training steps per variant, warm-up included")
    warmup: int = option(2, "untimed first steps")
    lr: float = option(0.001, "Adam learning rate")
    seed: int = option(0, "weights and data")
    reshard_after_forward: bool = option(
        True, "fsdp: free each layer's gathered parameters after forward and gather them again "
              "for backward (ZeRO-3); --no-reshard-after-forward keeps them (more memory, one "
              "all-gather less)")
    checkpoint: bool = option(
        False, "activation checkpointing in every variant: each layer keeps only its input and "
               "runs its forward again in backward (the launch measures the plain model with and "
               "without it either way)")
    tolerance: float = option(1e-4, "largest |sharded - one process| / max|one process| that "
                                    "matches", cli=False)

    def __post_init__(self):
        # the tensor-parallel lab's model, trained with the same checks
        object.__setattr__(self, "variants", check_training(self, VARIANTS))
        for name in ("reshard_after_forward", "checkpoint"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def check_world_size(self, world_size: int) -> None:
        """Refuse, before any launch, a model some rank would hold nothing of, or whose tensors
        do not split evenly (FSDP would pad them, and the bytes would stray from Ψ/N)."""
        positive_int("world size", world_size)
        if self.hidden < world_size:
            raise UsageError(f"a model of hidden size {self.hidden} is too small to shard over "
                             f"{world_size} ranks: its smallest tensors (biases, norms) have "
                             f"{self.hidden} values, fewer than one per rank")
        if self.hidden % world_size:
            raise UsageError(f"hidden size {self.hidden} is not divisible by {world_size} "
                             "ranks: every tensor's first dimension (h, 4h) must split evenly")

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def num_params(self) -> int:
        from labkit.tp.formulas import param_count

        return param_count(hidden=self.hidden, num_layers=self.num_layers)

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """What one rank needs (checked against the machine before launch): the
        single-process reference over all ranks' batches (the model, its gradients, Adam's two
        moments and a copy after one step: 20 bytes a parameter, and the activations of
        world_size x batch_size sequences), one variant at a time at DDP's size (16 bytes a
        parameter, plus a flat gradient buffer), and its activations."""
        from labkit.tp.formulas import activation_bytes

        acts = activation_bytes(batch_size=self.batch_size, seq_len=self.seq_len,
                                hidden=self.hidden, num_heads=self.num_heads,
                                num_layers=self.num_layers)
        return 0.4e9 + (20 + 20) * self.num_params() + (world_size + 1) * acts

    def describe(self) -> dict:
        """The fields a row carries about the workload."""
        return {**training_fields(self), "reshard_after_forward": self.reshard_after_forward,
                "checkpoint": self.checkpoint}
