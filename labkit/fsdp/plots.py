"""Figures of the sharded-data-parallel lab. Each takes rows (or the formulas' numbers) and
returns a matplotlib Figure; nothing here measures."""

from __future__ import annotations

from labkit.figures import new_figure

KINDS = (("param", "weights", "C0"), ("grad", "gradients", "C1"),
         ("optimizer", "Adam states", "C2"))


def _stacked(ax, x, layers, formula, *, ylabel: str, title: str) -> None:
    """One panel: ``layers`` (values, label, colour) stacked per bar, the formula's value as a
    black tick on each bar."""
    bottom = [0.0] * len(x)
    for vals, label, color in layers:
        ax.bar(x, vals, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(x, formula, "k_", ms=22, mew=2, label="formula")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)


def memory_and_comm(df, title: str | None = None, prof=None):
    """Three panels per variant: the bytes one rank holds (stacked, measured; the formula as a
    black tick), the bytes one step moves (measured volume by collective; formula tick), and the
    step time (measured p50; the prediction as a tick: in context with a machine profile
    ``prof``, :func:`labkit.fsdp.model.context`, else the launch's α–β one)."""
    from labkit.fsdp.report import select

    rows = select(df)
    fig, axes = new_figure(ncols=3, width=3.6)
    names = [f"{r['variant']}\nN={int(r['world_size'])}" for _, r in rows.iterrows()]
    x = list(range(len(rows)))
    _stacked(axes[0][0], x,
             [([r[f"{col}_bytes_per_rank"] / 1e6 for _, r in rows.iterrows()], label, color)
              for col, label, color in KINDS],
             rows["state_bytes_formula"] / 1e6, ylabel="MB held per rank", title="memory")
    _stacked(axes[0][1], x,
             [([mult * r[f"{col}_bytes_measured"] / 1e6 for _, r in rows.iterrows()], label,
               color)
              for col, label, mult, color in (("allreduce", "all-reduce (x2)", 2, "C3"),
                                              ("allgather", "all-gather", 1, "C4"),
                                              ("reduce_scatter", "reduce-scatter", 1, "C5"))],
             rows["comm_bytes_formula"] / 1e6, ylabel="MB moved per step (volume)",
             title="communication")
    ax = axes[0][2]
    # the bar is the step; its compute part no taller than the step (noise can make the
    # compute-only step the slower of the two)
    compute = rows[["compute_time_p50_s", "step_time_p50_s"]].min(axis=1) * 1e3
    ax.bar(x, compute, color="C0", label="compute (no comm)")
    ax.bar(x, rows["step_time_p50_s"] * 1e3 - compute, bottom=compute, color="C1",
           label="the rest")
    if prof is not None:
        from labkit.fsdp.model import context

        predicted = [context(r, prof)["step_s"] * 1e3 for _, r in rows.iterrows()]
    else:
        predicted = rows["predicted_step_s"] * 1e3
    ax.plot(x, predicted, "k_", ms=22, mew=2, label="predicted")
    ax.set_ylabel("ms per step (p50, slowest rank)")
    ax.set_title("step time")
    ax.legend(fontsize=7)
    for a in axes[0]:
        a.set_xticks(x, names)
        a.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    return fig


def memory_per_gpu(breakdown, *, gpu_memory_gb: float | None = None, title: str | None = None):
    """Horizontal stacked bars (GB per GPU), one per strategy: weights, gradients, optimizer
    states, activations; ``breakdown``: rows of :func:`labkit.fsdp.widgets.breakdown`."""
    fig, axes = new_figure(width=6.2, height=0.5 * len(breakdown) + 1.6)
    ax = axes[0][0]
    labels = [r["strategy"] for r in breakdown]
    y = list(range(len(breakdown)))[::-1]
    left = [0.0] * len(breakdown)
    for key, label, color in (("params", "weights", "C0"), ("gradients", "gradients", "C1"),
                              ("optimizer", "optimizer states", "C2"),
                              ("activations", "activations", "C7")):
        vals = [r[key] / 1e9 for r in breakdown]
        ax.barh(y, vals, left=left, color=color, label=label)
        left = [a + v for a, v in zip(left, vals)]
    if gpu_memory_gb:
        ax.axvline(gpu_memory_gb, color="firebrick", ls="--", lw=1,
                   label=f"GPU memory {gpu_memory_gb:g} GB")
    ax.set_yticks(y, labels)
    ax.set_xlabel("GB per GPU")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "memory per GPU")
    return fig


