"""Figures of the collectives and pipeline lab. Each takes rows (DataFrames) and draws; none
measures. ``busbw_vs_size`` (with the fitted α–β model), ``bubble_vs_microbatches`` (measured vs
formula, and busy time per microbatch), ``schedule_diagram`` (ranks × time, F and B blocks).
"""

from __future__ import annotations

import numpy as np

from . import new_figure

_KIND_COLOR = {"F": "#4C72B0", "B": "#DD8452"}


def busbw_vs_size(df, *, show_model: bool = True):
    """Left: busbw (and algbw, dashed) vs size per (op, world_size), with the model's busbw
    (dotted, same colour). Right: time vs size, measured p10–p90 band and the α–β model."""
    from ..comm import collective_time

    fig, (ax_bw, ax_t) = _two(fig_width=5.2)
    for (op, n), part in df.groupby(["op", "world_size"], sort=False):
        part = part.sort_values("size_bytes")
        x = part.size_bytes.to_numpy(float)
        line, = ax_bw.plot(x, part.busbw_gb_per_s, "o-", ms=3, label=f"{op} N={n} busbw")
        ax_bw.plot(x, part.algbw_gb_per_s, "--", color=line.get_color(), alpha=0.6,
                   label=f"{op} N={n} algbw")
        ax_t.plot(x, part.time_p50_s * 1e6, "o", ms=3, color=line.get_color(), label=f"{op} N={n}")
        ax_t.fill_between(x, part.time_p10_s * 1e6, part.time_p90_s * 1e6,
                          color=line.get_color(), alpha=0.15)
        alpha, beta = part.get("alpha_s"), part.get("beta_gb_per_s")
        if show_model and alpha is not None and np.isfinite(beta.iloc[0]):
            a, b = float(alpha.iloc[0]), float(beta.iloc[0]) * 1e9
            grid = np.geomspace(x.min(), x.max(), 100)
            t = collective_time(op, n, grid, a, b)
            f = part.busbw_gb_per_s.iloc[0] / part.algbw_gb_per_s.iloc[0]
            ax_bw.plot(grid, grid / t / 1e9 * f, ":", color=line.get_color(), lw=1.5,
                       label=f"{op} model: α={a * 1e6:.0f} µs, β={b / 1e9:.2f} GB/s")
            ax_t.plot(grid, t * 1e6, ":", color=line.get_color(), lw=1.5)
            cross = float(part.crossover_bytes.iloc[0])
            if x.min() <= cross <= x.max():
                ax_t.axvline(cross, color="grey", lw=0.8)
                ax_t.annotate("bandwidth\ndominates →", (cross, ax_t.get_ylim()[1]), fontsize=7,
                              va="top", ha="left")
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size S (bytes)")
        ax.grid(alpha=0.3, which="both")
    ax_t.set_yscale("log")
    ax_bw.set_ylabel("GB/s")
    ax_bw.set_title("busbw = S/t × factor(op, N)")
    ax_t.set_ylabel("time per call (µs), p10–p90 band")
    ax_t.set_title("time vs the α–β model")
    ax_bw.legend(fontsize=7)
    return fig


def _two(fig_width: float = 5.0):
    fig, axes = new_figure(2, width=fig_width)
    return fig, (axes[0][0], axes[0][1])


def bubble_vs_microbatches(df):
    """Left: measured bubble per schedule vs M, with (P−1)/(P−1+M). Right: the microbatch lever's
    cost on this machine: busy time per microbatch (F+B, one stage) and step time vs M."""
    from ..bubbles import bubble_fraction

    fig, (ax_b, ax_c) = _two()
    for (s, p), part in df.groupby(["schedule", "num_stages"], sort=False):
        part = part.sort_values("num_microbatches")
        m = part.num_microbatches
        line, = ax_b.plot(m, part.bubble_measured, "o-", label=f"{s} P={p} measured")
        ax_c.plot(m, part.busy_per_microbatch_s * 1e3 * m, "o-", color=line.get_color(),
                  label=f"{s} P={p}: busy per stage per step")
        ax_c.plot(m, part.step_time_s * 1e3, "s--", color=line.get_color(), alpha=0.6,
                  label=f"{s} P={p}: step time")
    for p in sorted(df.num_stages.unique()):
        grid = np.arange(1, max(df.num_microbatches.max(), 2) + 1)
        ax_b.plot(grid, [bubble_fraction(p, int(g)) for g in grid], "k:",
                  label=f"(P−1)/(P−1+M), P={p}")
    if "interleaved" in set(df.schedule):
        for r in df[df.schedule == "interleaved"].itertuples():
            ax_b.plot(r.num_microbatches, r.bubble_formula, "kx")
    ax_b.set(xlabel="microbatches M", ylabel="bubble fraction", ylim=(0, 1),
             title="bubble = 1 − Σ busy / (P × step)")
    ax_c.set(xlabel="microbatches M", ylabel="ms", title="the microbatch lever's cost here")
    for ax in (ax_b, ax_c):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if df.get("oversubscribed") is not None and df.oversubscribed.any():
        fig.suptitle("oversubscribed: ranks share cores, idle time is not only the bubble",
                     fontsize=9, color="firebrick")
    return fig


def schedule_diagram(blocks, *, title: str = "", ax=None, time_unit: str = "ms"):
    """Ranks × time: one bar per forward (blue) or backward (orange) of a microbatch, labelled
    with its microbatch number (and chunk for interleaved). ``blocks``: a DataFrame or a list of
    dicts with rank, stage, kind, microbatch, start_s, end_s (measured or :func:`simulate`)."""
    import pandas as pd

    b = pd.DataFrame(blocks)
    scale = {"ms": 1e3, "s": 1.0, "slot": 1.0}[time_unit]
    if ax is None:
        fig, axes = new_figure(1, width=9.0, height=0.6 + 0.55 * b["rank"].nunique())
        ax = axes[0][0]
    else:
        fig = ax.figure
    ranks = sorted(b["rank"].unique())
    chunked = b.stage.nunique() > len(ranks)
    for r in b.itertuples():
        x0, w = r.start_s * scale, (r.end_s - r.start_s) * scale
        ax.broken_barh([(x0, w)], (r.rank - 0.4, 0.8), facecolors=_KIND_COLOR[r.kind],
                       edgecolor="white", linewidth=0.5,
                       alpha=1.0 if not chunked or r.stage < len(ranks) else 0.65)
        label = f"{r.microbatch}" + (f"/{r.stage // len(ranks)}" if chunked else "")
        ax.text(x0 + w / 2, r.rank, label, ha="center", va="center", fontsize=7, color="white",
                clip_on=True)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel({"ms": "time since the step started (ms)", "s": "time (s)",
                   "slot": "time (forward = 1 slot)"}[time_unit])
    ax.legend(handles=[_patch("F", "forward"), _patch("B", "backward")], fontsize=7,
              loc="lower right")
    ax.set_title(title or "schedule: forward and backward of each microbatch per rank")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _patch(kind: str, label: str):
    from matplotlib.patches import Patch

    return Patch(color=_KIND_COLOR[kind], label=label)
