"""Shared figure helpers. Each lab's figures live in its own ``plots`` module
(``labkit.solve.plots``, ``labkit.ddp.plots``, ...): every function there takes rows (a
DataFrame) and returns a matplotlib Figure, and never measures anything. :func:`save` writes a
figure atomically (PNG, SVG or PDF by suffix); :func:`png_outputs` puts one in an explorer
widget.
"""

from __future__ import annotations

import os
from pathlib import Path


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 5.0, height: float = 3.6):
    """A figure with ``nrows x ncols`` axes, sized per panel; works without a display."""
    import matplotlib

    if not os.environ.get("DISPLAY") and "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, constrained_layout=True)
    _show_with_alt()
    return fig, axes


def _num(v: float) -> str:
    return f"{v:.3g}"


def _axis(ax, which: str) -> str:
    label = (ax.get_xlabel() if which == "x" else ax.get_ylabel()) or which
    scale = ax.get_xscale() if which == "x" else ax.get_yscale()
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    return f"{which}: {label}{' (log scale)' if scale == 'log' else ''}, {_num(lo)} to {_num(hi)}"


def alt_text(fig, limit: int = 6) -> str:
    """What ``fig`` shows, read off its artists: per panel the title, both axes (label, scale,
    range), each labelled line with its number of points and its last value, and the bars'
    count and tallest. The website's alt text of a lab figure.

    >>> fig, axes = new_figure()
    >>> ax = axes[0][0]
    >>> _ = ax.plot([1, 2, 4], [1.0, 1.8, 3.1], label="measured")
    >>> _ = ax.set(title="speedup", xlabel="ranks", ylabel="speedup")
    >>> alt_text(fig)
    "Figure of 1 panel. Panel 1, 'speedup': x: ranks, 0.85 to 4.15; y: speedup, 0.895 to 3.21; measured: 3 points, last (4, 3.1)."
    """
    panels = [ax for ax in fig.axes if ax.has_data()]
    parts = [f"Figure of {len(panels)} panel{'s' if len(panels) != 1 else ''}."]
    for k, ax in enumerate(panels, 1):
        bits = [_axis(ax, "x"), _axis(ax, "y")]
        lines = [ln for ln in ax.get_lines()
                 if not ln.get_label().startswith("_") and len(ln.get_xdata())]
        for ln in lines[:limit]:
            x, y = ln.get_xdata(), ln.get_ydata()
            bits.append(f"{ln.get_label()}: {len(x)} point{'s' if len(x) != 1 else ''}, "
                        f"last ({_num(float(x[-1]))}, {_num(float(y[-1]))})")
        if len(lines) > limit:
            bits.append(f"and {len(lines) - limit} more lines")
        bars = [p for c in ax.containers for p in getattr(c, "patches", [])]
        if bars:
            top = max(bars, key=lambda b: abs(b.get_height()))
            bits.append(f"{len(bars)} bars, the tallest {_num(top.get_height())}")
        title = ax.get_title()
        parts.append(f"Panel {k}{f', {title!r}' if title else ''}: {'; '.join(bits)}.")
    if fig._suptitle is not None and fig._suptitle.get_text():
        parts.insert(1, f"{fig._suptitle.get_text()}.")
    return " ".join(parts)


def text_overlaps(fig, *, drawn: bool = False) -> list[str]:
    """Pairs of visible texts of ``fig`` (titles, axis and tick labels, legends, notes) whose
    boxes overlap once drawn, as "'a' / 'b'" (empty: every text can be read). ``drawn``: the
    figure was drawn just now (:func:`save`), so its layout and ticks are as shown.

    >>> fig, axes = new_figure()
    >>> _ = axes[0][0].text(0.5, 0.5, "left note"), axes[0][0].text(0.5, 0.5, "right note")
    >>> text_overlaps(fig)
    ["'left note' / 'right note'"]
    """
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    if not drawn:
        fig.draw_without_rendering()
    hidden = set()  # tick labels of ticks outside the view: kept by matplotlib, never drawn
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            pad = 1e-9 * max(abs(lo), abs(hi), 1.0)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - pad <= tick.get_loc() <= hi + pad:
                    hidden.update((id(tick.label1), id(tick.label2)))
    boxes = []
    for t in fig.findobj(Text):
        if (id(t) in hidden or not t.get_visible() or not t.get_text().strip()
                or t.get_alpha() == 0):
            continue
        try:
            bb = t.get_window_extent(renderer)
        except (RuntimeError, ValueError):
            continue
        if bb.width > 0 and bb.height > 0:  # a box's rim is padding: touching is not overlapping
            dx, dy = 0.05 * bb.width, 0.1 * bb.height
            boxes.append((t.get_text(), Bbox.from_extents(bb.x0 + dx, bb.y0 + dy, bb.x1 - dx,
                                                          bb.y1 - dy)))
    return [f"{a!r} / {b!r}" for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]


