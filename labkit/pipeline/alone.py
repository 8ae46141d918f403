"""One microbatch's forward and backward of a rank's pipeline stages, each rank alone (rank
side): the arithmetic of a block without the schedule around it, which the step model
multiplies by the machine's co-run slowdown where the ranks compute at once.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from labkit import timing
from labkit.pipeline.config import FIXED_STEPS, PipelineConfig
from labkit.pipeline.schedules import stage_layers


def block_alone_s(model, rt, cfg: PipelineConfig, schedule: str, m: int, x) -> float:
    """One microbatch's forward and backward through this rank's stages (all V chunks), each
    rank **alone** in turn (:func:`labkit.timing.in_turns`), the median of
    :data:`FIXED_STEPS`: the slowest rank's. Its input needs a gradient past stage 0, as in the
    pipeline. Collective."""
    p, rank = rt.world_size, rt.rank
    v = cfg.virtual_stages if schedule == "interleaved" else 1
    spans = stage_layers(cfg.layers, p * v)
    stage = nn.Sequential(*[model[i] for s in range(rank, p * v, p) for i in spans[s]])
    a = x[: cfg.batch // m].detach().clone().requires_grad_(rank > 0)

    def forward_backward():
        stage.zero_grad(set_to_none=True)
        a.grad = None
        stage(a).pow(2).mean().backward()

    return timing.in_turns(rt, lambda: float(np.median(timing.repeat_timed(
        forward_backward, warmup=2, repeat=FIXED_STEPS, device=rt.device, barrier=False))))
