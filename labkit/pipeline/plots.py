"""Figures of the pipeline lab. Each takes rows (a DataFrame) or blocks and draws; none
measures: :func:`bubble_vs_microbatches` (the fill/drain bubble read off the timeline against
the formula, the step against (M + P − 1) × t_slot, and what more microbatches cost),
:func:`schedule_diagram` (ranks x time: measured forward and backward blocks over the ideal
schedule's), :func:`activations_vs_microbatches` (stage 0's peak of saved activations against
what its schedule implies), :func:`rate_vs_microbatch_size` (a stage's compute rate against the
microbatch's size, beside the machine profile's matrix product)."""

from __future__ import annotations

import numpy as np

from labkit.figures import new_figure

_KIND_COLOR = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
_KIND_NAME = {"F": "forward", "B": "backward", "W": "weight gradient"}


def bubble_vs_microbatches(df):
    """Left: the fill/drain bubble read off the timeline per schedule vs M, with its formula
    (dotted), the step model's share (open squares, where
    :func:`labkit.pipeline.report.add_model` added it) and the rest of the idle time (faint).
    Middle: the measured step against
    (M + P − 1) × t_slot(M) and the step model (where :func:`labkit.pipeline.report.add_model`
    added it), the shortest measured step starred. Right: the microbatch lever's cost here:
    each stage's compute per step, M × t_slot(M), as microbatches shrink."""
    from labkit.pipeline.formulas import bubble_fraction, bubble_text

    fig, axes = new_figure(3, width=4.4)
    ax_b, ax_s, ax_c = axes[0]
    formulas_drawn = set()
    for (s, p), part in df.groupby(["schedule", "num_stages"], sort=False):
        part = part.sort_values("num_microbatches")
        m = part.num_microbatches
        line, = ax_b.plot(m, part.bubble_fill_drain, "o-", label=f"{s} P={p} fill/drain")
        color = line.get_color()
        ax_b.plot(m, part.idle_other, ".:", color=color, alpha=0.5, label=f"{s} P={p} other idle")
        if "bubble_model" in part and part.bubble_model.notna().all():
            ax_b.plot(m, part.bubble_model, "s", mfc="none", color=color,
                      label=f"{s} P={p} step model")
        kind = "zero_bubble" if s == "zero_bubble" else ("interleaved" if s == "interleaved"
                                                         else "gpipe")
        v = int(part.virtual_stages.iloc[0])
        if (kind, p, v) not in formulas_drawn:
            formulas_drawn.add((kind, p, v))
            grid = np.arange(1, max(int(m.max()), 2) + 1)
            name = bubble_text(kind, v)
            ax_b.plot(grid, [bubble_fraction(num_stages=int(p), num_microbatches=int(g),
                                             schedule=kind, virtual_stages=v) for g in grid],
                      "k:" if kind == "gpipe" else "k--", lw=1, label=f"{name}, P={p}")
        ax_s.plot(m, part.step_time_s * 1e3, "o-", color=color, label=f"{s} P={p} measured")
        ax_s.plot(m, part.step_time_predicted_s * 1e3, "x--", color=color, alpha=0.7,
                  label=f"{s} P={p} (M+P−1)·t_slot")
        if "step_time_model_s" in part:
            ax_s.plot(m, part.step_time_model_s * 1e3, "s:", color=color, alpha=0.7,
                      label=f"{s} P={p} step model")
        best = part.loc[part.step_time_s.idxmin()]
        ax_s.plot(best.num_microbatches, best.step_time_s * 1e3, "*", ms=14, color=color,
                  markeredgecolor="k")
        ax_c.plot(m, m * part.slot_time_s * 1e3, "o-", color=color,
                  label=f"{s} P={p}: M × t_slot")
    ax_b.set(xlabel="microbatches M", ylabel="share of the step", ylim=(0, 1),
             title="bubble read off the timeline")
    ax_s.set(xlabel="microbatches M", ylabel="ms", ylim=(0, None),
             title="step: measured vs predicted (★ shortest)")
    ax_c.set(xlabel="microbatches M", ylabel="ms", ylim=(0, None),
             title="compute per stage per step")
    for ax in (ax_b, ax_s, ax_c):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if df.get("oversubscribed") is not None and df.oversubscribed.any():
        fig.suptitle("oversubscribed: ranks share cores, idle time is not only the bubble",
                     fontsize=9, color="firebrick")
    return fig


