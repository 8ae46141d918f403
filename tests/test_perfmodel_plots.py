"""The layout model's figures: every bar inside its axis with its value written beside it, and
no text drawn over another, for pure data parallelism (the tallest bars) as for a 3-D layout."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.figures import text_overlaps
from labkit.perfmodel import catalog, layouts, plots
from labkit.perfmodel.model import Cluster, Layout, Workload, predict

FABRICS = ("100GbE", "IB_HDR", "IB_NDR")


def _inside(fig) -> tuple[list, list]:
    """(bars whose end passes the value axis, annotations whose box leaves the axes)."""
    import matplotlib.patches as mpatches

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    box = ax.get_window_extent(renderer)
    bars = [p for p in ax.patches if isinstance(p, mpatches.Rectangle)]
    horizontal = ax.get_xlabel() == "seconds per step"
    end = (lambda p: p.get_x() + p.get_width()) if horizontal else (lambda p: p.get_y() + p.get_height())
    hi = ax.get_xlim()[1] if horizontal else ax.get_ylim()[1]
    past = [end(p) for p in bars if end(p) > hi]
    out = [t.get_text() for t in ax.texts
           if not box.contains(*t.get_window_extent(renderer).p0)
           or not box.contains(*t.get_window_extent(renderer).p1)]
    return past, out


@pytest.mark.parametrize("layout", [Layout(256, 1, 1, 1), Layout(8, 8, 4, 32)],
                         ids=["pure_dp", "dp8_tp8_pp4"])
def test_fabric_sweep_bars_and_values_fit_the_axis(layout):
    work = Workload(catalog.model_preset("Llama-3-70B"), 256)
    sweep = layouts.fabric_sweep(work, layout, FABRICS)
    fig = plots.fabric_sweep_plot(sweep)
    past, out = _inside(fig)
    assert past == [] and out == []
    assert text_overlaps(fig) == []
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert [lab.split(" s")[0] for lab in labels] == [f"{t:.3g}" for t in sweep.step_time_s]
    word = "OOM" if not sweep.fits.any() else "%"
    assert all(word in lab for lab in labels)


def test_explorer_bar_of_pure_dp_fits():
    cl = Cluster.from_catalog("DGX_H100", 32, inter_fabric="100GbE")
    p = predict(Workload(catalog.model_preset("Llama-3-70B")), cl, Layout(256, 1, 1, 1))
    fig = plots.breakdown_plot(pd.DataFrame([{"layout": "DP256 TP1 PP1", **p.row()}]), "layout")
    assert _inside(fig) == ([], [])
    assert text_overlaps(fig) == []
    assert fig.axes[0].get_ylim()[1] == pytest.approx(p.step_time_s * (1 + plots.HEADROOM))


def test_layout_search_bars_fit_the_axis():
    work = Workload(catalog.model_preset("Llama-3-8B"), 256, seq_len=2048)
    found = layouts.search(work, Cluster.from_catalog("DGX_H100", 4, inter_fabric="100GbE"))
    fig = plots.layout_search_plot(found)
    assert _inside(fig) == ([], [])
    assert text_overlaps(fig) == []
