"""labkit workshare: a job with a serial part you choose, timed at each rank count (Amdahl, live)."""

from __future__ import annotations

from ._common import positive_float, positive_int, print_frame, write_json_rows


def _fraction(text: str) -> float:
    import argparse

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def register(sub) -> None:
    p = sub.add_parser("workshare", help="time a job with a chosen serial fraction at each rank count",
                       description="Strong scaling of total-work matrix products, a serial-fraction "
                                   "share done by rank 0 alone; one thread per rank.")
    p.add_argument("--nproc", type=positive_int, nargs="+", default=[1, 2], metavar="N",
                   help="ranks per launch, one launch each (default: %(default)s)")
    p.add_argument("--total-work", type=positive_int, default=400, help="(default: %(default)s)")
    p.add_argument("--serial-fraction", type=_fraction, default=0.1, help="(default: %(default)s)")
    p.add_argument("--matrix-size", type=positive_int, default=192, help="(default: %(default)s)")
    p.add_argument("--repeat", type=positive_int, default=5, help="timed runs (default: %(default)s)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="S")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_workshare)


def cmd_workshare(args) -> int:
    from ..metrics import speedup_table
    from ..workshare import Config, measure

    config = dict(total_work=args.total_work, serial_fraction=args.serial_fraction,
                  matrix_size=args.matrix_size, repeat=args.repeat)
    Config(**config)  # refuse bad input before launching
    if args.json:
        from ..results import check_writable

        check_writable(args.json)
    live = measure(args.nproc, timeout_s=args.timeout, **config)
    print_frame(live, ["world_size", "time_s", "time_min_s", "time_cv", "oversubscribed",
                       "launch_wall_time_s"])
    if 1 in set(live.world_size) and len(live) > 1:
        rows, summary = speedup_table(dict(zip(live.world_size, live.time_s)),
                                      cores_per_rank=1, gpus_per_rank=0)
        print()
        print_frame(rows, ["world_size", "speedup", "efficiency", "relative_su", "karp_flatt"])
        print(f"\nAmdahl fit: f = {summary['amdahl_serial_fraction']:.3f} "
              f"(designed {args.serial_fraction:g})")
    if args.json:
        write_json_rows(args.json, live.to_dict("records"), key=("world_size", "serial_fraction"))
    return 0
