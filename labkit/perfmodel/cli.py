"""labkit model | search | catalog | model-check: the parallelism model (DP x TP x PP, with CP
and EP) and its clusters."""

from __future__ import annotations

import argparse

from labkit.cliargs import (
    positive_float_arg,
    positive_int_arg,
    write_json_rows,
)
from labkit.tables import print_frame

BREAKDOWN = ["fabric", "dp", "tp", "pp", "num_microbatches", "compute_s", "bubble_s", "dp_comm_s",
             "tp_comm_s", "pp_comm_s", "step_time_s", "scaling_efficiency", "samples_per_s", "mfu",
             "hfu", "memory_total_gb", "memory"]
#: shown beside the 3-D ones where a row has CP or EP > 1: column -> the column it follows
BEYOND_3D = {"cp": "pp", "ep": "cp", "ep_comm_s": "pp_comm_s", "cp_comm_s": "ep_comm_s"}
RANKED = ["rank", "dp", "tp", "pp", "num_microbatches", "step_time_s", "scaling_efficiency",
          "samples_per_s", "mfu", "memory_total_gb", "reason"]
COMPARED = ["term", "unit", "labkit", "mlsysim", "diff_pct", "same_formula", "cause"]
#: API field -> the flag that sets it (what an error message names)
FLAGS = {"global_batch_size": "--global-batch-size", "num_microbatches": "--microbatches",
         "virtual_stages": "--virtual-stages", "seq_len": "--seq-len", "zero_stage": "--zero",
         "dp_overlap": "--dp-overlap", "recompute": "--recompute", "efficiency": "--efficiency",
         "precision": "--precision", "placement": "--placement", "schedule": "--schedule",
         "tp_across_nodes": "--tp-across-nodes", "dp": "--dp", "tp": "--tp", "pp": "--pp",
         "cp": "--cp", "ep": "--ep"}


def _dp_overlap(text: str):
    """A fraction in [0, 1], or ``measured`` (the DDP lab's value on the reference VM,
    data/local.yaml)."""
    if text == "measured":
        return text
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1] or 'measured'") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {v}")
    return v


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", default="Llama-3-70B", help="model preset (default: %(default)s; "
                   "labkit catalog models)")
    g.add_argument("--node", default="DGX_H100", help="node preset (default: %(default)s)")
    g.add_argument("--nodes", type=positive_int_arg, default=32, help="(default: %(default)s)")
    g.add_argument("--fabric", nargs="+", metavar="KEY", help="inter-node fabric(s); one "
                   "prediction (or search) each (default: the node's)")
    g.add_argument("--accelerator", help="override the node's accelerator")
    g.add_argument("--intra-fabric", help="override the node's intra-node link (NVLink)")
    g = p.add_argument_group("workload and step")
    g.add_argument("--global-batch-size", "--global-batch", dest="global_batch",
                   type=positive_int_arg, default=256, metavar="B",
                   help="sequences per optimizer step (default: %(default)s)")
    g.add_argument("--seq-len", type=positive_int_arg, help="tokens per sequence (default: the "
                   "model's context length)")
    g.add_argument("--precision", default="bf16", help="(default: %(default)s)")
    g.add_argument("--efficiency", type=positive_float_arg, default=0.4,
                   help="achieved / peak FLOP/s of the compute (default: %(default)s)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage: 1 shards optimizer states over DP, 2 also gradients, 3 also "
                        "weights (re-gathered per microbatch) (default: %(default)s)")
    g.add_argument("--zero1", action="store_true", help="the same as --zero 1")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation recomputation (default: %(default)s)")
    g.add_argument("--dp-overlap", type=_dp_overlap, default=0.0, metavar="F|measured",
                   help="share of the DP communication hidden behind backward, or 'measured' "
                        "(the DDP lab's value on the reference 2-core VM, data/local.yaml) "
                        "(default: %(default)s)")
    g.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved"))
    g.add_argument("--placement", default="tp,dp,pp", help="rank order, innermost first "
                   "(default: %(default)s, Megatron's; mlsysim places tp,pp,dp)")
    g.add_argument("--tp-across-nodes", action="store_true",
                   help="allow a TP group to span nodes (priced on the inter-node link)")
    g.add_argument("--algorithm", default="auto",
                   choices=("auto", "ring", "tree", "double_binary_tree", "hierarchical"),
                   help="collective algorithm for DP and TP (default: %(default)s, the fastest, "
                        "as NCCL's tuner picks)")


