"""Host side: the website of the executed notebooks (``labkit site``).

Two builders, both of which work offline (no script, style, font or formula renderer from a CDN):

* **Quarto**, when ``quarto`` is on PATH: ``quarto render`` of the project in ``_quarto.yml``
  (front page ``index.qmd``, tutorials in order, sidebar, search) over the executed notebooks,
  nothing re-executed, into ``_site/``. Quarto's pages load MathJax 3, require.js, jQuery and the
  widget manager from CDNs; :func:`labkit.book.offline.make_offline` points them at local copies in
  ``site_libs/labkit/`` and refuses a page that still loads anything else from the network.
* **Preview**, everywhere else: nbconvert's ``lab`` HTML of every executed notebook plus an index
  page in tutorial order, into ``_preview/``. Widgets render from the state papermill saved in the
  notebook, through ``@jupyter-widgets/html-manager`` and ``require.js``; formulas through
  MathJax 2 (what nbconvert's template configures). All are copied from ``node_modules/``
  (``npm ci``) into ``vendor/`` of the site.

Both build in a temporary folder and swap it in at the end, so a failure leaves the previous
site whole, and both refuse to replace a folder they did not make.

Open ``_site/index.html`` or ``_preview/index.html`` directly, or serve the folder:
``python -m http.server -d _site``.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.book import a11y, front
from labkit.book.notebooks import REPO_ROOT, list_notebooks
from labkit.book.offline import (
    NODE_MODULES,
    check_node_modules,
    copy_vendor,
    make_offline,
    restore_widget_state,
)
from labkit.errors import LabkitError, UsageError
from labkit.explorer import web_outputs
from labkit.figures import alt_outputs

MARKER = ".labkit-site"
WIDGET_RENDERER = "vendor/html-manager/embed-amd.js"
REQUIRE_JS = "vendor/require.js"
MATHJAX = "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"

_STYLE = """
.labkit-nav { font: 14px/1.4 system-ui, sans-serif; padding: 8px 16px; background: #f3f4f6;
  border-bottom: 1px solid #ddd; display: flex; gap: 16px; }
.labkit-nav a { color: #1d4ed8; text-decoration: none; }
.labkit-nav .spacer { flex: 1; }
/* nbconvert's light theme draws prompts and some code tokens below WCAG's 4.5:1 contrast */
.jp-InputPrompt, .jp-OutputPrompt { color: #595959 !important; opacity: 1 !important; }
.highlight .c, .highlight .c1, .highlight .cm, .highlight .ch { color: #2f5f5f !important; }
.highlight .mf, .highlight .mi, .highlight .m, .highlight .il { color: #006100 !important; }
.highlight .ow, .highlight .o { color: #7a1fb8 !important; }
/* a link in running text is told apart by more than its colour */
.jp-RenderedHTMLCommon a, .jp-RenderedMarkdown a, .jp-OutputArea a { text-decoration: underline !important; }
"""

# MathJax 2 on the preview's index page, with the inline delimiters of nbconvert's pages
_INDEX_MATHJAX = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({tex2jax: {inlineMath: [['$','$'], ['\\\\(','\\\\)']], processEscapes: true},
                    messageStyle: "none"});
</script>
<script src="{src}"></script>"""

# front page of the Quarto site: the figure shown there, taken from this executed notebook
FRONT_FIGURE_NOTEBOOK = "02_speedup.ipynb"
FRONT_FIGURE = "lab-figure.png"


def quarto_path() -> str | None:
    """``quarto`` on PATH, else beside this Python (``pip install quarto-cli`` in the venv, which
    `make lab` runs without activating), else None."""
    return shutil.which("quarto") or shutil.which("quarto", path=str(Path(sys.executable).parent))


def quarto_available() -> bool:
    return quarto_path() is not None


def notebook_title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


# spans a summary is never cut inside: inline math, code, bold/italic, links
_ATOMS = re.compile(r"\$[^$]+\$|`[^`]+`|\*\*[^*]+\*\*|\*[^*]+\*|\[[^\]]*\]\([^)]*\)")


def summary(nb, limit: int = 240) -> str:
    """The first sentence of the first paragraph of prose (Markdown, for the index pages).

    Cut only between words and never inside ``$math$``, ```code```, ``**bold**`` or a link, with
    an ellipsis when the sentence is longer than ``limit`` characters.

    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
    ...     "# T\\n\\nIt took $t_1$ on **one\\nrank**. Then more. And more."), ])
    >>> summary(nb)
    'It took $t_1$ on **one rank**.'
    >>> summary(nb, limit=15)
    'It took $t_1$ …'
    """
    text = ""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        paras = [p.strip() for p in cell.source.split("\n\n")]
        text = next((p for p in paras if p and not p.startswith(("#", "$$", "|", "```", "<"))), "")
        if text:
            break
    text = " ".join(text.split())
    # words, with every atom kept whole (an atom's spaces become \0 while splitting)
    text = _ATOMS.sub(lambda m: m.group(0).replace(" ", "\0"), text)
    out = []
    for tok in (t.replace("\0", " ") for t in text.split(" ") if t):
        if len(" ".join([*out, tok])) > limit - 2:  # room for " …"
            return " ".join(out).rstrip(",;:") + " …"
        out.append(tok)
        # a sentence ends at . ! ? (not after "e.g.", "vs." or a lone letter such as "N.")
        if tok[-1] in ".!?" and len(tok) > 2 and not tok.endswith(_ABBREVIATIONS):
            break
    return " ".join(out)


_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def markdown_inline(text: str) -> str:
    """Markdown to HTML for one line of an index page; math stays ``$...$`` for MathJax.

    >>> markdown_inline("took $t_1$ on **two** ranks")
    'took $t_1$ on <strong>two</strong> ranks'
    """
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    out = markdown2html_mistune(text).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", out, flags=re.S)


def _nav(pages: list[dict], i: int) -> str:
    links = ['<a href="index.html">Scaling Lab</a>', '<span class="spacer"></span>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1]["html"]}">&larr; {html.escape(pages[i - 1]["title"])}</a>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1]["html"]}">{html.escape(pages[i + 1]["title"])} &rarr;</a>')
    return f'<nav class="labkit-nav">{"".join(links)}</nav>'


def _index_html(pages: list[dict], built: str, laws_html: str = "") -> str:
    items = []
    for p in pages:
        status = ' <strong style="color:#b91c1c">(a cell failed)</strong>' if p["failed"] else ""
        took = f' <span style="color:#666">({p["duration_s"]:.0f} s to run)</span>' \
            if p["duration_s"] is not None else ""
        items.append(f'<li><a href="{p["html"]}">{html.escape(p["title"])}</a>{status}{took}'
                     f'<p class="summary">{markdown_inline(p["summary"])}</p></li>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Scaling Lab</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 50em; margin: 2em auto;
padding: 0 1em; }} li {{ margin-bottom: 1em; }} li p {{ margin: .2em 0; color: #333; }}</style>
{_INDEX_MATHJAX.replace("{src}", MATHJAX)}
</head><body>
<h1>Scaling Lab</h1>
<p>Measured parallel scaling on your own machine: speedup, efficiency and cost; a distributed
solve; data-parallel training; collectives; pipeline bubbles; 3-D parallelism. Each tutorial
states every formula next to a number computed in it. Preview build of the executed notebooks
({html.escape(built)}).</p>
{laws_html}
<h2>The tutorials</h2>
<ol class="tutorials">
{chr(10).join(items)}
</ol>
</body></html>
"""


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not (out_dir / MARKER).exists() and (
            not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} exists and was not made by labkit site; pick another --out "
                         "(or remove it)")


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` (ours, or absent) by the finished site in ``tmp``."""
    (tmp / MARKER).write_text("built by labkit site; replaced on the next build\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def build_preview(executed_dir, out_dir, *, node_modules: Path = NODE_MODULES,
                  report=None) -> Path:
    """Build the preview site from executed notebooks; returns the index page.

    The site is assembled in a temporary folder and swapped in at the end, so a failure leaves
    the previous site whole. An existing ``out_dir`` is replaced only if this function made it.
    """
    import nbformat
    from nbconvert import HTMLExporter

    executed_dir, out_dir = Path(executed_dir), Path(out_dir)
    notebooks = list_notebooks(executed_dir)
    if not notebooks:
        raise UsageError(f"{executed_dir}: no executed notebooks (NN_name.ipynb); "
                         "run `labkit lab` first")
    check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        copy_vendor(tmp, node_modules)
        exporter = HTMLExporter(template_name="lab", widget_renderer_url=WIDGET_RENDERER,
                                require_js_url=REQUIRE_JS, mathjax_url=MATHJAX)
        nbs = [nbformat.read(p, as_version=4) for p in notebooks]
        for nb in nbs:  # no kernel behind the page: the explorers' page versions
            web_outputs(nb)
            alt_outputs(nb)
        pages = []
        for path, nb in zip(notebooks, nbs):
            pm = nb.metadata.get("papermill", {})
            pages.append({"html": path.stem + ".html", "title": notebook_title(nb, path.stem),
                          "summary": summary(nb), "failed": bool(pm.get("exception")),
                          "duration_s": pm.get("duration")})
        for i, nb in enumerate(nbs):
            body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": pages[i]["title"]}})
            nav = _nav(pages, i)
            body = re.sub(r"(<body[^>]*>)", lambda m, nav=nav: m.group(1) + nav, body, count=1)
            body = a11y.page(body.replace("</head>", f"<style>{_STYLE}</style></head>", 1))
            (tmp / pages[i]["html"]).write_text(body, encoding="utf-8")
        from labkit.book import drift, laws

        name, link = _report_name(report), _report_link(report)
        link = link.replace(f"[{name}]({name})", f'<a href="{name}">{name}</a>')
        _copy_report(report, tmp)
        (tmp / "index.html").write_text(_index_html(pages, time.strftime("%Y-%m-%d %H:%M"),
                                                    (f"<p>{link}</p>" if link else "")
                                                    + front.preview_html(
                                                        laws.gather(executed_dir),
                                                        drift.of_run(executed_dir))),
                                        encoding="utf-8")
        _swap_in(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / "index.html"


def front_figure(executed_dir) -> tuple[bytes, str, str] | None:
    """(PNG, caption, alt text) of a figure from the executed lab for the front page, or None.

    The last figure of notebook 02 (the speedup measured live on this machine); if that notebook
    has none (it failed), the last figure of any other executed notebook. The caption says what
    the figure shows (its cell's ``#| fig-alt`` sentence) and where it comes from; the alt text
    is the one computed from the figure's data when it was drawn (:func:`labkit.figures.alt_text`).
    """
    import base64

    import nbformat

    executed_dir = Path(executed_dir)
    paths = list_notebooks(executed_dir)
    paths.sort(key=lambda p: p.name != FRONT_FIGURE_NOTEBOOK)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        found = [(c, o) for c in nb.cells if c.cell_type == "code"
                 for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        if found:
            cell, out = found[-1]
            said = re.search(r'^#\|\s*fig-alt:\s*"?(.*?)"?\s*$', cell.source, re.M)
            title = notebook_title(nb, path.stem).split(":")[0]
            what = f"{said.group(1)} " if said else ""
            caption = f"{what}From *{title}* ({path.stem}), as executed by `labkit lab` here."
            alt = (out.get("metadata", {}).get("image/png") or {}).get("alt") or caption
            return base64.b64decode(out["data"]["image/png"]), caption, alt
    return None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PAGE_LINE = re.compile(r"^\s*\[\s*\d+\s*/\s*\d+\s*\]\s+(\S.*?)\s*$")


def quarto_failure(output: str, returncode: int) -> str:
    """One line from ``quarto render``'s output: the page it was on and why it stopped.

    >>> quarto_failure("[1/8] index.qmd\\n[2/8] notebooks/01_a.ipynb\\nERROR: YAMLError: bad\\n", 1)
    'quarto render failed on notebooks/01_a.ipynb: ERROR: YAMLError: bad'
    """
    lines = [_ANSI.sub("", line).rstrip() for line in output.splitlines()]
    page = None
    for line in lines:
        m = _PAGE_LINE.match(line)
        if m:
            page = m.group(1)
    errors = [line.strip() for line in lines if re.match(r"\s*(ERROR|Error)\b", line)]
    reason = errors[0] if errors else next(
        (line.strip() for line in reversed(lines) if line.strip()), f"exit status {returncode}")
    where = f"on {page}" if page else "before its first page"
    return f"quarto render failed {where}: {reason[:300]}"


def tutorials_in_order(config: dict) -> list[str]:
    """Make a ``_quarto.yml`` config render and list (sidebar section "Tutorials") every
    ``notebooks/NN_name.ipynb`` in order, so a new tutorial is never left off the site; the list.

    >>> cfg = {"project": {"render": ["index.qmd", "notebooks/01_a.ipynb"]},
    ...        "website": {"sidebar": {"contents": [{"section": "Tutorials", "contents": []}]}}}
    >>> names = tutorials_in_order(cfg)
    >>> cfg["project"]["render"][:2], names == cfg["website"]["sidebar"]["contents"][0]["contents"]
    (['index.qmd', 'notebooks/01_getting_started.ipynb'], True)
    """
    tutorials = [f"notebooks/{p.name}" for p in list_notebooks()]
    project = config.setdefault("project", {})
    project["render"] = [r for r in project.get("render", [])
                         if not str(r).startswith("notebooks/")] + tutorials
    for section in config.get("website", {}).get("sidebar", {}).get("contents", []):
        if isinstance(section, dict) and section.get("section") == "Tutorials":
            section["contents"] = list(tutorials)
    return tutorials


def render_quarto(executed_dir, out_dir=None, *, node_modules: Path = NODE_MODULES,
                  echo: bool = True, report=None) -> Path:
    """Quarto website of the EXECUTED notebooks, without executing anything again; offline.

    The stored notebooks have no outputs, and running them again inside ``quarto render`` would
    repeat every experiment. So the project (``_quarto.yml``, ``index.qmd``) is staged in a
    temporary folder with the executed copies from ``executed_dir`` in place of
    ``notebooks/*.ipynb`` and ``execute: enabled: false`` (Quarto then renders the outputs papermill
    saved, widget state included), with a figure of the executed lab for the front page,
    rendered, made offline (:func:`make_offline`) and swapped into ``out_dir`` (default
    ``_site/``) only when all of that worked: a page Quarto fails on leaves the previous site
    whole, and the error names the page. Quarto's output goes to stderr when ``echo``.
    ``quarto render`` at the repository root still works on its own: it executes once and freezes.
    """
    import nbformat
    import yaml

    executed_dir = Path(executed_dir)
    out_dir = Path(out_dir or REPO_ROOT / "_site").resolve()
    config = yaml.safe_load((REPO_ROOT / "_quarto.yml").read_text())
    if not list_notebooks(executed_dir):
        raise UsageError(f"{executed_dir}: no executed notebooks (NN_name.ipynb); "
                         "run `labkit lab` first")
    missing = [nb.name for nb in list_notebooks() if not (executed_dir / nb.name).is_file()]
    if missing:
        raise UsageError(f"{executed_dir}: no executed {', '.join(missing)} (run `labkit lab` first)")
    check_out_dir(out_dir)
    check_node_modules(node_modules, quarto=True)
    quarto = quarto_path()
    if quarto is None:
        raise UsageError("quarto is not installed (pip install quarto-cli, or Quarto's "
                         "installer); `labkit site --preview` builds the preview instead")
    config.setdefault("execute", {})["enabled"] = False
    config["execute"].pop("freeze", None)
    config["project"]["output-dir"] = "_site"
    tutorials_in_order(config)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="labkit-quarto-") as stage:
        stage = Path(stage)
        (stage / "notebooks").mkdir()
        for nb in list_notebooks():
            page = nbformat.read(executed_dir / nb.name, as_version=4)
            web_outputs(page)  # no kernel behind the page: the explorers' page versions
            alt_outputs(page)
            nbformat.write(page, stage / "notebooks" / nb.name)
        for extra in ("index.qmd",):
            shutil.copy2(REPO_ROOT / extra, stage / extra)
        from labkit.book import drift, laws

        table = laws.gather(executed_dir)
        if len(table):  # what this run measured, in the front page's first screen
            head, sep, rest = (REPO_ROOT / "index.qmd").read_text().partition("\n---\n")
            link = _report_link(report)  # the file joins the site once both are made
            moved = drift.of_run(executed_dir)
            (stage / "index.qmd").write_text(head + sep + "\n" + front.quarto_markdown(table, moved)
                                             + ("\n" + link + "\n" if link else "")
                                             + "\n" + rest)
        figure = front_figure(executed_dir)
        if figure:
            (stage / FRONT_FIGURE).write_bytes(figure[0])
            alt = figure[2].replace('"', "'")
            with open(stage / "index.qmd", "a") as f:
                f.write(f'\n## Measured here\n\n![{figure[1]}]({FRONT_FIGURE}){{fig-alt="{alt}"}}\n')
        a11y.quarto(stage, config)
        (stage / "_quarto.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        proc = subprocess.Popen([quarto, "render", "--no-execute"], cwd=stage, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, errors="replace")
        output = []
        for line in proc.stdout:
            output.append(line)
            if echo:
                sys.stderr.write(line)
        if proc.wait() != 0:
            kept = (f"the previous site in {out_dir} is left as it was" if out_dir.exists()
                    else f"nothing was written to {out_dir}")
            raise LabkitError(f"{quarto_failure(''.join(output), proc.returncode)} ({kept})")
        rendered = stage / "_site"
        if not (rendered / "index.html").is_file():
            raise LabkitError(f"quarto render wrote no index.html (output: "
                              f"{''.join(output)[-300:].strip()})")
        restore_widget_state(rendered, executed_dir)
        make_offline(rendered, node_modules)
        _copy_report(report, rendered)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            shutil.copytree(rendered, tmp, dirs_exist_ok=True)
            _swap_in(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / "index.html"


def build_site(executed_dir, out_dir=None, *, preview: bool = False,
               report=None) -> tuple[str, Path]:
    """Quarto if it is installed (unless ``preview``), else the preview; (builder, index page).

    ``out_dir`` defaults to ``_site`` (Quarto) or ``_preview`` (preview); ``report``: the run's
    report (a PDF or an HTML file, ``labkit report``), copied in and linked from the front
    page."""
    if quarto_available() and not preview:
        return "quarto", render_quarto(executed_dir, out_dir or REPO_ROOT / "_site",
                                       report=report)
    return "preview", build_preview(executed_dir, out_dir or "_preview", report=report)


def _report_name(report) -> str:
    """The file name the run's report gets in the site ('' without one). ``report``: a path,
    or (a future of the path, its name) while it is still being made."""
    if report is None:
        return ""
    if isinstance(report, tuple):
        return report[1]
    return "report" + Path(report).suffix if Path(report).is_file() else ""


def _report_link(report) -> str:
    """The front page's sentence linking the run's report (Markdown; '' without one)."""
    name = _report_name(report)
    what = "PDF" if name.endswith(".pdf") else "HTML"
    return (f"This run as one document, for a report or a hand-in: [{name}]({name}) ({what})."
            if name else "")


def _copy_report(report, folder: Path) -> None:
    """Put the run's report into the built site (waiting for it if it is still being made)."""
    name = _report_name(report)
    if name:
        path = report[0].result() if isinstance(report, tuple) else report
        shutil.copy2(path, Path(folder) / name)
