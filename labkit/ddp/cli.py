"""labkit ddp | diff: the data-parallel training lab and the A/B comparison of two of its runs.

``labkit ddp``'s flags are :class:`~labkit.ddp.config.DDPConfig`'s fields (in the groups
"workload" and "DDP") and the shared launch flags; the command builds the config, runs
:func:`labkit.ddp.run.run` and prints :mod:`labkit.ddp.report`'s tables; where this run has a
machine profile (``$LABKIT_MACHINE_PROFILE``, or ``machine_profile.json`` beside ``--json``;
``labkit calibrate`` measures one) also the model of a DDP step beside the measurement.
"""

from __future__ import annotations

import sys

from labkit.cliargs import (
    add_config_args,
    add_lab_command,
    config_from_args,
    launch_options,
    say_stored,
)
from labkit.ddp.config import DDP_OPTIONS, WORKLOAD_OPTIONS, DDPConfig
from labkit.tables import print_frame


def _config_flags(p) -> None:
    add_config_args(p, DDPConfig, group="workload", fields=WORKLOAD_OPTIONS)
    add_config_args(p, DDPConfig, group="DDP", fields=DDP_OPTIONS)


def register(sub) -> None:
    add_lab_command(
        sub, "ddp", DDPConfig, cmd_ddp, flags=_config_flags, launch_first=True, trace=True,
        help="DDP training: no-DDP baseline, then DDP at each world size; percentiles",
        description="Times optimizer steps of a synthetic model without DDP (1 process) and with "
                    "DDP at each --nproc (one launch each). Step time = slowest rank.")

    p = sub.add_parser("diff", help="compare two `labkit ddp --json` files (A/B, %% deltas)",
                       description="Settings side by side, then per world size p75/p95 of both "
                                   "runs and the %% change of B's throughput against A's.")
    p.add_argument("a", metavar="A.json", help="baseline results file")
    p.add_argument("b", metavar="B.json", help="test results file")
    p.add_argument("--csv", action="store_true", help="print the comparison table as CSV")
    p.set_defaults(func=cmd_diff)


def cmd_ddp(args) -> int:
    from labkit.ddp import report, verdicts
    from labkit.ddp.run import run

    # validate everything before anything launches or is written
    config = config_from_args(DDPConfig, args)
    launch = launch_options(args)
    prof = _profile(args.json)
    df = run(config, launch=launch, store=args.json, profile=prof)
    print(report.benchmark_table(df))
    print()
    print_frame(report.scaling_frame(df), floatfmt="{:.3g}")
    print(report.SCALING_LEGEND)
    if df.get("predicted_speedup_vs_no_ddp") is not None and \
            df["predicted_speedup_vs_no_ddp"].notna().any():
        # the model beside the measurement, and the verdicts computed from this run
        pred = report.prediction_frame(df)
        n = report.top_world_size(df)
        print()
        print_frame(pred, floatfmt="{:.3g}")
        print(report.PREDICTION_LEGEND)
        print(verdicts.model_sentence(pred["batch"], pred["error_pct"]))
        if len(pred) >= 2:
            print(verdicts.pays_sentence(pred["batch"], pred["measured"], ranks=n))
            cross = report.crossover(df, n)
            print(verdicts.crossover_sentence(cross))
            print(verdicts.agreement_sentence(cross["batches"], cross["predicted_speedups"],
                                              cross["measured_speedups"]))
    elif prof is None:
        print("\n(no model of the DDP step: it needs this machine's profile, "
              "`labkit calibrate --json results/machine_profile.json`, then --json "
              "results/ddp.json)")
    print()
    print(report.placement_table(df))
    if df["oversubscribed"].any():
        print("\nnote: oversubscribed launches (more rank-threads than cores): timings are not "
              "representative", file=sys.stderr)
    say_stored(args.json, df)
    if not df["placement_ok"].all():
        print("\nPROBLEM: ranks share a GPU; the numbers above are not what this machine can do",
              file=sys.stderr)
        return 1
    return 0


def _profile(json_path):
    """The machine profile of this run ($LABKIT_MACHINE_PROFILE, else the one beside the results
    file), or None: a terminal command does not spend seconds measuring one unasked."""
    import os

    from labkit import machine
    from labkit.errors import UsageError

    if not json_path and not os.environ.get(machine.ENV):
        return None
    try:
        return machine.profile(os.path.dirname(os.path.abspath(json_path or ".")), measure=False)
    except UsageError:
        return None


def cmd_diff(args) -> int:
    from labkit.ddp.diff import compare, format_diff

    settings, table, notes = compare(args.a, args.b)
    for note in notes:
        print(f"labkit diff: WARNING: {note}", file=sys.stderr)
    if args.csv:
        table.to_csv(sys.stdout, index=False)
    else:
        print(format_diff(settings, table))
    if notes and notes[0].startswith("the two files hold different models"):
        print(f"labkit diff: WARNING: {notes[0]}", file=sys.stderr)
    return 0
