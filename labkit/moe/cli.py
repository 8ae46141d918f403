"""labkit moe: expert parallelism, a mixture-of-experts layer over ranks, measured.

The flags are :class:`~labkit.moe.config.MoEConfig`'s fields and the shared launch flags; the
command builds the config, runs :func:`labkit.moe.run.run` and prints
:func:`labkit.moe.report.summary_frame`. Exit code 1 when the layer does not match one process.
"""

from __future__ import annotations

from labkit.cliargs import add_lab_command, mismatch_exit, run_lab, say_stored
from labkit.moe.config import MoEConfig
from labkit.tables import print_table


def register(sub) -> None:
    add_lab_command(
        sub, "moe", MoEConfig, cmd_moe, trace=True,
        help="expert parallelism: an MoE layer's experts over ranks, tokens by all-to-all",
        description="One torchrun launch per --nproc value, one thread per rank unless "
                    "--threads-per-rank says otherwise; the layer is checked against one "
                    "process running every expert (float64), its all-to-all bytes counted "
                    "against the routing drawn, its load, drops and step phases measured.")


def cmd_moe(args) -> int:
    from labkit.moe import report
    from labkit.moe.run import run

    _, df = run_lab(args, MoEConfig, run)
    print_table(report.summary_frame(df), report.SUMMARY_LEGEND)
    say_stored(args.json, df)
    return mismatch_exit(df, "labkit moe: the expert-parallel layer differs from one process "
                             "(column matches)")
