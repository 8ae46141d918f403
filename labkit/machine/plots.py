"""The profile in two panels: all-reduce and message time against size (idle and busy), and
the matrix-product rate against n (alone and together)."""

from __future__ import annotations


def profile_plot(prof):
    """A figure of ``prof`` (a :class:`~labkit.machine.profile.Profile`)."""
    from labkit.figures import new_figure

    df = prof.table()
    fig, axes = new_figure(2, width=5.0, height=3.8)
    a, b = axes[0]
    for (what, ctx), part in df[df.measurement.isin(["allreduce", "message"])].groupby(
            ["measurement", "context"]):
        part = part.sort_values("size_bytes")
        a.loglog(part.size_bytes, part.time_p50_s * 1e3, marker="o",
                 linestyle="-" if ctx == "idle" else "--", label=f"{what}, {ctx}")
    a.set_xlabel("bytes")
    a.set_ylabel("time (ms, p50)")
    a.set_title("messages: peers idle or their cores busy")
    a.legend(fontsize=8)
    for ctx, part in df[df.measurement == "matmul"].groupby("context"):
        part = part.sort_values("n")
        b.semilogx(part.n, part.flop_per_s / 1e9, marker="o", label=ctx)
    b.set_xlabel("n (n x n matrix product)")
    b.set_ylabel("GFLOP/s per rank")
    b.set_title(f"compute: alone or {prof.world_size} ranks at once")
    b.legend(fontsize=8)
    return fig
