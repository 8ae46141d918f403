"""Bubbles explorer: sliders for P, M, V and the schedule; the formula, and the ideal schedule
drawn by :func:`labkit.pipeline.schedules.simulate` (backward = 2 × forward, split into equal B
and W for zero bubble; no communication cost)."""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.explorer import Control, Live, page_html, png_of
from labkit.figures import png_outputs
from labkit.pipeline.formulas import bubble_fraction, measured_bubble
from labkit.pipeline.schedules import simulate


def describe(schedule: str, p: int, m: int, v: int) -> str:
    """The formula with numbers, and the bubble of the simulated schedule (HTML)."""
    if schedule == "interleaved":
        f = bubble_fraction(num_stages=p, num_microbatches=m, schedule=schedule,
                            virtual_stages=v)
        formula = f"(P−1)/(V·M+P−1) = {p - 1}/({v}·{m}+{p - 1}) = {f:.3f}"
    elif schedule == "zero_bubble":
        f = bubble_fraction(num_stages=p, num_microbatches=m, schedule=schedule)
        formula = f"(P−1)/(P−1+3M) = {p - 1}/({p - 1}+3·{m}) = {f:.3f}"
    else:
        f = bubble_fraction(num_stages=p, num_microbatches=m, schedule=schedule)
        formula = f"(P−1)/(P−1+M) = {p - 1}/({p - 1}+{m}) = {f:.3f}"
    blocks = simulate(schedule, p, m, virtual_stages=v)
    step = max(b["end_s"] for b in blocks)
    busy = [sum(b["end_s"] - b["start_s"] for b in blocks if b["rank"] == r) for r in range(p)]
    return (f"<b>{schedule}</b>, P={p}, M={m}" + (f", V={v}" if schedule == "interleaved" else "")
            + f": bubble {formula}; simulated 1 − Σbusy/(P·step) = "
            f"{measured_bubble(busy, step):.3f}")


def bubbles_explorer(num_stages: int = 4, num_microbatches: int = 8, virtual_stages: int = 2,
                     schedule: str = "1f1b"):
    """P, M, V sliders and a schedule menu -> formula text and the drawn schedule (drawn when
    the explorer is built too, so an executed notebook shows it without a kernel)."""
    import ipywidgets as w

    from labkit.pipeline.plots import schedule_diagram

    p = w.IntSlider(value=num_stages, min=1, max=16, description="P stages")
    m = w.IntSlider(value=num_microbatches, min=1, max=32, description="M microbatches")
    v = w.IntSlider(value=virtual_stages, min=1, max=4, description="V chunks")
    s = w.Dropdown(options=["gpipe", "1f1b", "interleaved", "zero_bubble"], value=schedule,
                   description="schedule")
    text, out = w.HTML(), w.Output()

    def redraw(*_):
        try:
            if s.value in ("1f1b", "interleaved", "zero_bubble") and m.value < p.value:
                raise UsageError(f"{s.value} needs M >= P (M={m.value} < P={p.value})")
            text.value = describe(s.value, p.value, m.value, v.value)
            fig = schedule_diagram(simulate(s.value, p.value, m.value, virtual_stages=v.value),
                                   time_unit="slot", title="ideal schedule (B = 2 F)")
            out.outputs = png_outputs(fig, f"ideal {s.value} schedule, P={p.value}, "
                                           f"M={m.value}")
        except UsageError as e:
            text.value = f"<span style='color:firebrick'>{e}</span>"

    for c in (p, m, v, s):
        c.observe(redraw, names="value")
    redraw()
    return Live(w.VBox([w.HBox([s, p]), w.HBox([m, v]), text, out]),
                page_explorer(num_stages, num_microbatches, virtual_stages, schedule,
                              figure=png_of(out.outputs)))


def _checked(schedule: str, num_stages: int, num_microbatches: int, virtual_stages: int) -> str:
    if schedule in ("1f1b", "interleaved", "zero_bubble") and num_microbatches < num_stages:
        raise UsageError(f"{schedule} needs M >= P (M={num_microbatches} < P={num_stages})")
    return describe(schedule, num_stages, num_microbatches,
                    virtual_stages if schedule == "interleaved" else 1)


def page_explorer(num_stages: int = 4, num_microbatches: int = 8, virtual_stages: int = 2,
                  schedule: str = "1f1b", figure=None) -> str:
    """The explorer for a page without a kernel (:mod:`labkit.explorer`), on a coarser grid
    (P up to 8, M in powers of two up to 32); V changes only the interleaved schedule."""
    from functools import lru_cache

    once = lru_cache(maxsize=None)(_checked)

    def text(schedule, num_stages, num_microbatches, virtual_stages):
        return once(schedule, num_stages, num_microbatches,
                    virtual_stages if schedule == "interleaved" else 1)

    return page_html(
        [Control("schedule", "schedule", ("gpipe", "1f1b", "interleaved", "zero_bubble"),
                 schedule),
         Control("num_stages", "P stages", (1, 2, 3, 4, 6, 8), num_stages),
         Control("num_microbatches", "M microbatches", (1, 2, 4, 8, 16, 32), num_microbatches),
         Control("virtual_stages", "V chunks (interleaved)", (1, 2, 3, 4), virtual_stages)],
        text, title="Pipeline bubbles explorer", figure=figure,
        note="The schedule drawn is the one the notebook ran with; redrawing it for other "
             "values needs Python (run the notebook in JupyterLab).")
