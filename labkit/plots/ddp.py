"""Figures of the DDP lab. Each takes :func:`labkit.ddp.run.ddp_scaling` rows, returns a Figure."""

from __future__ import annotations

from . import new_figure


def _label(r) -> str:
    return "no DDP" if r["variant"] == "no_ddp" else f"DDP N={int(r['world_size'])}"


def _ordered(df):
    return df.assign(_v=(df["variant"] == "ddp").astype(int)).sort_values(
        ["batch_size", "world_size", "_v"])


def step_time_distributions(df, title: str | None = None):
    """Box plots of every timed step (slowest rank) per run, one panel per batch size.

    The box spans p25-p75, whiskers p5-p95; the dots are the steps themselves, so a single
    straggling step is visible instead of averaged away.
    """
    batches = sorted(df["batch_size"].unique())
    fig, axes = new_figure(ncols=len(batches), width=4.6)
    for ax, batch in zip(axes[0], batches):
        part = _ordered(df[df["batch_size"] == batch])
        data = [[t * 1e3 for t in r["step_times_s"]] for _, r in part.iterrows()]
        labels = [_label(r) for _, r in part.iterrows()]
        ax.boxplot(data, whis=(5, 95), showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels)
        for i, d in enumerate(data, start=1):
            ax.plot([i + 0.18] * len(d), d, ".", ms=3, alpha=0.5, color="C1")
        ax.set_ylabel("step time, slowest rank (ms)")
        ax.set_title(f"{part.iloc[0]['model']}, batch {batch} per rank")
        ax.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    return fig


def throughput_vs_world_size(df, title: str | None = None):
    """Aggregate samples/s against world size, one panel per batch size: DDP, the ideal
    N x (1-rank DDP) line (dashed) and the no-DDP baseline (dotted) that DDP must beat."""
    batches = sorted(df["batch_size"].unique())
    fig, axes = new_figure(ncols=len(batches), width=4.2)
    for i, (ax, batch) in enumerate(zip(axes[0], batches)):
        part = df[df["batch_size"] == batch]
        color = f"C{i}"
        ddp = part[part["variant"] == "ddp"].sort_values("world_size")
        ax.plot(ddp["world_size"], ddp["samples_per_s"], "o-", color=color, label="DDP")
        one = ddp[ddp["world_size"] == 1]
        if len(one):
            ax.plot(ddp["world_size"], ddp["world_size"] * one.iloc[0]["samples_per_s"], "--",
                    color="gray", label="ideal: N x 1-rank DDP")
        base = part[part["variant"] == "no_ddp"]
        if len(base):
            ax.axhline(base.iloc[0]["samples_per_s"], ls=":", color="k", label="no DDP (1 process)")
        ax.set_xlabel("world size N (ranks)")
        ax.set_ylabel("samples / s (all ranks)")
        ax.set_xticks(sorted(df["world_size"].unique()))
        ax.set_ylim(bottom=0)
        ax.set_title(f"batch {batch} per rank")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def time_breakdown(df, title: str | None = None):
    """Stacked bars per DDP run: compute (step under no_sync) + exposed communication (ms),
    beside the standalone all-reduce of the same gradient bytes (hatched)."""
    if "exposed_comm_s" not in df:
        from ..errors import UsageError

        raise UsageError("no breakdown columns: run ddp_scaling with breakdown=True")
    ddp = _ordered(df[(df["variant"] == "ddp") & df["exposed_comm_s"].notna()])
    fig, axes = new_figure(width=5.4)
    ax = axes[0][0]
    x = list(range(len(ddp)))
    compute = ddp["nosync_step_time_p50_s"] * 1e3
    exposed = ddp["exposed_comm_s"] * 1e3
    ax.bar([i - 0.18 for i in x], compute, 0.36, label="compute (no_sync step)")
    ax.bar([i - 0.18 for i in x], exposed, 0.36, bottom=compute, label="exposed all-reduce")
    ax.bar([i + 0.18 for i in x], ddp["allreduce_time_p50_s"] * 1e3, 0.36, hatch="//",
           fill=False, label="standalone all-reduce")
    ax.set_xticks(x, [f"N={int(r.world_size)}\nbatch {int(r.batch_size)}"
                      for r in ddp.itertuples()])
    ax.set_ylabel("ms per step (p50)")
    ax.legend(fontsize=7)
    ax.set_title(title or "where a DDP step's time goes")
    return fig
