"""Figures of the context-parallel lab. Each takes rows and returns a matplotlib Figure;
nothing here measures."""

from __future__ import annotations

from labkit.figures import new_figure


def rank_compute(df, world_size: int, title: str | None = None):
    """Per variant at ``world_size`` ranks, one bar per rank: its share of the pass alone (ms,
    :func:`labkit.cp.verdicts.shares`), the score blocks it computes written above: the causal
    split's imbalance, the balanced split's evenness."""
    from labkit.cp.report import select
    from labkit.cp.verdicts import shares

    rows = select(df, world_size=world_size)
    fig, axes = new_figure(width=max(4.5, 1.4 * len(rows) * world_size / 2 + 1.5))
    ax = axes[0][0]
    ticks = []
    for i, (_, r) in enumerate(rows.iterrows()):
        for k, (t, n) in enumerate(zip(shares(r), r["blocks_per_rank"])):
            x = i * (world_size + 1) + k
            ax.bar(x, t * 1e3, color=f"C{k}", label=f"rank {k}" if i == 0 else None)
            ax.text(x, t * 1e3, f"{int(n)}", ha="center", va="bottom", fontsize=7)
        ticks.append((i * (world_size + 1) + (world_size - 1) / 2, r["variant"]))
    ax.set_xticks([p for p, _ in ticks], [t for _, t in ticks])
    ax.set_ylabel("ms, forward + backward alone on one core (ranks' median)")
    ax.legend(fontsize=7)
    ax.set_title(title or f"each rank's share at P = {world_size} (score blocks above)")
    return fig


def step_split(df, title: str | None = None):
    """Per run, the pass (ms) beside its compute (loopback) and its messages alone."""
    from labkit.cp.report import select

    rows = select(df)
    rows = rows[rows["world_size"] > 1]
    fig, axes = new_figure(width=max(4.5, 1.3 * len(rows) + 1.5))
    ax = axes[0][0]
    for i, (_, r) in enumerate(rows.iterrows()):
        ax.bar(3 * i, r["step_time_p50_s"] * 1e3, color="C0",
               label="pass (measured)" if i == 0 else None)
        ax.bar(3 * i + 1, r["compute_time_p50_s"] * 1e3, color="C1",
               label="compute (loopback)" if i == 0 else None)
        ax.bar(3 * i + 1, r["message_time_s"] * 1e3, bottom=r["compute_time_p50_s"] * 1e3,
               color="C2", label="messages alone" if i == 0 else None)
    ax.set_xticks([3 * i + 0.5 for i in range(len(rows))],
                  [f"{r['variant']}\nP={int(r['world_size'])}" for _, r in rows.iterrows()])
    ax.set_ylabel("ms per forward + backward (p50, slowest rank)")
    ax.legend(fontsize=7)
    ax.set_title(title or "ring attention: the pass against compute + messages")
    return fig
