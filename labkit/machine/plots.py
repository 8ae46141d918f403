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


def roofline_plot(roof, *, matmul=(), points=(), title: str | None = None):
    """The roofline of ``roof`` (a :class:`~labkit.machine.roofline.Roofline`) on log-log
    axes: ``min(peak, bandwidth x intensity)`` with the ridge point marked; ``matmul``: the
    profile's (n, FLOP/s) products at their intensity
    (:func:`~labkit.machine.roofline.matmul_intensity`); ``points``: (label, FLOP/s) rates of
    unknown intensity, drawn as horizontal lines (a training step's model FLOPs per second)."""
    import numpy as np

    from labkit.figures import new_figure
    from labkit.machine.roofline import matmul_intensity

    ridge = roof.ridge_flop_per_byte
    xs = [matmul_intensity(n) for n, _ in matmul]
    lo, hi = min([ridge / 100, *xs]) / 2, max([ridge * 100, *xs]) * 2
    x = np.geomspace(lo, hi, 200)
    fig, axes = new_figure(width=5.6, height=3.8)
    ax = axes[0][0]
    ax.loglog(x, [roof.attainable_flop_per_s(i) / 1e9 for i in x], color="k",
              label="roof: min(peak, bandwidth x intensity)")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    # the ridge's label runs up the foot of its line, below the roof where the products sit
    ax.text(ridge, 0.03, f"ridge: {ridge:.2g} FLOP/byte ", transform=ax.get_xaxis_transform(),
            rotation=90, ha="right", va="bottom", fontsize=7)
    if matmul:
        ax.plot(xs, [r / 1e9 for _, r in matmul], "o", color="C0",
                label="n x n products measured (profile)")
        # below and above their points in turn: neighbours a factor 2 apart in intensity
        # sit close on a wide axis
        for k, ((n, r), xi) in enumerate(zip(matmul, xs)):
            ax.annotate(f"n={n}", (xi, r / 1e9), xytext=(4, -10 if k % 2 == 0 else 4),
                        textcoords="offset points", fontsize=7)
    for i, (label, rate) in enumerate(points):
        ax.axhline(rate / 1e9, color=f"C{i + 1}", ls="--", lw=1, label=label)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of memory traffic)")
    ax.set_ylabel("GFLOP/s (one rank)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "roofline of one rank, measured")
    return fig
