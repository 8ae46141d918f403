"""How long notebook 10 runs at given parameters, estimated before anything launches, and the
refusal of parameters that would not fit its share of the lab's time (pure).

A student raises ``moe_tokens`` or ``cp_seq_len``: each launch then runs for as long as its
steps take (the MoE layer's work grows with T h f, ring attention's with S^2), and a setting
that needs minutes is refused in one line before the first launch, with its estimate and what
to change (:func:`check`).

:func:`launch_seconds` counts what a launch of :mod:`labkit.moe.worker` does: the one-process
reference (every expert on every rank's tokens, float64, on every rank), the checked step in
float64 and the ``steps`` float32 steps, each of them the busiest rank's expert products
(12 rows h f FLOPs) at :data:`EXPERT_EFFICIENCY` of the machine's matrix-product rate plus
:data:`STEP_S` (routing, the all-to-alls, autograd). :func:`notebook_seconds` adds the CP
launch (:func:`labkit.cp.budget.launch_seconds`) and the notebook's own work.

The constants were fitted on the 2-core machine the lab's budget is set for (torch 2.x, one
thread a rank, gloo, a best matrix-product rate of 48 GFLOP/s): one-thread timings of the
layer's step and of the reference (the fastest of 5; T = 64 to 4096, h = 64 to 512, E = 4 to
8, k = 1 to 8), whole launches on 2 ranks (T = 256: 2 to 5 s; 1024: 9 s; 2048: 13 s; 4096:
25 s; h = 512: 10 s; T = 1024 and h = 512: 20 s, with other programs on the cores) and runs of
the notebook at its defaults (6 to 16 s). Where the machine has its cores to itself the
estimate runs long (the notebook's defaults: 15 s estimated, 6 to 7 s measured): it errs on
the side of refusing, and ``budget_s`` can be raised.
"""

from __future__ import annotations

from labkit.cp import budget as cp_budget
from labkit.cp.config import CPConfig
from labkit.errors import UsageError
from labkit.machine.formulas import compute_slowdown
from labkit.moe.config import MoEConfig
from labkit.pipeline.config import best_matmul_flop_per_s

#: seconds a launch costs besides its steps: torchrun, importing torch, gloo's rendezvous,
#: drawing the weights, the placement table and the row (whole launches on 2 ranks: 1.9 to
#: 5.4 s at the defaults, 4.3 s at T = 64, h = 64, the longer ones with other programs on the
#: cores)
LAUNCH_S = 4.0
#: seconds the notebook costs besides its launches: the kernel's start, imports, the machine
#: profile read back, tables, laws, figures and traces (2 to 5 s of its 6 to 16 s at the
#: defaults, the longer runs with other programs on the cores)
NOTEBOOK_S = 5.0
#: seconds per step besides the expert products: routing, the all-to-alls, autograd (one
#: thread: 8 ms a step at T = 64, h = 64 on one rank; 13 ms on two)
STEP_S = 8e-3
#: the share of the matrix-product rate the experts' products reach in float32, and the
#: one-process reference's in float64 (measured: 0.5 to 0.8 of the best 48 GFLOP/s in the
#: steps of T = 256 to 4096, h = 256 to 512; 0.23 to 0.5 in the reference)
EXPERT_EFFICIENCY, FLOAT64_EFFICIENCY = 0.6, 0.25
#: ranks computing at once on their own cores run this much slower than alone (the CP budget's)
CO_RUN_SLOWDOWN = cp_budget.CO_RUN_SLOWDOWN


def rows_per_rank(config: MoEConfig) -> float:
    """(token, expert) pairs the experts of one rank compute per step with an even routing:
    T k, less what the capacity drops below a factor of 1.

    >>> rows_per_rank(MoEConfig()), rows_per_rank(MoEConfig(capacity_factor=0.5))
    (512.0, 256.0)
    """
    return config.tokens * config.top_k * min(1.0, config.capacity_factor)


#: steps each rank runs alone to time its phases' local work (labkit.moe.worker.local_phases:
#: one untimed, the median of the rest)
LOCAL_STEPS = 4


