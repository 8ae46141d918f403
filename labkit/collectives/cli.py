"""labkit collectives: an nccl-tests style size sweep of collectives, with an α–β fit.

The flags are :class:`~labkit.collectives.config.CollectivesConfig`'s fields (``--check``/``-c``
is added here: off unless given, as nccl-tests' ``-c``) and the shared launch flags; the command
builds the config, runs :func:`labkit.collectives.run.run` and prints
:func:`labkit.collectives.report.nccl_tests_table`.

Top level: argparse only (pandas, torch and the launcher are imported inside the handler).
"""

from __future__ import annotations

import sys

from labkit.cliargs import add_config_args, add_lab_command, config_from_args, run_lab, say_stored
from labkit.collectives.config import CollectivesConfig

#: the config's flags before --check (the order of --help is nccl-tests' -b -e -f -n -w, -c)
_SWEEP_FIELDS = ("ops", "min_bytes", "max_bytes", "factor", "iters", "warmup", "dtype")


def _config_flags(p) -> None:
    add_config_args(p, CollectivesConfig, fields=_SWEEP_FIELDS)
    p.add_argument("--check", "-c", action="store_true", help="count wrong elements (#wrong)")
    add_config_args(p, CollectivesConfig, fields=("fit_min_bytes",))


def _config(args) -> CollectivesConfig:
    return config_from_args(CollectivesConfig, args, check=args.check)


def register(sub) -> None:
    add_lab_command(sub, "collectives", CollectivesConfig, cmd_collectives, flags=_config_flags,
                    validate=_config, launch_first=True, default_nproc=(2,), trace=True,
                    help="nccl-tests-style sweep of a collective, with an α–β fit",
                    description="busbw per size; algbw = S/t, busbw = algbw × factor(op, N)")


def cmd_collectives(args) -> int:
    from labkit.collectives import report
    from labkit.collectives.run import run

    config, df = run_lab(args, _config, run)
    print(report.nccl_tests_table(df, warmup=config.warmup))
    say_stored(args.json, df)
    wrong = report.wrong_elements(df)
    if wrong:
        print(f"\nFAILED: {wrong} wrong element(s)", file=sys.stderr)
        return 1
    return 0
