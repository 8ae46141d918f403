"""labkit solve: weak, strong and throughput scaling of a distributed Krylov solve.

The flags are :class:`~labkit.solve.config.SolveConfig`'s fields and the shared launch flags;
the command builds the config, runs :func:`labkit.solve.run.run` and prints
:func:`labkit.solve.report.print_tables` (and, for a strong sweep over several sizes,
:func:`labkit.solve.crossover.print_crossover`).
"""

from __future__ import annotations

import sys

from labkit.cliargs import add_lab_command, config_from_args, launch_options, say_stored
from labkit.solve.config import SolveConfig


def register(sub) -> None:
    add_lab_command(
        sub, "solve", SolveConfig, cmd_solve, extra=_plot_args, trace=True,
        help="weak/strong/throughput scaling of a distributed Krylov solve (Poisson)",
        description="One torchrun launch per --nproc value runs every mode x partitioner x "
                    "method point; each solve is checked with a fresh ||b - Ax|| / ||b||.")


def _plot_args(p) -> None:
    p.add_argument("--plot", metavar="PATH", help="write the three-panel figure (PNG/SVG/PDF)")
    p.add_argument("--plot-only", action="store_true",
                   help="no launch: print the table and draw --plot from --json")


def cmd_solve(args) -> int:
    from labkit.errors import UsageError
    from labkit.solve import crossover, report

    if args.plot_only:
        if not args.json:
            raise UsageError("--plot-only needs --json PATH (the rows to draw)")
        from labkit.results import load

        df = load(args.json)
        if df.empty or "solve_time_s" not in df:
            raise UsageError(f"{args.json}: no solve rows")
        report.print_tables(df)
        crossover.print_crossover(df)
        _plot(df, args.plot or str(_png_of(args.json)))
        return 0
    from labkit.solve.run import run

    # validate everything before anything launches or is written
    config = config_from_args(SolveConfig, args)
    launch = launch_options(args)
    if args.plot:
        _check_plot_path(args.plot)
    df = run(config, launch=launch, store=args.json)
    say_stored(args.json, df)
    report.print_tables(df)
    crossover.print_crossover(df)
    if config.rhs == "manufactured":
        print(report.TRAP_NOTE)
    if args.plot:
        from labkit.results import load

        _plot(load(args.json) if args.json else df, args.plot)
    bad = report.gate_failures(df)
    if len(bad):
        print(f"labkit solve: {report.gate_message(bad)}", file=sys.stderr)
        return 1
    return 0


def _png_of(json_path: str):
    from pathlib import Path

    return Path(json_path).with_suffix(".png")


def _check_plot_path(path: str) -> None:
    from pathlib import Path

    from labkit.errors import UsageError

    p = Path(path)
    if not p.parent.is_dir():
        raise UsageError(f"--plot {path}: folder {p.parent} does not exist")
    if p.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"--plot {path}: use a .png, .svg or .pdf file name")


def _plot(df, path: str) -> None:
    from labkit.figures import save
    from labkit.solve.plots import scaling_figure

    _check_plot_path(path)
    save(scaling_figure(df), path)
    print(f"wrote {path}", file=sys.stderr)
