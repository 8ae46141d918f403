"""Does `labkit collectives` measure the collective, not its harness?

Side by side in one run, alternating: `labkit.collectives.run` (all-reduce, 2 ranks)
and a bare torchrun script timing a plain loop of dist.all_reduce at the same sizes (same thread
count, same iterations). Each is repeated REPEATS times; the busbw per size is the median over
repeats; the ratio labkit / raw should be within 10%. Which goes first alternates. The machine may be shared:
run it twice and read the load average it prints.

    .venv/bin/python benchmarks/collectives_bench.py [--repeats 3] [--iters 20]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from labkit import collectives
from labkit.collectives.formulas import busbw_gb_per_s, parse_size, size_sweep
from labkit.launch import LaunchOptions

HERE = Path(__file__).resolve().parent


def raw(sizes, iters, warmup):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "_raw_allreduce.py"), ",".join(map(str, sizes)), str(iters), str(warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    return {int(k): v for k, v in json.loads(line).items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="16M")
    ap.add_argument("--factor", type=float, default=8)
    a = ap.parse_args()
    sizes = [s for s, _ in size_sweep("all_reduce", 2, parse_size(a.min_bytes),
                                      parse_size(a.max_bytes), a.factor)]
    lab, base = {s: [] for s in sizes}, {s: [] for s in sizes}
    lab_mean, base_loop = {s: [] for s in sizes}, {s: [] for s in sizes}
    for k in range(a.repeats):
        # alternate which goes first: on a shared machine the load drifts between launches
        for which in (("lab", "raw") if k % 2 == 0 else ("raw", "lab")):
            if which == "lab":
                config = collectives.CollectivesConfig(
                    min_bytes=min(sizes), max_bytes=max(sizes), factor=a.factor, iters=a.iters,
                    warmup=a.warmup, check=False)
                df = collectives.run(config, launch=LaunchOptions(nprocs=(2,), progress=False,
                                                                  threads_per_rank=1))
                for r in df.itertuples():
                    lab[r.size_bytes].append(r.busbw_gb_per_s)
                    lab_mean[r.size_bytes].append(
                        busbw_gb_per_s(op="all_reduce", ranks=2, size_bytes=r.size_bytes,
                                       time_s=r.time_mean_s))
            else:
                for s, (t50, tloop) in raw(sizes, a.iters, a.warmup).items():
                    base[s].append(busbw_gb_per_s(op="all_reduce", ranks=2, size_bytes=s,
                                                  time_s=t50))
                    base_loop[s].append(busbw_gb_per_s(op="all_reduce", ranks=2, size_bytes=s,
                                                       time_s=tloop))
        print(f"repeat {k + 1}/{a.repeats} done", file=sys.stderr)
    print(f"all_reduce, 2 ranks, 1 thread each, {a.iters} iters, median of {a.repeats} repeats, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("busbw (GB/s) from the median call (labkit's busbw_gb_per_s vs the raw loop's median call)"
          " and from the mean (labkit time_mean_s vs the raw loop's total time / iters)")
    print(f"{'size (B)':>10} {'labkit p50':>11} {'raw p50':>9} {'ratio':>6}   "
          f"{'labkit mean':>11} {'raw loop':>9} {'ratio':>6}")
    ratios = []
    for s in sizes:
        lb, rb = float(np.median(lab[s])), float(np.median(base[s]))
        lm, rl = float(np.median(lab_mean[s])), float(np.median(base_loop[s]))
        ratios.append(lb / rb)
        print(f"{s:>10} {lb:>11.4f} {rb:>9.4f} {lb / rb:>6.3f}   {lm:>11.4f} {rl:>9.4f} {lm / rl:>6.3f}")
    med = float(np.median(ratios))
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"median-call ratio: median over sizes {med:.3f}, worst {worst:.3f}; within 10%: "
          f"{'yes' if abs(med - 1) <= 0.1 else 'NO'} (median), "
          f"{sum(abs(r - 1) <= 0.1 for r in ratios)}/{len(ratios)} sizes")


if __name__ == "__main__":
    main()
