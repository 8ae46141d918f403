"""labkit collectives | pipeline: thin commands over :mod:`labkit.commlab`.

Top level: argparse only (pandas, torch and the launcher are imported inside the handlers).
"""

from __future__ import annotations

import sys

from ._common import add_launch_args, launch_kwargs, nonneg_int, positive_int, write_json_rows


def register(sub) -> None:
    p = sub.add_parser("collectives", help="nccl-tests-style sweep of a collective, with an α–β fit",
                       description="busbw per size; algbw = S/t, busbw = algbw × factor(op, N)")
    add_launch_args(p, default_nproc=(2,))
    p.add_argument("--op", nargs="+", default=["all_reduce"], metavar="OP",
                   help="all_reduce all_gather reduce_scatter broadcast all_to_all (default: %(default)s)")
    p.add_argument("--min-bytes", "-b", default="8", help="smallest size, K/M/G suffixes (default: %(default)s)")
    p.add_argument("--max-bytes", "-e", default="64M", help="largest size (default: %(default)s)")
    p.add_argument("--factor", "-f", type=float, default=2.0, help="size multiplier (default: %(default)s)")
    p.add_argument("--iters", "-n", type=positive_int, default=20, help="timed calls per size (default: %(default)s)")
    p.add_argument("--warmup", "-w", type=nonneg_int, default=5, help="untimed calls per size (default: %(default)s)")
    p.add_argument("--dtype", default="float32", help="float32 float64 int32 int64 (default: %(default)s)")
    p.add_argument("--check", "-c", action="store_true", help="count wrong elements (#wrong)")
    p.add_argument("--fit-min-bytes", default="0", help="fit α, β on sizes >= this (default: all)")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_collectives)

    p = sub.add_parser("pipeline", help="pipeline bubbles of GPipe / 1F1B / interleaved vs formula",
                       description="bubble = 1 − Σ busy / (P × step time) against (P−1)/(P−1+M)")
    add_launch_args(p, default_nproc=(2,))
    p.add_argument("--schedule", nargs="+", default=["gpipe", "1f1b"], metavar="S",
                   help="naive_gpipe gpipe 1f1b interleaved (default: %(default)s)")
    p.add_argument("--microbatches", nargs="+", type=int, default=[2, 4, 8], metavar="M",
                   help="microbatch counts M (default: %(default)s)")
    p.add_argument("--layers", type=int, default=8, help="Linear+tanh blocks (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=512, help="width (default: %(default)s)")
    p.add_argument("--batch", type=int, default=128, help="samples per step (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (default: %(default)s)")
    p.add_argument("--virtual-stages", type=int, default=2, help="V for interleaved (default: %(default)s)")
    p.add_argument("--no-check", action="store_true", help="skip the single-process comparison")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_pipeline)


def _check_json(path) -> None:
    if path:
        from ..results import check_writable

        check_writable(path)


