"""labkit workshare | speedup: Amdahl's law, measured live and computed from your own timings.

``labkit workshare``'s config flags are :class:`~labkit.speedup.config.WorkshareConfig`'s
fields; the command runs :func:`labkit.speedup.run.run` and prints
:func:`labkit.speedup.report.print_workshare`. ``labkit speedup`` is pure (it never imports
torch): :func:`labkit.metrics.speedup_table` of the times given, printed by
:func:`labkit.speedup.report.print_speedup`.
"""

from __future__ import annotations

from labkit.cliargs import (
    add_config_args,
    add_store_arg,
    config_from_args,
    positive_float_arg,
    positive_int_arg,
)
from labkit.speedup.config import WorkshareConfig

#: ``labkit workshare`` times more runs than a notebook does by default
CLI_DEFAULTS = {"repeat": 5}


def register(sub) -> None:
    p = sub.add_parser("workshare", help="time a job with a chosen serial fraction at each rank count",
                       description="Strong scaling of total-work matrix products, a serial-fraction "
                                   "share done by rank 0 alone; one thread per rank.")
    p.add_argument("--nproc", type=positive_int_arg, nargs="+", default=[1, 2], metavar="N",
                   help="ranks per launch, one launch each (default: %(default)s)")
    add_config_args(p, WorkshareConfig, defaults=CLI_DEFAULTS)
    p.add_argument("--timeout", type=positive_float_arg, default=300.0, metavar="S",
                   help="seconds before a launch is killed, with all its ranks "
                        "(default: %(default)s)")
    add_store_arg(p)
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="also write each launch's per-rank timeline to DIR as a Chrome trace "
                        "(workshare-<P>ranks-<time>.trace.json: open in ui.perfetto.dev or "
                        "chrome://tracing)")
    # validate: the checks before a launch, for `labkit slurm` to run before writing a script
    p.set_defaults(func=cmd_workshare, validate=validate_workshare)

    p = sub.add_parser(
        "speedup", help="speedup, efficiency, relative SU, Karp-Flatt, Amdahl fit and knee of timings",
        description="Paste timings from your own cluster: labkit speedup --times 1:226 2:134 3:95 4:76")
    p.add_argument("--times", nargs="+", required=True, metavar="N:SECONDS",
                   help="wall time per rank count, N=1 included")
    p.add_argument("--gpus-per-rank", type=int, default=1, help="for SU (default: %(default)s)")
    p.add_argument("--cores-per-rank", type=int, default=0, help="for SU (default: %(default)s)")
    p.add_argument("--threshold", type=positive_float_arg, default=0.5,
                   help="efficiency below which more ranks waste money (default: %(default)s)")
    p.add_argument("--deadline", type=positive_float_arg, default=None, metavar="S",
                   help="also name the cheapest N whose time meets this deadline")
    add_store_arg(p)
    p.set_defaults(func=cmd_speedup)


def _config_and_launch(args):
    from labkit.launch import LaunchOptions

    config = config_from_args(WorkshareConfig, args)
    return config, LaunchOptions(nprocs=tuple(args.nproc), threads_per_rank=1,
                                 timeout_s=args.timeout, trace_dir=args.trace)


def validate_workshare(args) -> None:
    """The checks ``labkit workshare`` makes before its first launch, launching nothing."""
    from labkit.results import check_writable

    _config_and_launch(args)
    if args.json:
        check_writable(args.json)


def cmd_workshare(args) -> int:
    from labkit.cliargs import say_stored
    from labkit.speedup import report
    from labkit.speedup.run import run

    # validate everything before anything launches or is written
    config, launch = _config_and_launch(args)
    live = run(config, launch=launch, store=args.json)
    report.print_workshare(live, config.serial_fraction)
    say_stored(args.json, live)
    return 0


def cmd_speedup(args) -> int:
    from labkit.cliargs import write_json_rows
    from labkit.metrics import cheapest_for_deadline, parse_times, speedup_table
    from labkit.speedup import report

    times = parse_times(args.times)
    if args.gpus_per_rank < 0 or args.cores_per_rank < 0:
        from labkit.errors import UsageError

        raise UsageError("--gpus-per-rank and --cores-per-rank must be >= 0")
    if args.json:
        from labkit.results import check_writable

        check_writable(args.json)
    rows, summary = speedup_table(times, cores_per_rank=args.cores_per_rank,
                                  gpus_per_rank=args.gpus_per_rank, threshold=args.threshold)
    report.print_speedup(rows, summary)
    if args.deadline:
        best = cheapest_for_deadline(list(times), list(times.values()), args.deadline,
                                     cores_per_rank=args.cores_per_rank,
                                     gpus_per_rank=args.gpus_per_rank)
        print(f"cheapest N meeting {args.deadline:g} s: {best if best else 'none meets it'}")
    if args.json:
        write_json_rows(args.json, report.table_rows(rows, summary), key=report.TABLE_KEY)
    return 0
