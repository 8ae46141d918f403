"""The book: the tutorial notebooks run in batch, checked and published (no lab of its own).

Read in this order:

* :mod:`~labkit.book.exercises` (pure) -- ``check(answer, expected)``, the exercise cells;
* :mod:`~labkit.book.notebooks` -- find the tutorials, read and check their ``parameters``
  cell, execute one with papermill;
* :mod:`~labkit.book.kernel` -- the ``labkit-python3`` kernel they run on;
* :mod:`~labkit.book.sweep` -- one notebook over a parameter grid (``labkit sweep``);
* :mod:`~labkit.book.lab` -- every tutorial with its defaults (``labkit lab``);
* :mod:`~labkit.book.site` -- the website of the executed notebooks (``labkit site``);
* :mod:`~labkit.book.cli`.

``from labkit.book import exercises`` in a notebook. Importing this package imports nothing
heavy (papermill, nbformat and Quarto only when a notebook runs or a site is built).
"""

from labkit.book import exercises, kernel, lab, notebooks, site, sweep

__all__ = ["exercises", "kernel", "lab", "notebooks", "site", "sweep"]
