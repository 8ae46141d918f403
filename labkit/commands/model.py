"""labkit model | search | catalog | calibrate | slurm: the 3-D parallelism model and clusters."""

from __future__ import annotations

import argparse
import sys

from ._common import positive_float, positive_int, print_frame, write_json_rows

BREAKDOWN = ["fabric", "dp", "tp", "pp", "num_microbatches", "compute_s", "bubble_s", "dp_comm_s",
             "tp_comm_s", "pp_comm_s", "step_time_s", "scaling_efficiency", "samples_per_s",
             "memory_total_gb", "fits"]
RANKED = ["rank", "dp", "tp", "pp", "num_microbatches", "step_time_s", "scaling_efficiency",
          "samples_per_s", "mfu", "memory_total_gb", "reason"]


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", default="Llama-3-70B", help="model preset (default: %(default)s)")
    g.add_argument("--node", default="DGX_H100", help="node preset (default: %(default)s)")
    g.add_argument("--nodes", type=positive_int, default=32, help="(default: %(default)s)")
    g.add_argument("--accelerator", help="override the node's accelerator")
    g.add_argument("--intra-fabric", help="override the node's NVLink")
    g.add_argument("--global-batch", type=positive_int, default=256, metavar="B",
                   help="sequences per step (default: %(default)s)")
    g.add_argument("--seq-len", type=positive_int, help="default: the model's context length")
    g.add_argument("--precision", default="bf16", help="(default: %(default)s)")
    g.add_argument("--efficiency", type=positive_float, default=0.4,
                   help="achieved / peak FLOP/s of the compute (default: %(default)s)")
    g.add_argument("--zero1", action="store_true", help="shard optimizer states over DP")
    g.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved"))