def register(sub) -> None:
    p = sub.add_parser("model", help="predict one training step of a DP x TP x PP (x CP, EP) "
                       "layout",
                       description="labkit model --model Llama-3-70B --nodes 32 --tp 8 --pp 4 "
                                   "--microbatches 32 --fabric 100GbE IB_HDR IB_NDR; "
                                   "labkit model --model Mixtral-8x7B --nodes 4 --seq-len 2048 "
                                   "--ep 8")
    _add_workload_args(p)
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int_arg, help="default: GPUs / (tp x pp x cp)")
    g.add_argument("--tp", type=positive_int_arg, default=1)
    g.add_argument("--pp", type=positive_int_arg, default=1)
    g.add_argument("--microbatches", type=positive_int_arg, default=1, metavar="M",
                   help="per DP replica per step (gradient accumulation when --pp 1)")
    g.add_argument("--virtual-stages", type=positive_int_arg, default=1, metavar="V",
                   help="model chunks per GPU, >= 2 with --schedule interleaved")
    g.add_argument("--cp", type=positive_int_arg, default=1, help="context parallelism: ranks "
                   "that share each sequence (DP x TP x PP x CP = GPUs; must divide --seq-len) "
                   "(default: %(default)s)")
    g.add_argument("--ep", type=positive_int_arg, default=1, help="expert parallelism: DP ranks "
                   "that share a mixture's experts (must divide --dp and the model's experts) "
                   "(default: %(default)s)")
    p.add_argument("--steps", type=positive_int_arg, default=1000, help="for the cost (default: %(default)s)")
    p.add_argument("--compare", choices=("mlsysim",), help="also run mlsysim 0.3.0 on the same "
                   "scenario and print each term beside ours (pip install -e '.[mlsysim]')")
    p.add_argument("--json", metavar="PATH", help="also store the rows in this results file")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("search", help="rank every DP x TP x PP (x CP, EP) layout of a cluster, "
                       "explain the rest")
    _add_workload_args(p)
    p.add_argument("--microbatches", type=positive_int_arg, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--cp", type=positive_int_arg, nargs="+", default=[1], metavar="CP",
                   help="context-parallel sizes tried, each skipped where it does not divide the "
                        "GPUs left by TP x PP or the sequence (default: %(default)s)")
    p.add_argument("--ep", type=positive_int_arg, nargs="+", default=[1], metavar="EP",
                   help="expert-parallel sizes tried, each skipped where it does not divide DP "
                        "or the model's experts (default: %(default)s)")
    p.add_argument("--top", type=positive_int_arg, default=10, help="feasible layouts shown")
    p.add_argument("--rejected", action="store_true", help="also list the rejected layouts")
    p.add_argument("--json", metavar="PATH", help="also store all rows in this results file")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("catalog", help="print a catalog (accelerators, fabrics, nodes, models, local: a reference VM), "
                       "a reference dataset, or 'published' (the model beside published runs)")
    p.add_argument("name", help="catalog name, a reference dataset (ddp_k80, ddp_v100, ...) or "
                   "published")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("model-check", help="the model beside measured collectives / pipeline "
                       "rows, with this machine's profile (labkit calibrate measures it)")
    p.add_argument("--collectives", metavar="PATH", help="results file of labkit collectives")
    p.add_argument("--pipeline", metavar="PATH", help="results file of labkit pipeline")
    p.add_argument("--ddp", metavar="PATH", help="results file of labkit ddp: print the measured "
                   "overlap of the all-reduce with backward")
    p.add_argument("--profile", metavar="DIR", help="a run's results folder holding its machine "
                   "profile (measured there now if absent): the model's alpha, beta, compute rate, "
                   "co-run slowdown and in-context all-reduce")
    p.add_argument("--fit", action="store_true",
                   help="fit alpha, beta to the collective rows instead (no profile needed)")
    p.set_defaults(func=cmd_model_check)


def _flag_words(message: str) -> str:
    """An API message in the words of the command line: field names become their flags (a
    name in a comma list, as in a placement ``tp,dp,pp``, is a value and stays).

    >>> _flag_words("tp 16 spans nodes (placement dp,tp,pp) unless tp_across_nodes")
    '--tp 16 spans nodes (--placement dp,tp,pp) unless --tp-across-nodes'
    """
    import re

    names = "|".join(sorted(FLAGS, key=len, reverse=True))
    return re.sub(rf"(?<![\w,-])({names})(?![\w,-])", lambda m: FLAGS[m.group(1)], message)


