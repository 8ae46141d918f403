"""DDP lab benchmarks: (1) the harness does not distort the step it times, (2) DDP vs no DDP.

    .venv/bin/python benchmarks/ddp_bench.py               # both parts, ~3-5 min on 2 cores
    .venv/bin/python benchmarks/ddp_bench.py --part harness --blocks 9

Part 1, in this process (a world of one, like the 1-rank launch): the same model, optimizer and
batch stepped by a bare loop (``perf_counter`` around each step, nothing else) and by
``labkit.timing.repeat_timed`` over ``labkit.ddp.train.make_step`` (what the worker times: a
barrier before each step, a closure, a sync), alternating in short blocks so machine noise hits
both alike (one torch thread by default: spinning OpenMP threads make multi-threaded steps
swing with the neighbours' load). Reports the median over steps of each and their ratio; the goal is within 2%.

Part 2, real launches: ``ddp_scaling([1, 2])`` at batch 64 and 1024 per rank, repeated; medians of
the p50 step times and of N=2 throughput against the no-DDP baseline (``vs_no_ddp``).

The lab machines are shared: other jobs steal cores, so every number is a median of repeats
measured side by side, and the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def harness_overhead(model_name: str, batch: int, blocks: int, steps_per_block: int,
                     threads: int) -> None:
    import torch

    # one thread by default: idle OpenMP threads spin, so on a shared machine a 2-thread step
    # swings by 10x with the neighbours' load, drowning a 2% question in noise
    torch.set_num_threads(threads)

    from labkit import runtime, timing
    from labkit.ddp.config import DDPConfig
    from labkit.ddp.models import build_model, synthetic_batches
    from labkit.ddp.train import make_optimizer, make_step

    rt = runtime.init()  # a gloo world of one: repeat_timed's barrier runs, as in a launch
    cfg = DDPConfig(model=model_name, batch_size=batch)
    batches = synthetic_batches(cfg, 0, rt.device)
    model = build_model(cfg, rt.device)
    opt = make_optimizer(model, cfg)
    loss_fn = torch.nn.CrossEntropyLoss()
    labkit_step = make_step(model, opt, batches)

    def bare_block(n: int) -> list[float]:
        out = []
        for i in range(n):
            x, y = batches[i % len(batches)]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            out.append(time.perf_counter() - t0)
        return out

    bare_block(5)  # warm both paths (allocator, threads)
    bare, lab, ratios = [], [], []
    for b in range(blocks):
        order = ("bare", "labkit") if b % 2 == 0 else ("labkit", "bare")
        got = {}
        for which in order:
            if which == "bare":
                got[which] = bare_block(steps_per_block)
            else:
                got[which] = timing.repeat_timed(labkit_step, warmup=1, repeat=steps_per_block,
                                                 device=rt.device)
        bare += got["bare"]
        lab += got["labkit"]
        ratios.append(statistics.median(got["labkit"]) / statistics.median(got["bare"]))
    mb, ml = statistics.median(bare), statistics.median(lab)
    print(f"[harness] {model_name}, batch {batch}, {torch.get_num_threads()} threads, "
          f"{blocks} blocks x {steps_per_block} steps each, alternating")
    print(f"  bare loop     median step {mb * 1e3:8.3f} ms")
    print(f"  labkit timed  median step {ml * 1e3:8.3f} ms")
    print(f"  ratio labkit/bare: {ml / mb:.4f} over all steps; median of per-block ratios "
          f"{statistics.median(ratios):.4f} (goal: within 0.98-1.02)")
    runtime.finalize()


def ddp_vs_baseline(batches: list[int], repeats: int, steps: int, warmup: int,
                    threads_per_rank: int | None) -> None:
    from labkit.ddp.run import ddp_scaling

    per = {b: {k: [] for k in ("t0", "t1", "t2", "vs", "exposed", "compute")} for b in batches}
    for _ in range(repeats):  # both batch sizes inside each launch, so they see the same load
        df = ddp_scaling([1, 2], batch_size=batches, steps=steps, warmup=warmup, progress=False,
                         threads_per_rank=threads_per_rank)
        get = df.set_index(["batch_size", "variant", "world_size"])
        for b in batches:
            per[b]["t0"].append(get.loc[(b, "no_ddp", 1), "step_time_p50_s"])
            per[b]["t1"].append(get.loc[(b, "ddp", 1), "step_time_p50_s"])
            per[b]["t2"].append(get.loc[(b, "ddp", 2), "step_time_p50_s"])
            per[b]["vs"].append(get.loc[(b, "ddp", 2), "speedup_vs_no_ddp"])
            per[b]["exposed"].append(get.loc[(b, "ddp", 2), "exposed_comm_s"])
            per[b]["compute"].append(get.loc[(b, "ddp", 2), "nosync_step_time_p50_s"])
    med = statistics.median
    t1 = threads_per_rank or "cores // ranks"
    for b in batches:
        m = {k: med(v) for k, v in per[b].items()}
        print(f"[ddp] mlp 4.2 M params, batch {b}/rank, threads per rank: {t1}, {repeats} repeats "
              f"of {steps - warmup} timed steps (medians):")
        print(f"  no DDP (1 process)  {m['t0'] * 1e3:9.1f} ms/step  {b / m['t0']:8.0f} samples/s")
        print(f"  DDP N=1             {m['t1'] * 1e3:9.1f} ms/step  {b / m['t1']:8.0f} samples/s")
        print(f"  DDP N=2             {m['t2'] * 1e3:9.1f} ms/step  {2 * b / m['t2']:8.0f} samples/s"
              f"  (compute {m['compute'] * 1e3:.1f} ms, exposed all-reduce {m['exposed'] * 1e3:.1f} ms)")
        print(f"  N=2 throughput / no DDP = {m['vs']:.2f}x   (repeats: "
              + ", ".join(f"{v:.2f}" for v in per[b]["vs"]) + ")")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("harness", "ddp", "all"), default="all")
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--steps-per-block", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads in part 1")
    p.add_argument("--batches", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="part 2: OMP threads per rank (default: cores // ranks)")
    args = p.parse_args(argv)
    print(f"load average before: {os.getloadavg()} on {len(os.sched_getaffinity(0))} cores "
          "(shared machine: medians of repeats, side by side)")
    if args.part in ("harness", "all"):
        harness_overhead("mlp", 64, args.blocks, args.steps_per_block, args.threads)
    if args.part in ("ddp", "all"):
        ddp_vs_baseline(args.batches, args.repeats, args.steps, args.warmup, args.threads_per_rank)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
