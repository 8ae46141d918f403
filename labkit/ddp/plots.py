"""Figures of the DDP lab. Each takes :func:`labkit.ddp.run.run` rows, returns a Figure."""

from __future__ import annotations

from labkit.ddp.report import ALL_CORES, by_variant, run_label, top_world_size
from labkit.figures import new_figure
from labkit.results import select_rows


def _ordered(df):
    return by_variant(df, ("batch_size", "world_size"))


def step_time_distributions(df, title: str | None = None):
    """Box plots of every timed step (slowest rank) per run, one panel per batch size.

    The box spans p25-p75, whiskers p5-p95; the dots are the steps themselves, so a single
    straggling step is visible instead of averaged away.
    """
    batches = sorted(df["batch_size"].unique())
    fig, axes = new_figure(ncols=len(batches), width=4.6)
    for ax, batch in zip(axes[0], batches):
        part = _ordered(select_rows(df, batch_size=batch))
        data = [[t * 1e3 for t in r["step_times_s"]] for _, r in part.iterrows()]
        labels = [run_label(r) for _, r in part.iterrows()]
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


def throughput_vs_world_size(df, title: str | None = None, batches=None):
    """Aggregate samples/s against world size, one panel per batch size (``batches``, default
    all): DDP, the ideal N x (1-rank DDP) line (dashed), the no-DDP baseline (dotted) that DDP
    must beat and, where there is one, the no-DDP process with every core as a thread."""
    batches = sorted(df["batch_size"].unique()) if batches is None else sorted(batches)
    fig, axes = new_figure(ncols=len(batches), width=4.2)
    for i, (ax, batch) in enumerate(zip(axes[0], batches)):
        part = select_rows(df, batch_size=batch)
        color = f"C{i}"
        ddp = select_rows(part, variant="ddp").sort_values("world_size")
        ax.plot(ddp["world_size"], ddp["samples_per_s"], "o-", color=color, label="DDP")
        one = ddp[ddp["world_size"] == 1]
        if len(one):
            ax.plot(ddp["world_size"], ddp["world_size"] * one.iloc[0]["samples_per_s"], "--",
                    color="gray", label="ideal: N x 1-rank DDP")
        base = select_rows(part, variant="no_ddp")
        if len(base):
            ax.axhline(base.iloc[0]["samples_per_s"], ls=":", color="k", label="no DDP (1 process)")
        whole = select_rows(part, variant=ALL_CORES)
        if len(whole):
            ax.axhline(whole.iloc[0]["samples_per_s"], ls="-.", color="C3",
                       label=f"no DDP, {int(whole.iloc[0]['threads_per_rank'])} threads")
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
        from labkit.errors import UsageError

        raise UsageError("no breakdown columns: run with DDPConfig(breakdown=True)")
    ddp = _ordered(select_rows(df[df["exposed_comm_s"].notna()], variant="ddp"))
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


def speedup_vs_batch(df, world_size: int | None = None, title: str | None = None):
    """N ranks' throughput against the no-DDP process, measured (dots) and predicted by the
    model of the DDP step (dashed), against the batch per rank (log scale), with the line
    where DDP starts to pay (1) and both crossovers marked (:func:`labkit.ddp.report.crossover`).
    """
    import math

    from labkit.ddp.report import crossover, prediction_frame

    frame = prediction_frame(df, world_size)
    n = top_world_size(df, world_size)
    fig, axes = new_figure(width=6.0)
    ax = axes[0][0]
    ax.plot(frame["batch"], frame["measured"], "o-", color="C0", label="measured")
    ax.plot(frame["batch"], frame["predicted"], "s", color="C1", mfc="none",
            label="model at each batch: N t_no_DDP / the model's t_DDP")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(n, color="gray", ls=":", lw=0.8, label=f"ideal: {n}")
    if len(frame) >= 2:
        import numpy as np

        c = crossover(df, n)
        if c["noddp_fit"] is not None:  # the lines the predicted crossover extends
            (a0, a1), (c0, c1) = c["noddp_fit"], c["compute_fit"]
            b = np.geomspace(frame["batch"].min(), frame["batch"].max(), 100)
            ax.plot(b, n * (a0 + a1 * b) / (c0 + c1 * b + c["added_s"]), "--", color="C1",
                    lw=1, label="model, both steps fitted as lines a + c b")
        for key, color, ls in (("measured", "C0", "-"), ("predicted", "C1", "--")):
            b = c[key]
            if math.isfinite(b) and b > 0:
                ax.axvline(b, color=color, ls=ls, lw=0.8, alpha=0.7)
                ax.annotate(f"{key}: {b:.0f}", (b, 1.0), xytext=(4, 6 if key == "measured" else -14),
                            textcoords="offset points", fontsize=7, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(frame["batch"], [str(b) for b in frame["batch"]])
    ax.set_xlabel("batch per rank (samples)")
    ax.set_ylabel(f"throughput of {n} ranks / no DDP")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title(title or f"when DDP on {n} ranks pays")
    return fig


def comm_timeline(row, title: str | None = None):
    """One DDP step of ``row`` as rank 0's timeline measured it (the step of median length):
    backward shaded from its start to its last gradient, one bar per bucket from its
    all-reduce's launch to its completion, the end of the same backward without the
    all-reduce (``no_sync``, dashed) and the step's end (ms from the step's start)."""
    import numpy as np

    ends = list(row["timeline_step_end_s"])
    k = int(np.argsort(ends)[len(ends) // 2])
    start, last = row["timeline_backward_start_s"][k] * 1e3, row["timeline_backward_end_s"][k] * 1e3
    intervals = [(a * 1e3, b * 1e3) for a, b in row["comm_intervals_s"][k]]
    fig, axes = new_figure(width=6.0, height=1.4 + 0.16 * len(intervals))
    ax = axes[0][0]
    ax.axvspan(start, last, color="C0", alpha=0.15, label="backward (to its last gradient)")
    for i, (a, b) in enumerate(intervals):
        ax.barh(i, b - a, left=a, height=0.7, color="C1",
                label="a bucket's all-reduce (launched to completed)" if i == 0 else None)
    nosync = row.get("nosync_backward_s")
    if nosync is not None and nosync == nosync:
        ax.axvline(start + nosync * 1e3, color="C0", ls="--", lw=1,
                   label="backward's end without the all-reduce (no_sync, median)")
    ax.axvline(ends[k] * 1e3, color="k", lw=1, label="step's end")
    ax.set_yticks(range(len(intervals)), [f"bucket {i}" for i in range(len(intervals))],
                  fontsize=6 if len(intervals) > 8 else 8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's start (rank 0)")
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or f"N={int(row['world_size'])}, batch {int(row['batch_size'])}, "
                          f"{row['bucket_cap_mb']:g} MB buckets: one step")
    return fig
