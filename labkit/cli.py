"""``labkit``: the command line. Each command is a thin layer over a function notebooks call.

Command modules register their subcommands; their top level imports nothing heavy (the pure
commands, ``labkit speedup`` among them, answer without importing torch). Exit codes: 0 done,
1 a launch or a gate failed, 2 bad input (one line on stderr, nothing launched or written).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from .errors import LabkitError, UsageError

COMMAND_MODULES = (
    "labkit.commands.core",
    "labkit.commands.solve",
    "labkit.commands.comm",
    "labkit.commands.ddp",
    "labkit.commands.notebooks",
    "labkit.commands.model",
    "labkit.commands.workshare",
)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="labkit", description="Scaling Lab: measure parallel scaling honestly.")
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
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
    except LabkitError as e:
        print(f"labkit {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"labkit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
