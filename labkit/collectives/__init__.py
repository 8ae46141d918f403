"""The collectives lab: all-reduce, all-gather, reduce-scatter, broadcast and all-to-all timed
over a size sweep in nccl-tests' conventions (algbw, busbw, #wrong), with the α–β
(latency-bandwidth) model fitted to the sweep and set beside every measurement.

Read in this order:

* :mod:`~labkit.collectives.formulas` (pure) -- busbw factors, the α–β model, its fit, sizes;
* :mod:`~labkit.collectives.config` (pure) -- what a sweep asks for, validated before any launch;
* :mod:`~labkit.collectives.worker` (rank side) -- one launch: every op and size at one world size;
* :mod:`~labkit.collectives.run` (host side) -- :func:`run`, what notebook 06 and
  ``labkit collectives`` call;
* :mod:`~labkit.collectives.report`, :mod:`~labkit.collectives.plots`,
  :mod:`~labkit.collectives.cli`.

``from labkit import collectives; collectives.run(collectives.CollectivesConfig(max_bytes="1M"))``.
Importing this package imports nothing heavy (no torch).
"""

from labkit.collectives import formulas, plots, report
from labkit.collectives.config import CollectivesConfig
from labkit.collectives.run import run

__all__ = ["CollectivesConfig", "formulas", "plots", "report", "run"]
