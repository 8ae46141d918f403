"""ipywidgets explorers, one module per topic (``widgets.speedup``, ``widgets.bubbles``,
``widgets.layout``). Each builds its widgets from pure functions in :mod:`labkit.metrics` or
:mod:`labkit.model` and returns the top-level widget, so a notebook cell is one call.
"""
