"""The collectives lab: all-reduce, all-gather, reduce-scatter, broadcast and all-to-all timed
over a size sweep in nccl-tests' conventions (algbw, busbw, #wrong), with the α–β
(latency-bandwidth) model fitted where the sweep follows it and set beside every measurement.

Read in this order:

* :mod:`~labkit.collectives.formulas` (pure) -- busbw factors, the α–β model, its fit, sizes;
* :mod:`~labkit.collectives.regimes` (pure) -- where one α–β line applies in a sweep (the
  bandwidth regime) and the floor below it (the latency regime): the lab's model;
* :mod:`~labkit.collectives.config` (pure) -- what a sweep asks for, validated before any launch,
  and its estimated time against a notebook's budget;
* :mod:`~labkit.collectives.worker` (rank side) -- one launch: every op and size at one world size;
* :mod:`~labkit.collectives.run` (host side) -- :func:`run`, what notebook 06 and
  ``labkit collectives`` call;
* :mod:`~labkit.collectives.verdicts` (pure) -- the sentences and law rows notebook 06 prints;
* :mod:`~labkit.collectives.context` (pure) -- the all-reduce beside the machine profile's,
  idle and while every core computes;
* :mod:`~labkit.collectives.waits` (pure) -- the calls that waited for the scheduler, and their law;
* :mod:`~labkit.collectives.trace` (pure) -- every rank's timed calls on one clock, and the
  rows as a Chrome trace (``--trace DIR``);
* :mod:`~labkit.collectives.report`, :mod:`~labkit.collectives.plots`,
  :mod:`~labkit.collectives.cli`.

``from labkit import collectives; collectives.run(collectives.CollectivesConfig(max_bytes="1M"))``.
Importing this package imports nothing heavy (no torch).
"""

from labkit.collectives import (
    config,
    context,
    formulas,
    plots,
    regimes,
    report,
    trace,
    verdicts,
    waits,
)
from labkit.collectives.config import CollectivesConfig
from labkit.collectives.run import run

__all__ = ["CollectivesConfig", "config", "context", "formulas", "plots", "regimes", "report", "run",
           "trace", "verdicts", "waits"]
