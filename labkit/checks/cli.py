"""labkit env | placement: what this machine offers a launch, and where each rank runs.

``labkit placement``'s config flag is :class:`~labkit.checks.config.PlacementConfig`'s field,
beside the shared launch flags; the command runs :func:`labkit.checks.run.run` and prints
:func:`labkit.checks.report.print_placement`.
"""

from __future__ import annotations

import json
import sys

from labkit.checks.config import PlacementConfig
from labkit.cliargs import add_lab_command, config_from_args, launch_options, say_stored


def register(sub) -> None:
    p = sub.add_parser("env", help="torch version, backend, devices, cores")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_env)

    add_lab_command(sub, "placement", PlacementConfig, cmd_placement, launch_first=True,
                    help="launch ranks, print where each runs and a timed all-reduce")


def cmd_env(args) -> int:
    from labkit.checks.run import env_info

    info = env_info()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for k, v in info.items():
            print(f"{k:28s} {v}")
    return 0


def cmd_placement(args) -> int:
    from labkit.checks import report
    from labkit.checks.run import run

    # validate everything before anything launches or is written
    config = config_from_args(PlacementConfig, args)
    df = run(config, launch=launch_options(args), store=args.json)
    report.print_placement(df)
    say_stored(args.json, df)
    problems = report.sharing_problems(df)
    if len(problems):
        print(f"\nPROBLEM: {len(problems)} rank(s) share a GPU with another rank", file=sys.stderr)
        return 1
    return 0
