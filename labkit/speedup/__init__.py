"""The speedup lab: speedup, efficiency and cost of a strong-scaling run, Amdahl's and
Gustafson's laws, and a live job whose serial fraction you choose, fitted back (notebook 02).

Read in this order:

* :mod:`labkit.metrics` (pure, shared) -- the formulas: speedup, efficiency, relative SU,
  Karp-Flatt, the Amdahl fit, the knee; ``labkit speedup`` is them on your own timings;
* :mod:`~labkit.speedup.config` (pure) -- the workshare job, validated before any launch;
* :mod:`~labkit.speedup.worker` (rank side) -- the job: a serial part on rank 0, the rest split;
* :mod:`~labkit.speedup.run` (host side) -- :func:`run`, what notebook 02 and
  ``labkit workshare`` call;
* :mod:`~labkit.speedup.formulas` (pure) -- the job's model on this machine (the co-run
  slowdown carried) and what notebook 02 costs, estimated before it launches;
* :mod:`~labkit.speedup.verdicts` (pure) -- notebook 02's law rows and computed sentences;
* :mod:`~labkit.speedup.trace` (pure) -- each rank's timed runs as a Chrome trace
  (``labkit workshare --trace DIR``);
* :mod:`~labkit.speedup.report`, :mod:`~labkit.speedup.plots`, :mod:`~labkit.speedup.widgets`
  (the Amdahl explorer), :mod:`~labkit.speedup.cli`.

``from labkit import speedup; speedup.run(speedup.WorkshareConfig(serial_fraction=0.2), ...)``.
Importing this package imports nothing heavy (no torch).
"""

from labkit.speedup import formulas, plots, report, trace, verdicts, widgets
from labkit.speedup.config import WorkshareConfig
from labkit.speedup.run import run

__all__ = ["WorkshareConfig", "formulas", "plots", "report", "run", "trace", "verdicts",
           "widgets"]
