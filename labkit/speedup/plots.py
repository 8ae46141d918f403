"""Figures of notebook 02: speedup, efficiency and cost, Karp-Flatt, Amdahl against Gustafson.

Every function takes rows (a DataFrame with a ``source`` column naming each curve, as built from
:func:`labkit.metrics.speedup_table`) and returns a Figure. Nothing here measures.
"""

from __future__ import annotations

import numpy as np

from labkit.figures import new_figure
from labkit.metrics import amdahl_speedup, gustafson_speedup, knee


def _by_source(df):
    if "source" not in df.columns:
        return [("measured", df.sort_values("world_size"))]
    return [(s, part.sort_values("world_size")) for s, part in df.groupby("source", sort=False)]


def speedup_plot(df, *, title: str = "Strong scaling: speedup s = t1 / tN"):
    """Measured speedup per source, the perfect-scaling line s = N and each source's Amdahl fit."""
    fig, axes = new_figure()
    ax = axes[0, 0]
    n_max = int(df.world_size.max())
    ax.plot([1, n_max], [1, n_max], "k--", lw=1, label="perfect scaling s = N")
    for source, part in _by_source(df):
        line, = ax.plot(part.world_size, part.speedup, "o-", label=f"{source} measured")
        if "amdahl_speedup" in part and part.amdahl_speedup.notna().all():
            ax.plot(part.world_size, part.amdahl_speedup, ":", color=line.get_color(),
                    label=f"{source} Amdahl fit")
    ax.set_xlabel("N (ranks / GPUs)")
    ax.set_ylabel("speedup")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def efficiency_cost_plot(df, *, threshold: float = 0.5):
    """Left: efficiency E = s/N with the threshold and each source's knee. Right: relative SU N/s."""
    fig, axes = new_figure(2)
    left, right = axes[0]
    left.axhline(threshold, color="k", ls="--", lw=1, label=f"threshold E = {threshold:g}")
    for source, part in _by_source(df):
        line, = left.plot(part.world_size, part.efficiency, "o-", label=source)
        k = knee(part.world_size, part.efficiency, threshold)
        e_k = float(part.loc[part.world_size == k, "efficiency"].iloc[0])
        left.plot([k], [e_k], "s", ms=12, mfc="none", color=line.get_color())
        left.annotate(f"knee N={k}", (k, e_k), textcoords="offset points", xytext=(6, 6), fontsize=8)
        right.plot(part.world_size, part.relative_su, "o-", label=source)
    right.axhline(1, color="k", ls="--", lw=1, label="perfect scaling (N/s = 1)")
    left.set(xlabel="N", ylabel="efficiency E = s / N", title="Efficiency", ylim=(0, 1.1))
    right.set(xlabel="N", ylabel="relative SU = N / s", title="Cost against one rank")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def karp_flatt_plot(df):
    """Karp-Flatt serial fraction e(N) = (1/s - 1/N) / (1 - 1/N) per source (N > 1)."""
    fig, axes = new_figure()
    ax = axes[0, 0]
    for source, part in _by_source(df):
        part = part[part.world_size > 1]
        ax.plot(part.world_size, part.karp_flatt, "o-", label=source)
    ax.set(xlabel="N", ylabel="experimental serial fraction e",
           title="Karp-Flatt: flat e = fixed serial part, rising e = overhead grows with N")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def laws_plot(serial_fraction: float, max_world_size: int = 64, *, measured=None, mark: int | None = None):
    """Amdahl s = 1/(f + (1-f)/N) and Gustafson s = N - f(N-1) for one f, with optional points."""
    fig, axes = new_figure(width=5.5, height=3.8)
    ax = axes[0, 0]
    ns = np.arange(1, max_world_size + 1)
    f = serial_fraction
    ax.plot(ns, ns, "k--", lw=1, label="perfect scaling")
    ax.plot(ns, [amdahl_speedup(f, int(n)) for n in ns], label=f"Amdahl, f = {f:.3f} (fixed work)")
    ax.plot(ns, [gustafson_speedup(f, int(n)) for n in ns], label=f"Gustafson, f = {f:.3f} (work grows with N)")
    if f > 0:
        ax.axhline(1 / f, color="C0", ls=":", lw=1, label=f"Amdahl ceiling 1/f = {1 / f:.1f}")
    if measured is not None:
        for source, part in _by_source(measured):
            part = part[part.world_size <= max_world_size]
            ax.plot(part.world_size, part.speedup, "o", label=f"{source} measured")
    if mark:
        ax.axvline(mark, color="grey", lw=0.8)
    ax.set(xlabel="N", ylabel="speedup", xlim=(1, max_world_size),
           ylim=(0, max(2.0, min(max_world_size, 1.15 * gustafson_speedup(f, max_world_size)))))
    ax.set_title("Amdahl vs Gustafson")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return fig

