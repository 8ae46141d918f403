"""Figures of the collectives lab. Each takes rows (a DataFrame) and draws; none measures:
:func:`busbw_vs_size` (busbw, algbw and time per size, with the regime-aware model, the single
α–β line through every size, and the all-reduce timed while every core computes).

A figure is as wide as the website's column (:data:`WIDTH_IN` at the 120 dpi figures are saved
at: 780 px), so it is shown at its own size and its smallest text, the legends' 8 pt, reads as
8 pt. Its legends name each colour once (an op) and each line style once (what is drawn), not
every (op, style) pair: a sweep of five ops stays a legend of about ten entries.
"""

from __future__ import annotations

import numpy as np

from labkit.figures import new_figure

#: a panel's width (in): the website's column, 780 px at 120 dpi
WIDTH_IN = 6.5
#: the legends' text (pt), the smallest of a figure
LEGEND_PT = 8
#: the panels :func:`busbw_vs_size` can draw, top to bottom
PANELS = ("busbw", "time")


def _series(df):
    """Per (op, world size): its rows by size and its colour (the same in every panel)."""
    out = []
    for k, ((op, n), part) in enumerate(df.groupby(["op", "world_size"], sort=False)):
        out.append((op, n, part.sort_values("size_bytes"), f"C{k % 10}"))
    return out


def _modelled(part) -> bool:
    return "model_time_s" in part and bool(np.isfinite(part.model_time_s.astype(float)).any())


def _op_handles(series, *, marker: str, linestyle: str, with_fit: bool):
    """One legend entry per (op, world size), in its colour; with the fitted α and β where
    ``with_fit`` and the row has them."""
    from matplotlib.lines import Line2D

    handles = []
    for op, n, part, c in series:
        label = f"{op} N={n}"
        if with_fit and _modelled(part) and np.isfinite(float(part.alpha_s.iloc[0])):
            label += (f" (α {float(part.alpha_s.iloc[0]) * 1e6:.0f} µs, "
                      f"β {float(part.beta_gb_per_s.iloc[0]):.2f} GB/s)")
        handles.append(Line2D([], [], color=c, marker=marker, ms=4, ls=linestyle, label=label))
    return handles


def _legend(ax, handles) -> None:
    """The legend under the panel, in two columns (constrained layout makes room for it)."""
    ax.legend(handles=handles, fontsize=LEGEND_PT, ncol=2, loc="upper center",
              bbox_to_anchor=(0.5, -0.2), frameon=False)


def _busbw_panel(ax, series, *, show_model: bool) -> None:
    """busbw (and algbw, dashed) vs size, with the model's busbw in the bandwidth regime
    (dotted, same colour)."""
    from matplotlib.lines import Line2D

    for op, n, part, c in series:
        x = part.size_bytes.to_numpy(float)
        ax.plot(x, part.busbw_gb_per_s, "o-", ms=3, color=c, label=f"{op} N={n} busbw")
        ax.plot(x, part.algbw_gb_per_s, "--", color=c, alpha=0.6, label=f"{op} N={n} algbw")
        band = part[part.regime == "bandwidth"] if "regime" in part else part.iloc[:0]
        if show_model and _modelled(part) and len(band):  # a floor has no bandwidth to draw
            ax.plot(band.size_bytes, band.model_busbw_gb_per_s, ":", color=c, lw=1.5,
                    label=f"{op} N={n} model busbw")
    ax.set_ylabel("GB/s")
    ax.set_title("busbw = S/t × factor(op, N)")
    styles = [Line2D([], [], color="0.2", marker="o", ms=3, label="busbw, measured"),
              Line2D([], [], color="0.2", ls="--", alpha=0.6, label="algbw = S/t")]
    if show_model:
        styles.append(Line2D([], [], color="0.2", ls=":", lw=1.5,
                             label="model busbw (bandwidth regime)"))
    _legend(ax, _op_handles(series, marker="o", linestyle="-", with_fit=show_model) + styles)


