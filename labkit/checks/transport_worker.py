"""Worker: check the solve operator's transports (shared memory, torch.distributed) and time
one message on each.

Run by hand::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m labkit.checks.transport_worker \\
        --config '{"rounds": 1000, "jitter_us": 500}'

For each transport: ``rounds`` checked rounds (ring exchange + all-reduce, ranks out of step
by a random wait each round; every value received must be the one sent), then ``repeat`` timed
rounds. One row per transport with ``errors`` (must be 0) and the medians
``exchange_time_p50_s`` and ``allreduce_time_p50_s`` over the slowest rank.
"""

from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.checks.config import TransportCheckConfig
from labkit.harness import worker_main
from labkit.solve.transport import make_transport


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def check(rt, cfg: TransportCheckConfig, kind: str) -> dict:
    P, r, n = rt.world_size, rt.rank, cfg.values
    nxt, prv = (r + 1) % P, (r - 1) % P
    comm = make_transport(kind, rt, {nxt: n}, {prv: n})
    rng = random.Random(cfg.seed + r)
    send = torch.empty(n, dtype=torch.float64)
    recv = torch.empty(n, dtype=torch.float64)
    red = torch.empty(3, dtype=torch.float64)
    ramp = torch.arange(n, dtype=torch.float64)
    errors = 0

    def exchange():
        for q in [comm.irecv(recv, prv), comm.isend(send, nxt)]:
            q.wait()

    def one_round(i: int, jitter: float) -> int:
        if jitter:
            _busy(rng.uniform(0, jitter))
        send.copy_(ramp + 1000.0 * i + 1e6 * r)
        exchange()
        red.copy_(torch.tensor([1.0, float(r), float(i)]))
        comm.all_reduce(red)
        bad = int(not torch.equal(recv, ramp + 1000.0 * i + 1e6 * prv))
        want = torch.tensor([float(P), P * (P - 1) / 2, float(i * P)], dtype=torch.float64)
        return bad + int(not torch.equal(red, want))

    for i in range(cfg.rounds):
        errors += one_round(i, cfg.jitter_us)

    # no barrier per repeat: gloo's barrier releases ranks up to ~0.1 ms apart, which the shm
    # timings would then show as latency; the ring itself keeps the ranks in step
    ex = timing.repeat_timed(exchange, warmup=10, repeat=cfg.repeat, device=rt.device,
                             barrier=False)
    ar = timing.repeat_timed(lambda: comm.all_reduce(red), warmup=10, repeat=cfg.repeat,
                             device=rt.device, barrier=False)
    total = torch.tensor([float(errors)])
    dist.all_reduce(total)
    comm.close()
    return {"transport": comm.name, "rounds": cfg.rounds, "values": n, "jitter_us": cfg.jitter_us,
            "errors": int(total.item()), **timing.summarize(ex, "exchange_time"),
            **timing.summarize(ar, "allreduce_time")}


def run(rt: runtime.Runtime, cfg: TransportCheckConfig) -> dict:
    rows = [check(rt, cfg, kind) for kind in cfg.transports]
    return {"rows": rows} if rt.rank == 0 else {}


if __name__ == "__main__":
    worker_main(run, TransportCheckConfig)
