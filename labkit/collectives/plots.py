"""Figures of the collectives lab. Each takes rows (a DataFrame) and draws; none measures:
:func:`busbw_vs_size` (busbw, algbw and time per size, with the fitted α–β model)."""

from __future__ import annotations

import numpy as np

from labkit.figures import new_figure


def busbw_vs_size(df, *, show_model: bool = True):
    """Left: busbw (and algbw, dashed) vs size per (op, world_size), with the model's busbw
    (dotted, same colour). Right: time vs size, measured p10–p90 band and the α–β model."""
    from labkit.collectives.formulas import collective_time

    fig, axes = new_figure(2, width=5.2)
    ax_bw, ax_t = axes[0]
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
            t = collective_time(op=op, ranks=n, size_bytes=grid, alpha_s=a, beta_bytes_per_s=b)
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