def _named(flag: str, fn, *a, **kw):
    """Call a catalog lookup; its error (which lists the valid keys) names the flag."""
    from labkit.errors import UsageError

    try:
        return fn(*a, **kw)
    except UsageError as e:
        raise UsageError(f"{flag}: {e}") from None


def _dp_overlap_value(args) -> float:
    from labkit.errors import UsageError
    from labkit.perfmodel.catalog import local_entry

    if args.dp_overlap != "measured":
        return args.dp_overlap
    loc = local_entry()
    if loc.get("dp_overlap_fraction") is None:
        raise UsageError("--dp-overlap measured: data/local.yaml (the reference VM) has no "
                         "dp_overlap_fraction; give a fraction (`labkit ddp --nproc 2 --json "
                         "ddp.json`, then `labkit model-check --ddp ddp.json` measures one here)")
    return float(loc["dp_overlap_fraction"])


def _workload(args):
    from labkit.perfmodel import catalog
    from labkit.perfmodel.model import BYTES, Workload

    spec = _named("--model", catalog.model_preset, args.model)
    if args.precision not in BYTES:
        from labkit.errors import UsageError

        raise UsageError(f"--precision {args.precision!r}: known {', '.join(BYTES)}")
    return Workload(spec, args.global_batch, args.seq_len, args.precision, args.efficiency,
                    zero_stage=max(args.zero, 1 if args.zero1 else 0), recompute=args.recompute,
                    dp_overlap=_dp_overlap_value(args))


def _clusters(args):
    """One cluster per --fabric (the node's own when none), every key checked and named."""
    from labkit.perfmodel import catalog
    from labkit.perfmodel.model import Cluster

    nd = _named("--node", catalog.node, args.node)
    if args.accelerator:
        _named("--accelerator", catalog.accelerator, args.accelerator)
    if args.intra_fabric:
        _named("--intra-fabric", catalog.fabric, args.intra_fabric, scope="intra")
    out = []
    for fab in args.fabric or [None]:
        if fab:
            _named("--fabric", catalog.fabric, fab, scope="inter")
        out.append(Cluster.from_catalog(nd.key, args.nodes, inter_fabric=fab,
                                        intra_fabric=args.intra_fabric,
                                        accelerator=args.accelerator))
    return out


def _layout(args, cluster):
    """The layout the flags describe, refused in one line naming the flag when it cannot be
    built (:class:`~labkit.perfmodel.model.Layout`'s checks in the words of the command line;
    :func:`~labkit.perfmodel.model.predict` checks it against the cluster and the workload)."""
    from labkit.errors import UsageError
    from labkit.perfmodel import topology
    from labkit.perfmodel.model import Layout

    n, block = cluster.world_size, args.tp * args.pp * args.cp
    if args.dp is None and n % block:  # --dp's default: GPUs / (tp x pp x cp)
        cp = f" x --cp {args.cp}" if args.cp > 1 else ""
        raise UsageError(f"--tp {args.tp} x --pp {args.pp}{cp} = {block} does not divide "
                         f"the {n} GPUs of {cluster.name}")
    placement = ",".join(_named("--placement", topology.parse_placement, args.placement))
    try:
        return Layout(args.dp or n // block, args.tp, args.pp, args.microbatches,
                      args.schedule, args.virtual_stages, placement, args.tp_across_nodes,
                      cp=args.cp, ep=args.ep)
    except UsageError as e:
        raise UsageError(_flag_words(str(e))) from None


def _columns(df, columns: list[str]) -> list[str]:
    """``columns``, with the CP and EP ones (:data:`BEYOND_3D`) where a row has CP or EP > 1:
    a 3-D table stays as it was."""
    if not any(c in df and (df[c].fillna(1) > 1).any() for c in ("cp", "ep")):
        return columns
    out = list(columns)
    for col, after in BEYOND_3D.items():
        if col in df and col not in out and after in out:
            out.insert(out.index(after) + 1, col)
    return out


def _header(work, cluster, args) -> None:
    from labkit.perfmodel.model import assumptions

    eps = tuple(args.ep) if isinstance(args.ep, list) else (args.ep,)  # search's, or model's
    for line in assumptions(work, cluster, placement=args.placement, schedule=args.schedule,
                            algorithm=args.algorithm, ep=eps):
        print(f"# {line}")
    if args.dp_overlap == "measured":
        print(f"# DP overlap {work.dp_overlap:g}: measured by the DDP lab on the reference 2-core "
              "VM (data/local.yaml)")


