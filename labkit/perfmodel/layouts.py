"""The layout search: every DP x TP x PP (x CP x EP) = N of a cluster, each predicted by
:func:`labkit.perfmodel.model.predict`, the feasible ones ranked and the others explained; and
one layout across inter-node fabrics."""

from __future__ import annotations

from labkit.metrics import positive_count
from labkit.perfmodel import topology
from labkit.perfmodel.model import Cluster, Layout, Workload, division_problem, predict
from labkit.pipeline.formulas import interleavable


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search(work: Workload, cluster: Cluster, microbatches=(1, 2, 4, 8, 16, 32, 64),
           schedule: str = "1f1b", *, placement: str = topology.MEGATRON,
           tp_across_nodes: bool = False, algorithm: str = "auto", cp_sizes=(1,),
           ep_sizes=(1,)):
    """Every DP × TP × PP × CP = N, with EP of the DP ranks per expert group; the feasible ones
    ranked by throughput, the others explained. ``cp_sizes`` and ``ep_sizes`` are the CP and
    EP sizes tried (both 1 by default: the 3-D search); a size is skipped where it cannot
    apply: CP must divide N / (TP·PP) and the sequence, EP must divide DP and the model's
    experts (a dense model has EP 1 only). Mixtral 8x7B at 2048 tokens on 4 DGX H100 with
    EP 1, 2, 4 or 8 and CP 1 or 2: the fastest layout shards the experts.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> df = search(Workload(model_preset("Mixtral-8x7B"), seq_len=2048),
    ...             Cluster.from_catalog("DGX_H100", 4), cp_sizes=(1, 2), ep_sizes=(1, 2, 4, 8))
    >>> int(df.iloc[0].ep) > 1, sorted(set(df.cp)), sorted(set(df.ep))
    (True, [1, 2], [1, 2, 4, 8])

    For each (DP, TP, PP) the microbatch count with the highest throughput that fits in memory
    is kept. A layout is rejected, with the reason in ``reason``, when a TP group would leave
    its node (unless ``tp_across_nodes``), the layers do not split over PP, no M divides the
    batch, or no M fits in memory. Returns a DataFrame: feasible rows first (``rank`` 1, 2,
    ...), then rejected ones.
    """
    import pandas as pd

    n, g = cluster.world_size, cluster.gpus_per_node
    ms = sorted({positive_count("num_microbatches", m) for m in microbatches})
    cps = sorted({positive_count("cp", c) for c in cp_sizes})
    eps = sorted({positive_count("ep", e) for e in ep_sizes})
    mdl = work.model
    rows = []
    dims = [(t, p, c) for t in _divisors(n) for p in _divisors(n // t) for c in cps
            if (n // (t * p)) % c == 0 and work.seq_len % c == 0]
    for tp, pp, cp in dims:
        dp = n // (tp * pp * cp)
        for ep in [e for e in eps if dp % e == 0
                   and (e == 1 or mdl.is_moe and mdl.num_experts % e == 0)]:
            base = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}
            probe = Layout(dp, tp, pp, placement=placement, tp_across_nodes=True, cp=cp, ep=ep)
            if not tp_across_nodes and not probe.shape("tp", g).inside_one_node:
                why = (f"does not divide {g} GPUs per node" if g % tp
                       else f"spans nodes with placement {probe.placement}")
                rows.append({**base, "fits": False, "reason": f"TP={tp} {why} (TP would cross nodes)"})
                continue
            if work.model.num_layers % pp:
                rows.append({**base, "fits": False, "reason": f"{work.model.num_layers} layers "
                             f"do not split evenly over PP={pp} stages"})
                continue
            v = 2 if schedule == "interleaved" and work.model.num_layers % (2 * pp) == 0 else 1
            sched = schedule if v > 1 or schedule != "interleaved" else "1f1b"
            # an interleaved search keeps its M where it falls back to 1f1b (V = 1)
            layouts = [Layout(dp, tp, pp, m, sched, v, placement, tp_across_nodes, cp, ep)
                       for m in ms
                       if schedule != "interleaved"
                       or interleavable(num_stages=pp, num_microbatches=m)]
            preds = [predict(work, cluster, lay, algorithm=algorithm) for lay in layouts
                     if not division_problem(work, lay)]
            if not preds:
                rows.append({**base, "fits": False, "reason": f"global batch {work.global_batch_size}"
                             f" is not divisible by DP={dp} x M for any M in {ms}"})
                continue
            fitting = [p for p in preds if p.fits]
            if fitting:
                best = max(fitting, key=lambda p: (p.samples_per_s, -p.num_microbatches))
                rows.append({**best.row(), "reason": best.verdict()})
            else:
                least = min(preds, key=lambda p: p.memory["total"])
                rows.append({**least.row(), "reason": f"{least.verdict()} at best (M={least.num_microbatches})"})
    df = pd.DataFrame(rows)
    df["fits"] = df["fits"].astype(bool)
    ok = df[df.fits]
    if len(ok):  # (no layout predicted at all: no samples_per_s to sort by)
        ok = ok.sort_values("samples_per_s", ascending=False)
    ok.insert(0, "rank", range(1, len(ok) + 1))
    out = pd.concat([ok, df[~df.fits]], ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out


def fabric_sweep(work: Workload, layout: Layout, fabrics, node: str = "DGX_H100", nodes: int = 32):
    """The same layout on each inter-node fabric: one predicted row per fabric key."""
    import pandas as pd

    rows = []
    for key in fabrics:
        cl = Cluster.from_catalog(node, nodes, inter_fabric=key)
        p = predict(work, cl, layout)
        rows.append({"fabric": key, "bandwidth_gb_per_s": cl.inter.bandwidth_gb_per_s,
                     "latency_us": cl.inter.latency_us, **p.row()})
    return pd.DataFrame(rows)


def _name(r) -> str:
    return (f"DP {r.dp} x TP {r.tp} x PP {r.pp} x CP {r.cp} (EP {r.ep}), "
            f"M = {int(r.num_microbatches)}")


def beyond_3d(found) -> str:
    """What a search over CP and EP (:func:`search`) found beyond 3-D: its fastest layout that
    fits, with its EP and CP terms, beside the fastest that fits with CP = EP = 1.

    >>> import pandas as pd
    >>> rows = pd.DataFrame([dict(dp=4, tp=2, pp=8, cp=4, ep=1, num_microbatches=64, fits=True,
    ...                           samples_per_s=32.6, step_time_s=7.85, ep_comm_s=0.0,
    ...                           cp_comm_s=0.35),
    ...                      dict(dp=16, tp=8, pp=2, cp=1, ep=1, num_microbatches=16, fits=True,
    ...                           samples_per_s=30.9, step_time_s=8.28, ep_comm_s=0.0,
    ...                           cp_comm_s=0.0)])
    >>> print(beyond_3d(rows))
    fastest that fits: DP 4 x TP 2 x PP 8 x CP 4 (EP 1), M = 64, 32.6 samples/s (of its 7.85 s step, EP all-to-alls 0 s, CP K/V ring 0.35 s); fastest with CP = EP = 1: DP 16 x TP 8 x PP 2 x CP 1 (EP 1), M = 16, 30.9 samples/s: 1.06x for the layout found beyond 3-D.
    """
    ok = found[found.fits]
    if ok.empty:
        return "no layout fits in memory, with or without CP and EP."
    best = ok.iloc[0]
    head = (f"fastest that fits: {_name(best)}, {best.samples_per_s:.3g} samples/s (of its "
            f"{best.step_time_s:.3g} s step, EP all-to-alls {best.ep_comm_s:.3g} s, CP K/V ring "
            f"{best.cp_comm_s:.3g} s)")
    flat = ok[(ok.cp == 1) & (ok.ep == 1)]
    if flat.empty:
        return head + "; none fits with CP = EP = 1."
    three = flat.iloc[0]
    if best.cp == 1 and best.ep == 1:
        return head + ": CP = EP = 1, the 3-D search's answer."
    return (head + f"; fastest with CP = EP = 1: {_name(three)}, {three.samples_per_s:.3g} "
            f"samples/s: {best.samples_per_s / three.samples_per_s:.3g}x for the layout found "
            "beyond 3-D.")
