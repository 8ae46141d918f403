"""The layout search: every DP x TP x PP = N of a cluster, each predicted by
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
           tp_across_nodes: bool = False, algorithm: str = "auto"):
    """Every DP × TP × PP = N; the feasible ones ranked by throughput, the others explained.

    For each (DP, TP, PP) the microbatch count with the highest throughput that fits in memory
    is kept. A layout is rejected, with the reason in ``reason``, when a TP group would leave
    its node (unless ``tp_across_nodes``), the layers do not split over PP, no M divides the
    batch, or no M fits in memory. Returns a DataFrame: feasible rows first (``rank`` 1, 2,
    ...), then rejected ones.
    """
    import pandas as pd

    n, g = cluster.world_size, cluster.gpus_per_node
    ms = sorted({positive_count("num_microbatches", m) for m in microbatches})
    rows = []
    for tp in _divisors(n):
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            base = {"dp": dp, "tp": tp, "pp": pp}
            probe = Layout(dp, tp, pp, placement=placement, tp_across_nodes=True)
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
            layouts = [Layout(dp, tp, pp, m, sched, v, placement, tp_across_nodes) for m in ms
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
