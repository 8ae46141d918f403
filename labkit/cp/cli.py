"""labkit cp: context parallelism, ring attention over the sequence, measured.

The flags are :class:`~labkit.cp.config.CPConfig`'s fields and the shared launch flags; the
command builds the config, runs :func:`labkit.cp.run.run` and prints
:func:`labkit.cp.report.summary_frame`. Exit code 1 when the ring does not match one process.
"""

from __future__ import annotations

from labkit.cliargs import add_lab_command, mismatch_exit, run_lab, say_stored
from labkit.cp.config import CPConfig
from labkit.tables import print_table


def register(sub) -> None:
    add_lab_command(
        sub, "cp", CPConfig, cmd_cp, trace=True,
        help="context parallelism: ring attention over a sequence split across ranks",
        description="One torchrun launch per --nproc value, one thread per rank; every "
                    "variant is checked against one process's attention, its sends counted "
                    "against 2 (P-1)/P b S h per pass, what autograd saves against its "
                    "formula, and its pass timed beside its compute and its messages.")


def cmd_cp(args) -> int:
    from labkit.cp import report
    from labkit.cp.run import run

    _, df = run_lab(args, CPConfig, run)
    print_table(report.summary_frame(df), report.SUMMARY_LEGEND)
    say_stored(args.json, df)
    return mismatch_exit(df, "labkit cp: ring attention differs from one process "
                             "(column matches)")
