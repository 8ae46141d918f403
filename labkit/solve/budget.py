"""How long a solve sweep will take, estimated before anything is launched, and the refusal of
a sweep that would run past a notebook's time budget (pure: no torch).

The estimate is deliberately rough and on the slow side: its one job is to refuse, in one line
and before a launch, a choice of parameters (a method, a rank count, a size) that would take
several times a notebook's share of the lab's time, and to say what to change. Each solve is
``iterations x (time per iteration)``:

* iterations: CG on the Poisson matrix needs about ``0.17 x side x ln(2 / rtol)`` (``side`` =
  the grid side, ``DOF^(1/dim)``; CG's bound with sqrt(kappa) ~ side, at the rate this lab's
  runs converge), or exactly ``iterations`` where the sweep fixes them;
* time per iteration: ``c + k DOF / P``, times :data:`METHOD_COST` for the other methods, times
  the co-run slowdown when several ranks stream memory at once, times ``ranks / cores`` past
  the cores, plus the messages' fixed cost at more than one rank;
* per launch :data:`LAUNCH_S` (torchrun, importing torch, the process group); per point the
  copy-bandwidth and message measurements and the untimed first solve.
"""

from __future__ import annotations

import math

from labkit.errors import UsageError
from labkit.solve.config import timed_solves

#: seconds of one launch besides its solves (torchrun, importing torch, the process group)
LAUNCH_S = 3.5
#: one rank's fixed cost per iteration (the Python loop, a dozen torch calls), seconds
FIXED_ITERATION_S = 100e-6
#: what more than one rank adds per iteration (messages, waits, the split SpMV), seconds
FIXED_RANKS_S = 220e-6
#: seconds per DOF per iteration of CG on one rank, 2-D (the 7-point 3-D matrix: x 7/5)
SECONDS_PER_DOF = 13e-9
#: each rank's share of the work beside the others, over alone (ranks streaming memory at once)
CO_RUN = 1.4
#: what torch.distributed (gloo) adds per iteration over shared memory at more than one rank
TORCH_MESSAGES_S = 1e-3
#: per point: copy bandwidth and message-cost measurements, the untimed 3-iteration solve
POINT_S = 0.15
#: the shares' timing (labkit.solve.shares): rounds of every rank alone in turn, then together,
#: each sample about SHARE_SAMPLE_S (and a 1-iteration solve beside it), after two short
#: warm-up solves of about SHARE_WARM_S (samples of 20 ms, 10 iterations at 250,000 DOF, gave
#: co-run slowdowns of 1.14-1.70 over three lab runs on the 2-vCPU VM while the same launches'
#: solves computed 0.96-1.91x their share alone: one burst of a neighbour's filled a sample)
SHARES_ROUNDS, SHARE_SAMPLE_S, SHARE_WARM_S = 5, 0.05, 0.05
#: a method's cost to reach rtol on the Poisson matrix, relative to CG's (iterations x work per
#: iteration; restarted GMRES needs many more iterations and reads its whole basis each one)
METHOD_COST = {"cg": 1.0, "pcg": 1.3, "pipecg": 1.4, "minres": 1.4, "bicgstab": 1.7,
               "gmres": 6.0}
#: the parts of a notebook that are not its solve launches (kernel, figures, tables), seconds
NOTEBOOK_OVERHEAD_S = {"03_solve_scaling": 11.0, "04_solve_memory": 6.0}


def iterations(dof: int, *, dim: int = 2, rtol: float = 1e-6, fixed: int | None = None) -> float:
    """Iterations one CG solve of ``dof`` unknowns needs (``fixed`` when the sweep fixes them).

    250,000 DOF in 2-D (side 500) to 1e-6: 0.17 x 500 x ln(2e6) = 1,233 (this lab measured 1,226).

    >>> round(iterations(250_000))
    1233
    >>> iterations(250_000, fixed=50)
    50.0
    """
    if fixed is not None:
        return float(fixed)
    return 0.17 * dof ** (1.0 / dim) * math.log(2.0 / rtol)


