"""Figures of the collectives lab. Each takes rows (a DataFrame) and draws; none measures:
:func:`busbw_vs_size` (busbw, algbw and time per size, with the regime-aware model, the single
α–β line through every size, and the all-reduce timed while every core computes)."""

from __future__ import annotations

import numpy as np

from labkit.figures import new_figure


def busbw_vs_size(df, *, show_model: bool = True):
    """Left: busbw (and algbw, dashed) vs size per (op, world_size), with the model's busbw in
    the bandwidth regime (dotted, same colour). Right: time vs size, measured p50 with its p10–p90 band, the
    regime-aware model (solid: the α–β line in the bandwidth regime, flat at the floor below),
    the single line through every size (thin grey dashes) and, where measured, the all-reduce
    while every core computes (crosses)."""
    fig, axes = new_figure(2, width=5.2)
    ax_bw, ax_t = axes[0]
    for (op, n), part in df.groupby(["op", "world_size"], sort=False):
        part = part.sort_values("size_bytes")
        x = part.size_bytes.to_numpy(float)
        line, = ax_bw.plot(x, part.busbw_gb_per_s, "o-", ms=3, label=f"{op} N={n} busbw")
        c = line.get_color()
        ax_bw.plot(x, part.algbw_gb_per_s, "--", color=c, alpha=0.6, label=f"{op} N={n} algbw")
        ax_t.plot(x, part.time_p50_s * 1e6, "o", ms=3, color=c, label=f"{op} N={n} p50")
        ax_t.fill_between(x, part.time_p10_s * 1e6, part.time_p90_s * 1e6, color=c, alpha=0.15)
        busy = part.get("busy_time_p50_s")
        if busy is not None and busy.notna().any():
            ax_t.plot(x, busy.astype(float) * 1e6, "x", ms=5, color=c,
                      label=f"{op} N={n} while every core computes")
        if show_model and "model_time_s" in part and np.isfinite(part.model_time_s).any():
            a, b = float(part.alpha_s.iloc[0]), float(part.beta_gb_per_s.iloc[0])
            what = f"α={a * 1e6:.0f} µs, β={b:.2f} GB/s"
            band = part[part.regime == "bandwidth"]  # a floor has no bandwidth to draw
            if len(band):
                ax_bw.plot(band.size_bytes, band.model_busbw_gb_per_s, ":", color=c, lw=1.5,
                           label=f"{op} model ({what})")
            ax_t.plot(x, part.model_time_s * 1e6, "-", color=c, lw=1.2,
                      label=f"{op} model: line + floor")
            ax_t.plot(x, part.naive_time_s * 1e6, "--", color="grey", lw=0.8,
                      label=f"{op} one line through every size")
            if len(band):
                ax_t.axvline(float(band.size_bytes.min()), color=c, lw=0.6, ls=":")
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size S (bytes)")
        ax.grid(alpha=0.3, which="both")
    ax_t.set_yscale("log")
    ax_bw.set_ylabel("GB/s")
    ax_bw.set_title("busbw = S/t × factor(op, N)")
    ax_t.set_ylabel("time per call (µs), p10–p90 band")
    ax_t.set_title("time vs the model (dotted line: bandwidth regime starts)")
    ax_bw.legend(fontsize=6)
    ax_t.legend(fontsize=6)
    return fig
