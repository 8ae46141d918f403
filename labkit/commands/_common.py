"""Argument helpers shared by the commands (argparse only: importing this is free)."""

from __future__ import annotations

import argparse
import json
import sys


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def add_launch_args(p: argparse.ArgumentParser, default_nproc=(1, 2)) -> None:
    """--nproc N [N ...], --timeout, --threads-per-rank, --backend, and the multi-node flags."""
    g = p.add_argument_group("launch")
    g.add_argument("--nproc", type=positive_int, nargs="+", default=list(default_nproc),
                   metavar="N", help="ranks per node; one launch per value (default: %(default)s)")
    g.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                   help="seconds before a launch is killed, with all its ranks (default: %(default)s)")
    g.add_argument("--threads-per-rank", type=positive_int, default=None, metavar="T",
                   help="OMP_NUM_THREADS per rank (default: cores // ranks per node)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl when CUDA devices >= ranks per node, else gloo")
    g.add_argument("--nnodes", type=positive_int, default=1, help="nodes (multi-node launch)")
    g.add_argument("--node-rank", type=int, default=0, help="this node's index (multi-node)")
    g.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="c10d rendezvous on the first node (multi-node)")
    g.add_argument("--rdzv-id", default="labkit", help="rendezvous id shared by all nodes")


def launch_kwargs(args: argparse.Namespace) -> dict:
    return {
        "timeout_s": args.timeout,
        "threads_per_rank": args.threads_per_rank,
        "backend": args.backend,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "rdzv_endpoint": args.rdzv_endpoint,
        "rdzv_id": args.rdzv_id,
    }


def print_frame(df, columns=None, floatfmt: str = "{:.4g}", file=None) -> None:
    """Print a DataFrame as an aligned text table (no index), formatting floats compactly."""
    file = file or sys.stdout
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    if df.empty:
        print("(no rows)", file=file)
        return

    def fmt(v):
        if isinstance(v, float):
            return "-" if v != v else floatfmt.format(v)
        if isinstance(v, (dict, list)):
            return json.dumps(v)[:40]
        return str(v)

    cells = [[str(c) for c in df.columns]] + [[fmt(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=file)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=file)


def write_json_rows(path: str, rows, key=()) -> None:
    """Store rows (with provenance) in a results file."""
    from .. import results

    results.record(path, rows, key)
    print(f"wrote {len(rows)} row(s) to {path}", file=sys.stderr)
