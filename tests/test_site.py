"""The preview website, opened in headless Chromium: every page loads, shows its figures, renders
its widgets and formulas, and loads nothing from the internet. A screenshot of each notebook page
is kept in test-artifacts/ (git-ignored)."""

from __future__ import annotations

import functools
import http.server
import re
import threading
from pathlib import Path

import nbformat
import pytest

from labkit.book.site import MARKER, build_preview, quarto_available
from labkit.cli import main
from labkit.errors import UsageError
from labkit.explorer import MARK

from ._browser import (
    CHROMIUM_ARGS,
    block_offsite,
    browser_executable,
    move_explorers,
    page_audit,
)
from ._notebook_runs import NOTEBOOKS, executed_dir, run

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def classes(dom: str, name: str) -> int:
    """How many elements carry class ``name`` (not CSS text that mentions it)."""
    return len(re.findall(r'class="[^"]*\b' + re.escape(name) + r'\b[^"]*"', dom))


@pytest.fixture
def server(tmp_path):
    holder = {}

    def serve(folder):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        holder["httpd"] = httpd
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    if "httpd" in holder:
        holder["httpd"].shutdown()
        holder["httpd"].server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_refuses_a_folder_it_did_not_make(tmp_path):
    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), executed / "01_x.ipynb")
    foreign = tmp_path / "site"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    with pytest.raises(UsageError, match="not made by labkit site"):
        build_preview(executed, foreign)
    assert (foreign / "mine.txt").read_text() == "keep"
    with pytest.raises(UsageError, match="npm ci"):
        build_preview(executed, tmp_path / "new", node_modules=tmp_path / "no_node_modules")
    assert not (tmp_path / "new").exists()


