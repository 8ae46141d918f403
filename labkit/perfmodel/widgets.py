"""Layout explorer: pick a fabric, TP, PP and microbatches, watch the predicted step change.

``layout_explorer()`` returns a VBox: dropdowns for the model and the inter-node fabric, TP and
PP (DP follows as N / (TP·PP)), a microbatch slider, a readout (the formulas with this layout's
numbers, the memory verdict) and the stacked step-time bar. Every number comes from
:func:`labkit.perfmodel.model.predict`; an invalid layout shows its error instead of a bar. The figure is
drawn once when the explorer is built, so an executed notebook shows it without a kernel.
"""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.perfmodel.model import Cluster, Layout, Workload, predict


def readout(pred, cluster: Cluster) -> str:
    """The numbers beside the controls, as HTML.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> cl = Cluster.from_catalog("DGX_H100", 32)
    >>> p = predict(Workload(model_preset("Llama-3-70B")), cl, Layout(8, 8, 4, 32))
    >>> "bubble (P&minus;1)/(M+P&minus;1) = 3/35" in readout(p, cl)
    True
    >>> p = predict(Workload(model_preset("Mixtral-8x7B"), seq_len=2048), cl, Layout(256, 1, 1, 1, ep=8))
    >>> "EP 8: all-to-alls of 34 MB (ring, NVLink4)" in readout(p, cl)
    True
    """
    p = pred
    beyond = ""
    if p.ep > 1:
        beyond += (f"EP {p.ep}: all-to-alls of {p.ep_all_to_all_bytes / 1e6:.0f} MB "
                   f"({p.ep_algorithm}, {p.ep_link}) = {p.ep_comm_s:.3f} s<br>")
    if p.cp > 1:
        beyond += f"CP {p.cp}: K/V ring over {p.cp_link} = {p.cp_comm_s:.3f} s<br>"
    cp = f" &times; CP {p.cp}" if p.cp > 1 else ""
    return (f"DP {p.dp} &times; TP {p.tp} &times; PP {p.pp}{cp} = {p.world_size} GPUs, "
            f"{cluster.inter.key} between nodes; microbatch {p.microbatch_size:g} sequences<br>"
            f"compute {p.compute_s:.2f} s + bubble {p.bubble_s:.2f} s + DP {p.dp_comm_s:.3f} s + "
            f"TP {p.tp_comm_s:.3f} s + PP {p.pp_comm_s:.3f} s"
            + (f" + EP {p.ep_comm_s:.3f} s + CP {p.cp_comm_s:.3f} s" if beyond else "")
            + f" = <b>step {p.step_time_s:.2f} s</b><br>{beyond}"
            f"bubble (P&minus;1)/(M+P&minus;1) = {p.pp - 1}/{p.num_microbatches + p.pp - 1} = "
            f"{p.bubble_fraction:.1%}; efficiency {p.scaling_efficiency:.1%}; "
            f"{p.samples_per_s:.1f} samples/s; MFU {p.mfu:.1%}, HFU {p.hfu:.1%}<br>"
            f"DP all-reduce: {p.dp_algorithm}, {p.dp_ranks_per_node} rank(s) per node on "
            f"{p.dp_nodes} node(s) ({p.dp_link or 'none'}); placement {p.placement}<br>"
            f"memory: {'' if p.fits else '<b>OUT OF MEMORY</b> '}{p.verdict()}")


