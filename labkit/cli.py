"""``labkit``: the command line. Each command is a thin layer over a function notebooks call.

Each lab's ``cli`` module registers its subcommands (:data:`COMMAND_MODULES`); this module
registers the shared one, ``labkit table``. Their top level imports nothing heavy (the pure
commands, ``labkit speedup`` among them, answer without importing torch). Exit codes: 0 done,
1 a launch or a gate failed, 2 bad input (one line on stderr, nothing launched or written).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import warnings

from labkit.errors import LabkitError, RowsOnAnotherNode, UsageError

COMMAND_MODULES = (
    "labkit.checks.cli",
    "labkit.speedup.cli",
    "labkit.solve.cli",
    "labkit.collectives.cli",
    "labkit.pipeline.cli",
    "labkit.ddp.cli",
    "labkit.tp.cli",
    "labkit.fsdp.cli",
    "labkit.book.cli",
    "labkit.perfmodel.cli",
)


def register(sub) -> None:
    """The shared commands: ``labkit table`` reads any lab's results file."""
    p = sub.add_parser("table", help="print a results file as a table")
    p.add_argument("path", help="results JSON file")
    p.add_argument("--columns", nargs="+", help="only these columns")
    p.add_argument("--csv", action="store_true", help="CSV instead of an aligned table")
    p.add_argument("--describe", action="store_true",
                   help="print each column's unit and meaning instead of the rows")
    p.set_defaults(func=cmd_table)


def cmd_table(args) -> int:
    from labkit.cliargs import print_frame
    from labkit.results import describe, load

    df = load(args.path)
    if args.columns:
        missing = [c for c in args.columns if c not in df.columns]
        if missing:
            raise UsageError(f"{args.path}: no column(s) {missing}")
    if args.describe:
        df = describe(args.columns or list(df.columns), context=list(df.columns))
        columns = None
        if df.empty:
            print("(no columns)")
            return 0
    else:
        columns = args.columns
    if args.csv:
        (df[columns] if columns else df).to_csv(sys.stdout, index=False)
    elif args.describe:
        name_w = max(len("column"), *(len(c) for c in df["column"]))
        unit_w = max(len("unit"), *(len(u) for u in df["unit"]))
        print(f"{'column':{name_w}s}  {'unit':{unit_w}s}  meaning")
        for r in df.itertuples(index=False):
            print(f"{r.column:{name_w}s}  {r.unit:{unit_w}s}  {r.meaning}")
    else:
        print_frame(df, columns)
    return 0


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (the usage block is what ``--help`` is for)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from labkit import __version__

    parser = Parser(prog="labkit", description="Scaling Lab: measure parallel scaling honestly.")
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    register(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"labkit: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"labkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except RowsOnAnotherNode as e:  # a multi-node launch: the node of global rank 0 reports
        print(f"labkit {args.command}: {e}", file=sys.stderr)
        return 0
    except LabkitError as e:
        print(f"labkit {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C: 130; SIGTERM / SIGHUP (launch.Terminated): 128 + N
        signum = getattr(e, "signum", 2)
        print(f"labkit {args.command}: interrupted"
              + (f" ({signal.Signals(signum).name})" if signum != 2 else ""), file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
