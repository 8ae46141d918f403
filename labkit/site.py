"""Host side: the website of the executed notebooks (``labkit site``).

Two builders:

* **Quarto**, when ``quarto`` is on PATH: ``quarto render`` of the project in ``_quarto.yml``
  (tutorial order) over the executed notebooks, nothing re-executed, into ``_site/``.
* **Preview**, everywhere else: nbconvert's ``lab`` HTML of every executed notebook plus an index
  page in tutorial order, into ``_preview/``. Widgets render from the state papermill saved in the
  notebook, through ``@jupyter-widgets/html-manager`` and ``require.js``; formulas through
  MathJax 2. All three are copied from ``node_modules/`` (``npm ci``) into ``vendor/`` of the site,
  because nbconvert's default CDN URLs do not load offline, and a site that needs the internet
  to show a slider is not a preview.

Open ``_preview/index.html`` directly, or serve it: ``python -m http.server -d _preview``.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import UsageError
from .notebooks import REPO_ROOT, list_notebooks

NODE_MODULES = REPO_ROOT / "node_modules"
MARKER = ".labkit-site"
WIDGET_RENDERER = "vendor/html-manager/embed-amd.js"
REQUIRE_JS = "vendor/require.js"
MATHJAX = "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"

# (package folder, files or folders inside it) copied to vendor/<target>/...
_VENDOR = (
    ("requirejs", ("require.js",), ""),
    ("@jupyter-widgets/html-manager/dist", ("embed-amd.js", "*.woff2", "*.woff", "*.ttf", "*.eot",
                                            "*.svg"), "html-manager"),
    ("mathjax", ("MathJax.js", "config/TeX-AMS_CHTML-full.js", "config/Safe.js", "extensions/*.js",
                 "extensions/TeX", "extensions/HTML-CSS", "jax/input/TeX", "jax/output/CommonHTML",
                 "jax/element", "fonts/HTML-CSS/TeX/woff"), "mathjax"),
)

_STYLE = """
.labkit-nav { font: 14px/1.4 system-ui, sans-serif; padding: 8px 16px; background: #f3f4f6;
  border-bottom: 1px solid #ddd; display: flex; gap: 16px; }
.labkit-nav a { color: #1d4ed8; text-decoration: none; }
.labkit-nav .spacer { flex: 1; }
"""


def quarto_available() -> bool:
    return shutil.which("quarto") is not None


def copy_vendor(dest: Path, node_modules: Path = NODE_MODULES) -> None:
    for package, patterns, target in _VENDOR:
        src = node_modules / package
        if not src.is_dir():
            raise UsageError(f"{src} is missing: run `npm ci` in {REPO_ROOT} (the preview site "
                             "serves the widget renderer, require.js and MathJax from there)")
        for pattern in patterns:
            matches = sorted(src.glob(pattern))
            if not matches:
                raise UsageError(f"{src}: nothing matches {pattern} (run `npm ci` again)")
            for m in matches:
                out = dest / "vendor" / target / m.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                if m.is_dir():
                    shutil.copytree(m, out)
                else:
                    shutil.copy2(m, out)


def notebook_title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _summary(nb) -> str:
    """The first paragraph of prose after the title, for the index."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        paras = [p.strip() for p in cell.source.split("\n\n")]
        for p in paras:
            if p and not p.startswith("#"):
                return p.replace("\n", " ")[:300]
    return ""


def _nav(pages: list[dict], i: int) -> str:
    links = ['<a href="index.html">Scaling Lab</a>', '<span class="spacer"></span>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1]["html"]}">&larr; {html.escape(pages[i - 1]["title"])}</a>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1]["html"]}">{html.escape(pages[i + 1]["title"])} &rarr;</a>')
    return f'<nav class="labkit-nav">{"".join(links)}</nav>'


def _index_html(pages: list[dict], built: str) -> str:
    items = []
    for p in pages:
        status = ' <strong style="color:#b91c1c">(a cell failed)</strong>' if p["failed"] else ""
        took = f' <span style="color:#666">({p["duration_s"]:.0f} s to run)</span>' \
            if p["duration_s"] is not None else ""
        items.append(f'<li><a href="{p["html"]}">{html.escape(p["title"])}</a>{status}{took}'
                     f'<p>{html.escape(p["summary"])}</p></li>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Scaling Lab</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 50em; margin: 2em auto;
padding: 0 1em; }} li {{ margin-bottom: 1em; }} li p {{ margin: .2em 0; color: #333; }}</style>
</head><body>
<h1>Scaling Lab</h1>
<p>Measured parallel scaling on your own machine: speedup, efficiency and cost; a distributed
solve; data-parallel training; collectives; pipeline bubbles; 3-D parallelism. Each tutorial
states every formula next to a number computed in it. Preview build of the executed notebooks
({html.escape(built)}).</p>
<ol class="tutorials">
{chr(10).join(items)}
</ol></body></html>
"""


def build_preview(executed_dir, out_dir, *, node_modules: Path = NODE_MODULES) -> Path:
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
    if out_dir.exists() and not (out_dir / MARKER).exists() and any(out_dir.iterdir()):
        raise UsageError(f"{out_dir} exists and was not made by labkit site; pick another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        copy_vendor(tmp, node_modules)
        exporter = HTMLExporter(template_name="lab", widget_renderer_url=WIDGET_RENDERER,
                                require_js_url=REQUIRE_JS, mathjax_url=MATHJAX)
        nbs = [nbformat.read(p, as_version=4) for p in notebooks]
        pages = []
        for path, nb in zip(notebooks, nbs):
            pm = nb.metadata.get("papermill", {})
            pages.append({"html": path.stem + ".html", "title": notebook_title(nb, path.stem),
                          "summary": _summary(nb), "failed": bool(pm.get("exception")),
                          "duration_s": pm.get("duration")})
        for i, nb in enumerate(nbs):
            body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": pages[i]["title"]}})
            nav = _nav(pages, i)
            body = re.sub(r"(<body[^>]*>)", lambda m, nav=nav: m.group(1) + nav, body, count=1)
            body = body.replace("</head>", f"<style>{_STYLE}</style></head>", 1)
            (tmp / pages[i]["html"]).write_text(body, encoding="utf-8")
        (tmp / "index.html").write_text(_index_html(pages, time.strftime("%Y-%m-%d %H:%M")),
                                        encoding="utf-8")
        (tmp / MARKER).write_text("built by labkit site; replaced on the next build\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / "index.html"


def render_quarto(executed_dir, out_dir=None) -> Path:
    """Quarto website of the EXECUTED notebooks, without executing anything again.

    The stored notebooks have no outputs, and running them again inside ``quarto render`` would
    repeat every experiment. So the project (``_quarto.yml``, ``index.qmd``) is staged in a
    temporary folder with the executed copies from ``executed_dir`` in place of
    ``notebooks/*.ipynb`` and ``execute: enabled: false`` (Quarto then renders the outputs papermill
    saved, widget state included), and rendered into ``out_dir`` (default ``_site/``).
    ``quarto render`` at the repository root still works on its own: it executes once and freezes.
    """
    import yaml

    from .errors import LabkitError

    executed_dir = Path(executed_dir)
    out_dir = Path(out_dir or REPO_ROOT / "_site").resolve()
    config = yaml.safe_load((REPO_ROOT / "_quarto.yml").read_text())
    missing = [nb.name for nb in list_notebooks() if not (executed_dir / nb.name).is_file()]
    if missing:
        raise UsageError(f"{executed_dir}: no executed {', '.join(missing)} (run `labkit lab` first)")
    config.setdefault("execute", {})["enabled"] = False
    config["execute"].pop("freeze", None)
    config["project"]["output-dir"] = str(out_dir)
    with tempfile.TemporaryDirectory(prefix="labkit-quarto-") as stage:
        stage = Path(stage)
        (stage / "notebooks").mkdir()
        for nb in list_notebooks():
            shutil.copy2(executed_dir / nb.name, stage / "notebooks" / nb.name)
        for extra in ("index.qmd",):
            shutil.copy2(REPO_ROOT / extra, stage / extra)
        (stage / "_quarto.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        proc = subprocess.run(["quarto", "render", "--no-execute"], cwd=stage)
    if proc.returncode != 0:
        raise LabkitError(f"quarto render exited {proc.returncode}")
    return out_dir / "index.html"


def build_site(executed_dir, out_dir=None, *, preview: bool = False) -> tuple[str, Path]:
    """Quarto if it is installed (unless ``preview``), else the preview; (builder, index page).

    ``out_dir`` defaults to ``_site`` (Quarto) or ``_preview`` (preview)."""
    if quarto_available() and not preview:
        return "quarto", render_quarto(executed_dir, out_dir or REPO_ROOT / "_site")
    return "preview", build_preview(executed_dir, out_dir or "_preview")
