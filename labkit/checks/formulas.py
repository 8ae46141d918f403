"""What notebook 01 costs, estimated before it launches anything (pure).

The notebook's time is its launches: each starts an agent and one Python per rank that imports
torch, a few seconds that grow once ranks outnumber the cores (they take turns importing), plus
the timed all-reduces, and the machine profile when this run has none yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.checks.config import PlacementConfig
from labkit.errors import UsageError

#: notebook 01's share of the lab's budget (seconds of wall time at its defaults); 20, not
#: 18, since its launches time 40 all-reduces: [1, 2, 4] ranks at 8 MiB estimate 19 s
BUDGET_S = 20.0
#: one launch of a few ranks, each with a core: the agent, one Python per rank importing torch
#: and the rendezvous (about 2.5-3 s on a 2-core machine)
LAUNCH_S = 2.6
#: the notebook outside its launches: the kernel, imports (torch for env_info), the figure
NOTEBOOK_FIXED_S = 5.5
#: measuring the machine profile (one 2-rank launch), when this run has none stored
PROFILE_S = 8.0
#: all-reduces per placement launch: the checked one, the warm-up and the timed ones
ALLREDUCES = 1 + PlacementConfig().warmup + PlacementConfig().repeat
#: an all-reduce's cost on a slow machine, used before this one's profile is read: latency per
#: message and bytes per second (gloo over loopback on a busy 2-core machine)
SLOW_ALPHA_S = 300e-6
SLOW_BETA_BYTES_PER_S = 0.5e9


def launch_seconds(ranks: int, *, cores: int) -> float:
    """One launch of ``ranks`` ranks: ranks beyond the cores take turns importing torch.

    >>> launch_seconds(2, cores=2), launch_seconds(4, cores=2)
    (2.6, 5.2)
    """
    return LAUNCH_S * max(1.0, ranks / cores)


def notebook_seconds(*, world_sizes: Sequence[int], allreduce_bytes: int, show_failure: bool,
                     cores: int, profile_stored: bool) -> float:
    """Notebook 01's wall time: the fixed part, the profile unless stored, one placement launch
    per world size with its all-reduces (ring: 2(N-1) messages, 2(N-1)/N of the bytes each
    way), and the failing 2-rank launch.

    >>> notebook_seconds(world_sizes=[1, 2], allreduce_bytes=1 << 20, show_failure=True,
    ...                  cores=2, profile_stored=True)
    13.41...
    """
    total = NOTEBOOK_FIXED_S + (0.0 if profile_stored else PROFILE_S)
    for n in world_sizes:
        crowd = max(1.0, n / cores)
        allreduce_s = 0.0 if n < 2 else (2 * (n - 1) * SLOW_ALPHA_S
                                         + 2 * (n - 1) / n * allreduce_bytes
                                         / SLOW_BETA_BYTES_PER_S)
        total += launch_seconds(n, cores=cores) + ALLREDUCES * allreduce_s * crowd
    if show_failure:
        total += launch_seconds(2, cores=cores)
    return total


def check_budget(*, budget_s: float = BUDGET_S, **run) -> float:
    """The estimate of :func:`notebook_seconds` (keyword arguments ``run``), or a one-line
    :class:`~labkit.errors.UsageError` when it is over ``budget_s`` (plus the profile's
    measurement when this run has none stored), before anything launches.

    >>> check_budget(world_sizes=[1, 2, 4, 8], allreduce_bytes=1 << 20, show_failure=True,
    ...              cores=2, profile_stored=True)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: notebook 01 with world_sizes=[1, 2, 4, 8], allreduce_bytes=1048576 would take about 31 s, over its budget of 20 s: use fewer world sizes (a launch costs about 2.6 s, more beyond 2 ranks), a smaller allreduce_bytes, or show_failure=False
    """
    est = notebook_seconds(**run)
    # the profile is measured once per run of the lab, before this notebook, outside its share;
    # a notebook run by hand measures it too, and may take that much longer
    budget_s += 0.0 if run["profile_stored"] else PROFILE_S
    if est > budget_s:
        raise UsageError(
            f"notebook 01 with world_sizes={list(run['world_sizes'])}, allreduce_bytes="
            f"{run['allreduce_bytes']} would take about {est:.0f} s, over its budget of "
            f"{budget_s:g} s: use fewer world sizes (a launch costs about {LAUNCH_S:g} s, more "
            f"beyond {run['cores']} ranks), a smaller allreduce_bytes, or show_failure=False")
    return est
