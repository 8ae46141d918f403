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

from ..errors import UsageError

MODELS = ("mlp", "cnn", "transformer")

MODEL_DEFAULTS = {
    "mlp": {"input_dim": 1024, "hidden_dim": 1024, "output_dim": 10, "num_layers": 4},
    "cnn": {"input_dim": 3, "hidden_dim": 32, "output_dim": 10, "num_layers": 3},
    "transformer": {"input_dim": 64, "hidden_dim": 128, "output_dim": 10, "num_layers": 2},
}

DDP_FLAGS = ("bucket_cap_mb", "broadcast_buffers", "static_graph", "gradient_as_bucket_view")

# One stored row per (model and its sizes, variant, world size, batch per rank, DDP flags, device).
ROW_KEY = ("model", "input_dim", "hidden_dim", "output_dim", "num_layers", "image_size",
           "seq_len", "num_heads", "variant", "world_size", "batch_size", *DDP_FLAGS, "device")


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class DDPConfig:
    """One DDP benchmark. Invalid values raise :class:`~labkit.errors.UsageError`.

    ``steps`` counts every optimizer step a run takes, warm-up included; the first ``warmup``
    are not timed (``steps - warmup`` are). ``batch_size`` is per rank: N ranks train on
    N x batch_size samples per step; several batch sizes (a tuple) are all run inside each
    launch, one after the other (a launch costs seconds: sweep inside it, not around it). ``baseline`` adds the no-DDP run (a plain model, no
    wrapper, no all-reduce) in the 1-rank launch. ``breakdown`` also times steps under
    ``no_sync`` and a standalone all-reduce of the gradient bytes (where the time goes).

    >>> DDPConfig(model="mlp", batch_size=64).hidden_dim
    1024
    >>> DDPConfig(batch_size=[64, 1024]).batch_size
    (64, 1024)
    >>> DDPConfig(steps=5, warmup=5)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: warmup (5) must be < steps (5): no step would be timed
    """

    model: str = "mlp"
    batch_size: int | tuple[int, ...] = 64
    steps: int = 25
    warmup: int = 5
    bucket_cap_mb: float = 25.0
    broadcast_buffers: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    baseline: bool = True
    breakdown: bool = True
    input_dim: int | None = None
    hidden_dim: int | None = None
    output_dim: int | None = None
    num_layers: int | None = None
    image_size: int = 32
    seq_len: int = 32
    num_heads: int = 4
    lr: float = 0.01
    seed: int = 0
    num_batches: int = 4
    return_params: bool = False

    def __post_init__(self):
        if self.model not in MODELS:
            raise UsageError(f"unknown model {self.model!r} (known: {', '.join(MODELS)})")
        sizes = self.batch_size if isinstance(self.batch_size, (list, tuple)) else (self.batch_size,)
        if not sizes:
            raise UsageError("batch_size needs at least one value")
        for b in sizes:
            _int("batch_size", b, 1)
        if len(set(sizes)) != len(sizes):
            raise UsageError(f"batch_size has repeats: {list(sizes)}")
        object.__setattr__(self, "batch_size", tuple(sizes))
        _int("steps", self.steps, 1)
        _int("warmup", self.warmup, 0)
        if self.warmup >= self.steps:
            raise UsageError(f"warmup ({self.warmup}) must be < steps ({self.steps}): "
                             "no step would be timed")
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
            _int(name, getattr(self, name), 1)
        for name in ("image_size", "seq_len", "num_heads", "num_batches"):
            _int(name, getattr(self, name), 1)
        _int("seed", self.seed, 0)
        if self.model == "cnn" and self.image_size < 2 ** self.num_layers:
            raise UsageError(f"image_size {self.image_size} is too small for {self.num_layers} "
                             f"conv layers (each halves it; need >= {2 ** self.num_layers})")
        if self.model == "transformer" and self.hidden_dim % self.num_heads:
            raise UsageError(f"hidden_dim (d_model) {self.hidden_dim} must be divisible by "
                             f"num_heads {self.num_heads}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"lr must be a number > 0, got {self.lr!r}")

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def at(self, batch_size: int) -> DDPConfig:
        """This config with one batch size (what one run inside a launch uses)."""
        return dataclasses.replace(self, batch_size=batch_size)

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
