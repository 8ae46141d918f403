"""Shared figure helpers: a figure saved as a PNG is shown as that file, with the same alt text
and the same overlapping texts as drawing it again would give."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.figures import _png_with_alt, new_figure, save, text_overlaps  # noqa: E402


def _crowded():
    """Two notes on one spot, long tick labels that run into each other, a legend."""
    fig, axes = new_figure(width=3.0, height=2.4)
    ax = axes[0][0]
    ax.plot(range(8), range(8), label="measured")
    ax.set_xticks(range(8), [f"label number {i}" for i in range(8)])
    ax.text(3, 3, "left note")
    ax.text(3, 3, "right note")
    ax.legend()
    return fig


@pytest.mark.parametrize("dpi", [72, 120, 200])
def test_a_saved_figure_is_shown_as_its_file_with_the_overlaps_a_new_drawing_finds(tmp_path, dpi):
    fig = _crowded()
    path = save(fig, tmp_path / "crowded.png", dpi=dpi)
    png, meta = _png_with_alt(fig)
    assert png == path.read_bytes()  # not drawn again
    redrawn = text_overlaps(fig)
    assert meta["overlapping_text"] == redrawn and "'left note' / 'right note'" in redrawn
    assert any("label number" in pair for pair in redrawn)


def test_a_figure_changed_or_removed_after_saving_is_drawn_again(tmp_path):
    fig = _crowded()
    path = save(fig, tmp_path / "crowded.png")
    fig.axes[0].set_title("changed after saving")
    png, meta = _png_with_alt(fig)
    assert png != path.read_bytes() and "changed after saving" in meta["alt"]
    other = _crowded()
    path = save(other, tmp_path / "other.png")
    path.unlink()
    png, _ = _png_with_alt(other)
    assert png.startswith(b"\x89PNG")
    # a figure never saved, or saved as a PDF, is drawn as before
    pdf = _crowded()
    save(pdf, tmp_path / "crowded.pdf")
    assert _png_with_alt(pdf)[0].startswith(b"\x89PNG")
