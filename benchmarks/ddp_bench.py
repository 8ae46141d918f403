"""DDP lab benchmarks: (1) the harness does not distort the step it times, (2) DDP vs no DDP,
like with like, against the model of the DDP step and the targets.

    .venv/bin/python benchmarks/ddp_bench.py               # both parts, ~4-6 min on 2 cores
    .venv/bin/python benchmarks/ddp_bench.py --part harness --blocks 9
    .venv/bin/python benchmarks/ddp_bench.py --part ddp --repeats 5

Part 1, in this process (a world of one, like the 1-rank launch): the same model, optimizer and
batch stepped by a bare loop (``perf_counter`` around each step, nothing else) and by
``labkit.timing.repeat_timed`` over ``labkit.ddp.train.make_step`` (what the worker times: a
barrier before each step, a closure, a sync), alternating in short blocks so machine noise hits
both alike (one torch thread by default: spinning OpenMP threads make multi-threaded steps
swing with the neighbours' load). Reports the median over steps of each and their ratio; the goal is within 2%.

Part 2, real launches: ``labkit.ddp.run`` on 1 and 2 ranks, one thread for every process
(the no-DDP one included), over notebook 05's batch sweep, with the whole-machine run (every
core as a thread) at the smallest and largest batch: rounds of both launches, their order
swapped every round (so a load that drifts does not always fall on the same launch). Per batch
the medians over rounds of the measured speedup against the no-DDP process and of the model's
(:func:`labkit.ddp.predict.add_prediction_columns`, from the machine profile), the error, then
the targets side by side with what was measured: 2 ranks at least 1.5x the no-DDP process at
the largest batch, the model within 25% at every batch, the crossover batch predicted and
measured, and whether the model says rightly at which batches DDP pays.

The lab machines are shared: other jobs steal cores, so every number is a median of rounds
measured side by side, and the load average is printed with every round.
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
                    threads_per_rank: int, results_dir: str = "results") -> None:
    import math

    from labkit import ddp, machine
    from labkit.launch import LaunchOptions

    # the machine profile the model carries: measured once (a few seconds) into results/, or
    # the one $LABKIT_MACHINE_PROFILE names
    prof = machine.profile(results_dir)
    print(f"  {prof.describe()}; co-run slowdown at 2 ranks {prof.compute_slowdown(2):.2f}")
    batches = sorted(batches)
    ends = (batches[0], batches[-1])
    config = ddp.DDPConfig(batch_size=tuple(batches), steps=steps, warmup=warmup,
                           all_cores_batches=tuple(sorted(set(ends))))
    keys = ("t0", "tw", "t2", "tc", "pred_t2", "vs", "pred", "err", "vs_all")
    per = {b: {k: [] for k in keys} for b in batches}
    cross = {"measured": [], "predicted": []}
    for i in range(repeats):
        order = (1, 2) if i % 2 == 0 else (2, 1)  # interleaved: the launch order swaps
        load = os.getloadavg()[0]
        df = ddp.run(config, launch=LaunchOptions(nprocs=order, threads_per_rank=threads_per_rank,
                                                  progress=False), profile=prof)
        get = df.set_index(["batch_size", "variant", "world_size"])
        for b in batches:
            two = get.loc[(b, "ddp", 2)]
            per[b]["t0"].append(get.loc[(b, "no_ddp", 1), "step_time_p50_s"])
            per[b]["tw"].append(get.loc[(b, "no_ddp_all_cores", 1), "step_time_p50_s"]
                                if b in ends else math.nan)
            per[b]["t2"].append(two.step_time_p50_s)
            per[b]["tc"].append(two.nosync_step_time_p50_s)
            per[b]["pred_t2"].append(two.predicted_step_time_s)
            per[b]["vs"].append(two.speedup_vs_no_ddp)
            per[b]["pred"].append(two.predicted_speedup_vs_no_ddp)
            per[b]["err"].append(two.predicted_speedup_error_pct)
            per[b]["vs_all"].append(two.get("speedup_vs_all_cores", math.nan))
        c = ddp.report.crossover(ddp.report.select(df, ("no_ddp", "ddp")))
        cross["measured"].append(c["measured"])
        cross["predicted"].append(c["predicted"])
        cross.setdefault("agreement", []).append(c["agreement"])
        print(f"  round {i + 1}/{repeats}: launches {order}, load {load:.2f} -> "
              f"{os.getloadavg()[0]:.2f}; crossover measured {c['measured']:.0f}, predicted "
              f"{c['predicted']:.0f}; speedups " + ", ".join(
                  f"{b}: {per[b]['vs'][-1]:.2f}/{per[b]['pred'][-1]:.2f}" for b in batches)
              + " (measured/predicted)", flush=True)

    def med(v):
        v = [x for x in v if x == x]
        return statistics.median(v) if v else math.nan

    print(f"[ddp] mlp 4.2 M params, {threads_per_rank} thread(s) per process, {repeats} rounds of "
          f"{steps - warmup} timed steps (medians over rounds)")
    print(f"  {'batch':>5} {'no DDP':>9} {'DDP N=2':>9} {'compute':>9} {'model':>9} "
          f"{'speedup':>8} {'model':>7} {'error':>7}  {'vs 1 proc, all cores':>20}")
    for b in batches:
        m = {k: med(v) for k, v in per[b].items()}
        whole = (f"{m['vs_all']:.2f}x ({m['t0'] / m['tw']:.2f}x threads)" if b in ends else "")
        print(f"  {b:5d} {m['t0'] * 1e3:7.1f}ms {m['t2'] * 1e3:7.1f}ms {m['tc'] * 1e3:7.1f}ms "
              f"{m['pred_t2'] * 1e3:7.1f}ms {m['vs']:7.2f}x {m['pred']:6.2f}x {m['err']:+6.1f}%  "
              f"{whole:>20}")
    print("  (speedup = 2 t_no_DDP / t_DDP against the one-thread no-DDP process; model = "
          "t_no_DDP x co-run slowdown + copies + all-reduces in context (labkit.ddp.predict); "
          "error = the larger relative error, median of the rounds' errors)")
    big = batches[-1]
    vs_big = med(per[big]["vs"])
    worst = max(batches, key=lambda b: abs(med(per[b]["err"])))
    all_rounds = [abs(e) for b in batches for e in per[b]["err"]]
    cm, cp = med(cross["measured"]), med(cross["predicted"])
    print("\n  target                                         measured                     verdict")
    print(f"  2 ranks >= 1.5x no DDP at batch {big:<5}          {vs_big:.2f}x (rounds: "
          + ", ".join(f"{v:.2f}" for v in per[big]["vs"]) + f")   {'PASS' if vs_big >= 1.5 else 'FAIL'}")
    print(f"  model within 25% at every batch               worst median {med(per[worst]['err']):+.1f}% "
          f"(batch {worst}); worst single round {max(all_rounds):.1f}%   "
          f"{'PASS' if all(abs(med(per[b]['err'])) <= 25 for b in batches) else 'FAIL'}")
    print(f"  crossover batch, predicted vs measured        predicted {cp:.0f}, measured {cm:.0f} "
          "(rounds: " + ", ".join(f"{p:.0f}/{m:.0f}" for p, m in zip(cross["predicted"],
                                                                     cross["measured"]))
          + f")   {'error ' + format(100 * (cp - cm) / cm, '+.0f') + '%' if cm == cm else 'n/a'}")
    print("  the model says whether DDP pays, batch by batch   share right per round: "
          + ", ".join(f"{a:.2f}" for a in cross["agreement"])
          + f"   {'PASS' if all(a == 1.0 for a in cross['agreement']) else 'FAIL'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("harness", "ddp", "all"), default="all")
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--steps-per-block", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads in part 1")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 128],
                   help="part 2: batches per rank (notebook 05's sweep)")
    p.add_argument("--repeats", type=int, default=3, help="part 2: rounds")
    p.add_argument("--steps", type=int, default=5, help="part 2: steps per run (notebook 05's)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads-per-rank", type=int, default=1,
                   help="part 2: threads of every process, the no-DDP one included")
    p.add_argument("--results-dir", default="results",
                   help="part 2: where the machine profile is read from (or measured into)")
    args = p.parse_args(argv)
    from labkit.procs import available_cores

    print(f"load average before: {os.getloadavg()} on {available_cores()} cores "
          "(shared machine: medians of repeats, side by side)")
    if args.part in ("harness", "all"):
        harness_overhead("mlp", 64, args.blocks, args.steps_per_block, args.threads)
    if args.part in ("ddp", "all"):
        ddp_vs_baseline(args.batches, args.repeats, args.steps, args.warmup, args.threads_per_rank,
                        args.results_dir)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
