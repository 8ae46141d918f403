"""Worker: check the solve operator's transports (shared memory, torch.distributed) and time
one message on each.

Run by hand::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.checks.transport_worker \\
        --config '{"rounds": 1000, "jitter_us": 500}'

For each transport (unset: every one the ranks' device supports): ``rounds`` checked rounds
(ring exchange + all-reduce, ranks out of step by a random wait each round; every value
received must be the one sent), then ``repeat`` timed rounds. One row per transport with
``errors`` (must be 0) and the medians ``exchange_time_p50_s`` and ``allreduce_time_p50_s``
over the slowest rank; a transport asked for that cannot run on these ranks gets a row with
``note`` saying why.
"""

from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.checks.config import TRANSPORTS, TransportCheckConfig
from labkit.harness import worker_main
from labkit.solve.transport import make_transport, shm_possible


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def transports_to_run(rt, cfg: TransportCheckConfig) -> list[tuple[str, str | None]]:
    """(transport, why it cannot run here or None) for each transport of ``cfg``; unset: every
    one this rank's device supports (shm only on CPU tensors, all ranks on one host)."""
    why = {"shm": shm_possible(rt.world_size, rt.local_world_size, rt.device), "torch": None}
    if cfg.transports is None:
        return [(kind, None) for kind in TRANSPORTS if why[kind] is None]
    return [(kind, why[kind]) for kind in cfg.transports]


def check(rt, cfg: TransportCheckConfig, kind: str) -> dict:
    P, r, n = rt.world_size, rt.rank, cfg.values
    nxt, prv = (r + 1) % P, (r - 1) % P
    comm = make_transport(kind, rt, {nxt: n}, {prv: n})
    rng = random.Random(cfg.seed + r)
    # every tensor on the rank's device: nccl carries CUDA tensors only
    on = {"dtype": torch.float64, "device": rt.device}
    send = torch.empty(n, **on)
    recv = torch.empty(n, **on)
    red = torch.empty(3, **on)
    ramp = torch.arange(n, **on)
    errors = 0

    def exchange():
        # the solve operator's call (labkit.solve.operator.DistOperator.post_exchange)
        for q in comm.exchange_start([(send, nxt)], [(recv, prv)]):
            q.wait()

    def one_round(i: int, jitter: float) -> int:
        if jitter:
            _busy(rng.uniform(0, jitter))
        send.copy_(ramp + 1000.0 * i + 1e6 * r)
        exchange()
        red.copy_(torch.tensor([1.0, float(r), float(i)], **on))
        comm.all_reduce(red)
        bad = int(not torch.equal(recv, ramp + 1000.0 * i + 1e6 * prv))
        want = torch.tensor([float(P), P * (P - 1) / 2, float(i * P)], **on)
        return bad + int(not torch.equal(red, want))

    for i in range(cfg.rounds):
        errors += one_round(i, cfg.jitter_us)

    # no barrier per repeat: gloo's barrier releases ranks up to ~0.1 ms apart, which the shm
    # timings would then show as latency; the ring itself keeps the ranks in step
    ex = timing.repeat_timed(exchange, warmup=10, repeat=cfg.repeat, device=rt.device,
                             barrier=False)
    ar = timing.repeat_timed(lambda: comm.all_reduce(red), warmup=10, repeat=cfg.repeat,
                             device=rt.device, barrier=False)
    total = torch.tensor([float(errors)], **on)
    dist.all_reduce(total)
    comm.close()
    return {"transport": comm.name, "rounds": cfg.rounds, "values": n, "jitter_us": cfg.jitter_us,
            "errors": int(total.item()), **timing.summarize(ex, "exchange_time"),
            **timing.summarize(ar, "allreduce_time")}


def on_rank(rt: runtime.Runtime, cfg: TransportCheckConfig) -> dict:
    # a transport asked for that cannot run here (the host could not know the backend before
    # the launch) gets a row that says why, not a traceback
    rows = [check(rt, cfg, kind) if why is None else {"transport": kind, "note": why}
            for kind, why in transports_to_run(rt, cfg)]
    return {"rows": rows} if rt.rank == 0 else {}


if __name__ == "__main__":
    worker_main(on_rank, TransportCheckConfig)