def register(sub) -> None:
    p = sub.add_parser("model", help="predict one training step of a DP x TP x PP layout",
                       description="labkit model --model Llama-3-70B --nodes 32 --tp 8 --pp 4 "
                                   "--microbatches 32 --fabric 100GbE IB_HDR IB_NDR")
    _add_workload_args(p)
    p.add_argument("--fabric", nargs="+", metavar="KEY", help="inter-node fabric(s); one row each "
                   "(default: the node's)")
    p.add_argument("--dp", type=positive_int, help="default: GPUs / (tp x pp)")
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--microbatches", type=positive_int, default=1, metavar="M")
    p.add_argument("--virtual-stages", type=positive_int, default=1)
    p.add_argument("--steps", type=positive_int, default=1000, help="for the cost (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("search", help="rank every DP x TP x PP layout of a cluster, explain the rest")
    _add_workload_args(p)
    p.add_argument("--fabric", help="inter-node fabric (default: the node's)")
    p.add_argument("--microbatches", type=positive_int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--top", type=positive_int, default=10, help="feasible layouts shown")
    p.add_argument("--rejected", action="store_true", help="also list the rejected layouts")
    p.add_argument("--json", metavar="PATH", help="also store all rows in this results file")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("catalog", help="print a catalog (accelerators, fabrics, nodes, models, local) "
                       "or a reference dataset")
    p.add_argument("name", help="catalog name, or a reference dataset (ddp_k80, ddp_v100, ...)")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("calibrate", help="the model beside measured collectives / pipeline rows")
    p.add_argument("--collectives", metavar="PATH", help="results file of labkit collectives")
    p.add_argument("--pipeline", metavar="PATH", help="results file of labkit pipeline")
    p.add_argument("--fit", action="store_true",
                   help="fit alpha, beta to the collective rows (default: the committed local entry)")
    p.add_argument("--measure", action="store_true",
                   help="measure this machine (all-reduce sweep + compute rate) first")
    p.add_argument("--write", action="store_true", help="with --measure: store data/local.yaml")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("slurm", help="write an sbatch script (srun + torchrun, c10d rendezvous); never submits",
                       description="labkit slurm --nodes 2 --gpus-per-node 4 --time 00:30:00 "
                                   "--partition gpu --account mylab -- labkit solve --mode weak")
    p.add_argument("--nodes", type=positive_int, required=True)
    p.add_argument("--gpus-per-node", type=positive_int, required=True)
    p.add_argument("--time", required=True, metavar="HH:MM:SS")
    p.add_argument("--partition", required=True)
    p.add_argument("--account", required=True)
    p.add_argument("--cpus-per-task", type=positive_int, help="cores per node (default: one per GPU)")
    p.add_argument("--job-name", default="labkit")
    p.add_argument("--out", default="labkit-job.sbatch", help="script path (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also record the job's cost row here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run on every node")
    p.set_defaults(func=cmd_slurm)


def _workload(args):
    from ..catalog import model_preset
    from ..model import Workload

    return Workload(model_preset(args.model), args.global_batch, args.seq_len, args.precision,
                    args.efficiency, zero1=args.zero1)


def model_rows(args):
    """One predicted row per fabric (a DataFrame), with the cost of ``--steps`` steps."""
    import pandas as pd

    from ..model import Cluster, Layout, predict, run_cost

    work = _workload(args)
    rows = []
    for fab in args.fabric or [None]:
        cl = Cluster.from_catalog(args.node, args.nodes, inter_fabric=fab,
                                  intra_fabric=args.intra_fabric, accelerator=args.accelerator)
        dp = args.dp or max(1, cl.world_size // (args.tp * args.pp))
        lay = Layout(dp, args.tp, args.pp, args.microbatches, args.schedule, args.virtual_stages)
        pred = predict(work, cl, lay)
        rows.append({"model": args.model, "cluster": cl.name, "fabric": cl.inter.key, **pred.row(),
                     **run_cost(pred, cl, args.steps), "verdict": pred.verdict()})
    return pd.DataFrame(rows)


def cmd_model(args) -> int:
    from ..results import check_writable

    if args.json:
        check_writable(args.json)
    df = model_rows(args)
    print_frame(df, BREAKDOWN)
    for r in df.itertuples():
        print(f"{r.fabric}: {r.verdict}; {r.steps} steps: {r.gpu_hours:.1f} GPU-hours, {r.su:.1f} SU")
    if args.json:
        write_json_rows(args.json, df.to_dict("records"), key=("fabric", "dp", "tp", "pp", "num_microbatches"))
    return 0


def cmd_search(args) -> int:
    from ..model import Cluster, search
    from ..results import check_writable

    if args.json:
        check_writable(args.json)
    cl = Cluster.from_catalog(args.node, args.nodes, inter_fabric=args.fabric,
                              intra_fabric=args.intra_fabric, accelerator=args.accelerator)
    df = search(_workload(args), cl, tuple(args.microbatches), args.schedule)
    ok = df[df.fits]
    print(f"{args.model} on {cl.name} ({cl.world_size} GPUs, {cl.inter.key}): "
          f"{len(ok)} of {len(df)} layouts fit")
    print_frame(ok.head(args.top), RANKED)
    if args.rejected:
        print()
        print_frame(df[~df.fits], ["dp", "tp", "pp", "reason"])
    if args.json:
        write_json_rows(args.json, df.to_dict("records"), key=("dp", "tp", "pp"))
    return 0


def cmd_catalog(args) -> int:
    from .. import catalog

    if args.name in catalog.CATALOGS:
        df = catalog.catalog_frame(args.name)
    else:
        df = catalog.load_reference(args.name)
        print(f"{df.attrs.get('title')}\nsource: {df.attrs.get('source')}\n")
    print_frame(df)
    return 0


def cmd_calibrate(args) -> int:
    from .. import results
    from ..calibrate import calibration_check, summary
    from ..catalog import local_entry
    from ..errors import UsageError

    if args.write and not args.measure:
        raise UsageError("--write stores a new measurement: give --measure too")
    coll = results.read_rows(args.collectives) if args.collectives else []
    pipe = results.read_rows(args.pipeline) if args.pipeline else []
    if args.measure:
        from ..measure import measure_local

        loc, measured = measure_local(write=args.write)
        coll = coll or measured
        print(f"measured: alpha {loc['alpha_s'] * 1e6:.1f} us, beta {loc['beta_bytes_per_s'] / 1e9:.3f}"
              f" GB/s, compute {loc['compute_flop_per_s'] / 1e9:.1f} GFLOP/s"
              + (" (written to data/local.yaml)" if args.write else ""))
    else:
        loc = local_entry()
    if not coll and not pipe:
        raise UsageError("give --collectives PATH and/or --pipeline PATH (or --measure)")
    kw = {} if args.fit else {"alpha_s": loc["alpha_s"], "beta_bytes_per_s": loc["beta_bytes_per_s"]}
    df = calibration_check(coll, pipe, compute_flop_per_s=loc["compute_flop_per_s"], **kw)
    print_frame(df, ["lab", "what", "world_size", "size_bytes", "num_microbatches", "quantity",
                     "measured", "model", "error_pct"])
    print("median |error| %: " + ", ".join(f"{k} {v:.1f}" for k, v in summary(df).items()))
    return 0


def cmd_slurm(args) -> int:
    from .. import slurm

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    job = slurm.SlurmJob(tuple(cmd), args.nodes, args.gpus_per_node, args.time, args.partition,
                         args.account, args.cpus_per_task, args.job_name)
    if job.command[0] == "labkit":
        _check_labkit_command(list(job.command[1:]) + ["--nnodes", "2", "--node-rank", "0",
                                                      "--rdzv-endpoint", "h:1", "--rdzv-id", "x"])
    if args.json:
        from ..results import check_writable

        check_writable(args.json)
    path = slurm.write(job, args.out)
    c = job.cost()
    print(f"wrote {path} (not submitted; run: sbatch {path})")
    print(f"at most {c['gpu_hours']:.2f} GPU-hours, {c['su']:.2f} SU "
          f"({c['nodes']} nodes x {args.gpus_per_node} GPUs, {args.time})")
    if args.json:
        write_json_rows(args.json, [{**c, "script": str(path), "command": " ".join(job.command)}],
                        key=("script",))
    return 0


def _check_labkit_command(argv: list[str]) -> None:
    """Parse the labkit command here, with the launch flags we add, so a typo fails now."""
    import contextlib
    import io

    from ..cli import build_parser
    from ..errors import UsageError

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit:
        last = (err.getvalue().strip().splitlines() or ["invalid command"])[-1]
        raise UsageError(f"the command after -- does not parse as a multi-node labkit launch: "
                         f"{last}") from None
    print(f"checked: labkit {' '.join(argv[:1])} accepts the multi-node launch flags", file=sys.stderr)
