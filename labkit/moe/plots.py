"""Figures of the expert-parallel lab. Each takes rows (and a machine profile) and returns a
matplotlib Figure; nothing here measures."""

from __future__ import annotations

from labkit.figures import new_figure


def expert_load(row, title: str | None = None):
    """Per expert, a bar of the (token, expert) pairs routed to it, the kept part solid and the
    dropped part hatched on top, coloured by the rank that holds it; the capacity summed over
    the sending ranks (each rank's pairs past its own share are dropped, so an expert can drop
    below the line) and the even share (P T k / E) as lines."""
    from labkit.moe.report import load_frame

    frame = load_frame(row)
    p, e = int(row["world_size"]), int(row["num_experts"])
    fig, axes = new_figure(width=max(4.0, 0.7 * e + 2.0))
    ax = axes[0][0]
    for _, r in frame.iterrows():
        c = f"C{int(r['rank'])}"
        ax.bar(r["expert"], r["kept"], color=c,
               label=f"kept, on rank {int(r['rank'])}" if r["expert"] % (e // p) == 0 else None)
        if r["dropped"]:
            ax.bar(r["expert"], r["dropped"], bottom=r["kept"], color="white", edgecolor=c,
                   hatch="//", label="dropped" if r["expert"] == frame["expert"][
                       frame["dropped"] > 0].iloc[0] else None)
    even = p * int(row["tokens_per_rank"]) * int(row["top_k"]) / e
    ax.axhline(int(row["capacity"]) * p, color="k", ls="--", lw=1,
               label=f"capacity, {p} x {int(row['capacity'])} (applied per sending rank)")
    ax.axhline(even, color="gray", ls=":", lw=1, label="even share P T k / E")
    ax.set_xticks(range(e))
    ax.set_xlabel("expert")
    ax.set_ylabel("(token, expert) pairs per step")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    ax.set_title(title or f"load per expert, {p} rank(s), top-{int(row['top_k'])}")
    return fig


def step_phases(df, prof, title: str | None = None):
    """Per world size, two stacked bars (ms): the measured step's four phases (the slowest
    rank's, p50) and the machine profile's model of them, hatched
    (:func:`labkit.moe.verdicts.context`)."""
    from labkit.moe.formulas import PHASES
    from labkit.moe.report import select
    from labkit.moe.verdicts import context

    rows = select(df)
    fig, axes = new_figure(width=max(4.5, 1.8 * len(rows) + 2.0))
    ax = axes[0][0]
    labels = []
    for i, (_, r) in enumerate(rows.iterrows()):
        x = 2.6 * i
        ctx = context(r, prof)
        low = high = 0.0
        for j, ph in enumerate(PHASES):
            got, want = r[f"{ph}_time_s"] * 1e3, ctx[ph] * 1e3
            ax.bar(x, got, bottom=low, color=f"C{j}", label=f"{ph}" if i == 0 else None)
            ax.bar(x + 1, want, bottom=high, color=f"C{j}", alpha=0.45, hatch="//")
            low, high = low + got, high + want
        ax.plot([x - 0.4, x + 0.4], [r["step_time_p50_s"] * 1e3] * 2, color="k", lw=1.5,
                label="measured step (p50)" if i == 0 else None)
        labels += [(x, f"P={int(r['world_size'])}\nmeasured"), (x + 1, "model")]
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels])
    ax.set_ylabel("ms per step (forward + backward)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    ax.set_title(title or "an MoE step's phases: measured | model (hatched)")
    return fig
