"""How long notebook 09 takes at given parameters, estimated before anything is launched, and
the refusal of parameters that would not fit the notebook's share of the lab's time (pure).

The estimate counts the work of each launch in the launches' own terms (the single-process
reference, the compute rate's timed layers, every variant's checked, counted and timed steps,
the compute-only steps, the library's own work at a small hidden size) at a layer rate of
:data:`LAYER_EFFICIENCY` times this machine's matrix-product rate at n = h, the co-run
slowdown where ranks compute at once (notebook 09 passes none: it estimates its parameters on
this machine, not the moment's load), and adds what every launch costs before its work
(:data:`LAUNCH_S`: start the ranks, import torch, meet) and what the notebook costs around its
launches (:data:`NOTEBOOK_S`: kernel, imports, figures).
"""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.tp.config import OWN_WORK_STEPS
from labkit.tp.formulas import flops_per_rank

#: seconds one launch costs before its work on this 2-core machine (torchrun, torch, gloo)
LAUNCH_S = 6.0
#: seconds the notebook costs besides its launches (kernel, imports, figures, the widget)
NOTEBOOK_S = 7.5
#: a layer's forward + backward rate against an n x n matrix product's at n = h (LayerNorm,
#: softmax, GELU and thinner products)
LAYER_EFFICIENCY = 0.75
#: the library's step against the teaching version's (DTensor's bookkeeping), FSDP's and
#: ZeRO-1's against the plain model's (their wrappers)
LIBRARY_FACTOR = 1.4
WRAPPER_FACTOR = 1.5
#: the sequence-parallel step against the teaching version's (more collectives, the tokens'
#: copies around each; a rank's LayerNorms on 1/P of them)
SP_FACTOR = 1.1
#: the timed runs of the compute rate per rank (warm-up included)
RATE_RUNS = 4
#: one round of the library's own work at h = 16 on 2 ranks (a step of each version): 65-70 ms
OWN_WORK_ROUND_S = 0.07


def notebook_seconds(*, hidden: int, seq_len: int, num_layers: int, tp_batch: int,
                     dp_batch: int, steps: int, tp_ranks: int, fsdp_ranks: int,
                     matmul_flop_per_s: float, slowdown: float = 1.0,
                     sequence_parallel: bool = True) -> float:
    """Estimated seconds of notebook 09: a TP launch of ``tp_ranks`` (its rank 0 also runs the
    one-process baseline alone; with ``sequence_parallel`` the sp variant too, at P ranks
    only) and an FSDP launch of ``fsdp_ranks``.

    >>> kw = dict(hidden=256, seq_len=32, num_layers=2, tp_batch=8, dp_batch=4, steps=4,
    ...           tp_ranks=2, fsdp_ranks=2, matmul_flop_per_s=36e9, slowdown=1.25)
    >>> round(notebook_seconds(**kw), 1), round(notebook_seconds(**kw, sequence_parallel=False), 1)
    (26.3, 25.9)
    """
    rate = LAYER_EFFICIENCY * matmul_flop_per_s

    def t(batch, ranks=1, layers=num_layers):
        return flops_per_rank(batch_size=batch, seq_len=seq_len, hidden=hidden,
                              num_layers=layers, world_size=ranks) / rate

    def variants(step, sp, runs=steps):  # checked, counted and timed steps of every variant
        return (runs + 1) * step * (1 + LIBRARY_FACTOR + (SP_FACTOR if sp else 0.0))

    slow = slowdown if tp_ranks > 1 else 1.0
    step = t(tp_batch, tp_ranks) * slow
    total = (NOTEBOOK_S + LAUNCH_S + t(tp_batch) + RATE_RUNS * t(tp_batch, layers=1)
             + variants(step, sequence_parallel and tp_ranks > 1) + steps * step)
    if tp_ranks > 1:  # the baseline: rank 0 alone, the whole model (no sp: it is naive there)
        total += RATE_RUNS * t(tp_batch, layers=1) + variants(t(tp_batch), False)
        # the library's own work: rounds of both versions at a small hidden size, plus the
        # warm-up each variant now takes after its counted step
        total += OWN_WORK_ROUND_S * (OWN_WORK_STEPS + 2) + step * (
            1 + LIBRARY_FACTOR + (SP_FACTOR if sequence_parallel else 0.0))
    if fsdp_ranks:
        slow = slowdown if fsdp_ranks > 1 else 1.0
        step = t(dp_batch) * slow
        # four variants (DDP, ZeRO-1, ZeRO-2, FSDP; FSDP's one more sampled step and, on 2+
        # ranks, its steps with the collectives local), the plain model's steps, then with
        # activation checkpointing (4/3 of them) and its forwards
        local = steps if fsdp_ranks > 1 else 0
        total += (LAUNCH_S + fsdp_ranks * t(dp_batch)
                  + fsdp_ranks * RATE_RUNS * t(dp_batch, layers=1)
                  + (4 * (steps + 1) + 1 + local) * step * WRAPPER_FACTOR
                  + steps * step * (1 + 4 / 3 + 1 / 3))
    return total


def check(budget_s: float, **params) -> float:
    """The estimate of :func:`notebook_seconds`; over ``budget_s``: UsageError, before launch.

    >>> kw = dict(seq_len=32, num_layers=2, tp_batch=8, dp_batch=4, steps=4, tp_ranks=2,
    ...           fsdp_ranks=2, matmul_flop_per_s=36e9, slowdown=1.25)
    >>> round(check(28, hidden=256, **kw))
    26
    >>> check(28, hidden=1024, **kw)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: these parameters would take about 115 s on this machine, over the notebook's budget of 28 s: lower hidden, seq_len, the batches, num_layers or steps (or raise budget_s)
    """
    est = notebook_seconds(**params)
    if est > budget_s:
        raise UsageError(f"these parameters would take about {est:.0f} s on this machine, over "
                         f"the notebook's budget of {budget_s:.0f} s: lower hidden, seq_len, the "
                         "batches, num_layers or steps (or raise budget_s)")
    return est