def schedule_diagram(blocks, *, ideal=None, title: str = "", ax=None, time_unit: str = "ms"):
    """Ranks × time: one bar per forward (blue), backward (orange) or weight-gradient pass
    (green) of a microbatch, labelled with its microbatch number (and chunk for interleaved).
    ``blocks``: a DataFrame or a list of dicts with rank, stage, kind, microbatch, start_s,
    end_s: measured (:func:`labkit.pipeline.report.schedule_blocks`) or ideal
    (:func:`labkit.pipeline.schedules.simulate`). ``ideal``: blocks of the same form drawn
    underneath as outlines (:func:`labkit.pipeline.report.ideal_blocks`), so that the measured
    bars show where this machine departs from the schedule."""
    import pandas as pd
    from matplotlib.patches import Patch

    b = pd.DataFrame(blocks)
    scale = {"ms": 1e3, "s": 1.0, "slot": 1.0}[time_unit]
    if ax is None:
        fig, axes = new_figure(1, width=9.0, height=0.6 + 0.55 * b["rank"].nunique())
        ax = axes[0][0]
    else:
        fig = ax.figure
    ranks = sorted(b["rank"].unique())
    chunked = b.stage.nunique() > len(ranks)
    if ideal is not None:
        for r in pd.DataFrame(ideal).itertuples():
            ax.broken_barh([(r.start_s * scale, (r.end_s - r.start_s) * scale)],
                           (r.rank - 0.45, 0.9), facecolors="none",
                           edgecolors=_KIND_COLOR[r.kind], linewidth=1.0, linestyle="--")
    height = 0.6 if ideal is not None else 0.8
    for r in b.itertuples():
        x0, w = r.start_s * scale, (r.end_s - r.start_s) * scale
        ax.broken_barh([(x0, w)], (r.rank - height / 2, height), facecolors=_KIND_COLOR[r.kind],
                       edgecolor="white", linewidth=0.5,
                       alpha=1.0 if not chunked or r.stage < len(ranks) else 0.65)
        label = f"{r.microbatch}" + (f"/{r.stage // len(ranks)}" if chunked else "")
        ax.text(x0 + w / 2, r.rank, label, ha="center", va="center", fontsize=7, color="white",
                clip_on=True)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel({"ms": "time since the step started (ms)", "s": "time (s)",
                   "slot": "time (forward = 1 slot)"}[time_unit])
    kinds = [k for k in _KIND_COLOR if k in set(b.kind)]
    handles = [Patch(color=_KIND_COLOR[k], label=_KIND_NAME[k]) for k in kinds]
    if ideal is not None:
        handles.append(Patch(facecolor="none", edgecolor="grey", linestyle="--",
                             label="ideal schedule"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "schedule: forward and backward of each microbatch per rank")
    ax.grid(axis="x", alpha=0.3)
    return fig


def activations_vs_microbatches(df, schedules=("gpipe", "1f1b")):
    """Stage 0's peak of saved activations against M, per schedule and P: the measured points
    (``peak_activation_bytes``) and what the schedule implies as a line over every M the batch
    divides into and the schedule runs
    (:func:`~labkit.pipeline.activations.peak_activation_formula`); where the rows carry a
    device memory peak (CUDA), that too, faint (every rank's largest, weights and gradients
    included)."""
    from labkit.pipeline.activations import MIB, peak_activation_formula
    from labkit.pipeline.config import combo_problem

    fig, axes = new_figure(1, width=5.5)
    ax = axes[0][0]
    groups = df[df.schedule.isin(schedules)].groupby(["schedule", "num_stages"], sort=False)
    for marker, ((s, p), part) in zip("osD^v<>" * 9, groups):  # hollow: one may hide another
        part = part.sort_values("num_microbatches")
        r, p = part.iloc[0], int(p)
        grid = [m for m in range(1, int(part.num_microbatches.max()) + 1)
                if r.batch % m == 0 and not combo_problem(s, p, m)]
        line, = ax.plot(part.num_microbatches, part.peak_activation_bytes / MIB, marker, ms=8,
                        mfc="none", mew=1.5, label=f"{s} P={p} measured")
        ax.plot(grid, [peak_activation_formula(
            s, num_stages=p, num_microbatches=m, layers=int(r.layers), hidden=int(r.hidden),
            batch=int(r.batch), virtual_stages=int(r.virtual_stages)) / MIB for m in grid],
            "--", color=line.get_color(), label=f"{s} P={p}: what its schedule holds")
        if "device_memory_peak_bytes" in part and part.device_memory_peak_bytes.notna().any():
            ax.plot(part.num_microbatches, part.device_memory_peak_bytes / MIB, "x:",
                    color=line.get_color(), alpha=0.5, label=f"{s} P={p} device peak")
    ax.set(xlabel="microbatches M", ylabel="MiB saved for backward", ylim=(0, None),
           title="stage 0's peak of saved activations")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def rate_vs_microbatch_size(df):
    """One stage's forward + backward rate (GFLOP/s) against the microbatch size, per schedule
    and P: in the step (filled, solid) and from the blocks that ran alone (hollow, dotted),
    beside the machine profile's matrix product of as many operations, alone (black dashed)
    and with every rank at once (grey dashed): the columns of
    :func:`labkit.pipeline.rates.add_rates`."""
    from matplotlib.lines import Line2D

    fig, axes = new_figure(1, width=6.5, height=4.2)
    ax = axes[0][0]
    # the profile's lines first: the alt text names the first six lines
    prof = df.drop_duplicates("microbatch_size").sort_values("microbatch_size")
    ax.plot(prof.microbatch_size, prof.matmul_flop_per_s / 1e9, "k--", lw=1.2,
            label="profile's product, alone")
    ax.plot(prof.microbatch_size, prof.matmul_together_flop_per_s / 1e9, "--", color="grey",
            lw=1.2, label="profile's product, ranks together")
    handles = []
    for (s, p), part in df.groupby(["schedule", "num_stages"], sort=False):
        part = part.sort_values("microbatch_size")
        b = part.microbatch_size
        # labelled for the alt text; the legend shows colours and styles apart, to stay short
        line, = ax.plot(b, part.block_flop_per_s / 1e9, "o-", label=f"{s} P={p} in the step")
        alone = part.block_alone_flop_per_s.astype(float) / 1e9
        ax.plot(b, alone, "o:", mfc="none", color=line.get_color(), label=f"{s} P={p} alone")
        handles.append(Line2D([], [], color=line.get_color(), lw=3, label=f"{s} P={p}"))
    handles += [Line2D([], [], color="k", marker="o", label="block in the step"),
                Line2D([], [], color="k", marker="o", mfc="none", ls=":",
                       label="block alone (fill, drain)"),
                Line2D([], [], color="k", ls="--", label="profile's product, alone"),
                Line2D([], [], color="grey", ls="--", label="profile's product, ranks together")]
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(prof.microbatch_size), [str(int(v)) for v in prof.microbatch_size])
    ax.set(xlabel="microbatch size (samples)", ylabel="GFLOP/s", ylim=(0, None),
           title="a stage's forward + backward per microbatch,\nbeside the profile's matrix "
                 "product of as many operations")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=3)
    return fig
