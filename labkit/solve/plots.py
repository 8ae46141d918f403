"""Figures of the solve-scaling lab. Rows that failed the residual gate are left out."""

from __future__ import annotations

import math

from labkit.figures import new_figure
from labkit.solve.report import TIME_SPLIT as _SPLIT
from labkit.solve.report import passed as _passed


def _series(df):
    keys = [k for k in ("dim", "dof_requested", "partitioner", "method", "rhs") if k in df]
    return df.sort_values("world_size").groupby(keys, dropna=False) if keys else [((), df)]


def _label(key) -> str:
    key = key if isinstance(key, tuple) else (key,)
    return " ".join(str(k) for k in key[2:]) + (f" n={key[1]:,}" if len(key) > 1 else "")


def scaling_figure(df):
    """Three panels: weak (solve time vs ranks, ideal flat), strong (speedup vs ranks, ideal
    linear), throughput (DOF/s vs ranks, ideal linear from 1 rank)."""
    fig, axes = new_figure(3, 1)
    ax_w, ax_s, ax_t = axes[0]
    df = _passed(df)
    panels = ((ax_w, "weak", "solve time (s)", "weak: fixed DOF per rank"),
              (ax_s, "strong", "speedup t1 / tN", "strong: fixed total DOF"),
              (ax_t, "throughput", "DOF / s", "throughput"))
    for ax, mode, ylabel, title in panels:
        rows = df[df["mode"] == mode] if "mode" in df else df.iloc[:0]
        ns_all = sorted(rows["world_size"].unique()) if len(rows) else [1]
        for key, s in (_series(rows) if len(rows) else []):
            ns = s["world_size"].to_numpy()
            if mode == "weak":
                line, = ax.plot(ns, s["solve_time_s"], "o-", label=_label(key))
                t1 = s.loc[s["world_size"] == 1, "solve_time_s"]
                if len(t1):
                    ax.plot(ns_all, [t1.iloc[0]] * len(ns_all), "--", color=line.get_color(),
                            alpha=0.6)
            elif mode == "strong":
                sp = s["speedup"].astype(float)
                ax.plot(ns, sp, "o-", label=_label(key))
            else:
                line, = ax.plot(ns, s["throughput_dof_per_s"], "o-", label=_label(key))
                t1 = s.loc[s["world_size"] == 1, "throughput_dof_per_s"]
                if len(t1):
                    ax.plot(ns_all, [t1.iloc[0] * n for n in ns_all], "--",
                            color=line.get_color(), alpha=0.6)
        if mode == "strong":
            ax.plot(ns_all, ns_all, "k--", alpha=0.6, label="ideal (linear)")
        if not len(rows):
            ax.text(0.5, 0.5, f"no {mode} rows", ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel="ranks", ylabel=ylabel, title=title, xticks=ns_all)
        if len(rows):
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    ax_w.set_ylim(bottom=0)
    return fig


def time_split_figure(df, mode: str | None = None):
    """Stacked bars: where each solve's time goes (SpMV, halo, all-reduce, vector updates,
    other), as milliseconds per iteration, one bar per row labelled with its size (DOF of the
    whole problem), world size, partitioner and method (and mode, where the rows hold more
    than one), ordered by size, then world size."""
    df = _passed(df)
    if mode is not None:
        df = df[df["mode"] == mode]
    df = df.sort_values(["dof_global", "world_size", "partitioner", "method"], kind="stable")
    several_modes = "mode" in df and df["mode"].nunique() > 1
    # a bar's label is four lines of up to ~12 characters: room for each whatever the count
    fig, axes = new_figure(1, 1, width=max(7.0, 0.8 * len(df) + 1.0))
    ax = axes[0][0]
    labels = [f"{int(r.dof_global):,} DOF\nP={r.world_size}\n{r.partitioner}\n{r.method}"
              + (f"\n{r.mode}" if several_modes else "") for r in df.itertuples()]
    bottom = [0.0] * len(df)
    for col in _SPLIT:
        if col not in df:
            continue
        vals = (df[col] / df["iterations"].clip(lower=1) * 1e3).tolist()
        ax.bar(range(len(df)), vals, bottom=bottom, label=col.replace("_time_s", ""))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(df)), labels, fontsize=7)
    ax.set(ylabel="ms per iteration",
           title="time split per iteration" + (f" ({mode} scaling)" if mode else ""))
    ax.legend(fontsize=7)
    return fig


def halo_figure(df):
    """Halo values per SpMV and edge cut by partitioner and world size: from solve rows, or from
    :func:`labkit.solve.report.partition_table` (no gate column: every row counts)."""
    if "gate_passed" in df.columns:
        df = _passed(df)
    df = df.drop_duplicates(["world_size", "partitioner", "dof_global"])
    df = df[df["world_size"] > 1].sort_values(["world_size", "partitioner"], kind="stable")
    fig, axes = new_figure(2, 1, width=4.5)
    labels = [f"P={r.world_size}\n{r.partitioner}" for r in df.itertuples()]
    for ax, col, title in ((axes[0][0], "halo_values", "halo values received per SpMV"),
                           (axes[0][1], "edge_cut", "edge cut")):
        ax.bar(range(len(df)), df[col].tolist(), color="tab:orange")
        ax.set_xticks(range(len(df)), labels, fontsize=7)
        ax.set(title=title)
    return fig


def crossover_figure(table, summary):
    """Speedup at P ranks against the problem size: measured (per iteration and per solve), the
    naive model (messages only) and the full one, t1 / (c_P + s (t1 − c) / P), through the
    measured 1-rank times, and both crossovers."""
    from matplotlib.ticker import NullFormatter

    fig, axes = new_figure(1, 1, width=6)
    ax = axes[0][0]
    t = table.sort_values("dof_global")
    p = summary["ranks"]
    ax.plot(t["dof_global"], t["speedup_per_iteration"], "o-", label="measured (per iteration)")
    ax.plot(t["dof_global"], t["speedup"], "s:", alpha=0.7, label="measured (solve time)")
    ax.plot(t["dof_global"], t["naive_speedup"], ":", color="grey",
            label=f"naive: c_P = c + t_msg ({summary['message_s'] * 1e6:.0f} µs)")
    # s read at each size (a column of the table), or one s for every size
    s = t["slowdown"] if "slowdown" in t else [summary.get("slowdown", 1.0)]
    s_words = f"s = {min(s):.2f}" + (f" to {max(s):.2f}" if max(s) - min(s) >= 0.005 else "")
    ax.plot(t["dof_global"], t["predicted_speedup"], "k--",
            label=f"model t1 / (c_P + s (t1 − c)/{p}), c_P = {summary['fixed_p_s'] * 1e6:.0f} µs, "
                  f"{s_words}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(p, color="grey", lw=0.8, ls=":")
    pred = summary["predicted_crossover_dof"]
    if math.isfinite(pred):  # s >= P: the model says the ranks never pay
        ax.axvline(pred, color="k", lw=0.8, ls="--")
        ax.annotate(f"predicted\n{pred:,.0f}", (pred, 1.0), fontsize=7, ha="right", va="bottom")
    meas = summary["measured_crossover_dof"]
    if meas is not None:
        ax.axvline(meas, color="tab:blue", lw=0.8)
        ax.annotate(f"measured\n{meas:,.0f}", (meas, 1.0), fontsize=7, ha="left", va="top")
    ax.set_xscale("log")
    # a range under a decade labels its minor ticks (3e3, 4e3, ...), which then collide
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="DOF (whole problem)", ylabel=f"speedup at {p} ranks",
           title="when do more ranks pay? (strong scaling at several sizes)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig
