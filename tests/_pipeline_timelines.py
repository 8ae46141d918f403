"""Synthetic machine profiles whose messages wait for the scheduler, and pipeline steps whose
messages did, for the step models of the pipeline lab and notebook 08's model check."""

from __future__ import annotations

from labkit.collectives import formulas as collectives
from labkit.machine.profile import Profile
from labkit.pipeline import formulas, messages, schedules

#: the profile's transfers: a message of S bytes takes ALPHA / 2 + S / BETA when nothing waits
ALPHA, BETA, RATE, CO_RUN = 2e-4, 1e9, 30e9, 1.25
#: what a call that waited took beyond its transfer (the profile's excesses have this median)
WAIT_S = 3.6e-3


def message_transfer(size_bytes: float) -> float:
    return ALPHA / 2 + size_bytes / BETA


def compute_rows(*, rate: float, co_run: float, cores: int = 2) -> list[dict]:
    """A synthetic profile's compute rows, every number known: copies at 2 GB/s alone and
    together, n x n products (n = 64, 256) and the 2-layer MLP step of width 512, batch 64, at
    ``rate`` alone and ``co_run`` times slower together."""
    rows = [{"hostname": "synthetic", "cores": cores, "world_size": 2, "torch_version": "x",
             "timestamp": "2026-11-25T00:00:00+00:00", "measurement": "copy", "context": c,
             "size_bytes": 1 << 20, "time_p50_s": 1e-3, "bytes_per_s": 2e9}
            for c in ("alone", "together")]
    for n in (64, 256):
        for c, f in (("alone", 1.0), ("together", co_run)):
            rows.append({"measurement": "matmul", "context": c, "n": n,
                         "time_p50_s": 2 * n ** 3 / rate * f, "flop_per_s": rate / f})
    flop = 6 * 2 * 64 * 512 ** 2
    for c, f in (("alone", 1.0), ("together", co_run)):
        rows.append({"measurement": "step", "context": c, "n": 512, "time_p50_s": flop / rate * f,
                     "flop_per_s": rate / f})
    return rows


def wait_profile(*, co_run: float = CO_RUN, share_busy: float = 0.5) -> Profile:
    """A machine profile whose messages and all-reduces move at known transfers (their p10)
    and, as often as ``share_busy`` with the cores busy (0.2 idle), wait one scheduler tick
    (the excesses' median: :data:`WAIT_S`) more: the real class, synthetic rows."""
    rows = compute_rows(rate=RATE, co_run=co_run)
    for s in (8, 512, 32768, 65536, 131072, 262144, 524288, 1 << 21):
        for c, share in (("idle", 0.2), ("busy", share_busy)):
            waits = {"wait_share": share, "wait_excess_s": [WAIT_S - 1e-4, WAIT_S, WAIT_S + 1e-4]}
            ar = collectives.allreduce_time(size_bytes=s, ranks=2, alpha_s=ALPHA,
                                            beta_bytes_per_s=BETA)
            rows.append({"measurement": "allreduce", "context": c, "size_bytes": s,
                         "time_p10_s": ar, "time_p50_s": ar + share * WAIT_S, **waits})
            t = message_transfer(s)
            rows.append({"measurement": "message", "context": c, "size_bytes": s,
                         "time_p10_s": t, "time_p50_s": t + share * WAIT_S, **waits})
    return Profile.from_rows(rows, source="synthetic")


def measured_row(m: int, *, waited=(), wait_s: float = WAIT_S, schedule: str = "gpipe",
                 forward_s: float = 2e-3, backward_s: float = 4e-3, co_run: float = CO_RUN,
                 hidden: int = 512, batch: int = 128, layers: int = 8) -> dict:
    """A pipeline row (P = 2) as the worker makes it, from a step this machine would run: every
    block at its alone time slowed by ``co_run`` where both ranks compute, every message its
    profile transfer, and the messages into the blocks named in ``waited`` ((kind, stage,
    microbatch)) ``wait_s`` longer. Its timeline holds those waits: the model must count them."""
    transfer = message_transfer(4 * batch // m * hidden)
    orders = {r: [(k, r, mb, {"F": forward_s, "B": backward_s}[k])
                  for k, mb, _ in schedules._order(schedule, 2, m, 1, r)] for r in (0, 1)}
    placed = formulas.corun_replay(orders, last_stage=1, rank_of_stage={0: 0, 1: 1},
                                   slowdown={1: 1.0, 2: co_run}, message_s=transfer,
                                   wait_s={k: wait_s for k in waited})
    blocks = [{"rank": r, "stage": r, "kind": orders[r][i][0], "microbatch": orders[r][i][2],
               "start_s": a, "end_s": z} for (r, i), (a, z) in placed.items()]
    step = max(z for _, z in placed.values())
    split = formulas.timeline_split(blocks, step_end_s=step)
    bubble = formulas.bubble_fraction(num_stages=2, num_microbatches=m)
    return {"schedule": schedule, "num_stages": 2, "num_microbatches": m, "virtual_stages": 1,
            "layers": layers, "hidden": hidden, "batch": batch, "microbatch_size": batch // m,
            "step_time_s": step, "block_times": formulas.block_times([blocks]),
            "compute_share": split["compute_share"], "bubble_fill_drain": split["bubble_share"],
            "idle_other": split["other_share"], "bubble_measured": 1 - split["compute_share"],
            "bubble_formula": bubble, "slot_time_s": split["compute_s"] / (2 * m),
            "step_split_s": {"compute": split["compute_s"] / 2,
                             "fill/drain bubble": split["bubble_s"] / 2,
                             "messages and other waits": split["other_s"] / 2},
            "blocks": blocks, "median_step_blocks": blocks,
            "step_messages": messages.step_messages(blocks)}
