"""Figures of the checks (notebook 01). Each takes rows (a DataFrame) and returns a Figure."""

from __future__ import annotations

from labkit.figures import new_figure


def launch_cost_plot(df):
    """Placement rows: the launch wall time per world size beside one timed all-reduce."""
    fig, axes = new_figure(2)
    left, right = axes[0]
    per = df.groupby("world_size").first().reset_index()
    left.bar(per.world_size.astype(str), per.launch_wall_time_s, color="C1")
    left.set(xlabel="world_size", ylabel="seconds", title="One launch (torchrun, import torch, join)")
    right.bar(per.world_size.astype(str), per.allreduce_time_p50_s * 1e3, color="C0")
    size = int(per.allreduce_bytes.iloc[0]) if "allreduce_bytes" in per else 0
    right.set(xlabel="world_size", ylabel="milliseconds",
              title=f"One all-reduce of {size:,} bytes (p50)")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="y")
    return fig