def model_rows(args, work=None, clusters=None):
    """One predicted row per fabric (a DataFrame), with the cost of ``--steps`` steps."""
    import pandas as pd

    from labkit.errors import UsageError
    from labkit.perfmodel.model import predict, run_cost

    work = work or _workload(args)
    rows = []
    for cl in clusters or _clusters(args):
        lay = _layout(args, cl)
        try:  # the layout against the cluster and the workload: the model's checks
            pred = predict(work, cl, lay, algorithm=args.algorithm)
        except UsageError as e:
            raise UsageError(_flag_words(str(e))) from None
        cost = run_cost(pred, cl, args.steps)
        rows.append({"model": args.model, "cluster": cl.name, "fabric": cl.inter.key, **pred.row(),
                     **cost, "memory": "fits" if pred.fits else "OUT OF MEMORY",
                     "verdict": pred.verdict()})
    return pd.DataFrame(rows)


def cmd_model(args) -> int:
    from labkit.results import check_writable

    if args.json:
        check_writable(args.json)
    if args.compare:
        from labkit.errors import UsageError
        from labkit.perfmodel import mlsysim_engine

        if args.cp > 1 or args.ep > 1:
            raise UsageError("--compare mlsysim prices DP x TP x PP layouts: drop --cp and --ep "
                             "(mlsysim has no context parallelism; notebook 90 compares its "
                             "expert parallelism)")
        mlsysim_engine.require()
    work, clusters = _workload(args), _clusters(args)
    df = model_rows(args, work, clusters)
    _header(work, clusters[0], args)
    r0 = df.iloc[0]
    given = args.dp or args.tp > 1 or args.pp > 1 or args.cp > 1 or args.ep > 1
    beyond = (f" x CP {r0.cp}" if r0.cp > 1 else "") + (
        f", EP {r0.ep} (expert groups of {r0.ep} DP ranks)" if r0.ep > 1 else "")
    print(f"# layout: DP {r0.dp} x TP {r0.tp} x PP {r0.pp}{beyond}, {r0.num_microbatches} "
          f"microbatch(es) of {r0.microbatch_size:g} per replica"
          + ("" if given else " (no --dp/--tp/--pp/--cp/--ep given: pure data parallelism)"))
    print_frame(df, _columns(df, BREAKDOWN))
    for r in df.itertuples():
        coll = (f"DP {r.dp_algorithm} ({r.dp_ranks_per_node} per node on {r.dp_nodes} node(s), "
                f"{r.dp_link})" if r.dp > 1 else "no DP")
        if r.tp > 1:
            coll += f", TP {r.tp_algorithm} ({r.tp_link})"
        if r.ep > 1:
            coll += (f", EP {r.ep_algorithm} all-to-all of {r.ep_all_to_all_bytes / 1e6:.3g} MB "
                     f"({r.ep_link})")
        if r.cp > 1:
            coll += f", CP K/V ring ({r.cp_link})"
        if r.fits:
            print(f"{r.fabric}: {coll}; {r.verdict}; {r.steps} steps: {r.gpu_hours:.1f} "
                  f"GPU-hours, {r.su:.1f} SU")
        else:
            print(f"{r.fabric}: {coll}; OUT OF MEMORY, this layout cannot run "
                  f"({r.verdict.removeprefix('out of memory: ')}); no cost given (labkit search "
                  f"--nodes {args.nodes} ranks the layouts that fit)")
    if args.json:
        write_json_rows(args.json, df.to_dict("records"),
                        key=("fabric", "dp", "tp", "pp", "cp", "ep", "num_microbatches"))
    if args.compare:
        _compare_mlsysim(args, work, df)
    return 0


def _compare_mlsysim(args, work, df) -> None:
    import pandas as pd

    from labkit.errors import UsageError
    from labkit.perfmodel import mlsysim_engine

    if args.accelerator or args.intra_fabric:
        raise UsageError("--compare mlsysim prices mlsysim's own node: drop --accelerator and "
                         "--intra-fabric")
    for r in df.itertuples():
        s = mlsysim_engine.Scenario(
            f"{args.model}, {r.fabric}", args.model, args.node, args.nodes, r.fabric,
            args.global_batch, work.seq_len, args.precision, args.efficiency, r.tp, r.pp,
            r.num_microbatches, r.virtual_stages, r.zero_stage, r.recompute, r.dp_overlap,
            r.placement)
        cmp = pd.DataFrame(mlsysim_engine.compare([s]))
        print(f"\nmlsysim {mlsysim_engine.VERSION} beside labkit, {s.name} "
              "(diff = 100 (labkit - mlsysim) / mlsysim):")
        print_frame(cmp, COMPARED)


