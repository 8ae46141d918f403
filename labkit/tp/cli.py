"""labkit tp: tensor parallelism of a transformer layer, hand-written and torch's, measured.

The flags are :class:`~labkit.tp.config.TPConfig`'s fields and the shared launch flags; the
command builds the config, runs :func:`labkit.tp.run.run` and prints
:func:`labkit.tp.report.summary_frame`. Exit code 1 when a split model does not match one
process.
"""

from __future__ import annotations

from labkit.cliargs import add_lab_command, mismatch_exit, run_lab, say_stored
from labkit.tables import print_table
from labkit.tp.config import TPConfig


def register(sub) -> None:
    add_lab_command(
        sub, "tp", TPConfig, cmd_tp, trace=True,
        help="tensor parallelism: a Megatron layer split over ranks, by hand and by torch",
        description="One torchrun launch per --nproc value, one thread per rank unless "
                    "--threads-per-rank says otherwise (each rank is one device); every "
                    "variant is checked against one process, its collectives counted against "
                    "their formulas (4 L all-reduces of b s h; with sequence parallelism 6 L "
                    "all-gathers and 4 L reduce-scatters), and its step time predicted from "
                    "the measured compute rate and α–β.")


def cmd_tp(args) -> int:
    from labkit.tp import report
    from labkit.tp.run import run

    _, df = run_lab(args, TPConfig, run)
    print_table(report.summary_frame(df), report.SUMMARY_LEGEND)
    say_stored(args.json, df)
    return mismatch_exit(df, "labkit tp: a split model differs from one process "
                             "(column matches)")
