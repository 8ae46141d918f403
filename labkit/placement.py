"""Host side of the placement check: where each rank runs, and what this machine offers.

``placement(nprocs)`` launches :mod:`labkit.workers.placement` once per world size and returns
one row per rank (rank, local_rank, host, pid, device, device_name, cuda_visible_devices,
threads, problem, and a timed all-reduce); ``env_info()`` says what a launch would get here.
``labkit placement`` and ``labkit env`` (:mod:`labkit.commands.core`) print them.
"""

from __future__ import annotations


def env_info() -> dict:
    """What this machine offers a launch: versions, backend, devices, cores."""
    import torch
    import torch.distributed as dist

    from .launch import default_threads, detect_backend
    from .results import available_cores, provenance

    info = provenance()
    cuda = torch.cuda.is_available()
    info.update({
        "torch_version": torch.__version__,
        "cuda_available": cuda,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "gloo_available": dist.is_gloo_available(),
        "nccl_available": dist.is_nccl_available(),
        "default_backend_1_rank": detect_backend(1),
        "cores": available_cores(),
        "threads_per_rank_at_2_ranks": default_threads(2),
    })
    return info


def placement(nprocs=(1, 2), *, allreduce_bytes: int = 1 << 20, progress: bool = True, **launch_kw):
    """Launch each rank count, return the placement rows (one per rank per launch) as a DataFrame."""
    import pandas as pd

    from .checks import PlacementConfig
    from .config import to_dict
    from .launch import launch_many

    cfg = PlacementConfig(allreduce_bytes=allreduce_bytes)
    rows = []
    for res in launch_many("placement", nprocs, to_dict(cfg), progress=progress, **launch_kw):
        rows += res.rows()
    return pd.DataFrame(rows)