def cmd_collectives(args) -> int:
    from ..comm import CollectivesConfig, parse_size
    from ..commlab import COLLECTIVES_KEY, collectives

    CollectivesConfig(ops=tuple(args.op), min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                      factor=args.factor, iters=args.iters, warmup=args.warmup, dtype=args.dtype,
                      check=args.check)  # refuse bad input before anything launches
    fit_min = parse_size(args.fit_min_bytes) if args.fit_min_bytes not in ("0", 0) else 0
    _check_json(args.json)
    df = collectives(args.nproc, ops=args.op, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                     factor=args.factor, iters=args.iters, warmup=args.warmup, dtype=args.dtype,
                     check=args.check, min_fit_bytes=fit_min, **launch_kwargs(args))
    for (op, n), part in df.groupby(["op", "world_size"], sort=False):
        r0 = part.iloc[0]
        print(f"\n# {op}  world_size {n}  backend {r0.backend}  threads/rank {r0.threads_per_rank}"
              f"  iters {args.iters}  warmup {args.warmup}"
              + ("   [oversubscribed: timings not representative]" if r0.oversubscribed else ""))
        print(f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>5} {'root':>4} "
              f"{'time(us)':>9} {'p10(us)':>9} {'p90(us)':>9} {'algbw':>7} {'busbw':>7} "
              f"{'#wrong':>6} {'model(us)':>9} {'err(%)':>7}")
        print(f"# {'(B)':>10} {'(elem)':>10} {'':>8} {'':>5} {'':>4} {'':>9} {'':>9} {'':>9} "
              f"{'(GB/s)':>7} {'(GB/s)':>7}")
        for r in part.itertuples():
            wrong = "N/A" if r.wrong is None or r.wrong != r.wrong else str(int(r.wrong))
            print(f"  {r.size_bytes:>10} {r.count:>10} {r.dtype:>8} {r.redop:>5} {r.root:>4} "
                  f"{r.time_p50_s * 1e6:>9.1f} {r.time_p10_s * 1e6:>9.1f} {r.time_p90_s * 1e6:>9.1f} "
                  f"{r.algbw_gb_per_s:>7.3f} {r.busbw_gb_per_s:>7.3f} {wrong:>6} "
                  f"{r.model_time_s * 1e6:>9.1f} {r.model_error_pct:>7.1f}")
        print(f"# α–β fit: α = {r0.alpha_s * 1e6:.1f} us, β = {r0.beta_gb_per_s:.3f} GB/s; "
              f"bandwidth dominates above {r0.crossover_bytes / 1024:.0f} KiB; "
              f"median |model error| {part.model_error_pct.abs().median():.1f}%")
        print(f"# Avg bus bandwidth    : {part.busbw_gb_per_s.mean():.4f} GB/s")
    if args.json:
        write_json_rows(args.json, df.to_dict("records"), key=COLLECTIVES_KEY)
    wrong = df.wrong.fillna(0).sum() if "wrong" in df else 0
    if wrong:
        print(f"\nFAILED: {int(wrong)} wrong element(s)", file=sys.stderr)
        return 1
    return 0


def cmd_pipeline(args) -> int:
    from ..bubbles import PipelineConfig
    from ..commlab import PIPELINE_KEY, pipeline
    from ._common import print_frame

    cfg = PipelineConfig(schedules=tuple(args.schedule), microbatches=tuple(args.microbatches),
                         layers=args.layers, hidden=args.hidden, batch=args.batch,
                         steps=args.steps, warmup=args.warmup,
                         virtual_stages=args.virtual_stages, check=not args.no_check)
    for n in args.nproc:
        cfg.validate_for(n * args.nnodes)
    _check_json(args.json)
    df = pipeline(args.nproc, schedules=args.schedule, microbatches=args.microbatches,
                  layers=args.layers, hidden=args.hidden, batch=args.batch, steps=args.steps,
                  warmup=args.warmup, virtual_stages=args.virtual_stages,
                  check=not args.no_check, **launch_kwargs(args))
    shown = df.assign(step_ms=df.step_time_s * 1e3, busy_per_mb_ms=df.busy_per_microbatch_s * 1e3)
    print("bubble = 1 − Σ busy / (P × step time)   formula (P−1)/(P−1+M), interleaved (P−1)/(V·M+P−1)")
    print_frame(shown, ["schedule", "num_stages", "num_microbatches", "microbatch_size", "step_ms",
                        "busy_per_mb_ms", "bubble_measured", "bubble_formula", "bubble_error",
                        "matches_single_process", "oversubscribed"])
    for (s, p), part in df.groupby(["schedule", "num_stages"], sort=False):
        part = part.sort_values("num_microbatches")
        lo, hi = part.iloc[0], part.iloc[-1]
        if len(part) > 1:
            print(f"{s} P={p}: stage compute per step (busy / P) {lo.busy_time_s / p * 1e3:.1f} ms at "
                  f"M={lo.num_microbatches} -> {hi.busy_time_s / p * 1e3:.1f} ms at "
                  f"M={hi.num_microbatches}; step {lo.step_time_s * 1e3:.1f} -> "
                  f"{hi.step_time_s * 1e3:.1f} ms (smaller microbatches run slower per sample)")
    if df.oversubscribed.any():
        print("note: oversubscribed (more rank-threads than cores): ranks take turns on cores, "
              "so idle time is not only the pipeline's bubble", file=sys.stderr)
    if args.json:
        write_json_rows(args.json, df.to_dict("records"), key=PIPELINE_KEY)
    if "matches_single_process" in df and not df.matches_single_process.fillna(True).all():
        print("FAILED: pipelined output/gradients differ from a single process", file=sys.stderr)
        return 1
    return 0
