"""Amdahl serial-fraction explorer: move f and N, watch the speedup ceiling move.

``amdahl_explorer(measured)`` returns a VBox: a slider for the serial fraction f, one for N, a
readout with Amdahl's s(N) = 1 / (f + (1 - f)/N), the efficiency s/N, the ceiling 1/f and
Gustafson's N - f (N - 1), and the two curves with the measured points on top. All numbers come
from :mod:`labkit.metrics`. The figure is drawn once when the explorer is built, so an executed
notebook (and the website made from it) shows it even without a running kernel.
"""

from __future__ import annotations

from labkit.explorer import Control, Live, page_html, png_of
from labkit.figures import png_outputs
from labkit.metrics import amdahl_speedup, gustafson_speedup


def readout(serial_fraction: float, world_size: int) -> str:
    """The numbers beside the sliders, as HTML.

    >>> "s(8) = 4.706" in readout(0.1, 8)
    True
    """
    f, n = serial_fraction, world_size
    s = amdahl_speedup(f, n)
    ceiling = "&infin;" if f == 0 else f"{1 / f:.1f}"
    return (f"<b>Amdahl</b> s({n}) = 1 / (f + (1 &minus; f)/N) = <b>s({n}) = {s:.3f}</b>, "
            f"efficiency s/N = {s / n:.2f}, ceiling 1/f = {ceiling}<br>"
            f"<b>Gustafson</b> s({n}) = N &minus; f (N &minus; 1) = {gustafson_speedup(f, n):.2f}")


def amdahl_explorer(measured=None, *, serial_fraction: float = 0.1, world_size: int = 8,
                    max_world_size: int = 32):
    """The explorer widget; ``measured`` (optional) is speedup rows with ``world_size``,
    ``speedup`` and optionally ``source`` columns, drawn as points."""
    import ipywidgets as w

    from labkit.speedup.plots import laws_plot

    f_slider = w.FloatSlider(value=serial_fraction, min=0.0, max=0.5, step=0.005,
                             description="serial f", readout_format=".3f",
                             continuous_update=False, style={"description_width": "initial"})
    n_slider = w.IntSlider(value=min(world_size, max_world_size), min=1, max=max_world_size,
                           description="N", continuous_update=False)
    text = w.HTML()
    plot = w.Output()

    def redraw(_change=None):
        text.value = readout(f_slider.value, n_slider.value)
        fig = laws_plot(f_slider.value, max_world_size, measured=measured, mark=n_slider.value)
        plot.outputs = png_outputs(fig, f"Amdahl and Gustafson, f = {f_slider.value:.3f}")

    f_slider.observe(redraw, names="value")
    n_slider.observe(redraw, names="value")
    redraw()
    return Live(w.VBox([w.HBox([f_slider, n_slider]), text, plot]),
                page_explorer(serial_fraction, world_size, max_world_size,
                              figure=png_of(plot.outputs)))


def page_explorer(serial_fraction: float, world_size: int, max_world_size: int = 32,
                  figure=None) -> str:
    """The explorer for a page without a kernel (:mod:`labkit.explorer`): f in steps of 0.01,
    N over 1..``max_world_size``, the same readout."""
    fs = tuple(round(0.01 * k, 2) for k in range(51))
    ns = tuple(range(1, max_world_size + 1))
    return page_html([Control("serial_fraction", "serial f", fs, serial_fraction),
                      Control("world_size", "N", ns, min(world_size, max_world_size))],
                     readout, title="Amdahl and Gustafson explorer", figure=figure,
                     note="The figure shows the values the notebook ran with; redrawing it "
                          "needs Python (run the notebook in JupyterLab).")
