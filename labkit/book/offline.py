"""Host side: the websites work offline. Every script, style, font and formula renderer a page
loads is a local copy from ``node_modules/`` (``npm ci``): the preview's copies go to
``vendor/``, the Quarto site's to ``site_libs/labkit/`` with every CDN ``<script>`` of its pages
pointed at them; a page that would still fetch anything from another host is refused. Widget
state papermill saved goes into the Quarto pages exactly as saved."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from labkit.book.notebooks import REPO_ROOT
from labkit.errors import LabkitError, UsageError

NODE_MODULES = REPO_ROOT / "node_modules"

_FONTS = ("*.woff2", "*.woff", "*.ttf", "*.eot", "*.svg")

# (package folder, files or folders inside it, target): copied to vendor/<target>/... (preview)
_VENDOR = (
    ("requirejs", ("require.js",), ""),
    ("@jupyter-widgets/html-manager/dist", ("embed-amd.js", *_FONTS), "html-manager"),
    ("mathjax", ("MathJax.js", "config/TeX-AMS_CHTML-full.js", "config/Safe.js", "extensions/*.js",
                 "extensions/TeX", "extensions/HTML-CSS", "jax/input/TeX", "jax/output/CommonHTML",
                 "jax/element", "fonts/HTML-CSS/TeX/woff"), "mathjax"),
)

#: where the Quarto site's local copies go (inside Quarto's own site_libs/)
QUARTO_LIBS = "site_libs/labkit"

# The same for the Quarto site, into site_libs/labkit/<target>/. Quarto's pages want MathJax 3
# (their scripts call MathJax.typeset), hence the second MathJax package (npm alias mathjax3).
_QUARTO_VENDOR = (
    ("requirejs", ("require.js",), ""),
    ("jquery/dist", ("jquery.min.js",), ""),
    ("@jupyter-widgets/html-manager/dist", ("embed-amd.js", *_FONTS), "html-manager"),
    ("mathjax3/es5", ("tex-chtml-full.js", "output/chtml/fonts/woff-v2"), "mathjax"),
)

# What Quarto 1.7 loads from CDNs, and the local copy that replaces it (None: dropped; the ES6
# polyfill is for browsers older than any that runs MathJax 3 or the widget manager).
_CDN_SCRIPTS = (
    (r"https://cdnjs\.cloudflare\.com/ajax/libs/jquery/[^\"']+/jquery(?:\.min)?\.js", "jquery.min.js"),
    (r"https://cdnjs\.cloudflare\.com/ajax/libs/require\.js/[^\"']+/require(?:\.min)?\.js",
     "require.js"),
    (r"https://(?:unpkg\.com|cdn\.jsdelivr\.net/npm)/@jupyter-widgets/html-manager@[^/\"']*"
     r"/dist/embed-amd\.js", "html-manager/embed-amd.js"),
    (r"https://cdn\.jsdelivr\.net/npm/mathjax@3[^/\"']*/es5/tex-chtml(?:-full)?\.js",
     ("mathjax-widgets.js", "mathjax/tex-chtml-full.js")),
    (r"https://cdnjs\.cloudflare\.com/polyfill/[^\"']+", None),
)
# The widget manager typesets labels with MathJax 2's ``MathJax.Hub.Queue``; Quarto's pages run
# MathJax 3, which has no Hub. This config (loaded before MathJax 3) gives it one, so a slider's
# label neither stays raw nor throws.
_MATHJAX_WIDGETS_JS = """// MathJax 2's Hub.Queue(["Typeset", Hub, element]) for the widget manager, on MathJax 3
(function () {
  var hub = {Queue: function () {
    for (var i = 0; i < arguments.length; i++) {
      var job = arguments[i];
      if (Array.isArray(job) && job[0] === "Typeset" && window.MathJax.typesetPromise) {
        window.MathJax.typesetPromise([job[2]]).catch(function () {});
      }
    }
  }};
  var config = window.MathJax || {};
  config.startup = config.startup || {};
  var ready = config.startup.ready;
  config.startup.ready = function () {
    if (ready) { ready(); } else { window.MathJax.startup.defaultReady(); }
    window.MathJax.Hub = hub;
  };
  window.MathJax = config;
})();
"""
_SCRIPT_TAG = re.compile(r"""<script\b[^>]*?\bsrc=["']([^"']+)["'][^>]*>\s*</script>\s*""", re.I)
# a script, stylesheet, font or icon that a page would fetch (plain <a href> links are not)
_FETCHED = re.compile(
    r"""<script\b[^>]*?\bsrc=["'](?P<s>(?:https?:)?//[^"']+)["']"""
    r"""|<link\b(?=[^>]*\brel=["'](?:stylesheet|preload|modulepreload|icon|prefetch)["'])"""
    r"""[^>]*?\bhref=["'](?P<l>(?:https?:)?//[^"']+)["']""", re.I)
_CSS_FETCHED = re.compile(r"""(?:@import\s+(?:url\()?|url\()\s*["']?((?:https?:)?//[^"')\s]+)""", re.I)


def _copy_packages(dest: Path, node_modules: Path, packages, purpose: str) -> None:
    for package, patterns, target in packages:
        src = node_modules / package
        if not src.is_dir():
            raise UsageError(f"{src} is missing: run `npm ci` in {REPO_ROOT} ({purpose})")
        for pattern in patterns:
            matches = sorted(src.glob(pattern))
            if not matches:
                raise UsageError(f"{src}: nothing matches {pattern} (run `npm ci` again)")
            for m in matches:
                out = dest / target / m.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                if m.is_dir():
                    shutil.copytree(m, out, dirs_exist_ok=True)
                else:
                    shutil.copy2(m, out)


def copy_vendor(dest: Path, node_modules: Path = NODE_MODULES) -> None:
    """The preview's local widget renderer, require.js and MathJax 2, into ``dest/vendor``."""
    _copy_packages(dest / "vendor", node_modules, _VENDOR,
                   "the preview site serves the widget renderer, require.js and MathJax from there")


def check_node_modules(node_modules: Path = NODE_MODULES, *, quarto: bool = False) -> None:
    """Refuse early (before an expensive run) when the npm packages a site copies are missing."""
    for package, _, _ in _QUARTO_VENDOR if quarto else _VENDOR:
        if not (node_modules / package).is_dir():
            raise UsageError(f"{node_modules / package} is missing: run `npm ci` in {REPO_ROOT} "
                             "(the site serves MathJax, require.js and the widget renderer from "
                             "local copies)")


def make_offline(site, node_modules: Path = NODE_MODULES) -> list[str]:
    """Make a rendered Quarto site load nothing from the network; the pages changed.

    Copies require.js, jQuery, the widget manager and MathJax 3 into ``site_libs/labkit/`` and
    points every page's CDN ``<script>`` at them (relative URLs, so the site works from a server
    or from disk). A page or stylesheet that would still fetch a script, style or font from
    another host is an error naming it: a page that needs the internet to show a formula is not
    what this site promises.
    """
    site = Path(site)
    libs = site / QUARTO_LIBS
    _copy_packages(libs, node_modules, _QUARTO_VENDOR,
                   "the Quarto site serves MathJax, require.js and the widget manager from there")
    (libs / "mathjax-widgets.js").write_text(_MATHJAX_WIDGETS_JS)
    changed, remote = [], []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        prefix = Path(os.path.relpath(libs, page.parent)).as_posix()

        def local(m, prefix=prefix):
            for pattern, targets in _CDN_SCRIPTS:
                if re.fullmatch(pattern, m.group(1)):
                    targets = (targets,) if isinstance(targets, str) else targets or ()
                    return "".join(f'<script src="{prefix}/{t}"></script>\n' for t in targets)
            return m.group(0)

        new = _SCRIPT_TAG.sub(local, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page.relative_to(site).as_posix())
        remote += [f"{page.relative_to(site).as_posix()} loads {m.group('s') or m.group('l')}"
                   for m in _FETCHED.finditer(new)]
    for css in sorted(site.rglob("*.css")):
        remote += [f"{css.relative_to(site).as_posix()} loads {u}"
                   for u in _CSS_FETCHED.findall(css.read_text(encoding="utf-8", errors="replace"))]
    if remote:
        raise LabkitError(f"the site would load {len(remote)} file(s) from the network "
                          f"(no local copy known): {'; '.join(remote[:5])}")
    return changed


_WIDGET_STATE = re.compile(
    r'(<script type="application/vnd\.jupyter\.widget-state\+json">)(.*?)(</script>)', re.S)
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"


def state_json(state: dict) -> str:
    """Widget state as JSON that is safe inside <script>: every <, > and & escaped.

    >>> print(state_json({"value": "<b>&</b>"}))
    {"value": "\\u003cb\\u003e\\u0026\\u003c/b\\u003e"}
    """
    return (json.dumps(state).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


def restore_widget_state(site, executed_dir) -> list[str]:
    """Put each notebook's saved widget state into its page exactly as papermill saved it; the
    pages changed.

    Quarto passes the state through its HTML post-processing, which rewrites HTML it finds inside
    the JSON strings (an ``HTML`` widget holding a ``<table>`` comes out with raw newlines, and
    the widget manager then renders nothing on that page). A state script that is still not
    JSON afterwards is an error naming the page.
    """
    import nbformat

    site, executed_dir = Path(site), Path(executed_dir)
    changed, broken = [], []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        if WIDGET_STATE_MIME not in text:
            continue
        nb_path = executed_dir / page.with_suffix(".ipynb").name
        state = None
        if nb_path.is_file():
            state = nbformat.read(nb_path, as_version=4).metadata.get("widgets", {}).get(
                WIDGET_STATE_MIME)
        if state is not None:
            new = _WIDGET_STATE.sub(lambda m, st=state: m.group(1) + state_json(st) + m.group(3),
                                    text, count=1)
            if new != text:
                page.write_text(new, encoding="utf-8")
                changed.append(page.relative_to(site).as_posix())
                text = new
        for m in _WIDGET_STATE.finditer(text):
            try:
                json.loads(m.group(2))
            except ValueError as e:
                broken.append(f"{page.relative_to(site).as_posix()} ({e})")
    if broken:
        raise LabkitError(f"widget state that is not JSON on {', '.join(broken)}: its widgets "
                          "would not render")
    return changed
