"""Solve lab benchmark: labkit's distributed CG against scipy's CG and the bandwidth floor,
and 2 ranks against 1, measured side by side in one run (medians over rounds).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/solve_bench.py --total-dof 501264 --rounds 3 [--sla]

Each round runs scipy's CG (this process, 1 thread) on the same matrix and right-hand side,
then one labkit launch at 1 rank and one at 2 ranks (1 thread per rank; each launch: 1 warm-up
solve, then --repeat timed solves, median; cg and the pipelined pipecg in the same launch; the
default transport, shared memory), and one more 2-rank cg launch with ``transport="torch"``
(halos and all-reduces through gloo), to show what the transport is worth. Rounds interleave the contenders so that a noisy
neighbour on a shared machine hurts all of them alike. Targets: 1 rank <= 1.15 x the
bandwidth floor and <= 0.9 x scipy per iteration; 2 ranks >= 1.6 x faster than 1; with --sla,
torch-sla's 2-rank solve of the same problem >= 2 x slower than labkit's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy/scipy load their BLAS

import numpy as np  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402


def scipy_cg(A, b, rtol):
    its = [0]

    def count(_):
        its[0] += 1

    t0 = time.perf_counter()
    _, info = spla.cg(A, b, rtol=rtol, maxiter=10 * A.shape[0], callback=count)
    return time.perf_counter() - t0, its[0], info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--total-dof", type=int, default=501_264)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--rtol", type=float, default=1e-8)
    p.add_argument("--partitioner", default="simple")
    p.add_argument("--sla", action="store_true",
                   help="also torch-sla's 2-rank solve of the same problem (1 timed solve per "
                        "round; needs pip install torch-sla -c constraints.txt)")
    args = p.parse_args(argv)

    from labkit import solve
    from labkit.launch import LaunchOptions
    from labkit.solve.config import closest_grid
    from labkit.solve.problems import global_matrix, rhs

    def solve_at(nprocs, **config):
        cfg = solve.SolveConfig(total_dof=args.total_dof, partitioners=(args.partitioner,),
                                rtol=args.rtol, **config)
        return solve.run(cfg, launch=LaunchOptions(nprocs=nprocs, threads_per_rank=1,
                                                   progress=False, timeout_s=3600))

    dims = closest_grid(args.total_dof, 2)
    A = global_matrix(dims).tocsr()
    A.indices = A.indices.astype(np.int32)  # scipy would pick int32 itself at this size
    A.indptr = A.indptr.astype(np.int32)
    b = rhs("random", dims, np.arange(A.shape[0]))
    print(f"2-D Poisson {dims[0]}x{dims[1]} = {A.shape[0]:,} DOF, random rhs, rtol {args.rtol:g}, "
          f"1 thread per process, {args.rounds} round(s); cores shared with other jobs: "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    rec = {k: [] for k in ("scipy_s", "scipy_it_s", "l1_s", "l1_it_s", "l1_floor_s", "l2_s",
                           "l2_it_s", "l2_floor_s", "sla2_s", "p1_s", "p2_s", "p2_it_s", "g2_s",
                           "g2_it_s")}
    its = {}
    for r in range(args.rounds):
        t, n_it, info = scipy_cg(A, b, args.rtol)
        rec["scipy_s"].append(t)
        rec["scipy_it_s"].append(t / n_it)
        its["scipy"] = n_it
        df = solve_at((1, 2), methods=("cg", "pipecg"), warmup=1, repeat=args.repeat)
        for n, tag in ((1, "l1"), (2, "l2")):
            row = df[(df.world_size == n) & (df.method == "cg")].iloc[0]
            pipe = df[(df.world_size == n) & (df.method == "pipecg")].iloc[0]
            assert pipe.gate_passed, f"pipecg {n}: gate failed, rel.res {pipe.rel_residual:.2e}"
            rec[f"p{n}_s"].append(pipe.solve_time_s)
            if n == 2:
                rec["p2_it_s"].append(pipe.time_per_iteration_s)
            assert row.gate_passed, f"{n} rank(s): gate failed, rel.res {row.rel_residual:.2e}"
            rec[f"{tag}_s"].append(row.solve_time_s)
            rec[f"{tag}_it_s"].append(row.time_per_iteration_s)
            rec[f"{tag}_floor_s"].append(row.bandwidth_floor_s)
            its[tag] = int(row.iterations)
        # the same 2-rank cg with halos and all-reduces through gloo instead of shared memory
        gloo = solve_at((2,), warmup=1, repeat=args.repeat, transport="torch").iloc[0]
        assert gloo.gate_passed, f"gloo transport: gate failed, rel.res {gloo.rel_residual:.2e}"
        rec["g2_s"].append(gloo.solve_time_s)
        rec["g2_it_s"].append(gloo.time_per_iteration_s)
        if args.sla:
            sla = solve_at((2,), warmup=0, repeat=1, engine="torch-sla").iloc[0]
            assert sla.gate_passed, f"torch-sla: gate failed, rel.res {sla.rel_residual:.2e}"
            rec["sla2_s"].append(sla.solve_time_s)
            print(f"round {r + 1}: torch-sla 2 ranks {sla.solve_time_s:.2f} s", flush=True)
        print(f"round {r + 1}: scipy {t:.2f} s ({n_it} it), labkit 1 rank "
              f"{rec['l1_s'][-1]:.2f} s ({its['l1']} it), 2 ranks {rec['l2_s'][-1]:.2f} s "
              f"({its['l2']} it, {row.transport}), gloo transport {gloo.solve_time_s:.2f} s; load {os.getloadavg()[0]:.1f}", flush=True)
    med = {k: statistics.median(v) for k, v in rec.items() if v}
    print("\nmedians over rounds (ms per iteration):")
    print(f"  scipy CG          {med['scipy_it_s'] * 1e3:8.3f}   ({its['scipy']} iterations)")
    print(f"  labkit 1 rank     {med['l1_it_s'] * 1e3:8.3f}   floor {med['l1_floor_s'] * 1e3:.3f}"
          f"   ({its['l1']} iterations)")
    print(f"  labkit 2 ranks    {med['l2_it_s'] * 1e3:8.3f}   floor {med['l2_floor_s'] * 1e3:.3f}")
    print(f"  pipecg 2 ranks    {med['p2_it_s'] * 1e3:8.3f}")
    print(f"  cg 2 ranks, gloo  {med['g2_it_s'] * 1e3:8.3f}   (transport torch: gloo's threads)")
    ratios = [
        ("1 rank / bandwidth floor", med["l1_it_s"] / med["l1_floor_s"], "<= 1.15"),
        ("1 rank / scipy CG (per iteration)", med["l1_it_s"] / med["scipy_it_s"], "<= 0.90"),
        ("1 rank / scipy CG (solve time)", med["l1_s"] / med["scipy_s"], "<= 0.90"),
        ("speedup 2 ranks vs 1 (solve time)", med["l1_s"] / med["l2_s"], ">= 1.60"),
        ("2 ranks / bandwidth floor", med["l2_it_s"] / med["l2_floor_s"], "(info)"),
    ]
    if args.sla:
        ratios.append(("torch-sla 2 ranks / labkit 2 ranks", med["sla2_s"] / med["l2_s"], ">= 2.00"))
    ratios += [("gloo transport: speedup 2 ranks vs 1", med["l1_s"] / med["g2_s"], "(info)"),
               ("pipecg: speedup 2 ranks vs 1", med["p1_s"] / med["p2_s"], "(info)"),
               ("best 2-rank vs cg 1 rank (solve time)",
                med["l1_s"] / min(med["l2_s"], med["p2_s"]), ">= 1.60"),
               ("pipecg 2 ranks / cg 2 ranks (per it.)", med["p2_it_s"] / med["l2_it_s"], "(info)")]
    print("\nratios (medians):")
    for name, v, target in ratios:
        print(f"  {name:36s} {v:6.3f}   target {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
