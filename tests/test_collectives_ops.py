"""Notebook 06's sweep beyond the all-reduce: the sentences on reduce-scatter (sharded data
parallelism) and all-to-all (experts) read off their regimes, their line laws, and the figure's
fit to the page column. All pure: nothing launches."""

from __future__ import annotations

import pytest

from labkit.collectives import formulas, regimes, verdicts
from labkit.collectives.regimes import find_regimes
from labkit.errors import UsageError
from tests.test_collectives_regimes import SIZES, floor_then_line

# -- reduce-scatter (FSDP / ZeRO) and all-to-all (experts) in notebook 06's default sweep --------

def _line(op, beta=1.2e9, alpha=1e-4):
    sizes = tuple(8 * 4 ** k for k in range(12))
    times = tuple(formulas.collective_time(op=op, ranks=2, size_bytes=s, alpha_s=alpha,
                                           beta_bytes_per_s=beta) for s in sizes)
    return find_regimes(op, 2, sizes=sizes, times=times)


def test_sharded_gradients_sentence_reads_both_sweeps_and_their_lines():
    ar, rs = _line("all_reduce"), _line("reduce_scatter")
    text = verdicts.sharded_gradients_sentence(rs, ar, grad_bytes=16.8e6)
    t_rs = formulas.collective_time(op="reduce_scatter", ranks=2, size_bytes=ar.sizes[-1],
                                    alpha_s=1e-4, beta_bytes_per_s=1.2e9)
    t_ar = formulas.collective_time(op="all_reduce", ranks=2, size_bytes=ar.sizes[-1],
                                    alpha_s=1e-4, beta_bytes_per_s=1.2e9)
    assert f"({t_rs / t_ar:.2g}x;" in text and "bandwidth regime" in text
    # a reduce-scatter twice as slow per byte shows as a larger ratio
    slow = verdicts.sharded_gradients_sentence(_line("reduce_scatter", beta=0.6e9), ar,
                                               grad_bytes=16.8e6)
    assert slow != text and "not swept" in verdicts.sharded_gradients_sentence(
        None, ar, grad_bytes=16.8e6)


def test_experts_sentence_prices_four_all_to_alls_per_layer():
    a2a = _line("all_to_all")
    text = verdicts.experts_sentence(a2a, tokens=512, experts_per_token=2, hidden_size=4096,
                                     bytes_per_value=2, layers=32)
    size = formulas.moe_all_to_all_bytes(tokens=512, experts_per_token=2, hidden_size=4096,
                                         bytes_per_value=2)
    one = a2a.time_s(size)
    assert f"{4 * 32 * one:.3g} s of a step" in text and "the sweep measured" in text
    beyond = verdicts.experts_sentence(a2a, tokens=1 << 16, experts_per_token=2,
                                       hidden_size=4096, bytes_per_value=2, layers=32)
    assert "beyond the sweep" in beyond
    flat = find_regimes("all_to_all", 2, sizes=(8, 64, 512), times=(4e-4, 4.1e-4, 4e-4))
    assert "no α–β line" in verdicts.experts_sentence(flat, tokens=512, experts_per_token=2,
                                                     hidden_size=4096, bytes_per_value=2,
                                                     layers=32)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_to_all"])
def test_new_default_ops_have_their_line_law(op):
    row = verdicts.line_law(_line(op))
    assert row["kind"] == "model" and row["holds"] and op in row["law"]


# -- the figures ----------------------------------------------------------------------------

def _swept_rows():
    """Rows of the notebook's default sweep for every op, fitted, with busy all-reduces."""
    rows = []
    for k, op in enumerate(formulas.OPS):
        for s, t in zip(SIZES, floor_then_line(alpha=(1 + k) * 1e-4)):
            rows.append({"op": op, "world_size": 2, "dtype": "float32", "size_bytes": s,
                         "time_p50_s": t, "time_p10_s": 0.8 * t, "time_p90_s": 2 * t,
                         "algbw_gb_per_s": s / t / 1e9,
                         "busbw_gb_per_s": formulas.busbw_gb_per_s(op=op, ranks=2, size_bytes=s,
                                                                   time_s=t),
                         "busy_time_p50_s": 3 * t if op == "all_reduce" else None})
    return regimes.add_fit(rows)


@pytest.mark.parametrize("panels", [("busbw",), ("time",), ("busbw", "time")])
def test_the_figure_fits_the_page_column_with_readable_legends(panels):
    """A panel is the website's column wide (780 px at the 120 dpi it is saved at), so its
    text is shown at its own size: legends of at least 8 pt, one entry per op and per line
    style (not per pair), and no text over another."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkit.collectives import plots
    from labkit.figures import text_overlaps

    fig = plots.busbw_vs_size(pd.DataFrame(_swept_rows()), panels=panels)
    try:
        assert fig.get_size_inches()[0] * 120 <= 780
        axes = [ax for ax in fig.axes if ax.has_data()]
        assert len(axes) == len(panels)
        for ax in axes:
            texts = ax.get_legend().get_texts()
            assert all(t.get_fontsize() >= 8 for t in texts)
            assert len(texts) <= len(formulas.OPS) + 6
            assert sum(t.get_text().startswith("all_reduce N=2") for t in texts) == 1
        assert text_overlaps(fig) == []
    finally:
        plt.close(fig)
    with pytest.raises(UsageError, match="panels must be some of busbw, time"):
        plots.busbw_vs_size(pd.DataFrame(_swept_rows()), panels=("legend",))
