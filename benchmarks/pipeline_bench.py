"""Pipeline lab benchmark: the bubble read off the timeline against (P−1)/(P−1+M), and the step
model (alone blocks, the machine profile's co-run slowdown and messages) against the measured
step, with notebook 07's defaults (medians over rounds).

    .venv/bin/python benchmarks/pipeline_bench.py --rounds 3 [--profile DIR] [--notebook]

Each round is one 2-rank launch of GPipe (M = 1, 2, 4, 8), 1F1B and zero bubble (M = 2, 4, 8)
with notebook 07's model (6 layers, hidden 1024, batch 128, 3 timed steps after a checked
step); odd rounds run the schedules in the reverse order, so that a noisy neighbour on a shared
machine hurts all of them alike. The machine profile is read from ``--profile`` (a folder with
``machine_profile.json``) or measured once first. Targets (P = 2): the fill/drain bubble within
the law rows' absolute tolerance of (P−1)/(P−1+M) for GPipe at every M and 1F1B at M >= 2; the
step model within the step laws' tolerance. With --notebook, notebook 07 is also executed once
with its defaults and timed (target: its budget share, 28 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from labkit.pipeline.config import NOTEBOOK_BUDGET_S
from labkit.pipeline.verdicts import BUBBLE_TOLERANCE, STEP_TOLERANCE_PCT

TARGETS = {"gpipe": (1, 2, 4, 8), "1f1b": (2, 4, 8)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--profile", default=None, help="folder holding machine_profile.json "
                                                     "(default: measured once, first)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "zero_bubble"])
    p.add_argument("--notebook", action="store_true", help="also time notebook 07 (defaults)")
    args = p.parse_args(argv)

    from labkit import machine, pipeline
    from labkit.launch import LaunchOptions

    prof_dir = args.profile or tempfile.mkdtemp(prefix="pipeline-bench-")
    prof = machine.profile(prof_dir)

    print(f"pipeline P = 2, {args.layers} layers x hidden {args.hidden}, batch {args.batch}, "
          f"{args.steps} timed steps, {args.rounds} round(s); cores shared with other jobs: "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    rows, loads, walls = [], [], []
    for r in range(args.rounds):
        order = args.schedules if r % 2 == 0 else args.schedules[::-1]
        config = pipeline.PipelineConfig(schedules=order, microbatches=(1, 2, 4, 8),
                                         layers=args.layers, hidden=args.hidden,
                                         batch=args.batch, steps=args.steps, warmup=1,
                                         skip_invalid=True)
        t0 = time.perf_counter()
        df = pipeline.run(config, launch=LaunchOptions(nprocs=(2,), progress=False,
                                                       timeout_s=600))
        walls.append(time.perf_counter() - t0)
        df = pipeline.report.add_model(df, prof)
        loads.append(os.getloadavg()[0])
        assert df.matches_single_process.all(), "a pipelined step differs from one process"
        rows += [{**row, "round": r} for row in df.to_dict("records")]
        best = {s: int(pipeline.verdicts.best_microbatches(df, s).num_microbatches)
                for s in dict.fromkeys(df.schedule)}
        print(f"round {r + 1}: launch {walls[-1]:.1f} s, load {loads[-1]:.1f}, shortest step at "
              + ", ".join(f"{s} M={m}" for s, m in best.items()), flush=True)

    import pandas as pd

    df = pd.DataFrame(rows)
    med = (df.groupby(["schedule", "num_microbatches"], sort=False)
           .agg(step_ms=("step_time_s", lambda x: 1e3 * statistics.median(x)),
                predicted_ms=("step_time_model_s", lambda x: 1e3 * statistics.median(x)),
                step_err_pct=("step_model_error_pct", "median"),
                slot_ms=("slot_time_s", lambda x: 1e3 * statistics.median(x)),
                fill_drain=("bubble_fill_drain", "median"), formula=("bubble_formula", "first"),
                other=("idle_other", "median"), old_bubble=("bubble_measured", "median"))
           .reset_index())
    med["bubble_err"] = med.fill_drain - med.formula
    print("\nmedians over rounds (P = 2):")
    print(f"  {'schedule':12s} {'M':>2s} {'step ms':>8s} {'pred ms':>8s} {'err %':>6s} "
          f"{'slot ms':>8s} {'fill/drain':>10s} {'formula':>7s} {'diff':>6s} {'other':>6s}"
          f" {'1-busy/step':>11s}  targets")
    ok_all = True
    for r in med.itertuples():
        marks = []
        if r.num_microbatches in TARGETS.get(r.schedule, ()):
            b_ok = abs(r.bubble_err) <= BUBBLE_TOLERANCE
            s_ok = abs(r.step_err_pct) <= STEP_TOLERANCE_PCT
            ok_all &= b_ok and s_ok
            marks = [f"bubble {'ok' if b_ok else 'MISS'}", f"step {'ok' if s_ok else 'MISS'}"]
        print(f"  {r.schedule:12s} {r.num_microbatches:2d} {r.step_ms:8.1f} {r.predicted_ms:8.1f} "
              f"{r.step_err_pct:+6.1f} {r.slot_ms:8.2f} {r.fill_drain:10.3f} {r.formula:7.3f} "
              f"{r.bubble_err:+6.3f} {r.other:6.3f} {r.old_bubble:11.3f}  {' '.join(marks)}")
    print("\nshortest measured step (medians over rounds): "
          + ", ".join(f"{s} M={int(part.loc[part.step_ms.idxmin()].num_microbatches)} "
                      f"({part.step_ms.min():.1f} ms)"
                      for s, part in med.groupby("schedule", sort=False)))
    print(f"targets: fill/drain within {BUBBLE_TOLERANCE} of (P-1)/(P-1+M) (GPipe M=1,2,4,8; "
          f"1F1B M=2,4,8), the step model within {STEP_TOLERANCE_PCT:g}%: "
          f"{'all met' if ok_all else 'NOT all met'}")
    print(f"launch wall time median {statistics.median(walls):.1f} s; load average per round "
          f"{', '.join(f'{x:.1f}' for x in loads)}")

    if args.notebook:
        from labkit.book.notebooks import NOTEBOOK_DIR, execute

        with tempfile.TemporaryDirectory() as tmp:
            load = os.getloadavg()[0]
            res = execute(NOTEBOOK_DIR / "07_pipeline_bubbles.ipynb", f"{tmp}/07.ipynb",
                          {"results_dir": f"{tmp}/results"}, cwd=tmp, cell_timeout_s=600)
            print(f"notebook 07 with its defaults: {'ok' if res['ok'] else 'FAILED'} in "
                  f"{res['elapsed_s']:.1f} s (target < {NOTEBOOK_BUDGET_S:g} s on 2 cores; load "
                  f"{load:.1f} -> "
                  f"{os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
