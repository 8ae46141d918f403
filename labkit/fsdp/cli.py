"""labkit fsdp: the same model under DDP, a hand-written ZeRO-1 and FSDP2, measured.

The flags are :class:`~labkit.fsdp.config.FSDPConfig`'s fields and the shared launch flags;
the command builds the config, runs :func:`labkit.fsdp.run.run` and prints
:mod:`labkit.fsdp.report`'s tables. Exit code 1 when a sharded model does not match one
process.
"""

from __future__ import annotations

from labkit.cliargs import add_lab_command, mismatch_exit, run_lab, say_stored
from labkit.fsdp.config import FSDPConfig
from labkit.tables import print_table


def register(sub) -> None:
    add_lab_command(
        sub, "fsdp", FSDPConfig, cmd_fsdp, trace=True,
        help="sharded data parallelism: DDP, ZeRO-1 by hand and FSDP2, bytes and time",
        description="One torchrun launch per --nproc value; every variant is checked against "
                    "one process, the bytes each rank holds and moves are counted against the "
                    "ZeRO formulas, and each step time is put beside its prediction.")


def cmd_fsdp(args) -> int:
    from labkit.fsdp import report
    from labkit.fsdp.run import run

    _, df = run_lab(args, FSDPConfig, run)
    print_table(report.summary_frame(df), report.SUMMARY_LEGEND)
    print()
    print_table(report.memory_frame(df))
    print()
    print_table(report.comm_frame(df))
    say_stored(args.json, df)
    return mismatch_exit(df, "labkit fsdp: a sharded model differs from one process "
                             "(column matches)")
