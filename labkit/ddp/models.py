"""Rank side: the lab's three models and their seeded synthetic data.

Defined here because torchvision does not import beside the CPU torch build on the lab machines.
Each model is sized by a :class:`~labkit.ddp.config.DDPConfig` (``input_dim``, ``hidden_dim``,
``output_dim``, ``num_layers``, and ``image_size`` / ``seq_len`` / ``num_heads`` where they apply)
and ends in ``output_dim`` class scores, trained with cross-entropy.

* ``mlp``: Linear(input, hidden), ReLU, (num_layers - 1) x [Linear(hidden, hidden), ReLU],
  Linear(hidden, output). No buffers, no randomness: DDP on N ranks equals one process on the
  N batches concatenated, which the tests check.
* ``cnn``: num_layers x [Conv 3x3, BatchNorm, ReLU, MaxPool 2], global average pool, Linear.
  BatchNorm has buffers (running statistics): the one model where ``broadcast_buffers`` matters,
  and where DDP is *not* the concatenated batch (each rank normalises by its own batch).
* ``transformer``: Linear(input, d_model) + learned positions, num_layers encoder layers
  (feed-forward 4 d_model, dropout 0 so runs are deterministic), mean over tokens, Linear.

Data never comes from disk: :func:`synthetic_batches` draws ``num_batches`` batches per rank on
the device with a generator seeded by (seed, rank, index), and a run cycles through them. Step
``s`` of rank ``r`` always sees batch ``s % num_batches`` of rank ``r``, so a run is reproducible
and a single-process reference can rebuild every rank's data.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.ddp.config import DDPConfig


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(input_dim, hidden_dim), nn.ReLU()]
        for _ in range(num_layers - 1):
            layers += [nn.Linear(hidden_dim, hidden_dim), nn.ReLU()]
        layers.append(nn.Linear(hidden_dim, output_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, in_channels: int, channels: int, output_dim: int, num_layers: int):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for _ in range(num_layers):
            layers += [nn.Conv2d(c, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU(), nn.MaxPool2d(2)]
            c = channels
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, output_dim)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


class SmallTransformer(nn.Module):
    def __init__(self, input_dim: int, d_model: int, output_dim: int, num_layers: int,
                 seq_len: int, num_heads: int):
        super().__init__()
        self.embed = nn.Linear(input_dim, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=4 * d_model,
                                           dropout=0.0, batch_first=True)
        # enable_nested_tensor only speeds up padded inference; off, it stops a warning
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, output_dim)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x) + self.pos).mean(dim=1))


def build_model(cfg: DDPConfig, device: torch.device | str = "cpu", seed: int | None = None):
    """The model ``cfg`` describes, initialised from ``seed`` (default ``cfg.seed``): every rank
    building it with the same seed holds the same weights before DDP even broadcasts them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        if cfg.model == "mlp":
            model = MLP(cfg.input_dim, cfg.hidden_dim, cfg.output_dim, cfg.num_layers)
        elif cfg.model == "cnn":
            model = SmallCNN(cfg.input_dim, cfg.hidden_dim, cfg.output_dim, cfg.num_layers)
        else:
            model = SmallTransformer(cfg.input_dim, cfg.hidden_dim, cfg.output_dim,
                                     cfg.num_layers, cfg.seq_len, cfg.num_heads)
    return model.to(device)


def input_shape(cfg: DDPConfig) -> tuple[int, ...]:
    """Shape of one sample (without the batch dimension)."""
    if cfg.model == "mlp":
        return (cfg.input_dim,)
    if cfg.model == "cnn":
        return (cfg.input_dim, cfg.image_size, cfg.image_size)
    return (cfg.seq_len, cfg.input_dim)


def synthetic_batches(cfg: DDPConfig, rank: int, device: torch.device | str = "cpu",
                      batch_size: int | None = None):
    """``cfg.num_batches`` (inputs, labels) pairs of ``batch_size`` samples for ``rank``
    (default: the config's only batch size).

    Drawn on ``device`` (no host-to-device copy inside a timed step), from a generator seeded by
    (seed, rank, index) so another process can rebuild exactly this data.
    """
    device = torch.device(device)
    if batch_size is None:
        if len(cfg.batch_size) != 1:
            raise ValueError(f"config has batch sizes {cfg.batch_size}: pass batch_size")
        batch_size = cfg.batch_size[0]
    out = []
    for i in range(cfg.num_batches):
        g = torch.Generator(device=device)
        g.manual_seed(1_000_003 * cfg.seed + 7_919 * rank + i)
        x = torch.randn((batch_size, *input_shape(cfg)), generator=g, device=device)
        y = torch.randint(0, cfg.output_dim, (batch_size,), generator=g, device=device)
        out.append((x, y))
    return out


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def grad_bytes(model: nn.Module) -> int:
    """Bytes of gradient one rank contributes to the all-reduce of every step."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
