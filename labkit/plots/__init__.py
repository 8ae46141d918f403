"""Figures, one module per lab (``plots.solve``, ``plots.ddp``, ``plots.comm``, ``plots.model``,
``plots.speedup``). Every function takes rows (a DataFrame) and returns a matplotlib Figure; it
never measures anything. :func:`save` writes a figure atomically (PNG or SVG by suffix).
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


def save(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` through a temporary file, so a reader never sees half a PNG."""
    path = Path(path)
    if not path.parent.is_dir():
        from ..errors import UsageError

        raise UsageError(f"{path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=dpi)
    os.replace(tmp, path)
    return path
