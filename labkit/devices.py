"""Host side: which accelerators this node has, which backend a launch gets, and whether its
ranks fit in device memory, decided before anything launches.

The rule (one place): ``nccl`` when this node has at least as many CUDA devices as ranks per node,
else ``gloo`` on the CPU. Asking for nccl with more ranks than GPUs is refused (the extra ranks
would die in ``set_device``); auto-choosing gloo on a node that *has* GPUs, only too few, is
allowed but warned about and recorded in every row (``gloo_fallback``), since such rows time the
CPU, not the GPUs the reader thinks they paid for.

GPUs are looked for without importing torch where no hint of a driver exists (no
``nvidia-smi``, no ``/dev/nvidia*`` device node, no ``CUDA_VISIBLE_DEVICES``): importing torch
costs over a second on a small laptop, and most laptops have no CUDA.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import warnings
from dataclasses import dataclass

from labkit.errors import UsageError

#: device memory a rank cannot use for its data (CUDA context, cuBLAS/NCCL workspaces)
CONTEXT_RESERVE_BYTES = 1 << 30


class GlooFallbackWarning(UserWarning):
    """This node has GPUs, but fewer than ranks per node: the launch runs on gloo/CPU."""


@dataclass(frozen=True)
class Gpus:
    """The CUDA devices this node offers a launch: how many, and the memory of each (bytes)."""

    count: int
    memory_bytes: tuple = ()
    name: str = ""

    @property
    def smallest_memory_bytes(self) -> int | None:
        return min(self.memory_bytes) if self.memory_bytes else None


def _driver_hint() -> bool:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible.strip() not in ("", "-1")
    if sys.platform == "darwin":  # no CUDA on macOS: gloo (NCCL does not build there)
        return False
    # NVIDIA's tools or device nodes; ROCm's (torch.cuda is HIP there, its nccl is RCCL)
    return (shutil.which("nvidia-smi") is not None or bool(glob.glob("/dev/nvidia[0-9]*"))
            or os.path.exists("/dev/kfd")
            or any(os.environ.get(v) for v in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")))


def gpus(*, ask_torch: bool = False) -> Gpus:
    """This node's CUDA devices as torch sees them (honouring ``CUDA_VISIBLE_DEVICES``); torch
    is asked only where a driver is hinted at, or ``ask_torch``. torch counts the devices once
    per process: a notebook that changes ``CUDA_VISIBLE_DEVICES`` after its first launch must
    restart its kernel."""
    if not (ask_torch or _driver_hint()):
        return Gpus(0)
    import torch

    if not torch.cuda.is_available():
        return Gpus(0)
    n = torch.cuda.device_count()
    # properties come from the driver without creating a context on the device
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    return Gpus(n, tuple(int(p.total_memory) for p in props), props[0].name if props else "")


def choose_backend(ranks_per_node: int, requested: str | None = None, *,
                   found: Gpus | None = None, warn: bool = True) -> tuple[str, bool]:
    """(backend, gloo_fallback) for ``ranks_per_node`` ranks on this node; ``warn``: a
    :class:`GlooFallbackWarning` when gloo is chosen on a node whose GPUs are too few.

    >>> choose_backend(2, found=Gpus(0))
    ('gloo', False)
    >>> choose_backend(2, found=Gpus(4))
    ('nccl', False)
    >>> choose_backend(2, "gloo", found=Gpus(4))
    ('gloo', False)
    >>> choose_backend(8, "nccl", found=Gpus(4))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: --backend nccl runs one rank per GPU: 8 ranks per node need 8 GPUs, this node has 4 (use --nproc 4 or fewer, or --backend gloo)
    """
    if requested not in (None, "gloo", "nccl"):
        raise UsageError(f"backend must be gloo or nccl, got {requested!r}")
    if requested == "gloo":
        return "gloo", False
    found = gpus(ask_torch=requested == "nccl") if found is None else found
    if requested == "nccl":
        if found.count < ranks_per_node:
            raise UsageError(
                f"--backend nccl runs one rank per GPU: {ranks_per_node} ranks per node need "
                f"{ranks_per_node} GPUs, this node has {found.count} (use --nproc "
                f"{found.count} or fewer, or --backend gloo)" if found.count else
                "--backend nccl needs CUDA GPUs; this node has none that torch can see "
                "(check CUDA_VISIBLE_DEVICES and the driver), or use --backend gloo")
        return "nccl", False
    if found.count >= ranks_per_node:
        return "nccl", False
    if found.count and warn:
        warnings.warn(f"{ranks_per_node} ranks per node but {found.count} GPUs: the launch runs "
                      "on gloo on the CPU and its rows are marked gloo_fallback (use --nproc "
                      f"{found.count} for the GPUs)", GlooFallbackWarning, stacklevel=3)
    return "gloo", found.count > 0


def sweep_backend(ranks_per_node, requested: str | None = None, *,
                  found: Gpus | None = None) -> tuple[str | None, bool]:
    """One backend for every launch of a sweep (``ranks_per_node``: each launch's): (the
    backend each launch is given, None where each chooses its own; whether gloo was chosen
    for all of them because the node's GPUs are too few for the largest). A sweep's world
    sizes are compared with each other (speedups, the model's crossover), so where its small
    launches would run on the GPUs and its large ones fall back to gloo on the CPU, all of them
    run on the CPU, with a :class:`GlooFallbackWarning`, and their rows are marked
    ``gloo_fallback``.

    >>> with warnings.catch_warnings(record=True) as said:
    ...     sweep_backend([1, 2], found=Gpus(1))
    ('gloo', True)
    >>> str(said[0].message)[:60]
    '2 ranks per node but 1 GPUs: every launch of this sweep runs'
    >>> sweep_backend([1, 2], found=Gpus(2)), sweep_backend([1, 2], found=Gpus(0))
    ((None, False), (None, False))
    >>> sweep_backend([1, 2], "nccl", found=Gpus(1))  # asked for: each launch is refused or not
    ('nccl', False)
    """
    sizes = [int(n) for n in ranks_per_node]
    if requested is not None or len(sizes) < 2:
        return requested, False
    found = gpus() if found is None else found
    chosen = {choose_backend(n, found=found, warn=False)[0] for n in sizes}
    if len(chosen) < 2:
        return None, False
    warnings.warn(f"{max(sizes)} ranks per node but {found.count} GPUs: every launch of this "
                  "sweep runs on gloo on the CPU, so that its world sizes compare like for like, "
                  "and its rows are marked gloo_fallback (use --nproc up to "
                  f"{found.count} for the GPUs)", GlooFallbackWarning, stacklevel=3)
    return "gloo", True


def check_device_memory(bytes_per_rank: float, *, world_size: int,
                        found: Gpus | None = None) -> None:
    """Refuse an nccl launch whose rank cannot fit its estimated bytes in one device's memory
    (less :data:`CONTEXT_RESERVE_BYTES`); warn above 80% of it.

    >>> check_device_memory(2e9, world_size=2, found=Gpus(2, (80 << 30, 80 << 30)))
    >>> check_device_memory(100e9, world_size=2, found=Gpus(2, (80 << 30, 80 << 30), "H100"))
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: a rank needs about 100.0 GB of device memory at world size 2; a H100 has 85.9 GB (84.8 GB usable): use a smaller size or more ranks
    """
    found = gpus() if found is None else found
    total = found.smallest_memory_bytes
    if not total:
        return
    usable = total - CONTEXT_RESERVE_BYTES
    name = found.name or "GPU"
    if bytes_per_rank > usable:
        raise UsageError(f"a rank needs about {bytes_per_rank / 1e9:.1f} GB of device memory at "
                         f"world size {world_size}; a {name} has {total / 1e9:.1f} GB "
                         f"({usable / 1e9:.1f} GB usable): use a smaller size or more ranks")
    if bytes_per_rank > 0.8 * usable:
        from labkit.launchspec import MemoryWarning

        warnings.warn(f"a rank needs about {bytes_per_rank / 1e9:.1f} GB of the "
                      f"{usable / 1e9:.1f} GB usable on a {name}: close to the limit",
                      MemoryWarning, stacklevel=3)