def _time_panel(ax, series, *, show_model: bool) -> None:
    """Time vs size: measured p50 with its p10–p90 band, the regime-aware model (solid: the
    α–β line in the bandwidth regime, flat at the floor below), the single line through every
    size (thin grey dashes), where the bandwidth regime starts (dotted vertical) and, where
    measured, the all-reduce while every core computes (crosses)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    busy_seen = regime_seen = False
    for op, n, part, c in series:
        x = part.size_bytes.to_numpy(float)
        ax.plot(x, part.time_p50_s * 1e6, "o", ms=3, color=c, label=f"{op} N={n} p50")
        ax.fill_between(x, part.time_p10_s * 1e6, part.time_p90_s * 1e6, color=c, alpha=0.15)
        busy = part.get("busy_time_p50_s")
        if busy is not None and busy.notna().any():
            busy_seen = True
            ax.plot(x, busy.astype(float) * 1e6, "x", ms=5, color=c,
                    label=f"{op} N={n} while every core computes")
        if show_model and _modelled(part):
            ax.plot(x, part.model_time_s * 1e6, "-", color=c, lw=1.2,
                    label=f"{op} N={n} model: line + floor")
            ax.plot(x, part.naive_time_s * 1e6, "--", color="grey", lw=0.8,
                    label=f"{op} N={n} one line through every size")
            band = part[part.regime == "bandwidth"]
            if len(band):
                regime_seen = True
                ax.axvline(float(band.size_bytes.min()), color=c, lw=0.6, ls=":")
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs)")
    ax.set_title("time per call against the model")
    styles = [Line2D([], [], color="0.2", marker="o", ms=3, ls="", label="p50, measured"),
              Patch(color="0.2", alpha=0.15, label="p10–p90 of the calls")]
    if busy_seen:
        styles.append(Line2D([], [], color="0.2", marker="x", ms=5, ls="",
                             label="p50 while every core computes"))
    if show_model:
        styles += [Line2D([], [], color="0.2", lw=1.2, label="model: floor, then α–β line"),
                   Line2D([], [], color="grey", ls="--", lw=0.8,
                          label="one α–β line through every size")]
    if regime_seen:
        styles.append(Line2D([], [], color="0.2", ls=":", lw=0.6,
                             label="bandwidth regime starts"))
    _legend(ax, _op_handles(series, marker="o", linestyle="", with_fit=False) + styles)


def busbw_vs_size(df, *, show_model: bool = True, panels=PANELS):
    """``panels`` of :data:`PANELS`, one above the other, each :data:`WIDTH_IN` wide with its
    legend under it: ``busbw``, busbw (and algbw, dashed) vs size per (op, world_size) with the
    model's busbw in the bandwidth regime (dotted, same colour) and each op's fitted α, β in
    the legend; ``time``, time vs size, measured p50 with its p10–p90 band, the regime-aware
    model (solid: the α–β line in the bandwidth regime, flat at the floor below), the single
    line through every size (thin grey dashes) and, where measured, the all-reduce while every
    core computes (crosses)."""
    panels = tuple(panels)
    unknown = [p for p in panels if p not in PANELS]
    if not panels or unknown:
        from labkit.errors import UsageError

        raise UsageError(f"panels must be some of {', '.join(PANELS)}, got {panels!r}")
    series = _series(df)
    legend_in = 0.25 * (1 + (len(series) + 6) // 2)  # two columns of entries under a panel
    fig, axes = new_figure(1, len(panels), width=WIDTH_IN, height=3.2 + legend_in)
    draw = {"busbw": _busbw_panel, "time": _time_panel}
    for ax, panel in zip((row[0] for row in axes), panels):
        draw[panel](ax, series, show_model=show_model)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size S (bytes)")
        ax.grid(alpha=0.3, which="both")
    return fig