def layout_explorer(model: str = "Llama-3-70B", node: str = "DGX_H100", nodes: int = 32,
                    fabrics=("100GbE", "IB_HDR", "IB_NDR"), tp: int = 8, pp: int = 4,
                    num_microbatches: int = 32, global_batch_size: int = 256):
    """The explorer widget over ``nodes`` catalog nodes."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd
    from IPython.display import display

    from labkit.perfmodel.catalog import load_catalog, model_preset
    from labkit.perfmodel.plots import breakdown_plot

    g = Cluster.from_catalog(node, nodes).gpus_per_node
    n = g * nodes
    style = {"description_width": "initial"}
    m_dd = w.Dropdown(options=sorted(load_catalog("models")), value=model, description="model")
    f_dd = w.Dropdown(options=list(fabrics), value=fabrics[-1], description="fabric")
    tp_dd = w.Dropdown(options=[d for d in range(1, g + 1) if g % d == 0], value=tp, description="TP")
    pp_dd = w.Dropdown(options=[d for d in range(1, n + 1) if n % d == 0 and d <= 64], value=pp,
                       description="PP")
    m_sl = w.IntSlider(value=num_microbatches, min=1, max=128, description="microbatches M",
                       continuous_update=False, style=style)
    text = w.HTML()
    plot = w.Output()

    def redraw(_change=None):
        cl = Cluster.from_catalog(node, nodes, inter_fabric=f_dd.value)
        try:
            work = Workload(model_preset(m_dd.value), global_batch_size)
            lay = Layout(max(1, n // (tp_dd.value * pp_dd.value)), tp_dd.value, pp_dd.value, m_sl.value)
            pred = predict(work, cl, lay)
        except UsageError as e:
            text.value = f"<b>not a valid layout:</b> {e}"
            with plot:
                plot.clear_output()
            return
        text.value = readout(pred, cl)
        fig = breakdown_plot(pd.DataFrame([{"layout": f"DP{lay.dp} TP{lay.tp} PP{lay.pp}",
                                            **pred.row()}]), "layout", "Predicted step")
        with plot:
            plot.clear_output(wait=True)
            display(fig)
        plt.close(fig)

    for c in (m_dd, f_dd, tp_dd, pp_dd, m_sl):
        c.observe(redraw, names="value")
    redraw()
    from labkit.explorer import Live

    return Live(w.VBox([w.HBox([m_dd, f_dd]), w.HBox([tp_dd, pp_dd, m_sl]), text, plot]),
                page_explorer(model=model, node=node, nodes=nodes, fabrics=fabrics, tp=tp,
                              pp=pp, num_microbatches=num_microbatches,
                              global_batch_size=global_batch_size))


def page_explorer(model: str = "Llama-3-70B", node: str = "DGX_H100", nodes: int = 32,
                  fabrics=("100GbE", "IB_HDR", "IB_NDR"), tp: int = 8, pp: int = 4,
                  num_microbatches: int = 32, global_batch_size: int = 256) -> str:
    """The explorer for a page without a kernel (:mod:`labkit.explorer`): the same controls,
    microbatches in powers of two, PP up to 64."""
    from functools import lru_cache

    from labkit.explorer import Control, page_html
    from labkit.perfmodel.catalog import load_catalog, model_preset

    g = Cluster.from_catalog(node, nodes).gpus_per_node
    n = g * nodes
    cluster = lru_cache(maxsize=None)(
        lambda fabric: Cluster.from_catalog(node, nodes, inter_fabric=fabric))
    work = lru_cache(maxsize=None)(lambda m: Workload(model_preset(m), global_batch_size))

    def text(model, fabric, tp, pp, num_microbatches):
        cl = cluster(fabric)
        lay = Layout(max(1, n // (tp * pp)), tp, pp, num_microbatches)
        return readout(predict(work(model), cl, lay), cl)

    return page_html(
        [Control("model", "model", tuple(sorted(load_catalog("models"))), model),
         Control("fabric", "fabric", tuple(fabrics), fabrics[-1]),
         Control("tp", "TP", tuple(d for d in range(1, g + 1) if g % d == 0), tp),
         Control("pp", "PP", tuple(d for d in range(1, n + 1) if n % d == 0 and d <= 64), pp),
         Control("num_microbatches", "microbatches M", tuple(2 ** k for k in range(8)),
                 num_microbatches)],
        text, title=f"Layout explorer ({nodes} {node} nodes, {n} GPUs)",
        note="The bar chart of the step needs Python: run the notebook in JupyterLab to see "
             "it for each layout.")
