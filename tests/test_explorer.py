"""Page explorers (labkit.explorer): every setting's readout computed in Python, looked up in
the browser; the lab's four explorers built on it; the site keeps the page version."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

from labkit.errors import UsageError
from labkit.explorer import MARK, WIDGET_MIME, Control, Live, page_html, readouts, web_outputs


def _table(page: str) -> list[str]:
    data = re.search(r'atob\("([A-Za-z0-9+/=]+)"\)', page).group(1)
    return json.loads(gzip.decompress(base64.b64decode(data)))


def test_every_setting_is_computed_in_grid_order_and_starts_where_asked():
    cs = [Control("a", "first a", (1, 2, 3), 2), Control("op", "op", ("+", "*"), "*")]
    page = page_html(cs, lambda a, op: f"{a}{op}3", title="t")
    table = _table(page)
    assert table == ["1+3", "1*3", "2+3", "2*3", "3+3", "3*3"]
    # the readout shown before any script runs is the starting setting's
    assert re.search(r'role="status"[^>]*>2\*3<', page)
    # a slider for numbers, a menu for words, each with its label
    assert '<input type="range"' in page and "<select" in page
    ids = re.findall(r'id="(lx-[0-9a-f]+-\d)"', page)
    assert len(ids) == 2 and all(f'<label for="{i}">' in page for i in ids)
    assert MARK in page and "http" not in page  # nothing fetched from anywhere


def test_a_slider_starts_at_the_nearest_value_and_a_menu_refuses_an_unknown_one():
    assert Control("f", "f", (0.0, 0.1, 0.2), 0.13).start() == 1
    with pytest.raises(UsageError, match="not one of"):
        Control("m", "model", ("a", "b"), "c").start()


def test_an_invalid_setting_reads_as_its_reason_and_a_huge_grid_is_refused():
    def readout(n):
        if n == 0:
            raise UsageError("n must be positive")
        return str(n)
    assert readouts([Control("n", "n", (0, 1))], readout) == [
        "<b>not a valid setting:</b> n must be positive", "1"]
    with pytest.raises(UsageError, match="fewer values"):
        readouts([Control("a", "a", tuple(range(200))), Control("b", "b", tuple(range(200)))],
                 str)


class _Widget:
    def _repr_mimebundle_(self, **kwargs):
        return {"text/plain": "VBox()", WIDGET_MIME: {"model_id": "abc", "version_major": 2}}


def test_live_holds_both_and_the_site_keeps_the_page_version():
    live = Live(_Widget(), "<div data-labkit-explorer='x'>page</div>")
    bundle = live._repr_mimebundle_()
    assert set(bundle) == {"text/plain", WIDGET_MIME, "text/html"}
    other = {"data": {WIDGET_MIME: {"model_id": "y"}, "text/plain": "a plain widget"}}
    nb = {"cells": [{"cell_type": "code", "outputs": [{"data": dict(bundle)}, other]}]}
    assert web_outputs(nb) == 1
    kept, untouched = nb["cells"][0]["outputs"]
    assert set(kept["data"]) == {"text/html"}
    assert WIDGET_MIME in untouched["data"]  # a widget with no page version stays a widget


@pytest.mark.parametrize("build", ["speedup", "pipeline", "fsdp", "perfmodel"])
def test_the_lab_explorers_answer_like_their_python_readouts(build):
    if build == "speedup":
        from labkit.speedup.widgets import page_explorer, readout
        page, want = page_explorer(0.1, 8), readout(0.1, 8)
    elif build == "pipeline":
        from labkit.pipeline.widgets import describe, page_explorer
        page, want = page_explorer(4, 8, 2, "1f1b"), describe("1f1b", 4, 8, 1)
    elif build == "fsdp":
        from labkit.fsdp.widgets import activations, breakdown, page_explorer, readout
        from labkit.perfmodel.catalog import model_preset
        page = page_explorer("Llama-3-8B", dp=8, tp=1, micro_batch=1, seq_len=4096)
        want = readout(breakdown(params=model_preset("Llama-3-8B").params, dp=8, tp=1,
                                 activation_bytes=activations("Llama-3-8B", dp=8, tp=1,
                                                              micro_batch=1, seq_len=4096)),
                       80.0)
    else:
        from labkit.perfmodel.catalog import model_preset
        from labkit.perfmodel.model import Cluster, Layout, Workload, predict
        from labkit.perfmodel.widgets import page_explorer, readout
        page = page_explorer()
        cl = Cluster.from_catalog("DGX_H100", 32, inter_fabric="IB_NDR")
        want = readout(predict(Workload(model_preset("Llama-3-70B"), 256), cl,
                               Layout(8, 8, 4, 32)), cl)
    shown = re.search(r'role="status" aria-live="polite">(.*?)</div>(?:<img|<p><small>)', page,
                      re.S).group(1)
    assert shown == want
    assert want in _table(page)
    assert len(page) < 250_000, "a page explorer should stay small"


def test_a_figure_shown_in_ipython_carries_its_alt_text_onto_the_page():
    from IPython.core.interactiveshell import InteractiveShell

    from labkit.figures import alt_outputs, alt_text, new_figure

    ip = InteractiveShell.instance()
    fig, axes = new_figure()
    axes[0][0].bar(["1 rank", "2 ranks"], [3.0, 1.7], label="step")
    axes[0][0].set(ylabel="ms per step", title="where the time goes")
    data, meta = ip.display_formatter.format(fig)
    alt = meta["image/png"]["alt"]
    assert alt == alt_text(fig) and "2 bars, the tallest 3" in alt and "ms per step" in alt
    cell = {"cell_type": "code", "source": '#| fig-alt: "Bars of the step."\nfig',
            "outputs": [{"output_type": "display_data", "data": data, "metadata": meta}]}
    assert alt_outputs({"cells": [cell]}) == 1
    shown = cell["outputs"][0]["data"]["text/html"]
    assert shown.startswith('<img src="data:image/png;base64,')
    assert 'alt="Bars of the step. Figure of 1 panel.' in shown


def test_a_frame_on_a_page_has_units_no_nan_no_index_and_full_names():
    import pandas as pd

    from labkit.tables import frame_html

    law = "step at the model's best M, gpipe P=2: the measured step at the chosen M"
    df = pd.DataFrame({"law": [law, "b"], "step_time_s": [0.0123, float("nan")],
                       "size_bytes": [2 << 20, 4 << 20], "blocks": [[1, 2], [3]]})
    page = frame_html(df)
    assert "<th scope=\"col\">step time (ms)</th>" in page and "size (MiB)" in page
    assert ">12.3<" in page and ">–<" in page and "nan" not in page.lower()
    assert law.replace("'", "&#x27;") in page and "..." not in page
    assert ">2<" in page and ">4<" in page and "(2 items)" in page
    assert page.startswith('<div class="labkit-table" style="overflow-x:auto')


def test_in_ipython_every_frame_is_shown_by_the_table_helper():
    import pandas as pd
    from IPython.core.interactiveshell import InteractiveShell

    from labkit.tables import show_frames_readably

    ip = InteractiveShell.instance()
    show_frames_readably()
    data, _ = ip.display_formatter.format(pd.DataFrame({"step_time_s": [0.5]}))
    assert data["text/html"].startswith('<div class="labkit-table"')
    assert "step time (ms)" in data["text/html"] and ">500<" in data["text/html"]
