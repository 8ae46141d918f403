"""Figures of the tensor-parallel lab. Each takes rows (or the formulas' inputs) and returns a
matplotlib Figure; nothing here measures."""

from __future__ import annotations

from labkit.figures import new_figure


def step_breakdown(df, prof=None, title: str | None = None):
    """Per run, two stacked bars (ms): measured (the step: the part the step with f and g off
    takes, then the rest) and predicted, hatched. With a machine profile ``prof`` the
    prediction is the in-context model (:func:`labkit.tp.verdicts.context`: compute alone x
    the co-run slowdown, the profile's collectives, the scheduler waits counted in the row's
    median step, and for the library DTensor's own work and the teaching version's waits:
    :func:`~labkit.tp.library.model_context`); without one, the launch's own (compute alone,
    α–β all-reduces)."""

    from labkit.tp.library import bookkeeping_s, model_context
    from labkit.tp.report import select

    rows = select(df)
    extra = bookkeeping_s(rows)
    fig, axes = new_figure(width=max(4.5, 1.6 * len(rows) + 1.5))
    ax = axes[0][0]
    labels, waits_shown = [], False
    for i, (_, r) in enumerate(rows.iterrows()):
        x = 2.6 * i
        step = r["step_time_p50_s"] * 1e3  # the bar is the step: compute, then the rest
        c = min(r["compute_time_p50_s"] * 1e3, step)
        m = step - c
        ax.bar(x, c, color="C0", label="compute (measured)" if i == 0 else None)
        ax.bar(x, m, bottom=c, color="C1", label="communication (measured)" if i == 0 else None)
        pw = 0.0
        if prof is not None:
            ctx = model_context(r, rows, prof, bookkeeping=extra)
            pc, pm, pw = (ctx[k] * 1e3 for k in ("compute_s", "transfers_s", "waits_s"))
            pb = (ctx["step_s"] - ctx["compute_s"] - ctx["comm_s"]) * 1e3
        else:
            pc, pm, pb = r["predicted_compute_s"] * 1e3, r["predicted_comm_s"] * 1e3, 0.0
        ax.bar(x + 1, pc, color="C0", alpha=0.45, hatch="//",
               label="compute (predicted)" if i == 0 else None)
        ax.bar(x + 1, pm, bottom=pc, color="C1", alpha=0.45, hatch="//",
               label="collectives (predicted)" if i == 0 else None)
        if pw > 0:
            ax.bar(x + 1, pw, bottom=pc + pm, color="C3", alpha=0.45, hatch="//",
                   label=None if waits_shown else
                   "scheduler waits, counted (predicted; the library: the teaching version's)")
            waits_shown = True
        if pb > 0:
            ax.bar(x + 1, pb, bottom=pc + pm + pw, color="C2", alpha=0.45, hatch="//",
                   label="DTensor's own work (predicted)")
        labels.append((x + 0.5, f"{r['variant']}\nP={int(r['world_size'])}"))
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels])
    ax.set_ylabel("ms per training step (p50, slowest rank)")
    ax.legend(fontsize=7)
    ax.set_ylim(bottom=0)
    ax.set_title(title or "where a TP step's time goes: measured | predicted")
    return fig


def speedup_vs_hidden(hiddens, cases: dict, *, batch_size: int, seq_len: int, ranks: int,
                      num_layers: int = 1, title: str | None = None):
    """Predicted speedup of ``ranks`` TP ranks over one (:func:`labkit.tp.formulas.tp_speedup`)
    against the hidden size, one line per case: ``{label: {"compute_flop_per_s",
    "alpha_s", "beta_bytes_per_s"}}``; the break-even hidden size of each is marked."""
    from labkit.tp.formulas import breakeven_hidden, tp_speedup

    fig, axes = new_figure(width=5.6)
    ax = axes[0][0]
    for i, (label, c) in enumerate(cases.items()):
        kw = dict(compute_flop_per_s=c["compute_flop_per_s"], alpha_s=c["alpha_s"],
                  beta_bytes_per_s=c["beta_bytes_per_s"])
        ys = [tp_speedup(batch_size=batch_size, seq_len=seq_len, hidden=h,
                         num_layers=num_layers, ranks=ranks, **kw) for h in hiddens]
        ax.plot(hiddens, ys, "-", color=f"C{i}", label=label)
        h0 = breakeven_hidden(batch_size=batch_size, seq_len=seq_len, ranks=ranks, **kw)
        if min(hiddens) <= h0 <= max(hiddens):
            ax.axvline(h0, color=f"C{i}", ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(ranks, color="gray", ls="--", lw=0.8, label=f"ideal: {ranks}")
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(hiddens), max(hiddens))
    ax.set_ylim(bottom=0)  # a speedup is positive: no negative tick beside the first h
    ax.set_xlabel("hidden size h")
    ax.set_ylabel(f"T(1) / T({ranks}), predicted")
    ax.set_title(title or f"when {ranks}-way TP pays (b·s = {batch_size * seq_len} tokens)")
    ax.legend(fontsize=7)
    return fig
