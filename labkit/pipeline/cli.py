"""labkit pipeline: measured pipeline bubbles of GPipe, 1F1B and interleaved 1F1B vs the formula.

The flags are :class:`~labkit.pipeline.config.PipelineConfig`'s fields and the shared launch
flags; the command builds the config, runs :func:`labkit.pipeline.run.run` and prints
:func:`labkit.pipeline.report.bubble_table`.

Top level: argparse only (pandas, torch and the launcher are imported inside the handler).
"""

from __future__ import annotations

import sys

from labkit.cliargs import add_lab_command, mismatch_exit, run_lab, say_stored
from labkit.pipeline.config import PipelineConfig


def register(sub) -> None:
    add_lab_command(sub, "pipeline", PipelineConfig, cmd_pipeline, launch_first=True,
                    default_nproc=(2,), trace=True,
                    help="pipeline bubbles of GPipe / 1F1B / interleaved vs formula",
                    description="bubble = 1 − Σ busy / (P × step time) against (P−1)/(P−1+M)")


def cmd_pipeline(args) -> int:
    from labkit.pipeline import report
    from labkit.pipeline.run import run

    _, df = run_lab(args, PipelineConfig, run)  # run checks the config at every P first
    print(report.bubble_table(df))
    if df.oversubscribed.any():
        print(report.OVERSUBSCRIBED_NOTE, file=sys.stderr)
    say_stored(args.json, df)
    return mismatch_exit(df, "FAILED: pipelined output/gradients differ from a single process")