def cmd_search(args) -> int:
    from labkit.errors import UsageError
    from labkit.perfmodel import topology
    from labkit.perfmodel.layouts import search
    from labkit.results import check_writable

    if args.json:
        check_writable(args.json)
    work = _workload(args)
    placement = ",".join(_named("--placement", topology.parse_placement, args.placement))
    rows = []
    for i, cl in enumerate(_clusters(args)):
        try:
            df = search(work, cl, tuple(args.microbatches), args.schedule, placement=placement,
                        tp_across_nodes=args.tp_across_nodes, algorithm=args.algorithm,
                        cp_sizes=tuple(args.cp), ep_sizes=tuple(args.ep))
        except UsageError as e:
            raise UsageError(_flag_words(str(e))) from None
        if i == 0:
            _header(work, cl, args)
        ok = df[df.fits]
        print(f"{'' if i == 0 else chr(10)}{args.model} on {cl.name} ({cl.world_size} GPUs, "
              f"{cl.inter.key}): {len(ok)} of {len(df)} layouts fit")
        print_frame(ok.head(args.top), _columns(df, RANKED))
        if args.rejected:
            print()
            print_frame(df[~df.fits], _columns(df, ["dp", "tp", "pp", "reason"]))
        df.insert(0, "fabric", cl.inter.key)
        rows += df.to_dict("records")
    if args.json:
        write_json_rows(args.json, rows, key=("fabric", "dp", "tp", "pp", "cp", "ep"))
    return 0


def cmd_catalog(args) -> int:
    from labkit.perfmodel import catalog

    if args.name == "published":
        from labkit.perfmodel import published

        df = published.table()
        print(f"{df.attrs['title']}\ntraining runs priced at efficiency {df.attrs['efficiency']:g} "
              f"({df.attrs['efficiency_note']})\n")
        print_frame(df, ["run", "quantity", "predicted", "measured", "error_pct", "tolerance_pct",
                         "holds", "implied_efficiency"])
        for r in df.itertuples():
            print(f"\n{r.run}: {r.what}\n  model: {r.model}\n  missed: {r.missed}\n"
                  f"  source: {r.source}")
        return 0
    if args.name in catalog.CATALOGS:
        df = catalog.catalog_frame(args.name)
    else:
        df = catalog.load_reference(args.name)
        print(f"{df.attrs.get('title')}\nsource: {df.attrs.get('source')}\n")
    print_frame(df)
    return 0


def cmd_model_check(args) -> int:
    from labkit import results
    from labkit.errors import UsageError
    from labkit.perfmodel.modelcheck import model_check, overlap_from_ddp_rows, summary

    if args.fit and args.profile:
        raise UsageError("give --profile DIR or --fit, not both")
    coll = results.read_rows(args.collectives) if args.collectives else []
    pipe = results.read_rows(args.pipeline) if args.pipeline else []
    if args.ddp:
        frac, n = overlap_from_ddp_rows(results.read_rows(args.ddp))
        print(f"DP overlap with backward, measured by the DDP lab: {frac:.3f} (median of {n} "
              f"row(s) of {args.ddp}; use: labkit model --dp-overlap {frac:.3f})")
        if not (coll or pipe):
            return 0
    if not coll and not pipe:
        raise UsageError("give --collectives PATH and/or --pipeline PATH (or --ddp PATH)")
    if not (args.fit or args.profile):
        raise UsageError("give --profile DIR (a run's results folder with its machine profile, "
                         "measured there if absent; labkit calibrate) or --fit")
    prof = None
    if args.profile:
        from labkit import machine

        prof = machine.profile(args.profile)
    df = model_check(coll, pipe, profile=prof, fit=args.fit)
    print_frame(df, ["lab", "what", "world_size", "size_bytes", "num_microbatches", "quantity",
                     "measured", "model", "error_pct"])
    print("median |error| %: " + ", ".join(f"{k} {v:.1f}" for k, v in summary(df).items()))
    return 0
