"""Figures of the 3-D parallelism model: the step breakdown per fabric, the layout search, and
the model against this machine's measurements. Each takes rows (a DataFrame) and returns a Figure.
"""

from __future__ import annotations

from . import new_figure

PARTS = [("compute_s", "compute", "#4c72b0"), ("bubble_s", "bubble", "#dd8452"),
         ("dp_comm_s", "DP all-reduce", "#55a868"), ("tp_comm_s", "TP all-reduce", "#c44e52"),
         ("pp_comm_s", "PP send/recv", "#8172b3")]


def _stacked(ax, labels, df, horizontal=False):
    left = [0.0] * len(df)
    for col, name, color in PARTS:
        vals = list(df[col].fillna(0.0))
        if horizontal:
            ax.barh(labels, vals, left=left, label=name, color=color)
        else:
            ax.bar(labels, vals, bottom=left, label=name, color=color)
        left = [a + b for a, b in zip(left, vals)]
    return left


def breakdown_plot(rows, label_col: str = "fabric", title: str = "Predicted step time"):
    """Stacked bars: compute, bubble, DP, TP and PP communication per row, efficiency on top."""
    fig, axes = new_figure(1, 1, width=6.0, height=3.8)
    ax = axes[0][0]
    labels = [str(x) for x in rows[label_col]]
    tops = _stacked(ax, labels, rows)
    for x, top, eff in zip(labels, tops, rows["scaling_efficiency"]):
        ax.annotate(f"{eff:.0%}", (x, top), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("seconds per step")
    ax.set_title(f"{title} (label: scaling efficiency = compute / step)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def fabric_sweep_plot(rows):
    """The same layout on each inter-node fabric (rows of :func:`labkit.model.fabric_sweep`)."""
    return breakdown_plot(rows, "fabric", "One layout, three fabrics")


def layout_search_plot(rows, top: int = 10):
    """Feasible layouts, best first, as stacked horizontal bars; the rejected ones counted."""
    ok = rows[rows.fits].head(top).iloc[::-1]
    fig, axes = new_figure(1, 1, width=7.0, height=0.45 * max(len(ok), 3) + 1.4)
    ax = axes[0][0]
    labels = [f"DP{r.dp} TP{r.tp} PP{r.pp} M{int(r.num_microbatches)}" for r in ok.itertuples()]
    tops = _stacked(ax, labels, ok, horizontal=True)
    for y, top, thr in zip(labels, tops, ok["samples_per_s"]):
        ax.annotate(f" {thr:.1f} samples/s", (top, y), va="center", fontsize=8)
    ax.set_xlabel("seconds per step")
    ax.set_xlim(0, max(tops + [1e-9]) * 1.3)
    n_bad = int((~rows.fits).sum())
    ax.set_title(f"{len(rows) - n_bad} of {len(rows)} layouts fit; {n_bad} rejected", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5)
    return fig


def calibration_plot(check):
    """Model against measurement (rows of :func:`labkit.calibrate.calibration_check`)."""
    kinds = [q for q in ("time_s", "bubble_fraction", "step_time_s") if q in set(check.quantity)]
    fig, axes = new_figure(len(kinds), 1, width=4.0, height=3.6)
    titles = {"time_s": "collectives: time (s)", "bubble_fraction": "pipeline: bubble fraction",
              "step_time_s": "pipeline: step time (s)"}
    for ax, q in zip(axes[0], kinds):
        part = check[check.quantity == q]
        ax.scatter(part.measured, part.model, s=18)
        lo, hi = min(part.measured.min(), part.model.min()), max(part.measured.max(), part.model.max())
        ax.plot([lo, hi], [lo, hi], color="gray", lw=1, ls="--", label="model = measured")
        if q == "time_s":
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel("measured")
        ax.set_ylabel("model")
        ax.set_title(titles[q], fontsize=10)
        ax.legend(fontsize=7)
    return fig
