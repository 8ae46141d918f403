"""Rank side: the one place where a rank joins the world.

Everything is driven by the environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``...) plus ``LABKIT_BACKEND`` from the launcher. gloo on CPU, nccl on CUDA, the device
from ``LOCAL_RANK``; a CPU rank bound to its share of the cores. Rank code never launches ranks
(that is :mod:`labkit.launch`).
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import socket
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Runtime:
    """What a rank knows about itself once :func:`init` has run."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    #: seconds from this process's start to the process group joined (importing torch and
    #: labkit, the rendezvous; None where the start cannot be read)
    ready_s: float | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_RUNTIME: Runtime | None = None


def _choose_backend(local_world_size: int) -> str:
    requested = os.environ.get("LABKIT_BACKEND", "auto")
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def init(timeout_s: float | None = None) -> Runtime:
    """Join the process group described by the environment (idempotent).

    Outside torchrun (no ``WORLD_SIZE``) this is a world of one, still with a real gloo process
    group so that collectives in worker code run unchanged in a plain ``python -m``.
    """
    from labkit import audit

    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if "MASTER_ADDR" not in os.environ:  # plain python: a private world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    backend = _choose_backend(local_world_size)
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():  # one rank per GPU, or set_device dies
            raise RuntimeError(f"nccl: local rank {local_rank} has no GPU of its own (this node "
                               f"has {torch.cuda.device_count()}): start at most that many ranks "
                               "per node, or use gloo")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        # the device audit (labkit.audit): cpu:0 stands for the GPU, a real CPU device that a
        # call's arguments tell apart from the host's default
        device = torch.device("cpu", 0) if audit.enabled() else torch.device("cpu")
    timeout = _dt.timedelta(seconds=float(timeout_s or pg_timeout_s()))
    if rank != 0 and world_size > 1 and os.environ.get("MASTER_PORT", "").isdigit():
        wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                       timeout_s=timeout.total_seconds(), rank=rank)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout,
                            **kwargs)
    # a CPU rank's compute bound to its share of the cores (labkit.procs.bind_to_cores), once
    # gloo has started its threads: they stay free to run on any core. GPU ranks are left to
    # the cluster's launcher (srun --cpu-bind, torchrun's NUMA binding): which cores suit a GPU
    # is the node's NUMA layout, not an even split
    if backend == "gloo":
        from labkit.procs import bind_to_cores

        bind_to_cores(local_rank, local_world_size)
    if audit.enabled() and backend != "nccl":
        audit.install(device, rank=rank, local_rank=local_rank)
    from labkit.procs import age_s

    _RUNTIME = Runtime(rank, world_size, local_rank, local_world_size, backend, device,
                       ready_s=age_s())
    return _RUNTIME


def wait_for_store(host: str, port: int, *, timeout_s: float, rank: int,
                   every_s: float = 0.005) -> float:
    """Wait until the rendezvous store at ``host:port`` accepts a connection; the seconds it took.

    Why: rank 0 hosts the store (under labkit's light agent; torchrun's agent hosts its own
    before the ranks start, and then this returns at once). A rank that asks torch for it before
    rank 0 has opened it is refused and retries after a backoff: 0.35-0.6 s lost by a rank
    that came 0.05-0.2 s early, in about half the 2-rank launches here. Knocking every 5 ms costs
    nothing and joins as soon as the store is up.
    """
    t0 = time.monotonic()
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return time.monotonic() - t0
        except OSError:
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"rank {rank}: no rendezvous store at {host}:{port} after "
                                   f"{timeout_s:g} s (rank 0 never opened it)") from None
            time.sleep(every_s)


def pg_timeout_s() -> float:
    """How long a rank waits for its peers before giving up: ``LABKIT_PG_TIMEOUT_S`` (600 s)."""
    return float(os.environ.get("LABKIT_PG_TIMEOUT_S", 600))


def finalize() -> None:
    global _RUNTIME
    if dist.is_initialized():
        dist.destroy_process_group()
    _RUNTIME = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


#: when this rank last made progress (a timed sample, a print0): the launcher's timeout message
#: names the ranks whose mark stopped moving (see labkit.harness's heartbeat)
LAST_PROGRESS = [time.time()]


def mark_progress() -> None:
    LAST_PROGRESS[0] = time.time()