PEAK_KINDS = (("params", "weights", "C0"), ("gradients", "gradients", "C1"),
              ("optimizer", "Adam states", "C2"), ("buffers", "buffers", "C4"),
              ("activations", "activations", "C7"))


def peak_memory(df, title: str | None = None):
    """Two panels: per variant the most one rank held during a step, counted and stacked by
    kind, its formula as a black tick (FSDP with the other resharding setting as a grey bar:
    its total only); and the plain model's saved activations without and with activation
    checkpointing, counted, their formulas as ticks."""
    from labkit.fsdp.report import select

    rows = select(df)
    fig, axes = new_figure(ncols=2, width=4.4)
    ax = axes[0][0]
    names = [f"{r['variant']}\nN={int(r['world_size'])}" for _, r in rows.iterrows()]
    x = list(range(len(rows)))
    _stacked(ax, x, [([r[f"peak_{k}_bytes"] / 1e6 for _, r in rows.iterrows()], label, color)
                     for k, label, color in PEAK_KINDS],
             rows["peak_bytes_formula"] / 1e6, ylabel="MB held per rank at the step's peak",
             title="peak over one step")
    fsdp = rows[rows["stage"] == "zero3"]
    for _, r in fsdp.iterrows():
        other = "kept" if r["reshard_after_forward"] else "resharded"
        x.append(len(x))
        names.append(f"fsdp\n{'no reshard' if other == 'kept' else 'reshard'}")
        ax.bar(x[-1], r[f"peak_{other}_bytes_per_rank"] / 1e6, color="white", edgecolor="C0",
               hatch="//", label="the other resharding (total)")
        ax.plot(x[-1], r[f"peak_{other}_bytes_formula"] / 1e6, "k_", ms=22, mew=2)
    ax.set_xticks(x, names)
    top = max(rows["peak_bytes_per_rank"].max(), rows["peak_bytes_formula"].max())
    ax.set_ylim(0, 1.45 * top / 1e6)  # room for the legend above the bars
    ax.legend(fontsize=6, ncol=3, loc="upper center")
    ax = axes[0][1]
    first = rows.iloc[0]
    labels = ["no checkpointing", "checkpointing"]
    ax.bar([0, 1], [first["activation_bytes_measured"] / 1e6,
                    first["checkpoint_activation_bytes_measured"] / 1e6], color="C7",
           label="counted")
    ax.plot([0, 1], [first["activation_bytes_formula"] / 1e6,
                     first["checkpoint_activation_bytes_formula"] / 1e6], "k_", ms=22, mew=2,
            label="formula")
    ax.set_xticks([0, 1], labels)
    ax.set_ylabel("MB saved for backward (plain model, one rank)")
    ax.set_title("activation checkpointing")
    ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def step_trace(trace, variant: str = "fsdp"):
    """One recorded step of ``variant`` from the lab's Chrome trace (a document or a
    ``.trace.json`` path, :mod:`labkit.fsdp.trace`): for every rank a row of compute and its
    row(s) of collectives (:func:`labkit.figures.trace_timeline`). Returns (figure, alt text
    computed from the slices)."""
    from labkit import trace as tr
    from labkit.figures import trace_timeline

    doc = trace if isinstance(trace, dict) else tr.load(trace)
    names = [t for t in tr.threads(doc) if t.startswith(f"{variant} N=")]
    if not names:
        from labkit.errors import UsageError

        raise UsageError(f"no recorded step of {variant} in the trace (threads: "
                         f"{', '.join(tr.threads(doc))})")
    return trace_timeline(doc, thread=names, title=names[0])
