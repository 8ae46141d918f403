"""``labkit``: the command line. Each command is a thin layer over a function notebooks call.

Each lab's ``cli`` module registers its subcommands (:data:`COMMAND_MODULES`); this module
registers the shared ones, ``labkit slurm`` and ``labkit table``. Their top level imports nothing heavy (the pure
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
    "labkit.machine.cli",
    "labkit.moe.cli",
    "labkit.cp.cli",
)


def register(sub) -> None:
    """The shared commands: ``labkit slurm`` writes a batch script for any lab's command,
    ``labkit table`` reads any lab's results file."""
    from labkit.cliargs import nonneg_int_arg, positive_int_arg

    p = sub.add_parser("slurm", help="write an sbatch script (srun + torchrun, c10d rendezvous); never submits",
                       description="labkit slurm --nodes 2 --gpus-per-node 4 --time 00:30:00 "
                                   "-- labkit solve --mode weak --dof-per-rank 250000 (see docs/cluster.md)")
    p.add_argument("--nodes", type=positive_int_arg, required=True)
    p.add_argument("--gpus-per-node", type=nonneg_int_arg, required=True,
                   help="GPUs per node; 0: a CPU job (no --gres line)")
    p.add_argument("--time", required=True, metavar="HH:MM:SS")
    p.add_argument("--partition", help="where the cluster needs one (default: its default partition)")
    p.add_argument("--account", help="where the cluster needs one (default: your default account)")
    p.add_argument("--cpus-per-task", type=positive_int_arg,
                   help="cores per node (default: one per GPU; in a CPU job, one per rank)")
    p.add_argument("--ranks-per-node", type=positive_int_arg, metavar="R",
                   help="ranks each node starts (default: --gpus-per-node; in a CPU job the labkit "
                        "command's largest --nproc, else 1)")
    p.add_argument("--setup", metavar="LINE",
                   help="shell line that makes the environment on the nodes (e.g. 'module load "
                        "python; source ~/venv/bin/activate'; default: put this environment's "
                        "bin folder first on PATH)")
    p.add_argument("--job-name", default="labkit")
    p.add_argument("--out", default="labkit-job.sbatch", help="script path (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also record the job's cost row here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run on every node")
    p.set_defaults(func=cmd_slurm)
    p = sub.add_parser("table", help="print a results file as a table")
    p.add_argument("path", help="results JSON file")
    p.add_argument("--columns", nargs="+", help="only these columns")
    p.add_argument("--csv", action="store_true", help="CSV instead of an aligned table")
    p.add_argument("--describe", action="store_true",
                   help="print each column's unit and meaning instead of the rows")
    p.set_defaults(func=cmd_table)


def cmd_table(args) -> int:
    from labkit.results import describe, load
    from labkit.tables import print_frame

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


def check_command(argv: list[str]) -> argparse.Namespace:
    """Parse ``labkit ARGV`` and run the checks it makes before launching, launching nothing:
    the command's ``validate`` hook (:func:`validate_launch`) where it has one, else its launch
    options. UsageError (one line) when the command would be refused; the parsed flags else.
    """
    import contextlib
    import io


    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit:
        last = (err.getvalue().strip().splitlines() or ["invalid command"])[-1]
        raise UsageError(last) from None
    hook = getattr(args, "validate", None)
    if callable(hook):
        hook(args)
    elif hasattr(args, "nproc"):
        from labkit.cliargs import launch_options

        launch_options(args)
    return args



def cmd_slurm(args) -> int:
    from pathlib import Path

    from labkit import slurm
    from labkit.errors import UsageError

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    job = slurm.SlurmJob(tuple(cmd), args.nodes, args.gpus_per_node, args.time, args.partition,
                         args.account, args.cpus_per_task, args.job_name,
                         ranks_per_node=args.ranks_per_node, setup=args.setup)
    tool = "labkit" if job.command[0] == "labkit" else "torchrun"
    if job.setup is None and not Path(job.bin_dir, tool).exists():
        raise UsageError(f"{tool} is not installed in {job.bin_dir} (this environment, which the "
                         "script would use): install it there, or give --setup LINE")
    if tool == "labkit":
        _check_labkit_command(job)
    if args.json:
        from labkit.results import check_writable

        check_writable(args.json)
    path = slurm.write(job, args.out)
    print(f"wrote {path} (not submitted; run: sbatch {path})")
    print(job.cost_line())
    if args.json:
        from labkit.cliargs import write_json_rows

        write_json_rows(args.json, [{**job.cost(), "script": str(path),
                                     "command": " ".join(job.command)}], key=("script",))
    return 0


def _check_labkit_command(job) -> None:
    """Run the checks the labkit command makes before its first launch, as one node of this
    job would run it, so a command the cluster would refuse fails now, before any script."""
    from labkit.errors import UsageError

    argv = job.labkit_argv[1:] + ["--nnodes", str(job.nodes), "--node-rank", "0",
                                  "--rdzv-endpoint", "localhost:29500", "--rdzv-id", "check"]
    try:
        args = check_command(argv)
    except UsageError as e:
        raise UsageError(f"the command after -- is refused as a {job.nodes}-node labkit "
                         f"launch: {e}") from None
    what = ("passes the checks it makes before a launch"
            if callable(getattr(args, "validate", None)) else "parses with the multi-node flags")
    print(f"checked: labkit {argv[0]} {what}", file=sys.stderr)


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
