"""The Quarto website with real Quarto (skipped, with the reason, where `quarto` is not on PATH;
.ci/run installs it): built once per session from the executed notebooks the notebook tests
share, then opened page by page in headless Chromium from a local server with every request
that leaves 127.0.0.1 failed on purpose. Formulas must be typeset, widget views rendered,
figures loaded, the sidebar, page navigation and search must work. Bad input for `labkit site`
(no executed notebooks, Quarto failing on a page, a folder it did not make) is one clear line,
with the previous site left whole. Screenshots of each page go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest

from labkit.book.notebooks import REPO_ROOT, list_notebooks
from labkit.book.offline import QUARTO_LIBS
from labkit.book.site import FRONT_FIGURE, MARKER, quarto_available, render_quarto
from labkit.cli import main
from labkit.explorer import MARK
from tests._browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    block_offsite,
    browser_executable,
    move_explorers,
    page_audit,
)

from ._notebook_runs import NOTEBOOKS, executed_dir, run

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

_skip_without_quarto = pytest.mark.skipif(
    not quarto_available(),
    reason="needs Quarto on PATH (.ci/run installs it from ../shared/tools/quarto; elsewhere "
           "`pip install quarto-cli` or Quarto's installer)")


def needs_quarto(test):
    """Marked `quarto`; skipped, saying why, where `quarto` is not on PATH (never passed)."""
    return pytest.mark.quarto(_skip_without_quarto(test))


@pytest.fixture(scope="session")
def quarto_site():
    """(site folder, execute() rows): the Quarto site of the session's executed notebooks."""
    runs = {p.name: run(p) for p in NOTEBOOKS}  # executed once per session (test_notebooks)
    folder = Path(tempfile.mkdtemp(prefix="labkit-quarto-site-"))
    t0 = time.perf_counter()
    index = render_quarto(executed_dir(), folder / "site", echo=False)
    print(f"quarto site rendered in {time.perf_counter() - t0:.1f} s")
    yield index.parent, runs
    shutil.rmtree(folder, ignore_errors=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(folder) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_quarto_project_lists_every_tutorial_in_order():
    """`quarto render` at the root uses _quarto.yml as it is: it must name every tutorial (labkit
    site adds any it lacks to its staged copy), and the front page must link each."""
    import yaml

    config = yaml.safe_load((REPO_ROOT / "_quarto.yml").read_text())
    tutorials = [f"notebooks/{p.name}" for p in list_notebooks()]
    assert config["project"]["render"] == ["index.qmd", *tutorials]
    sections = [s for s in config["website"]["sidebar"]["contents"] if s.get("section") == "Tutorials"]
    assert sections and sections[0]["contents"] == tutorials
    front = (REPO_ROOT / "index.qmd").read_text()
    assert [t for t in tutorials if f"]({t})" not in front] == [], "index.qmd does not link these"


def test_make_offline_points_cdn_scripts_at_local_copies_and_refuses_unknown_ones(tmp_path):
    """What Quarto 1.7 loads from CDNs becomes the site's own copy (relative to each page);
    a script from anywhere else is an error naming the page and the URL."""
    from labkit.book.offline import make_offline
    from labkit.errors import LabkitError

    site = tmp_path / "site"
    (site / "notebooks").mkdir(parents=True)
    head = ('<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js" '
            'integrity="sha512-x" crossorigin="anonymous"></script>\n'
            '<script src="https://unpkg.com/@jupyter-widgets/html-manager@*/dist/embed-amd.js" '
            'crossorigin="anonymous"></script>\n'
            '<script src="https://cdnjs.cloudflare.com/polyfill/v3/polyfill.min.js?features=es6">'
            '</script>\n<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml-full.js" '
            'type="text/javascript"></script>\n')
    page = site / "notebooks" / "p.html"
    page.write_text(f"<html><head>{head}</head><body><a href='https://example.org'>x</a></body>")
    assert make_offline(site) == ["notebooks/p.html"]
    text = page.read_text()
    assert re.findall(r'src="([^"]+)"', text) == [
        "../site_libs/labkit/require.js", "../site_libs/labkit/html-manager/embed-amd.js",
        "../site_libs/labkit/mathjax-widgets.js", "../site_libs/labkit/mathjax/tex-chtml-full.js"]
    assert "href='https://example.org'" in text  # a link is not a download
    for src in re.findall(r'src="\.\./([^"]+)"', text):
        assert (site / src).is_file(), src
    page.write_text('<html><head><script src="https://cdn.example.org/x.js"></script></head></html>')
    with pytest.raises(LabkitError, match=r"notebooks/p\.html loads https://cdn\.example\.org/x\.js"):
        make_offline(site)


def test_widget_state_is_restored_from_the_executed_notebook(tmp_path):
    """Quarto's post-processing rewrites HTML inside widget-state strings (raw newlines: not
    JSON); labkit site puts the notebook's own state back, escaped for <script>."""
    import json

    from labkit.book.offline import WIDGET_STATE_MIME, restore_widget_state
    from labkit.errors import LabkitError

    state = {"state": {"m1": {"model_name": "HTMLModel", "state": {"value": "<table>\n<tr></tr></table>"}}},
             "version_major": 2, "version_minor": 0}
    executed = tmp_path / "executed"
    executed.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {WIDGET_STATE_MIME: state}
    nbformat.write(nb, executed / "01_x.ipynb")
    site = tmp_path / "site" / "notebooks"
    site.mkdir(parents=True)
    mangled = '{"state": {"m1": {"state": {"value": "<table class="x">\n</table>"}}}}'
    page = site / "01_x.html"
    page.write_text(f'<body><script type="{WIDGET_STATE_MIME}">\n{mangled}\n</script></body>')
    assert restore_widget_state(site.parent, executed) == ["notebooks/01_x.html"]
    body = re.search(r'json">(.*)</script>', page.read_text(), re.S).group(1)
    assert json.loads(body) == state and "<" not in body
    (site / "02_y.html").write_text(f'<script type="{WIDGET_STATE_MIME}">{mangled}</script>')
    with pytest.raises(LabkitError, match=r"notebooks/02_y\.html"):  # no notebook to restore from
        restore_widget_state(site.parent, executed)


# --- bad input -------------------------------------------------------------------------------

def test_site_refuses_missing_notebooks_and_foreign_folders(tmp_path, capsys):
    """With or without Quarto: one line naming the cause, nothing touched."""
    out = tmp_path / "site"
    assert main(["site", "--executed", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no executed notebooks" in err[0] and "labkit lab" in err[0], err
    assert not out.exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["site", "--executed", str(tmp_path / "none"), "--out", str(foreign)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not made by labkit site" in err[0] and str(foreign) in err[0], err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


@needs_quarto
def test_quarto_failing_on_one_page_names_it_and_keeps_the_previous_site(tmp_path, capsys):
    """Quarto stops on a page (here a cell option that is not YAML): the error names the page and
    Quarto's reason in one line, and the site from before is still there, whole."""
    executed = tmp_path / "executed"
    executed.mkdir()
    for p in list_notebooks():  # stored notebooks are enough: Quarto fails before any output
        shutil.copy2(p, executed / p.name)
    bad = executed / "01_getting_started.ipynb"
    nb = nbformat.read(bad, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell("#| fig-cap: [not closed\n1 + 1"))
    nbformat.write(nb, bad)
    out = tmp_path / "site"
    out.mkdir()
    (out / MARKER).write_text("")
    (out / "index.html").write_text("the previous site")
    assert main(["site", "--executed", str(executed), "--out", str(out)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("labkit site: failed: quarto render failed on "
                           "notebooks/01_getting_started.ipynb: "), last
    assert "YAML" in last and "left as it was" in last, last
    assert (out / "index.html").read_text() == "the previous site"
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "index.html"])
    assert not list(tmp_path.glob(".site.*")), "a temporary site folder was left behind"


# --- the site --------------------------------------------------------------------------------

@pytest.mark.slow
@needs_quarto
def test_quarto_front_page_and_offline_files(quarto_site):
    site, _ = quarto_site
    assert (site / MARKER).exists()
    index = (site / "index.html").read_text()
    main_part = index.split('id="quarto-document-content"', 1)[1]
    for p in NOTEBOOKS:  # every tutorial linked, with a one-line summary after the link
        m = re.search(rf'<li><a href="\./notebooks/{p.stem}\.html">[^<]+</a>(.*?)</li>', main_part,
                      re.S)
        assert m, f"the front page does not link {p.stem}"
        assert len(re.sub(r"<[^>]+>", "", m.group(1)).strip()) > 20, f"{p.stem}: no summary"
        assert "**" not in m.group(1) and "$" not in m.group(1), f"{p.stem}: raw Markdown"
    text = " ".join(re.sub(r"<[^>]+>", "", main_part).split())
    assert "make lab" in text and "make test" in text and "What the lab measures" in text
    assert f'src="{FRONT_FIGURE}"' in main_part and "labkit lab" in main_part
    assert (site / FRONT_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # offline: every page's scripts and styles are the site's own
    for page in site.rglob("*.html"):
        head = page.read_text().split("<body", 1)[0]
        assert not re.search(r'<(script|link)\b[^>]*(src|href)="(https?:)?//', head), page
    for needed in ("require.js", "jquery.min.js", "html-manager/embed-amd.js",
                   "mathjax/tex-chtml-full.js", "mathjax-widgets.js"):
        assert (site / QUARTO_LIBS / needed).is_file(), needed


def _open(page, url: str) -> dict:
    """Load a page; wait for MathJax and the widget manager; what the DOM then holds."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, wait_until="load")
    try:
        page.wait_for_function("() => !document.querySelector('span.math') || (window.MathJax"
                               " && MathJax.startup && MathJax.startup.promise)", timeout=30_000)
    except PlaywrightTimeout:
        pytest.fail(f"{url}: MathJax did not start in 30 s")
    page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    views = page.locator(f'script[type="{WIDGET_VIEW}"]').count()
    rendered = "() => document.querySelectorAll('.jupyter-widgets.lm-Widget').length"
    if views:  # the manager puts a rendered view after each view script
        try:
            page.wait_for_function(f"n => ({rendered})() >= n", arg=views, timeout=30_000)
        except PlaywrightTimeout:
            pytest.fail(f"{url}: {page.evaluate(rendered)} widgets rendered for {views} "
                        "views in 30 s")
    return page.evaluate("""() => ({
        math: document.querySelectorAll('span.math').length,
        typeset: document.querySelectorAll('span.math mjx-container').length,
        raw: /\\\\\\(|\\\\\\[/.test(document.querySelector('main').innerText),
        widgets: document.querySelectorAll('.jupyter-widgets.lm-Widget').length,
        sliders: document.querySelectorAll('.widget-slider').length,
        images: [...document.querySelectorAll('main img')].map(i => [i.src, i.naturalWidth]),
        sidebar: [...document.querySelectorAll('#quarto-sidebar a.sidebar-link[href]')]
                     .map(a => a.getAttribute('href')),
    })""") | {"views": views}


def check_audit(report: dict) -> None:
    """Every page: no MathJax error, alt text on every image, no serious or critical axe-core
    violation, no sideways scrolling; every explorer's readout changed when it was moved."""
    bad = {rel: {k: v for k, v in a.items() if v} for rel, a in report["audit"].items()}
    bad = {rel: a for rel, a in bad.items() if a}
    assert not bad, "pages a reader cannot fully use:\n" + "\n".join(
        f"{rel}: {a}" for rel, a in bad.items())
    for rel, moved in report["explorers"].items():
        for title, before, after in moved:
            assert after != before, f"{rel}: moving {title} did not change its readout"
    assert sum(map(len, report["explorers"].values())) >= 4, report["explorers"]


def check_site_in_chromium(site: Path, executed: Path, base: str) -> dict:
    """Every page of the Quarto ``site`` (served at ``base``) in Chromium, offline; then
    navigation and search. Asserts as it goes; returns what was blocked, missing or raised."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    report = {"blocked": [], "failed": [], "errors": [], "pages": {}, "audit": {},
              "explorers": {}}
    pages = ["index.html"] + [f"notebooks/{p.stem}.html" for p in list_notebooks(executed)]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_executable(), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 1000})
            block_offsite(ctx, base, report["blocked"])
            page = ctx.new_page()
            page.on("pageerror", lambda e: report["errors"].append(f"{page.url}: {e}"))
            page.on("response", lambda r: report["failed"].append(f"{r.status} {r.url}")
                    if r.status >= 400 else None)
            for rel in pages:
                seen = report["pages"][rel] = _open(page, f"{base}/{rel}")
                if rel == "index.html":
                    has_math, n_views, n_png = True, 0, 1
                else:
                    nb = nbformat.read(executed / Path(rel).with_suffix(".ipynb").name, as_version=4)
                    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
                    # an explorer's widget gives way to its page version (labkit.explorer)
                    n_views = sum(WIDGET_VIEW in o.get("data", {})
                                  and MARK not in "".join(o["data"].get("text/html", ""))
                                  for o in outputs)
                    n_png = sum("image/png" in o.get("data", {}) for o in outputs)
                    has_math = any("$" in c.source for c in nb.cells if c.cell_type == "markdown")
                if has_math:
                    assert seen["math"] >= 1, f"{rel}: no formula on the page"
                assert seen["typeset"] == seen["math"] and not seen["raw"], \
                    f"{rel}: formulas not typeset ({seen['typeset']} of {seen['math']})"
                assert seen["views"] == n_views, f"{rel}: {seen['views']} of {n_views} views"
                assert seen["widgets"] >= n_views, f"{rel}: widgets did not render"
                assert len(seen["images"]) >= n_png, f"{rel}: figures missing"
                assert all(w > 0 for _, w in seen["images"]), f"{rel}: an image did not load"
                assert len(seen["sidebar"]) == len(pages) - 1, f"{rel}: sidebar {seen['sidebar']}"
                report["audit"][rel] = page_audit(page)
                report["explorers"][rel] = move_explorers(page)
                # one screen: the first widget if the page has one (math is typeset around
                # it), else the top of the page
                if n_views:
                    page.locator(".jupyter-widgets.lm-Widget").first.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / f"quarto-{Path(rel).stem}.png"))

            # navigation: front page -> tutorial 02 (its link) -> next page -> sidebar -> home
            page.goto(f"{base}/index.html")
            page.locator("main ol a[href$='notebooks/02_speedup.html']").click()
            page.wait_for_url("**/notebooks/02_speedup.html")
            report["sliders_02"] = page.locator(
                "[data-labkit-explorer] input[type=range]").count()
            page.locator(".nav-page-next a").click()
            page.wait_for_url("**/notebooks/03_solve_scaling.html")
            page.locator("#quarto-sidebar a[href$='08_3d_parallelism.html']").click()
            page.wait_for_url("**/notebooks/08_3d_parallelism.html")
            page.locator("#quarto-header a.nav-link", has_text="Home").click()
            page.wait_for_url(re.compile(r"/(index\.html)?$"))
            assert "What the lab measures" in page.locator("main").inner_text()

            # search: the navbar's search finds notebook 02 by a word only it uses
            page.locator("#quarto-search button").first.click()
            box = page.locator("input.aa-Input")
            box.wait_for(timeout=10_000)
            box.fill("Gustafson")
            hit = page.locator(".aa-Item a[href*='02_speedup.html']")
            hit.first.wait_for(timeout=10_000)
            page.screenshot(path=str(ARTIFACTS / "quarto-search.png"))
            hit.first.click()
            page.wait_for_url("**/notebooks/02_speedup.html**")
        finally:
            browser.close()
    return report


@pytest.mark.slow
@pytest.mark.browser
@needs_quarto
def test_quarto_site_in_chromium_offline(quarto_site, serve):
    pytest.importorskip("playwright", reason="Playwright is in the dev extra (make setup)")
    site, runs = quarto_site
    report = check_site_in_chromium(site, executed_dir(), serve(site))
    assert not report["blocked"], f"pages asked the network for {sorted(set(report['blocked']))}"
    assert not report["failed"], f"missing files: {report['failed']}"
    assert not report["errors"], f"page errors: {report['errors']}"
    if runs["02_speedup.ipynb"]["ok"]:
        assert report["sliders_02"] >= 2, "notebook 02: the Amdahl sliders did not render"
    check_audit(report)
    failed_runs = [r["error"] for r in runs.values() if not r["ok"]]
    assert not failed_runs, "notebooks failed to execute:\n" + "\n".join(failed_runs)