def _png_with_alt(fig):
    """A figure shown in a notebook: the PNG, and in the output's metadata its
    :func:`alt_text` (the website builders make it the image's alt) and its
    :func:`text_overlaps` (the notebook tests fail on any). A figure :func:`save` wrote as a
    PNG and left as it was (the same :func:`alt_text`) is shown as that file: drawing it
    again costs a second or more a figure on a small machine."""
    from IPython.core.pylabtools import print_figure

    saved = _saved_png(fig)
    if saved is not None:
        return Path(saved["path"]).read_bytes(), {"alt": saved["alt"],
                                                   "overlapping_text": saved["overlaps"]}
    return print_figure(fig, "png", bbox_inches="tight"), {
        "alt": alt_text(fig), "overlapping_text": text_overlaps(fig)}


def _saved_png(fig) -> dict | None:
    """What :func:`save` recorded of ``fig``'s PNG, if the file is still there and the figure
    still reads the same (:func:`alt_text`); else None."""
    saved = getattr(fig, "_labkit_saved_png", None)
    if saved is None or not Path(saved["path"]).is_file() or alt_text(fig) != saved["alt"]:
        return None
    return saved


def saved_image(fig, path: str | os.PathLike):
    """A figure shown as the PNG it was saved to (a heavy figure costs seconds to draw inline
    again), carrying what :func:`_png_with_alt` records: its alt text and overlapping texts."""
    from IPython.display import Image

    saved = _saved_png(fig)
    if saved is None:
        saved = {"alt": alt_text(fig), "overlaps": text_overlaps(fig)}
    return Image(filename=str(path), metadata={"overlapping_text": saved["overlaps"]},
                 alt=saved["alt"])