def launch_seconds(config: MoEConfig, world_size: int, *, flop_per_s: float,
                   cores: int) -> float:
    """Wall seconds of one launch of ``world_size`` ranks on a machine of ``cores`` cores
    whose rank multiplies matrices at ``flop_per_s`` alone: :data:`LAUNCH_S`, then, slowed by
    σ (:data:`CO_RUN_SLOWDOWN` where ranks compute at once, times P / cores beyond the cores),
    the reference (12 E P T h f FLOPs in float64), the checked step (12 rows h f in float64)
    and ``steps`` steps (12 rows h f in float32 and :data:`STEP_S` each), then, unslowed, the
    ranks in turn, :data:`LOCAL_STEPS` steps each alone. The notebook's defaults on 2 cores:

    >>> round(launch_seconds(MoEConfig(), 2, flop_per_s=48e9, cores=2), 1)
    5.9
    """
    p, h, f = world_size, config.hidden, config.expert_width
    slow = compute_slowdown(p, co_run=CO_RUN_SLOWDOWN, measured_ranks=p, cores=cores)
    f64 = FLOAT64_EFFICIENCY * flop_per_s
    reference = 12 * config.num_experts * p * config.tokens * h * f / f64
    product = 12 * rows_per_rank(config) * h * f
    checked = STEP_S + product / f64
    step = STEP_S + product / (EXPERT_EFFICIENCY * flop_per_s)
    # then each phase's local work alone: LOCAL_STEPS steps per rank, the ranks in turn
    local = p * LOCAL_STEPS * step if p > 1 else 0.0
    return LAUNCH_S + slow * (reference + checked + config.steps * step) + local


def notebook_seconds(moe_config: MoEConfig, cp_config: CPConfig, *, moe_ranks: int,
                     cp_ranks: int, flop_per_s: float, cores: int) -> dict:
    """Notebook 10's run, estimated: ``{"moe": ..., "cp": ..., "notebook": ..., "total":
    ...}`` seconds (its MoE launch, its CP launch, its own work :data:`NOTEBOOK_S`).

    >>> est = notebook_seconds(MoEConfig(), CPConfig(), moe_ranks=2, cp_ranks=2,
    ...                        flop_per_s=48e9, cores=2)
    >>> {k: round(v, 1) for k, v in est.items()}
    {'moe': 5.9, 'cp': 8.1, 'notebook': 5.0, 'total': 19.0}
    """
    moe = launch_seconds(moe_config, moe_ranks, flop_per_s=flop_per_s, cores=cores)
    cp = cp_budget.launch_seconds(cp_config, cp_ranks, flop_per_s=flop_per_s, cores=cores)
    return {"moe": moe, "cp": cp, "notebook": NOTEBOOK_S, "total": NOTEBOOK_S + moe + cp}


def check(moe_config: MoEConfig, cp_config: CPConfig, *, moe_ranks: int, cp_ranks: int,
          machine, budget_s: float) -> float:
    """The estimate of :func:`notebook_seconds` on ``machine`` (a
    :class:`labkit.machine.Profile`: its cores, and the fastest matrix product one rank reached
    alone, :func:`labkit.pipeline.config.best_matmul_flop_per_s`: other programs on the cores
    only ever lower a measured rate), or a one-line :class:`UsageError` before anything
    launches when it exceeds ``budget_s``, giving the estimate, the budget and what to change.

    >>> class Machine:
    ...     cores = 2
    ...     rows = ({"measurement": "matmul", "context": "alone", "flop_per_s": 48e9},)
    >>> round(check(MoEConfig(), CPConfig(), moe_ranks=2, cp_ranks=2, machine=Machine(),
    ...             budget_s=36), 1)
    19.0
    >>> check(MoEConfig(tokens=8192), CPConfig(), moe_ranks=2, cp_ranks=2, machine=Machine(),
    ...       budget_s=36)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: these parameters would run about 74 s here (the MoE launch 61 s, the CP launch 8 s, the notebook 5 s), over this notebook's budget of 36 s: lower moe_tokens (8192), moe_hidden (256) or moe_experts x moe_top_k, or raise budget_s
    """
    cores = int(machine.cores)
    est = notebook_seconds(moe_config, cp_config, moe_ranks=moe_ranks, cp_ranks=cp_ranks,
                           flop_per_s=best_matmul_flop_per_s(machine), cores=cores)
    if est["total"] <= budget_s:
        return est["total"]
    if est["moe"] >= est["cp"]:
        fix = (f"lower moe_tokens ({moe_config.tokens}), moe_hidden ({moe_config.hidden}) or "
               "moe_experts x moe_top_k")
    else:
        fix = f"lower cp_seq_len ({cp_config.seq_len}) or cp_hidden ({cp_config.hidden})"
    if max(moe_ranks, cp_ranks) > cores:
        fix += f", run at most {cores} ranks (one per core)"
    raise UsageError(f"these parameters would run about {est['total']:.0f} s here (the MoE "
                     f"launch {est['moe']:.0f} s, the CP launch {est['cp']:.0f} s, the notebook "
                     f"{est['notebook']:.0f} s), over this notebook's budget of {budget_s:g} s: "
                     f"{fix}, or raise budget_s")