def test_site_without_executed_notebooks(tmp_path, capsys):
    assert main(["site", "--preview", "--executed", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    assert "labkit lab" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.browser
def test_preview_site_in_chromium(tmp_path, server):
    pytest.importorskip("playwright", reason="Playwright is in the dev extra (make setup)")
    runs = {p.name: run(p) for p in NOTEBOOKS}  # executed once per session (test_notebooks)
    made = tmp_path / "made.html"
    made.write_text("<html><body>the run's report</body></html>")
    index = build_preview(executed_dir(), tmp_path / "site", report=made)
    site = index.parent
    assert (site / "report.html").read_text() == made.read_text()
    assert '<a href="report.html">report.html</a>' in index.read_text()
    assert (site / MARKER).exists()
    for page in site.glob("*.html"):  # offline: no script, style or font from a CDN
        text = page.read_text()
        assert not re.search(r'(src|href)="https?://', text.split("<body", 1)[0]), page.name
    pages = ["index.html"] + [f"{p.stem}.html" for p in NOTEBOOKS if runs[p.name]["ok"]]
    # one browser for every page: each page is read as rendered (its DOM once MathJax and the
    # widget manager are done), photographed and audited as a reader meets it
    # where Quarto is installed, test_quarto audits every page of the Quarto site with every
    # axe rule; the preview's own template and outputs are then contrast-checked on the front
    # page and the two pages that hold every kind of output (tables, widgets, explorers)
    full = (set(pages) if not quarto_available() else
            {"index.html", "07_pipeline_bubbles.html", "09_splitting_the_model.html"})
    doms, report = open_pages(server(site), pages, views={
        f"{p.stem}.html": _views(executed_dir() / p.name) for p in NOTEBOOKS if runs[p.name]["ok"]},
        contrast=full)

    dom = doms["index.html"]
    for p in NOTEBOOKS:
        assert f'href="{p.stem}.html"' in dom, f"index does not link {p.stem}"
    # each summary is Markdown rendered (bold, code, typeset math), cut only between sentences
    # or words
    summaries = re.findall(r'<p class="summary">(.*?)</p>', dom, re.S)
    assert len(summaries) == len(NOTEBOOKS), summaries
    for text in summaries:
        visible = re.sub(r"<[^>]+>", "", re.sub(r"<mjx-assistive-mml.*?</mjx-assistive-mml>|"
                                                r'<script type="math/[^"]*">.*?</script>', "",
                                                text, flags=re.S))
        assert "**" not in visible and "$" not in visible and "`" not in visible, text
        assert re.search(r"[.!?]\s*$|\w \u2026$", visible.strip()), f"cut mid-word: {visible!r}"
    assert classes(dom, "mjx-chtml") >= 1, "index: the summaries' formulas were not typeset"
    assert "<strong>" in dom
    # the front page's law table: each kind counted apart, as the executed notebooks stored them
    from labkit.book import laws

    gathered = laws.gather(executed_dir())
    assert len(gathered), "the executed notebooks stored no law rows"
    counts = re.search(r'<table class="law-counts">(.*?)</table>', dom, re.S)
    assert counts, "index: no table of law counts"
    for c in laws.counts(gathered):
        assert f"<td>{c['kind']}</td>" in counts.group(1)
        assert f"<td>{c['held']} of {c['laws']}</td>" in counts.group(1)

    for p in NOTEBOOKS:
        if not runs[p.name]["ok"]:
            continue  # reported by test_notebooks; checked below
        nb = nbformat.read(executed_dir() / p.name, as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        n_png = sum("image/png" in o.get("data", {}) for o in outputs)
        n_views = _views(executed_dir() / p.name)
        has_math = any("$" in c.source for c in nb.cells if c.cell_type == "markdown")
        dom = doms[f"{p.stem}.html"]
        assert 'class="labkit-nav"' in dom and "jp-Notebook" in dom, f"{p.stem}: page did not load"
        assert n_png >= 1, f"{p.stem}: the executed notebook has no figure"
        assert len(re.findall(r'<img[^>]+src="data:image/png', dom)) >= n_png, f"{p.stem}: figures missing"
        if n_views:
            state = nb.metadata.get("widgets", {}).get(
                "application/vnd.jupyter.widget-state+json", {}).get("state", {})
            assert state, f"{p.stem}: widget views but no saved widget state"
            # lm-Widget elements exist only once the html-manager has rendered a view
            assert classes(dom, "lm-Widget") >= n_views, f"{p.stem}: widgets did not render"
            models = {m.get("model_name", "") for m in state.values()}
            # an explorer's sliders are in the state, but its page version shows instead
            explorers = sum(MARK in "".join(o.get("data", {}).get("text/html", ""))
                            for o in outputs)
            if not explorers and any(m.endswith("SliderModel") for m in models):
                assert classes(dom, "widget-slider") >= 1, f"{p.stem}: sliders did not render"
            if not explorers and "DropdownModel" in models:
                assert classes(dom, "widget-dropdown") >= 1, f"{p.stem}: dropdowns did not render"
        if has_math:
            assert classes(dom, "mjx-chtml") >= 1, f"{p.stem}: MathJax did not typeset"
        assert (ARTIFACTS / f"{p.stem}.png").stat().st_size > 10_000

    from .test_quarto import check_audit

    assert not report["blocked"], f"pages asked the network for {sorted(set(report['blocked']))}"
    check_audit(report)
    failed = [r["error"] for r in runs.values() if not r["ok"]]
    assert not failed, "notebooks failed to execute:\n" + "\n".join(failed)


def _views(notebook: Path) -> int:
    """Widget views the page must render: every view output but an explorer's, which gives way
    to its page version (:mod:`labkit.explorer`)."""
    nb = nbformat.read(notebook, as_version=4)
    return sum(WIDGET_VIEW in o.get("data", {}) and MARK not in "".join(o["data"].get("text/html", ""))
               for c in nb.cells if c.cell_type == "code" for o in c.outputs)


# MathJax 2 typesets in its startup queue, after the page's load event: startup has posted
# "End" once that typeset is done, and an idle queue has run whatever the widgets queued since
MATHJAX_DONE = ("() => !window.MathJax || !MathJax.Hub || (MathJax.Hub.Startup.signal.posted"
                ".some(m => m === 'End') && !MathJax.Hub.queue.running && !MathJax.Hub.queue.pending)")


def open_pages(base: str, pages: list[str], *, views: dict,
               contrast: set | None = None) -> tuple[dict, dict]:
    """Every page as a reader meets it, in one browser with every request off the site refused:
    ({page: its DOM once MathJax has typeset and ``views[page]`` widgets have rendered},
    {"audit": :func:`tests._browser.page_audit` per page, "explorers": each explorer moved,
    "blocked": requests refused}). A screenshot of each notebook page goes to test-artifacts/.
    ``contrast``: the pages audited with axe's color-contrast rule too (None: every page)."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    doms, report = {}, {"audit": {}, "explorers": {}, "blocked": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_executable(), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 2400})
            block_offsite(ctx, base, report["blocked"])
            page = ctx.new_page()
            for rel in pages:
                page.goto(f"{base}/{rel}", wait_until="load")
                page.wait_for_function(MATHJAX_DONE, timeout=30_000)
                if views.get(rel):  # the html-manager renders each view after the page loads
                    page.wait_for_function(
                        "n => document.querySelectorAll('.lm-Widget').length >= n",
                        arg=views[rel], timeout=30_000)
                doms[rel] = page.content()
                if rel != "index.html":
                    page.screenshot(path=str(ARTIFACTS / rel.replace(".html", ".png")))
                report["audit"][rel] = page_audit(page, contrast=contrast is None
                                                  or rel in contrast)
                report["explorers"][rel] = move_explorers(page)
        finally:
            browser.close()
    return doms, report


FAKE_QUARTO = """#!/usr/bin/env python3
# stands in for Quarto: records what it was asked to render, writes an index page
import json, pathlib, sys, yaml
cfg = yaml.safe_load(pathlib.Path("_quarto.yml").read_text())
out = pathlib.Path(cfg["project"]["output-dir"]); out.mkdir(parents=True, exist_ok=True)
nbs = {p.name: json.loads(p.read_text()) for p in sorted(pathlib.Path("notebooks").glob("*.ipynb"))}
outputs = {k: sum(len(c.get("outputs", [])) for c in v["cells"]) for k, v in nbs.items()}
(out / "index.html").write_text(json.dumps({"argv": sys.argv[1:], "execute": cfg["execute"],
                                            "render": cfg["project"]["render"], "outputs": outputs}))
"""


def test_quarto_renders_the_executed_notebooks_without_executing_them(tmp_path, monkeypatch):
    """Where Quarto is installed, `labkit site` renders the executed copies (outputs kept) with
    execution off; a stand-in `quarto` on PATH records what it was given."""
    import json
    import os

    from labkit.book.notebooks import list_notebooks
    from labkit.book.site import build_site

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "quarto").write_text(FAKE_QUARTO.replace("python3", str(Path(os.sys.executable))))
    (bindir / "quarto").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    executed = tmp_path / "executed"
    executed.mkdir()
    for nb_path in list_notebooks():
        nb = nbformat.read(nb_path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell("1", outputs=[
            nbformat.v4.new_output("execute_result", {"text/plain": "1"}, execution_count=1)]))
        nbformat.write(nb, executed / nb_path.name)
    builder, index = build_site(executed, tmp_path / "site")
    assert builder == "quarto"
    seen = json.loads(index.read_text())
    assert seen["argv"] == ["render", "--no-execute"] and seen["execute"] == {"enabled": False}
    assert seen["render"][1:] == [f"notebooks/{p.name}" for p in list_notebooks()]
    assert all(n >= 1 for n in seen["outputs"].values())  # the executed copies, not the stored ones
    with pytest.raises(UsageError, match="labkit lab"):
        build_site(tmp_path / "nothing-here", tmp_path / "site")