def _show_with_alt() -> None:
    """In a running IPython, show figures through :func:`_png_with_alt` (registered after
    pyplot is imported, so after matplotlib's inline backend set its own)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure

    ip.display_formatter.formatters["image/png"].for_type(Figure, _png_with_alt)


def png_outputs(fig, text: str, dpi: int = 90) -> tuple:
    """``fig`` as the ``outputs`` of an ``ipywidgets.Output``: one PNG ``display_data`` with
    ``text`` as its plain-text form; the figure is closed. A widget sets ``output.outputs`` to
    it directly (not ``with output:``, which needs a kernel's display hook), so the figure is
    part of the widget state saved in the notebook and shown on the website.

    >>> fig, _ = new_figure()
    >>> out = png_outputs(fig, "an empty panel")
    >>> out[0]["output_type"], out[0]["data"]["text/plain"]
    ('display_data', 'an empty panel')
    """
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return ({"output_type": "display_data", "metadata": {},
             "data": {"image/png": base64.b64encode(buf.getvalue()).decode(),
                      "text/plain": text}},)


def save(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` through a temporary file, so a reader never sees half a PNG."""
    path = Path(path)
    if not path.parent.is_dir():
        from labkit.errors import UsageError

        raise UsageError(f"{path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=dpi)
    os.replace(tmp, path)
    if path.suffix.lower() == ".png":  # shown as this file (_png_with_alt), not drawn again
        shown_dpi, fig.dpi = fig.dpi, dpi  # the texts where savefig just placed them
        try:
            overlaps = text_overlaps(fig, drawn=True)
        finally:
            fig.dpi = shown_dpi
        fig._labkit_saved_png = {"path": str(path), "alt": alt_text(fig), "overlaps": overlaps}
    return path


def trace_timeline(trace, *, thread=None, title: str | None = None, width: float = 9.0):
    """Threads of a trace (:mod:`labkit.trace`: a document or a ``.trace.json`` path) as a
    static figure: a row of bars per (rank, thread) (``broken_barh``), one colour per category,
    idle slices hatched grey, a slice's name written in its bar where it fits (the text is
    measured once drawn). ``thread``: a name (a lab's row, e.g. ``gpipe M=4``), or several
    drawn in that order for every rank (the FSDP lab's compute and collectives of one step);
    default the trace's first. Returns (figure, alt text computed from the slices:
    :func:`labkit.trace.describe` of each thread)."""
    from labkit import trace as tr

    doc = trace if isinstance(trace, dict) else tr.load(trace)
    threads = [thread] if thread is None or isinstance(thread, str) else list(thread)
    if not threads:
        from labkit.errors import UsageError

        raise UsageError("trace_timeline needs at least one thread")
    names = [tr.timeline(doc, t)[0] for t in threads]  # a missing one: UsageError naming them
    every = tr.threads(doc)
    rows = [(pid, name, every[name][pid])
            for pid in sorted({p for t in names for p in every[t]})
            for name in names if pid in every[name]]
    spans = [e for _, _, mine in rows for e in mine]
    t0 = min(e["ts"] for e in spans)
    span_ms = (max(e["ts"] + e["dur"] for e in spans) - t0) / 1e3
    fig, axes = new_figure(width=width, height=0.9 + 0.45 * len(rows))
    ax = axes[0][0]
    cats = list(dict.fromkeys(e["cat"] for e in spans if e["cat"] != tr.IDLE))
    colors = {c: f"C{k % 10}" for k, c in enumerate(cats)}
    labels = []
    for row, (_, _, mine) in enumerate(rows):
        for cat in [*cats, tr.IDLE]:
            bars = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in mine if e["cat"] == cat]
            if not bars:
                continue
            idle = cat == tr.IDLE
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors="0.92" if idle else colors[cat],
                           edgecolors="0.6" if idle else "white", hatch="//" if idle else None,
                           linewidth=0.5, label=cat)
        labels += [(ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, row, e["name"], ha="center",
                            va="center", fontsize=7, color="white"), e)
                   for e in mine if e["cat"] != tr.IDLE]
    many = len(names) > 1
    ax.set_yticks(range(len(rows)), [f"rank {pid}" + (f": {name.rpartition(': ')[2]}"
                                                     if many and ": " in name else "")
                                     for pid, name, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set(xlabel="ms from the first slice", xlim=(0, span_ms), title=title or names[0])
    handles, cat_names = ax.get_legend_handles_labels()
    unique = dict(zip(cat_names, handles))  # one entry per category, not per rank
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    # a name stays only where it fits inside its bar
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for text, e in labels:
        x0, _ = ax.transData.transform(((e["ts"] - t0) / 1e3, 0))
        x1, _ = ax.transData.transform(((e["ts"] - t0 + e["dur"]) / 1e3, 0))
        if text.get_window_extent(renderer).width > 0.85 * (x1 - x0):
            text.remove()
    return fig, " ".join(tr.describe(doc, t) for t in names)


def alt_outputs(nb) -> int:
    """Give every figure of an executed notebook its alt text on the website: a PNG output whose
    metadata holds an ``alt`` (:func:`_png_with_alt`) becomes an HTML image carrying it, after
    the cell's own ``#| fig-alt:`` sentence where it has one (what the figure is for, then what
    it shows). Returns how many outputs changed."""
    import base64
    import html
    import re

    changed = 0
    for cell in nb.get("cells", []):
        said = re.search(r'^#\|\s*fig-alt:\s*"?(.*?)"?\s*$', "".join(cell.get("source", "")), re.M)
        for out in cell.get("outputs", []):
            data, meta = out.get("data", {}), out.get("metadata", {})
            alt = (meta.get("image/png") or {}).get("alt")
            if "image/png" not in data or not alt:
                continue
            if said:
                alt = f"{said.group(1)} {alt}"
            png = data["image/png"]
            png = (base64.b64encode(png).decode() if isinstance(png, bytes)
                   else "".join(png).replace("\n", ""))
            out["data"] = {"text/html": f'<img src="data:image/png;base64,{png}" '
                                        f'alt="{html.escape(alt)}" style="max-width:100%">'}
            changed += 1
    return changed