def iteration_s(dof: int, ranks: int, *, dim: int = 2, method: str = "cg",
                cores: int = 2, transport: str = "auto") -> float:
    """Seconds of one iteration of ``method`` on ``dof`` unknowns over ``ranks`` ranks.

    >>> round(iteration_s(100_000, 1) * 1e6), round(iteration_s(100_000, 2) * 1e6)
    (1400, 1230)
    >>> round(iteration_s(100_000, 4) / iteration_s(100_000, 2), 2)  # 4 ranks on 2 cores
    1.26
    """
    k = SECONDS_PER_DOF * (1.4 if dim == 3 else 1.0)
    per_rank = k * dof / ranks * (CO_RUN if ranks > 1 else 1.0)
    t = FIXED_ITERATION_S + per_rank
    if ranks > 1:
        t += FIXED_RANKS_S + (TORCH_MESSAGES_S if transport == "torch" else 0.0)
    return METHOD_COST[method] * t * max(1.0, ranks / cores)


def sweep_s(cfg, world_sizes, *, cores: int = 2) -> float:
    """Seconds a sweep of ``cfg`` (a :class:`~labkit.solve.config.SolveConfig`) takes over
    ``world_sizes``, one launch each: solves (warmup and timed, rank 0's inline ones too), the
    measurements of each point, the launches.

    >>> from labkit.solve.config import SolveConfig
    >>> cfg = SolveConfig(total_dof=(2_000, 100_000), repeat=1, warmup=0, rtol=1e-6)
    >>> round(sweep_s(cfg, [1, 2]), 1)
    9.8
    """
    from labkit.solve.config import points

    total = 0.0
    for p in world_sizes:
        total += LAUNCH_S
        for mode, _, dims in points(cfg, p):
            dof = math.prod(dims)
            its = iterations(dof, dim=cfg.dim, rtol=cfg.rtol, fixed=cfg.iterations)
            for method in cfg.methods:
                for _ in cfg.partitioners:
                    one = its * iteration_s(dof, p, dim=cfg.dim, method=method, cores=cores,
                                            transport=cfg.transport)
                    solves = cfg.warmup + timed_solves(cfg.repeat, one,
                                                       min_timed_s=cfg.min_timed_s)
                    t = solves * one
                    if cfg.inline_baseline(mode, p):
                        t += solves * its * iteration_s(dof, 1, dim=cfg.dim, method=method)
                    if cfg.time_shares(mode, p, method):  # alone in turn, and together
                        t += SHARES_ROUNDS * (p + 1) * 1.2 * SHARE_SAMPLE_S + SHARE_WARM_S
                    total += t + POINT_S
    return total


def check(cfg, world_sizes, *, budget_s: float, notebook: str, cores: int = 2,
          min_ranks: int = 1) -> float:
    """The estimated seconds of a notebook with this sweep (its launches and
    :data:`NOTEBOOK_OVERHEAD_S`); a :class:`~labkit.errors.UsageError` before any launch when
    that is over ``budget_s``, saying what to change, or when a launch has fewer ranks than
    the notebook compares (``min_ranks``).

    >>> from labkit.solve.config import SolveConfig
    >>> check(SolveConfig(total_dof=(2_000,)), [1], budget_s=15, notebook="04_solve_memory",
    ...       min_ranks=2)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: world_sizes [1]: this notebook compares 2 or more ranks with rank 0 alone; use [2]

    >>> from labkit.solve.config import SolveConfig
    >>> check(SolveConfig(total_dof=(250_000,), methods=("gmres",)), [1, 2], budget_s=25,
    ...       notebook="03_solve_scaling")
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: this sweep would take about 250 s, over the notebook's budget of 25 s: use fewer or smaller sizes, fewer methods, partitioners or ranks, or fewer repeats (or raise budget_s)
    """
    if min(world_sizes) < min_ranks:
        raise UsageError(f"world_sizes {list(world_sizes)}: this notebook compares {min_ranks} or "
                         f"more ranks with rank 0 alone; use [{min_ranks}]")
    estimate = sweep_s(cfg, world_sizes, cores=cores) + NOTEBOOK_OVERHEAD_S.get(notebook, 0.0)
    if estimate > budget_s:
        raise UsageError(f"this sweep would take about {estimate:.0f} s, over the notebook's "
                         f"budget of {budget_s:g} s: use fewer or smaller sizes, fewer methods, "
                         "partitioners or ranks, or fewer repeats (or raise budget_s)")
    return estimate