def print0(*args, **kwargs) -> None:
    """``print`` on rank 0 only, flushed (rank logs are files; unflushed lines vanish on a kill)."""
    mark_progress()
    if rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def seed_everything(seed: int, *, per_rank: bool = False) -> int:
    """Seed Python, NumPy and torch. ``per_rank`` offsets by the rank (different data per rank)."""
    s = int(seed) + (rank() if per_rank else 0)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)
    return s


def sync(device: torch.device | None = None) -> None:
    """Wait for queued device work, so a clock read after it means something."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def placement(rt: Runtime) -> list[dict] | None:
    """Every rank's placement, gathered to rank 0 (others get None).

    Columns: rank, local_rank, host, pid, device, device_name, cuda_visible_devices,
    threads (torch intra-op threads), cores (the cores it may run on: its share, where
    :func:`init` bound it), and ``problem``: a non-empty string where two ranks share
    one GPU (same host and same physical device), the classic misconfiguration that halves
    throughput silently. ``ready_s``: seconds from the rank's process start to the process
    group joined.
    """
    from labkit.procs import bound_cores

    if rt.device.type == "cuda":
        props = torch.cuda.get_device_properties(rt.device)
        device_name = props.name
        uuid = str(getattr(props, "uuid", "")) or f"{rt.device.index}"
    else:
        device_name = _cpu_name()
        uuid = ""
    me = {
        "rank": rt.rank,
        "local_rank": rt.local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(rt.device),
        "device_name": device_name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "threads": torch.get_num_threads(),
        "bound_cores": bound_cores(),
        "ready_s": rt.ready_s,
        "_uuid": uuid,
    }
    table: list = [None] * rt.world_size
    dist.all_gather_object(table, me)
    if rt.rank != 0:
        return None
    seen: dict[tuple, int] = {}
    for row in table:
        row["problem"] = ""
        if row["device"].startswith("cuda"):
            where = (row["host"], row.pop("_uuid"))
            if where in seen:
                row["problem"] = f"shares its GPU with rank {seen[where]}"
            seen.setdefault(where, row["rank"])
        else:
            row.pop("_uuid")
    return table


def rank0_host(rt: Runtime) -> dict | None:
    """Where global rank 0 runs, told to every rank of a multi-node world (one small
    broadcast): ``host`` and ``node`` (the SLURM node name, where there is one). A node that
    does not host rank 0 gets no rows; its launcher says where they are instead. None
    in a one-node world."""
    if rt.world_size == rt.local_world_size:
        return None
    box = [{"host": socket.gethostname(), "node": os.environ.get("SLURMD_NODENAME")}
           if rt.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _cpu_name() -> str:
    """``"cpu: MODEL"``, or ``"cpu"`` where the platform does not tell the model
    (:func:`labkit.procs.cpu_model`, which asks torch's own CPU probe in a rank)."""
    from labkit.procs import cpu_model

    model = cpu_model()
    return f"cpu: {model}" if model else "cpu"


def run_meta(rt: Runtime) -> dict:
    """The rank-side facts a launch records beside its rows."""
    meta = asdict(rt)
    meta["device"] = str(rt.device)
    meta["device_name"] = (torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda"
                           else _cpu_name())
    meta["torch_version"] = torch.__version__
    meta["threads_per_rank"] = torch.get_num_threads()
    return meta


def reset_device_peak(device: torch.device | None) -> None:
    """Start a new peak of device memory on ``device`` (CUDA); nothing on a CPU, whose
    memory is the host's (measured as RSS by the launcher)."""
    if device is not None and device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_peak_bytes(device: torch.device | None) -> int | None:
    """The most device memory this process's tensors held on ``device`` since the last
    :func:`reset_device_peak` (CUDA); None on a CPU, where there is no device memory apart
    from the host's."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def rank_device() -> torch.device:
    """This rank's device as :func:`init` chose it: where a tensor handed to torch.distributed
    lives when the caller holds no :class:`Runtime`. A process group joined without ``init``
    gives the current GPU on NCCL; none at all, the CPU."""
    if _RUNTIME is not None:
        return _RUNTIME.device
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_device_peak_bytes(device: torch.device | None) -> int | None:
    """The largest :func:`device_peak_bytes` of any rank, on every rank. Collective on CUDA
    (one all-reduce); on a CPU None, and no message (every rank of a world has one kind of
    device, so all of them take the same branch)."""
    mine = device_peak_bytes(device)
    if mine is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    t = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
