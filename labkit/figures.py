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
    return fig, axes


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
    return path
