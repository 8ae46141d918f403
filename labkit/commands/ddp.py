"""labkit ddp | diff: the data-parallel training lab and the A/B comparison of two of its runs."""

from __future__ import annotations

import argparse
import sys

from ._common import add_launch_args, launch_kwargs, print_frame


def register(sub) -> None:
    p = sub.add_parser(
        "ddp", help="DDP training: no-DDP baseline, then DDP at each world size; percentiles",
        description="Times optimizer steps of a synthetic model without DDP (1 process) and with "
                    "DDP at each --nproc (one launch each). Step time = slowest rank.")
    add_launch_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--model", default="mlp", help="mlp, cnn or transformer (default: %(default)s)")
    g.add_argument("--batch-size", type=int, nargs="+", default=[64], metavar="N",
                   help="samples per rank per step; several values all run inside each launch "
                   "(default: %(default)s)")
    g.add_argument("--steps", type=int, default=25, help="optimizer steps, warm-up included "
                   "(default: %(default)s)")
    g.add_argument("--warmup", type=int, default=5, help="untimed first steps (default: %(default)s)")
    for name, what in (("input-dim", "mlp: features; cnn: channels; transformer: features/token"),
                       ("hidden-dim", "mlp: units; cnn: channels; transformer: d_model"),
                       ("output-dim", "classes"), ("num-layers", "hidden/conv/encoder layers")):
        g.add_argument(f"--{name}", type=int, default=None, help=f"{what} (default: per model)")
    g.add_argument("--image-size", type=int, default=32, help="cnn (default: %(default)s)")
    g.add_argument("--seq-len", type=int, default=32, help="transformer (default: %(default)s)")
    g.add_argument("--num-heads", type=int, default=4, help="transformer (default: %(default)s)")
    g.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="weights and data (default: %(default)s)")
    g = p.add_argument_group("DDP")
    g.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="gradient bucket size in MB (default: %(default)s)")
    g.add_argument("--broadcast-buffers", action=argparse.BooleanOptionalAction, default=False,
                   help="send rank 0's buffers before every forward (default: off)")
    g.add_argument("--static-graph", action=argparse.BooleanOptionalAction, default=False,
                   help="tell DDP the graph never changes (default: off)")
    g.add_argument("--grad-as-bucket-view", dest="gradient_as_bucket_view",
                   action=argparse.BooleanOptionalAction, default=False,
                   help="gradients are views into the all-reduce buckets (default: off)")
    g.add_argument("--no-ddp-baseline", dest="baseline", action="store_false",
                   help="skip the no-DDP run (it runs in the 1-rank launch)")
    g.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                   help="skip the no_sync steps and the standalone all-reduce")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_ddp)

    p = sub.add_parser("diff", help="compare two `labkit ddp --json` files (A/B, %% deltas)",
                       description="Settings side by side, then per world size p75/p95 of both "
                                   "runs and the %% change of B's throughput against A's.")
    p.add_argument("a", metavar="A.json", help="baseline results file")
    p.add_argument("b", metavar="B.json", help="test results file")
    p.add_argument("--csv", action="store_true", help="print the comparison table as CSV")
    p.set_defaults(func=cmd_diff)


CONFIG_ARGS = ("model", "batch_size", "steps", "warmup", "input_dim", "hidden_dim", "output_dim",
               "num_layers", "image_size", "seq_len", "num_heads", "lr", "seed", "bucket_cap_mb",
               "broadcast_buffers", "static_graph", "gradient_as_bucket_view", "baseline",
               "breakdown")


def cmd_ddp(args) -> int:
    from ..ddp import report
    from ..ddp.run import ddp_scaling

    options = {k: getattr(args, k) for k in CONFIG_ARGS}
    df = ddp_scaling(args.nproc, json_path=args.json, **options, **launch_kwargs(args))
    print(report.benchmark_table(df))
    print()
    print_frame(report.scaling_frame(df), floatfmt="{:.3g}")
    print(report.SCALING_LEGEND)
    print()
    print(report.placement_table(df))
    if df["oversubscribed"].any():
        print("\nnote: oversubscribed launches (more rank-threads than cores): timings are not "
              "representative", file=sys.stderr)
    if args.json:
        print(f"wrote {len(df)} row(s) to {args.json}", file=sys.stderr)
    if not df["placement_ok"].all():
        print("\nPROBLEM: ranks share a GPU; the numbers above are not what this machine can do",
              file=sys.stderr)
        return 1
    return 0


def cmd_diff(args) -> int:
    from ..ddp.diff import compare, format_diff

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
