"""Figures of the 3-D parallelism model: the step breakdown per fabric, the layout search, the
model against this machine's measurements and against mlsysim. Each takes rows (a DataFrame)
and returns a Figure. A layout that does not fit in memory is drawn hatched and labelled OOM.
"""

from __future__ import annotations

from labkit.figures import new_figure

PARTS = [("compute_s", "compute", "#4c72b0"), ("bubble_s", "bubble", "#dd8452"),
         ("dp_comm_s", "DP all-reduce", "#55a868"), ("tp_comm_s", "TP all-reduce", "#c44e52"),
         ("pp_comm_s", "PP send/recv", "#8172b3"), ("ep_comm_s", "EP all-to-all", "#937860"),
         ("cp_comm_s", "CP K/V ring", "#da8bc3")]


def _legend(df):
    """The parts the rows have; EP and CP only where some row pays them."""
    from matplotlib.patches import Patch

    return [Patch(color=color, label=name) for col, name, color in PARTS
            if col in df and (col not in ("ep_comm_s", "cp_comm_s") or (df[col] > 0).any())]


def _stacked(ax, labels, df, horizontal=False):
    left = [0.0] * len(df)
    fits = list(df["fits"]) if "fits" in df else [True] * len(df)
    hatch = ["" if f else "//" for f in fits]
    for col, name, color in PARTS:
        if col not in df:  # rows of a 3-D prediction made elsewhere: no EP or CP term
            continue
        vals = list(df[col].fillna(0.0))
        if horizontal:
            bars = ax.barh(labels, vals, left=left, label=name, color=color)
        else:
            bars = ax.bar(labels, vals, bottom=left, label=name, color=color)
        for bar, h in zip(bars, hatch):
            bar.set_hatch(h)
        left = [a + b for a, b in zip(left, vals)]
    return left


#: the value axis past the tallest bar, as a share of it: room for the two-line label above it
#: (without it the axis ends at the tallest bar and its label runs into the title)
HEADROOM = 0.22


def breakdown_plot(rows, label_col: str = "fabric", title: str = "Predicted step time"):
    """Stacked bars: compute, bubble, DP, TP, PP, EP and CP communication per row, the step
    time and the efficiency (or OOM) above each. The value axis is set from the rows, so the
    tallest bar (pure DP on a slow fabric, say) and its label stay inside it."""
    fig, axes = new_figure(1, 1, width=6.0, height=3.8)
    ax = axes[0][0]
    labels = [str(x) for x in rows[label_col]]
    tops = _stacked(ax, labels, rows)
    fits = list(rows["fits"]) if "fits" in rows else [True] * len(rows)
    for x, top, eff, ok in zip(labels, tops, rows["scaling_efficiency"], fits):
        ax.annotate(f"{top:.3g} s\n{eff:.0%}" if ok else f"{top:.3g} s\nOOM", (x, top),
                    ha="center", va="bottom", fontsize=9, color="black" if ok else "#c44e52")
    ax.set_ylim(0, max(tops + [1e-9]) * (1 + HEADROOM))
    ax.set_ylabel("seconds per step")
    oom = "; hatched: out of memory" if not all(fits) else ""
    ax.set_title(f"{title}\n(label: step time, efficiency = compute / step{oom})",
                 fontsize=10)
    ax.legend(handles=_legend(rows), fontsize=8, loc="lower right")
    return fig


def fabric_sweep_plot(rows):
    """The same layout on each inter-node fabric (rows of :func:`labkit.perfmodel.layouts.fabric_sweep`)."""
    return breakdown_plot(rows, "fabric", "One layout, three fabrics")


def layout_search_plot(rows, top: int = 10):
    """Feasible layouts, best first, as stacked horizontal bars; the rejected ones counted."""
    ok = rows[rows.fits].head(top).iloc[::-1]
    fig, axes = new_figure(1, 1, width=7.0, height=0.45 * max(len(ok), 3) + 1.4)
    ax = axes[0][0]
    labels = [f"DP{r.dp} TP{r.tp} PP{r.pp}" + "".join(f" {d.upper()}{getattr(r, d)}"
                                                      for d in ("cp", "ep") if getattr(r, d, 1) > 1)
              + f" M{int(r.num_microbatches)}" for r in ok.itertuples()]
    tops = _stacked(ax, labels, ok, horizontal=True)
    for y, top, thr in zip(labels, tops, ok["samples_per_s"]):
        ax.annotate(f" {thr:.1f} samples/s", (top, y), va="center", fontsize=8)
    ax.set_xlabel("seconds per step")
    ax.set_xlim(0, max(tops + [1e-9]) * 1.3)
    n_bad = int((~rows.fits).sum())
    ax.set_title(f"{len(rows) - n_bad} of {len(rows)} layouts fit; {n_bad} rejected", fontsize=10)
    handles = _legend(ok)
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18),
              ncol=len(handles))  # one row: a second one would run into the axis label
    return fig


def mlsysim_plot(side):
    """Step-time terms of both engines per scenario (rows of
    :func:`labkit.perfmodel.mlsysim_engine.side_by_side`): labkit left, mlsysim right."""
    terms = [("compute_s", "compute"), ("bubble_s", "bubble"), ("dp_comm_s", "DP"),
             ("tp_comm_s", "TP"), ("pp_comm_s", "PP")]
    colors = {t: c for (t, _, c) in PARTS}
    names = list(dict.fromkeys(side.scenario))
    fig, axes = new_figure(1, 1, width=8.0, height=0.42 * len(names) + 2.0)
    ax = axes[0][0]
    for j, engine in enumerate(("labkit", "mlsysim")):
        left = [0.0] * len(names)
        ys = [i + (-0.2 if j == 0 else 0.2) for i in range(len(names))]  # y grows downwards
        for term, label in terms:
            vals = [float(side[(side.scenario == n) & (side.term == term)][engine].iloc[0])
                    for n in names]
            ax.barh(ys, vals, height=0.38, left=left, color=colors[term],
                    label=label if j == 0 else None, hatch="" if j == 0 else "..")
            left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (upper bar: labkit; lower, dotted: mlsysim 0.3.0)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=5)
    ax.set_title("The same scenarios through both engines (mlsysim: compute, not its replica "
                 "time)", fontsize=10)
    return fig
