"""The tensor-parallel lab's configuration (pure: no torch), validated on the host before launch.

One :class:`TPConfig` describes one benchmark: a stack of ``num_layers`` transformer layers of
width ``hidden`` (attention with ``num_heads`` heads, then an MLP of width 4·hidden), a batch of
``batch_size`` sequences of ``seq_len`` tokens that every rank sees whole (tensor parallelism
splits the weights, not the batch), and the variants to run: ``naive`` (the hand-written
Megatron block, f and g as explicit all-reduces), ``library``
(``torch.distributed.tensor.parallel``) and ``sp`` (the hand-written block with sequence
parallelism). Checks that need the world size are in
:meth:`TPConfig.check_world_size`, which :func:`labkit.launch.launch_lab` calls for every world
size before the first launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import (
    between_0_and_1,
    check_steps,
    distinct_choices,
    option,
    positive_int,
)
from labkit.errors import UsageError

#: naive: the teaching version, f and g written by hand as autograd functions around
#: dist.all_reduce; library: the same split by ColwiseParallel / RowwiseParallel; sp: the
#: teaching version with sequence parallelism (LayerNorms, residuals and the loss split by the
#: sequence; all-gathers and reduce-scatters instead of f and g, :mod:`labkit.tp.sp`)
VARIANTS = ("naive", "library", "sp")

#: the fields that fix the model and its batch (:mod:`labkit.tp.models`); the FSDP lab trains
#: the same model and validates them the same way
SHAPE = ("hidden", "num_heads", "seq_len", "batch_size", "num_layers")


def check_shape(config) -> None:
    """Refuse a model and batch that cannot be built: every :data:`SHAPE` field of ``config``
    a positive integer, the hidden size a whole number of heads.

    >>> from types import SimpleNamespace
    >>> check_shape(SimpleNamespace(hidden=30, num_heads=4, seq_len=8, batch_size=2,
    ...                             num_layers=1))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: hidden size 30 is not divisible by num_heads 4
    """
    for name in SHAPE:
        positive_int(name, getattr(config, name))
    if config.hidden % config.num_heads:
        raise UsageError(f"hidden size {config.hidden} is not divisible by num_heads "
                         f"{config.num_heads}")


def check_training(config, variants: tuple) -> tuple:
    """Refuse a training workload of this model that cannot run (the FSDP lab's too): the
    model and batch (:func:`check_shape`), the steps, a seed >= 0, the learning rate and the
    tolerance in (0, 1); the variants asked for, distinct and among ``variants``, returned as
    a tuple.

    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(variants="library", hidden=64, num_heads=4, seq_len=8, batch_size=2,
    ...                       num_layers=1, steps=3, warmup=1, lr=0.01, seed=0, tolerance=1e-4)
    >>> check_training(cfg, VARIANTS)
    ('library',)
    >>> check_training(SimpleNamespace(**{**vars(cfg), "lr": 2.0}), VARIANTS)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: lr must be a number in (0, 1), got 2.0
    """
    chosen = distinct_choices("variant", config.variants, variants)
    check_shape(config)
    check_steps(config.warmup, config.steps)
    positive_int("seed", config.seed, minimum=0)
    for name in ("lr", "tolerance"):
        between_0_and_1(name, getattr(config, name))
    return chosen


def training_fields(config) -> dict:
    """The fields a row carries about a training workload of this model: the :data:`SHAPE`,
    the steps and the optimizer's learning rate and seed.

    >>> list(training_fields(TPConfig()))[:3], training_fields(TPConfig())["measured_steps"]
    (['hidden', 'num_heads', 'seq_len'], 8)
    """
    return {name: getattr(config, name)
            for name in (*SHAPE, "steps", "warmup", "measured_steps", "lr", "seed")}


#: rounds of the library's own work at ``own_work_hidden`` (one step of each version a round):
#: at h = 16 on 2 ranks here a round took 65-70 ms (the teaching version's 14-19, the
#: library's 49-53)
OWN_WORK_STEPS = 9


@dataclass(frozen=True)
class TPConfig:
    """One tensor-parallel benchmark; invalid values raise :class:`~labkit.errors.UsageError`.

    ``steps`` counts every training step of a variant, warm-up included (the first ``warmup``
    are not timed). The fields are ``labkit tp``'s flags.

    >>> TPConfig(hidden=64, num_heads=4).variants
    ('naive', 'library', 'sp')
    >>> TPConfig(variants="megatron")
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: unknown variant 'megatron' (choose from naive, library, sp)
    >>> TPConfig(seq_len=30).check_world_size(4)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: seq_len 30 is not divisible by 4 ranks: sequence parallelism (variant sp) gives every rank as many tokens
    >>> TPConfig(hidden=64, num_heads=4).check_world_size(8)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: a model of 4 heads is too small to shard over 8 ranks: each rank needs at least one whole head
    """

    variants: tuple = option(VARIANTS, "naive (f and g by hand), library "
                             "(torch.distributed.tensor.parallel) and/or sp (by hand, with "
                             "sequence parallelism)", flag="--variant", metavar="V")
    hidden: int = option(256, "hidden size h (d_model); the MLP is 4h wide")
    num_heads: int = option(8, "attention heads (split across the ranks)")
    seq_len: int = option(32, "tokens per sequence s")
    batch_size: int = option(8, "sequences per step b (every rank sees the whole batch)")
    num_layers: int = option(2, "transformer layers (attention block + MLP block each)")
    steps: int = option(10, "training steps per variant, warm-up included")
    warmup: int = option(2, "untimed first steps")
    lr: float = option(0.01, "SGD learning rate")
    seed: int = option(0, "weights and data")
    baseline: bool = option(True, "in a launch of P > 1 ranks, rank 0 also runs every variant "
                            "on the whole model alone while the others wait: the 1-rank rows "
                            "without a 1-rank launch (--no-baseline: none)")
    tolerance: float = option(1e-4, "largest |TP - one process| / max|one process| that matches",
                              cli=False)
    own_work_hidden: int = option(16, "in a launch of P > 1 ranks with the library and the "
                                  "teaching version, also time both at this small hidden size "
                                  "(rounded up to whole heads), interleaved: the library's own "
                                  "work on P ranks, which its step law adds (0: off)")

    def __post_init__(self):
        object.__setattr__(self, "variants", check_training(self, VARIANTS))
        if not isinstance(self.baseline, bool):
            raise UsageError(f"baseline must be true or false, got {self.baseline!r}")
        positive_int("own_work_hidden", self.own_work_hidden, minimum=0)

    def check_world_size(self, world_size: int) -> None:
        """Refuse, before any launch, a split that leaves a rank without a whole head or with
        a ragged slice of the hidden size."""
        positive_int("world size", world_size)
        if self.num_heads < world_size:
            raise UsageError(f"a model of {self.num_heads} heads is too small to shard over "
                             f"{world_size} ranks: each rank needs at least one whole head")
        if self.num_heads % world_size:
            raise UsageError(f"num_heads {self.num_heads} is not divisible by {world_size} "
                             "ranks: attention is split by whole heads")
        if self.hidden % world_size:  # implied by the two checks above; said plainly anyway
            raise UsageError(f"hidden size {self.hidden} is not divisible by {world_size} ranks")
        if "sp" in self.variants and self.seq_len % world_size:
            raise UsageError(f"seq_len {self.seq_len} is not divisible by {world_size} ranks: "
                             "sequence parallelism (variant sp) gives every rank as many tokens")

    @property
    def own_work_width(self) -> int:
        """The hidden size the library's own work is timed at: ``own_work_hidden`` rounded up
        to whole heads; 0 where it is off, where the library or the teaching version is not
        run, or where it would not be below ``hidden`` (then it is the step itself).

        >>> TPConfig().own_work_width, TPConfig(num_heads=32, hidden=512).own_work_width
        (16, 32)
        >>> TPConfig(hidden=16).own_work_width, TPConfig(variants=("library",)).own_work_width
        (0, 0)
        """
        if not self.own_work_hidden or not {"naive", "library"} <= set(self.variants):
            return 0
        width = -(-self.own_work_hidden // self.num_heads) * self.num_heads
        return width if width < self.hidden else 0

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """What one rank needs (checked against the machine before launch): the full model
        (every rank builds it from the seed, and it is the single-process reference) with its
        gradients, each variant's shard with gradients and momentum, and the activations of the
        reference and of one variant (:func:`labkit.tp.formulas.activation_bytes`)."""
        from labkit.tp.formulas import activation_bytes, param_count

        p = param_count(hidden=self.hidden, num_layers=self.num_layers)
        acts = activation_bytes(batch_size=self.batch_size, seq_len=self.seq_len,
                                hidden=self.hidden, num_heads=self.num_heads,
                                num_layers=self.num_layers)
        return 0.4e9 + 4 * (2 * p + 3 * p / world_size * len(self.variants)) + 2 * acts

    def describe(self) -> dict:
        """The fields a row carries about the workload (:func:`training_fields`)."""
        return training_fields(self)
