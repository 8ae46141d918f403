"""TP and FSDP lab benchmark: the harness does not distort the step it times.

    .venv/bin/python benchmarks/split_bench.py                 # ~1-2 min on 2 cores
    .venv/bin/python benchmarks/split_bench.py --rounds 24 --steps-per-round 4

The script starts itself under torchrun on 2 ranks, one thread each (what ``labkit tp`` runs).
In every rank the same two steps -- a tensor-parallel step (the teaching version,
``labkit.tp.models.naive_tp_model``, SGD) and a sharded step (FSDP2, ``fully_shard``, Adam), on
the labs' default models -- are run

* by a **bare loop**: ``perf_counter`` around the step written out inline, nothing else;
* by **labkit**: ``labkit.timing.repeat_timed`` over ``labkit.tp.models.make_step``, what the
  workers time (a closure, a barrier before each step, a device sync around it),

alternating in short rounds (bare first in even rounds, labkit first in odd ones) so machine
noise hits both alike. Rank 0 prints, per step kind, the median step time of each path over all
ranks' samples, their ratio, and the median of the per-round ratios; the goal is within 3%.

The lab machines are shared: other jobs steal cores, so the numbers are medians of rounds
measured side by side, and the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import main_on_ranks, print_side_by_side


def _rank_side(args) -> None:
    import torch

    from labkit import runtime, timing
    from labkit.fsdp.config import FSDPConfig
    from labkit.fsdp.shard import wrap_fsdp
    from labkit.tp.config import TPConfig
    from labkit.tp.models import (
        Comm,
        build_model,
        loss_fn,
        make_optimizer,
        make_step,
        naive_tp_model,
        synthetic_batch,
    )

    rt = runtime.init()
    tcfg, fcfg = TPConfig(), FSDPConfig()
    kinds = {}

    full = build_model(hidden=tcfg.hidden, num_heads=tcfg.num_heads, num_layers=tcfg.num_layers,
                       seed=0, device=rt.device)
    x, y = synthetic_batch(batch_size=tcfg.batch_size, seq_len=tcfg.seq_len, hidden=tcfg.hidden,
                           seed=0, device=rt.device)
    model = naive_tp_model(full, rt.rank, rt.world_size, Comm(rt.world_size, rt.device))
    opt = make_optimizer(model, tcfg.lr)
    kinds["tp (teaching version)"] = (model, opt, x, y)

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    fmodel = wrap_fsdp(build_model(hidden=fcfg.hidden, num_heads=fcfg.num_heads,
                                   num_layers=fcfg.num_layers, seed=0, device=rt.device), mesh)
    fx, fy = synthetic_batch(batch_size=fcfg.batch_size, seq_len=fcfg.seq_len,
                             hidden=fcfg.hidden, seed=0, rank=rt.rank, device=rt.device)
    fopt = torch.optim.Adam(fmodel.parameters(), lr=fcfg.lr)
    kinds["fsdp (FSDP2)"] = (fmodel, fopt, fx, fy)

    for name, (m, o, xx, yy) in kinds.items():
        def bare(n, m=m, o=o, xx=xx, yy=yy):
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                o.zero_grad(set_to_none=True)
                loss_fn(m(xx.detach().requires_grad_(True)), yy).backward()
                o.step()
                runtime.sync(rt.device)
                out.append(time.perf_counter() - t0)
            return out

        labkit_step = make_step(m, o, xx, yy)
        bare(3)  # warm both paths (allocator, threads, FSDP's buffers)
        timing.repeat_timed(labkit_step, warmup=0, repeat=2, device=rt.device)
        got = {"bare": [], "labkit": []}
        ratios = []
        for r in range(args.rounds):
            order = ("bare", "labkit") if r % 2 == 0 else ("labkit", "bare")
            this = {}
            for which in order:
                if which == "bare":
                    this[which] = bare(args.steps_per_round)
                else:
                    this[which] = timing.repeat_timed(labkit_step, warmup=0,
                                                      repeat=args.steps_per_round,
                                                      device=rt.device)
            got["bare"] += this["bare"]
            got["labkit"] += this["labkit"]
            ratios.append(statistics.median(this["labkit"]) / statistics.median(this["bare"]))
        allb = timing.gather_samples(got["bare"]).ravel()
        alll = timing.gather_samples(got["labkit"]).ravel()
        allr = timing.gather_samples(ratios).ravel()
        if rt.rank == 0:
            print(f"[{name}] {rt.world_size} ranks, {torch.get_num_threads()} thread(s) each, "
                  f"{args.rounds} rounds x {args.steps_per_round} steps per path, alternating",
                  flush=True)
            print_side_by_side({"bare loop": allb, "labkit timed": alll}, allr, what="step",
                               unit="ms", goal=" (goal: within 0.97-1.03)")
    runtime.finalize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--steps-per-round", type=int, default=5)
    return main_on_ranks(__file__, p, argv, _rank_side, env={"OMP_NUM_THREADS": "1"},
                         note="shared machine: medians of rounds, side by side")


if __name__ == "__main__":
    sys.exit(main())
