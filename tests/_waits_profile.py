"""A synthetic machine profile whose messages are two kinds of call, every number known: the
transfers (each size's 10th percentile), a share of calls that also waited for the scheduler
and what each took beyond its transfer. Shared by the tests of the labs that count the
scheduler waits of a measured step (MoE, CP, DDP)."""

from __future__ import annotations

from labkit.machine import Profile

#: what a call that waited took beyond its transfer, in every synthetic profile here
WAIT_S = 3.6e-3


def allreduce_transfer(size_bytes: float, *, busy: bool = False) -> float:
    """The synthetic all-reduce's transfer on 2 ranks: 2 (N-1) alpha + S / beta, alpha 100 us,
    beta 1 GB/s; 1.5 times that while the cores compute."""
    return (2e-4 + size_bytes / 1e9) * (1.5 if busy else 1.0)


def message_transfer(size_bytes: float, *, busy: bool = False) -> float:
    """The synthetic one-way message's transfer: 100 us + S / (1 GB/s); 1.5 times busy."""
    return (1e-4 + size_bytes / 1e9) * (1.5 if busy else 1.0)


def profile(*, co_run: float = 1.2, share_idle: float = 0.2, share_busy: float = 0.5,
            wait_s: float = WAIT_S) -> Profile:
    """The profile: products at 10 GFLOP/s alone, ``co_run`` slower together, copies at 21 GB/s
    alone (1.5x slower together), and messages and all-reduces at the transfers above
    (reduce-scatters twice the all-reduce's, all-gathers once), a ``share_idle``
    (``share_busy``) of the calls waiting ``wait_s`` more."""
    base = {"hostname": "synthetic", "cores": 2, "torch_version": None, "world_size": 2,
            "timestamp": "2026-11-25T03:00:00+00:00"}
    rows = []
    for n in (64, 512):
        t = 2 * n ** 3 / 1e10
        rows += [{**base, "measurement": "matmul", "context": c, "n": n, "size_bytes": None,
                  "time_p50_s": t * f, "flop_per_s": 2 * n ** 3 / (t * f)}
                 for c, f in (("alone", 1.0), ("together", co_run))]
    rows += [{**base, "measurement": "step", "context": c, "n": 512, "size_bytes": None,
              "time_p50_s": 0.01 * f, "flop_per_s": 1e10 / f}
             for c, f in (("alone", 1.0), ("together", co_run))]
    rows += [{**base, "measurement": "copy", "context": c, "n": None, "size_bytes": 1 << 20,
              "time_p50_s": 1e-4 * f, "bytes_per_s": 2 * (1 << 20) / (1e-4 * f)}
             for c, f in (("alone", 1.0), ("together", 1.5))]
    for s in (8, 4096, 1 << 20, 16 << 20):
        for ctx, share in (("idle", share_idle), ("busy", share_busy)):
            busy = ctx == "busy"
            # gloo's reduce-scatter about twice an all-reduce of the buffer, its all-gather
            # about one, as this machine's profiles time them
            for what, t in (("allreduce", allreduce_transfer(s, busy=busy)),
                            ("message", message_transfer(s, busy=busy)),
                            ("reduce_scatter", 2 * allreduce_transfer(s, busy=busy)),
                            ("all_gather", allreduce_transfer(s, busy=busy))):
                rows.append({**base, "measurement": what, "context": ctx, "n": None,
                             "size_bytes": s, "time_p50_s": t + share * wait_s,
                             "time_p10_s": t, "wait_share": share,
                             "wait_excess_s": [wait_s] * round(10 * share),
                             "bytes_per_s": s / t})
    return Profile.from_rows(rows, source="synthetic")
