"""Explorers that stay alive on a static page: each readout an explorer can show is computed in
Python once, when the notebook runs, and the page's controls look it up in the browser.

Why: the website is made from executed notebooks and has no kernel, so an ipywidgets explorer
there is a picture of its first state. The explorers of this lab only evaluate formulas, so the
answer to every setting of a (web-sized) grid of control values is small: :func:`page_html`
writes labelled controls, the grid's readouts (gzip, base64) and a few lines of JavaScript that
show the one picked; nothing is fetched from anywhere. :class:`Live` shows the ipywidgets
explorer in Jupyter and this page explorer on the website from the same output
(:func:`web_outputs` picks the web one when the site is built).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import itertools
import json
from dataclasses import dataclass

#: the mark of a page explorer's HTML (tests and :func:`web_outputs` look for it)
MARK = "data-labkit-explorer"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: the most readouts one page explorer precomputes (a larger grid is a coarser grid's job)
MAX_READOUTS = 20000


@dataclass(frozen=True)
class Control:
    """One control of a page explorer: a slider over ``values`` when they are all numbers,
    else a menu; ``value``: where it starts (default: the first value)."""

    name: str
    label: str
    values: tuple
    value: object = None

    def start(self) -> int:
        """The index the control starts at: ``value``'s, or for a slider the nearest value's."""
        if self.value is None:
            return 0
        if self.slider and self.value not in self.values:
            return min(range(len(self.values)), key=lambda j: abs(self.values[j] - self.value))
        if self.value not in self.values:
            from labkit.errors import UsageError
            raise UsageError(f"{self.label}: start value {self.value!r} is not one of "
                             f"{list(self.values)}")
        return list(self.values).index(self.value)

    @property
    def slider(self) -> bool:
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)


def readouts(controls, readout) -> list[str]:
    """``readout(**values)`` at every point of the grid, in the order of
    ``itertools.product`` over the controls (the last control varies fastest); an invalid
    point (a :class:`~labkit.errors.LabkitError`) reads as its one-line reason.

    >>> cs = [Control("a", "a", (1, 2)), Control("op", "op", ("+", "*"))]
    >>> readouts(cs, lambda a, op: f"{a}{op}3 = {a + 3 if op == '+' else a * 3}")
    ['1+3 = 4', '1*3 = 3', '2+3 = 5', '2*3 = 6']
    """
    from labkit.errors import LabkitError

    size = 1
    for c in controls:
        size *= len(c.values)
    if size > MAX_READOUTS:
        from labkit.errors import UsageError
        raise UsageError(f"a page explorer of {size} settings is more than {MAX_READOUTS}: "
                         "give its controls fewer values")
    out = []
    for values in itertools.product(*(c.values for c in controls)):
        try:
            out.append(readout(**dict(zip((c.name for c in controls), values))))
        except LabkitError as e:
            out.append(f"<b>not a valid setting:</b> {html.escape(str(e))}")
    return out


_SCRIPT = """(function () {
  var root = document.getElementById(%(id)s), sizes = %(sizes)s, table = null;
  var inputs = Array.prototype.slice.call(root.querySelectorAll("[data-axis]"));
  var out = root.querySelector(".labkit-readout");
  function show() {
    var k = 0;
    inputs.forEach(function (el, i) {
      k = k * sizes[i] + Number(el.value);
      var shown = root.querySelector("output[for='" + el.id + "']");
      if (shown) shown.textContent = el.getAttribute("data-label-" + el.value);
    });
    if (table) out.innerHTML = table[k];
  }
  inputs.forEach(function (el) { el.addEventListener("input", show); });
  if (!window.DecompressionStream) {
    out.innerHTML += "<br><i>This browser cannot unpack the explorer's table; open the " +
                     "notebook in JupyterLab to move it.</i>";
    return;
  }
  var bytes = Uint8Array.from(atob(%(data)s), function (c) { return c.charCodeAt(0); });
  new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip")))
    .text().then(function (t) { table = JSON.parse(t); root.setAttribute("data-ready", "1");
                                show(); });
})();"""


def page_html(controls, readout, *, title: str, note: str = "",
              figure: tuple[str, str] | None = None) -> str:
    """The page explorer: one labelled control per :class:`Control`, the readout of the current
    setting (live: ``role=status``), ``figure`` (base64 PNG, alt text) drawn at the notebook's
    values with ``note`` beside it, and the script. Works offline: everything is inline."""
    controls = list(controls)
    table = readouts(controls, readout)
    start = [c.start() for c in controls]
    k = 0
    for c, i in zip(controls, start):
        k = k * len(c.values) + i
    data = base64.b64encode(gzip.compress(json.dumps(table).encode(), mtime=0)).decode()
    uid = "lx-" + hashlib.sha1((title + data).encode()).hexdigest()[:10]
    parts = [f'<div id="{uid}" class="labkit-explorer" {MARK}="{html.escape(title)}">',
             f"<p><b>{html.escape(title)}</b> (live on this page: every setting's numbers were "
             "computed by the notebook's Python)</p>", '<div class="labkit-controls">']
    for n, (c, i) in enumerate(zip(controls, start)):
        cid = f"{uid}-{n}"
        labels = " ".join(f'data-label-{j}="{html.escape(str(v))}"'
                          for j, v in enumerate(c.values))
        parts.append(f'<label for="{cid}">{html.escape(c.label)}</label> ')
        if c.slider:
            parts.append(f'<input type="range" id="{cid}" data-axis="{n}" min="0" '
                         f'max="{len(c.values) - 1}" step="1" value="{i}" {labels}> '
                         f'<output for="{cid}">{html.escape(str(c.values[i]))}</output>')
        else:
            opts = "".join(f'<option value="{j}"{" selected" if j == i else ""}>'
                           f"{html.escape(str(v))}</option>" for j, v in enumerate(c.values))
            parts.append(f'<select id="{cid}" data-axis="{n}" {labels}>{opts}</select>')
        parts.append("<br>")
    parts.append("</div>")
    parts.append(f'<div class="labkit-readout" role="status" aria-live="polite">{table[k]}</div>')
    if figure:
        parts.append(f'<img src="data:image/png;base64,{figure[0]}" alt="{html.escape(figure[1])}"'
                     ' style="max-width:100%">')
    if note:
        parts.append(f"<p><small>{html.escape(note)}</small></p>")
    script = _SCRIPT % {"id": json.dumps(uid), "data": json.dumps(data),
                        "sizes": json.dumps([len(c.values) for c in controls])}
    parts.append(f"<script>{script}</script></div>")
    return "".join(parts)


class Live:
    """An ipywidgets explorer in Jupyter, its page explorer (``html``) on the website: one
    output holding both (Jupyter prefers the widget; the site builders keep the HTML)."""

    def __init__(self, widget, html_text: str):
        self.widget, self.html = widget, html_text

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data = {**data, "text/html": self.html}
        return data

    def __getattr__(self, name):  # the widget's own API (children, value, ...) stays reachable
        return getattr(self.widget, name)


def web_outputs(nb) -> int:
    """Keep only the page explorer of every output that holds one beside its widget (the
    website has no kernel); returns how many outputs changed."""
    changed = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME in data and MARK in "".join(data.get("text/html", "")):
                del data[WIDGET_MIME]
                data.pop("text/plain", None)
                changed += 1
    return changed


def png_of(outputs) -> tuple[str, str] | None:
    """(base64 PNG, alt text) of the first image in widget ``outputs``
    (:func:`labkit.figures.png_outputs`), or None."""
    for out in outputs or ():
        data = out.get("data", {})
        if "image/png" in data:
            return data["image/png"], data.get("text/plain", "")
    return None
