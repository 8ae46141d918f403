"""labkit env | placement | speedup | table."""

from __future__ import annotations

import json
import sys

from ._common import add_launch_args, launch_kwargs, positive_float, print_frame, write_json_rows


def register(sub) -> None:
    p = sub.add_parser("env", help="torch version, backend, devices, cores")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("placement", help="launch ranks, print where each runs and a timed all-reduce")
    add_launch_args(p)
    p.add_argument("--allreduce-bytes", type=int, default=1 << 20, help="(default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_placement)

    p = sub.add_parser(
        "speedup", help="speedup, efficiency, relative SU, Karp-Flatt, Amdahl fit and knee of timings",
        description="Paste timings from your own cluster: labkit speedup --times 1:226 2:134 3:95 4:76")
    p.add_argument("--times", nargs="+", required=True, metavar="N:SECONDS",
                   help="wall time per rank count, N=1 included")
    p.add_argument("--gpus-per-rank", type=int, default=1, help="for SU (default: %(default)s)")
    p.add_argument("--cores-per-rank", type=int, default=0, help="for SU (default: %(default)s)")
    p.add_argument("--threshold", type=positive_float, default=0.5,
                   help="efficiency below which more ranks waste money (default: %(default)s)")
    p.add_argument("--deadline", type=positive_float, default=None, metavar="S",
                   help="also name the cheapest N whose time meets this deadline")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_speedup)

    p = sub.add_parser("table", help="print a results file as a table")
    p.add_argument("path", help="results JSON file")
    p.add_argument("--columns", nargs="+", help="only these columns")
    p.add_argument("--csv", action="store_true", help="CSV instead of an aligned table")
    p.set_defaults(func=cmd_table)


def cmd_env(args) -> int:
    from ..placement import env_info

    info = env_info()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for k, v in info.items():
            print(f"{k:28s} {v}")
    return 0


def cmd_placement(args) -> int:
    if args.json:
        from ..results import check_writable

        check_writable(args.json)
    from ..placement import placement

    df = placement(args.nproc, allreduce_bytes=args.allreduce_bytes, **launch_kwargs(args))
    for n, part in df.groupby("world_size"):
        print(f"\nworld_size {n}: placement")
        print_frame(part, ["rank", "local_rank", "host", "pid", "device", "device_name",
                           "cuda_visible_devices", "threads", "problem"])
        r = part.iloc[0]
        print(f"all-reduce of {r.allreduce_bytes} B: p50 {r.allreduce_time_p50_s * 1e3:.3f} ms, "
              f"min {r.allreduce_time_min_s * 1e3:.3f} ms (slowest rank), correct: {r.allreduce_correct}"
              + ("   [oversubscribed: timings not representative]" if r.oversubscribed else ""))
    problems = df[df.problem.astype(bool)]
    if args.json:
        write_json_rows(args.json, df.to_dict("records"), key=("world_size", "rank", "hostname"))
    if len(problems):
        print(f"\nPROBLEM: {len(problems)} rank(s) share a GPU with another rank", file=sys.stderr)
        return 1
    return 0


def cmd_speedup(args) -> int:
    from ..metrics import cheapest_for_deadline, parse_times, speedup_table

    times = parse_times(args.times)
    if args.gpus_per_rank < 0 or args.cores_per_rank < 0:
        from ..errors import UsageError

        raise UsageError("--gpus-per-rank and --cores-per-rank must be >= 0")
    if args.json:
        from ..results import check_writable

        check_writable(args.json)
    df, summary = speedup_table(times, cores_per_rank=args.cores_per_rank,
                                gpus_per_rank=args.gpus_per_rank, threshold=args.threshold)
    print("speedup s = t1/tN   efficiency E = s/N   relative SU = N/s   "
          "Karp-Flatt e = (1/s - 1/N)/(1 - 1/N)")
    shown = df.copy()
    for c in ("speedup", "efficiency", "relative_su", "karp_flatt", "amdahl_speedup"):
        shown[c] = shown[c].round(3 if c != "speedup" else 2)
    print_frame(shown, floatfmt="{:g}")
    f = summary["amdahl_serial_fraction"]
    print(f"\nAmdahl fit (least squares, tN/t1 = f + (1-f)/N): serial fraction f = {f:.4f}, "
          f"max speedup 1/f = {summary['amdahl_max_speedup']:.2f}")
    print(f"knee: N = {summary['knee_world_size']} is the largest N with efficiency >= "
          f"{summary['knee_threshold']:g}; fastest N = {summary['fastest_world_size']}")
    if args.deadline:
        best = cheapest_for_deadline(list(times), list(times.values()), args.deadline,
                                     cores_per_rank=args.cores_per_rank,
                                     gpus_per_rank=args.gpus_per_rank)
        print(f"cheapest N meeting {args.deadline:g} s: {best if best else 'none meets it'}")
    if args.json:
        write_json_rows(args.json, [{**r, **summary} for r in df.to_dict("records")],
                        key=("world_size",))
    return 0


def cmd_table(args) -> int:
    from ..results import load

    df = load(args.path)
    if args.columns:
        missing = [c for c in args.columns if c not in df.columns]
        if missing:
            from ..errors import UsageError

            raise UsageError(f"{args.path}: no column(s) {missing}")
    if args.csv:
        (df[args.columns] if args.columns else df).to_csv(sys.stdout, index=False)
    else:
        print_frame(df, args.columns)
    return 0
