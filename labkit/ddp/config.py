"""The DDP lab's configuration (pure: no torch), validated on the host before anything launches.

One :class:`DDPConfig` describes one benchmark: a model, a batch per rank, how many optimizer
steps (warm-up included) and the four DDP knobs. The launcher passes it to every launch as JSON
(:func:`labkit.config.to_dict`), the worker rebuilds it (:func:`labkit.config.from_dict`).

Model sizes default per model (``None`` = the model's default, resolved here so rows carry the
numbers actually used):

============  =========================  =======================  ==========  ==========
model         input_dim                  hidden_dim               output_dim  num_layers
============  =========================  =======================  ==========  ==========
mlp           1024 features              1024 units               10 classes  4 Linear
cnn           3 channels (32x32 image)   32 channels              10 classes  3 conv
transformer   64 features per token      128 (d_model), 4 heads   10 classes  2 encoder
============  =========================  =======================  ==========  ==========

The default MLP has 4.2 M parameters: 16.8 MB of fp32 gradients to all-reduce every step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from labkit.config import check_steps, distinct_positive_ints, one_of, option, positive_int
from labkit.errors import UsageError

MODELS = ("mlp", "cnn", "transformer")

MODEL_DEFAULTS = {
    "mlp": {"input_dim": 1024, "hidden_dim": 1024, "output_dim": 10, "num_layers": 4},
    "cnn": {"input_dim": 3, "hidden_dim": 32, "output_dim": 10, "num_layers": 3},
    "transformer": {"input_dim": 64, "hidden_dim": 128, "output_dim": 10, "num_layers": 2},
}

#: calls of the gradients' standalone all-reduce per round: with the default 4 rounds, 12 calls, about as
#: many as the machine profile times per size (11), so the calls' transfer (the median of the
#: fastest, :func:`labkit.machine.formulas.transfer_of`) is the same statistic over as many
#: calls as the profile's it is compared with; one call a round left 4, and their transfer
#: swung 11.5-19.5 ms at 16.8 MB between the rows of one run
ALLREDUCE_CALLS = 3

DDP_FLAGS = ("bucket_cap_mb", "broadcast_buffers", "static_graph", "gradient_as_bucket_view")

#: the fields ``labkit ddp`` shows in its "workload" and "DDP" argument groups
WORKLOAD_OPTIONS = ("model", "batch_size", "steps", "warmup", "input_dim", "hidden_dim",
                    "output_dim", "num_layers", "image_size", "seq_len", "num_heads", "lr", "seed")
DDP_OPTIONS = (*DDP_FLAGS, "baseline", "breakdown")


@dataclass(frozen=True)
class DDPConfig:
    """One DDP benchmark. Invalid values raise :class:`~labkit.errors.UsageError`.

    ``steps`` counts every optimizer step a run takes, warm-up included; the first ``warmup``
    are not timed (``steps - warmup`` are). ``batch_size`` is per rank: N ranks train on
    N x batch_size samples per step; several batch sizes (a tuple) are all run inside each
    launch, one after the other (a launch costs seconds: sweep inside it, not around it).
    ``baseline`` adds the no-DDP run (a plain model, no wrapper, no all-reduce) in the 1-rank
    launch, with that launch's threads (``threads_per_rank``: give it 1 to compare like with
    like, one core per process). ``all_cores_batches`` (notebooks, benchmarks: some of the
    batch sizes) times the same no-DDP run a second time at those batches, in that launch, with
    every allocated core as a thread: one process using the whole machine, the other way to use
    its cores. ``breakdown`` also times, on more than one rank, steps under ``no_sync``, a
    standalone all-reduce of the gradient bytes and of a few smaller sizes (for the α–β fit),
    and DDP's copies of the gradients into its buckets and back (where the time goes). The
    fields but the last three are ``labkit ddp``'s flags.

    >>> DDPConfig(model="mlp", batch_size=64).hidden_dim
    1024
    >>> DDPConfig(batch_size=[64, 1024]).batch_size
    (64, 1024)
    >>> DDPConfig(steps=5, warmup=5)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: warmup (5) must be < steps (5): no step would be timed
    """

    model: str = option("mlp", "mlp, cnn or transformer")
    batch_size: tuple[int, ...] = option(
        (64,), "samples per rank per step; several values all run inside each launch", metavar="N")
    steps: int = option(25, "optimizer steps, warm-up included")
    warmup: int = option(5, "untimed first steps")
    input_dim: int | None = option(
        None, "mlp: features; cnn: channels; transformer: features/token (default: per model)")
    hidden_dim: int | None = option(
        None, "mlp: units; cnn: channels; transformer: d_model (default: per model)")
    output_dim: int | None = option(None, "classes (default: per model)")
    num_layers: int | None = option(None, "hidden/conv/encoder layers (default: per model)")
    image_size: int = option(32, "cnn")
    seq_len: int = option(32, "transformer")
    num_heads: int = option(4, "transformer")
    lr: float = option(0.01, "SGD learning rate")
    seed: int = option(0, "weights and data")
    bucket_cap_mb: float = option(25.0, "gradient bucket size in MB")
    broadcast_buffers: bool = option(False, "send rank 0's buffers before every forward")
    static_graph: bool = option(False, "tell DDP the graph never changes")
    gradient_as_bucket_view: bool = option(
        False, "gradients are views into the all-reduce buckets", flag="--grad-as-bucket-view")
    baseline: bool = option(True, "skip the no-DDP run (it runs in the 1-rank launch)",
                            flag="--no-ddp-baseline")
    breakdown: bool = option(True, "skip the no_sync steps and the standalone all-reduce",
                             flag="--no-breakdown")
    all_cores_batches: tuple[int, ...] = option(
        (), "batch sizes at which the 1-rank launch also times the no-DDP run with every core "
        "as a thread", cli=False)
    num_batches: int = option(4, "synthetic batches each rank cycles through", cli=False)
    return_params: bool = option(False, "rank 0's DDP rows carry every rank's parameters (tests)",
                                 cli=False)

    def __post_init__(self):
        one_of("model", self.model, MODELS)
        sizes = distinct_positive_ints("batch_size", self.batch_size)
        object.__setattr__(self, "batch_size", sizes)
        whole = self.all_cores_batches
        whole = tuple(whole) if isinstance(whole, (list, tuple)) else (whole,)
        for b in whole:
            positive_int("all_cores_batches", b)
            if b not in sizes:
                raise UsageError(f"all_cores_batches: {b} is not one of the batch sizes "
                                 f"{list(sizes)}")
        object.__setattr__(self, "all_cores_batches", whole)
        check_steps(self.warmup, self.steps)
        b = self.bucket_cap_mb
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise UsageError(f"bucket_cap_mb must be a number > 0, got {b!r}")
        object.__setattr__(self, "bucket_cap_mb", float(b))  # 25 and 25.0: one upsert key
        for name in ("broadcast_buffers", "static_graph", "gradient_as_bucket_view",
                     "baseline", "breakdown", "return_params"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, default in MODEL_DEFAULTS[self.model].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            positive_int(name, getattr(self, name))
        for name in ("image_size", "seq_len", "num_heads", "num_batches"):
            positive_int(name, getattr(self, name))
        positive_int("seed", self.seed, minimum=0)
        if self.model == "cnn" and self.image_size < 2 ** self.num_layers:
            raise UsageError(f"image_size {self.image_size} is too small for {self.num_layers} "
                             f"conv layers (each halves it; need >= {2 ** self.num_layers})")
        if self.model == "transformer" and self.hidden_dim % self.num_heads:
            raise UsageError(f"hidden_dim (d_model) {self.hidden_dim} must be divisible by "
                             f"num_heads {self.num_heads}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"lr must be a number > 0, got {self.lr!r}")

    def memory_bytes_per_rank(self, world_size: int) -> float:
        """What one rank needs at the largest batch (checked against the machine before launch;
        :func:`labkit.ddp.formulas.memory_bytes_per_rank`)."""
        from labkit.ddp.formulas import memory_bytes_per_rank, param_count

        p = param_count(model=self.model, input_dim=self.input_dim, hidden_dim=self.hidden_dim,
                        output_dim=self.output_dim, num_layers=self.num_layers,
                        seq_len=self.seq_len)
        h, n = self.hidden_dim, self.num_layers
        if self.model == "mlp":
            sample, acts = self.input_dim, 2 * h * n + self.output_dim
        elif self.model == "cnn":
            sample = self.input_dim * self.image_size ** 2
            acts = 4 * h * sum((self.image_size // 2 ** k) ** 2 for k in range(n))
        else:
            sample = self.seq_len * self.input_dim
            acts = n * self.seq_len * (10 * h + self.num_heads * self.seq_len)
        return memory_bytes_per_rank(params=p, batch_size=max(self.batch_size),
                                     activations_per_sample=acts, sample_values=sample,
                                     batches=self.num_batches)

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def at(self, batch_size: int) -> DDPConfig:
        """This config with one batch size (what one run inside a launch uses)."""
        return dataclasses.replace(self, batch_size=batch_size, all_cores_batches=tuple(
            b for b in self.all_cores_batches if b == batch_size))

    def describe(self) -> dict:
        """The fields a result row carries about the workload (not the run's bookkeeping)."""
        if len(self.batch_size) != 1:
            raise UsageError("describe() needs a config of one batch size: use at(batch)")
        out = {"model": self.model, "batch_size": self.batch_size[0], "steps": self.steps,
               "warmup": self.warmup, "measured_steps": self.measured_steps}
        out.update({k: getattr(self, k) for k in DDP_FLAGS})
        out.update({k: getattr(self, k) for k in MODEL_DEFAULTS[self.model]})
        out.update({"image_size": self.image_size if self.model == "cnn" else None,
                    "seq_len": self.seq_len if self.model == "transformer" else None,
                    "num_heads": self.num_heads if self.model == "transformer" else None,
                    "lr": self.lr, "seed": self.seed})
        return out
