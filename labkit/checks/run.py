"""Host side of the checks: what this machine offers, where each rank runs, whether the solve
operator's transports deliver every message.

* :func:`env_info` -- what a launch would get here (``labkit env``);
* :func:`run` -- the placement check: one launch per world size of
  :mod:`labkit.checks.placement_worker`, one row per rank (``labkit placement``, notebook 01);
* :func:`transport_check` -- :mod:`labkit.checks.transport_worker`: every message of both
  transports checked, one exchange and one all-reduce timed (notebook 03).
"""

from __future__ import annotations

from labkit.checks.config import PlacementConfig, TransportCheckConfig
from labkit.config import expect_config
from labkit.launch import LaunchOptions


def env_info() -> dict:
    """What this machine offers a launch: versions, backend, devices, cores."""
    import torch
    import torch.distributed as dist

    from labkit.devices import choose_backend
    from labkit.launch import default_threads
    from labkit.procs import available_cores
    from labkit.results import provenance

    info = provenance()
    cuda = torch.cuda.is_available()
    info.update({
        "torch_version": torch.__version__,
        "cuda_available": cuda,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "gloo_available": dist.is_gloo_available(),
        "nccl_available": dist.is_nccl_available(),
        "default_backend_1_rank": choose_backend(1, warn=False)[0],
        "cores": available_cores(),
        "threads_per_rank_at_2_ranks": default_threads(2),
    })
    return info


def run(config: PlacementConfig, launch: LaunchOptions | None = None, store=None):
    """The placement check: one launch per world size; the rows (one per rank per launch) as
    a DataFrame, columns in :data:`labkit.checks.report.COLUMNS`.

    ``launch``: rank counts and the rest (:class:`~labkit.launch.LaunchOptions`, default 1 and
    2 ranks); ``store``: a results file to upsert the rows into, under
    :data:`labkit.checks.report.KEY`. Ranks that share a GPU are marked in ``problem``
    (:func:`labkit.checks.report.sharing_problems`).
    """
    import pandas as pd

    from labkit import results
    from labkit.checks.report import KEY
    from labkit.launch import launch_lab

    expect_config(config, PlacementConfig)
    launches = launch_lab("placement", config, launch, store)
    rows = [row for res in launches for row in res.rows()]
    results.store_rows(store, rows, KEY)
    return pd.DataFrame(rows)


def transport_check(config: TransportCheckConfig, launch: LaunchOptions | None = None):
    """Check and time the solve operator's transports, one launch per world size of ``launch``
    (default: 2 ranks, no progress bar).

    One row per transport and world size: ``errors`` (messages that arrived wrong: must be 0),
    and the p50 over the slowest rank of one ring exchange of ``values`` doubles
    (``exchange_time_p50_s``) and of one 3-value all-reduce (``allreduce_time_p50_s``). shm
    asked for on nccl ranks is refused before the launch; a transport asked for that the
    ranks find they cannot use (e.g. shm across hosts) gets a row with only ``note``.
    """
    import pandas as pd

    from labkit.launch import launch_lab

    expect_config(config, TransportCheckConfig)
    launch = LaunchOptions(nprocs=(2,), progress=False) if launch is None else launch
    return pd.DataFrame([row for res in launch_lab("transport", config, launch)
                         for row in res.rows()])
