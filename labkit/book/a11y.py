"""What every page of both websites runs once it has loaded, so a reader with a screen reader
or a keyboard can use it (and a wide formula scrolls inside its column): Quarto's search box and button get names (Quarto 1.7 renders them
without), and an output that scrolls sideways becomes a focusable, named region, so the
keyboard can scroll it (axe-core's scrollable-region-focusable). The browser tests run axe-core
over every page to hold this."""

from __future__ import annotations

from pathlib import Path

SCRIPT = """<style>
/* a display formula wider than the column scrolls inside it, not the whole page */
mjx-container[display="true"], .MathJax_Display { overflow-x: auto; overflow-y: hidden;
  max-width: 100%; }
</style>
<script>
(function () {
  var queued = false;
  function name(sel, label) {
    document.querySelectorAll(sel).forEach(function (el) {
      if (!el.getAttribute("aria-label")) el.setAttribute("aria-label", label);
    });
  }
  function fix() {
    queued = false;
    name(".aa-DetachedSearchButton, #quarto-search button", "Search the site");
    name(".aa-Autocomplete, input.aa-Input", "Search the site");
    document.querySelectorAll("main pre, .cell-output-display, .jp-OutputArea-output, " +
                              ".labkit-table, mjx-container[display='true'], .MathJax_Display"
                              ).forEach(function (el) {
      if (el.scrollWidth > el.clientWidth + 1 && !el.hasAttribute("tabindex")) {
        el.setAttribute("tabindex", "0");
        el.setAttribute("role", "region");
        el.setAttribute("aria-label", "output, scrolls sideways");
      }
    });
  }
  function later() { if (!queued) { queued = true; setTimeout(fix, 50); } }
  window.addEventListener("load", fix);
  document.addEventListener("DOMContentLoaded", fix);
  new MutationObserver(later).observe(document.documentElement, {childList: true, subtree: true});
})();
</script>"""

#: the file a staged Quarto project includes after every page's body
QUARTO_INCLUDE = "_labkit_a11y.html"


def quarto(stage: Path, config: dict) -> None:
    """Have the staged Quarto project (``config``: its ``_quarto.yml``) include the script."""
    (Path(stage) / QUARTO_INCLUDE).write_text(SCRIPT + "\n", encoding="utf-8")
    html = config.setdefault("format", {}).setdefault("html", {})
    after = html.get("include-after-body") or []
    html["include-after-body"] = [*([after] if isinstance(after, str) else after),
                                  QUARTO_INCLUDE]


def page(text: str) -> str:
    """A preview page with the style and script before its ``</body>``.

    >>> out = page("<html><body><p>hi</p></body></html>")
    >>> out.startswith("<html><body><p>hi</p><style>"), out.endswith("</script></body></html>")
    (True, True)
    """
    return text.replace("</body>", SCRIPT + "</body>", 1)
