"""The data-parallel training lab: optimizer steps of a synthetic model without DDP (one plain
process) and with DistributedDataParallel at each world size; step-time percentiles over the
slowest rank, throughput and scaling against 1-rank DDP and against no DDP, where a step's
time goes (compute under ``no_sync``, exposed all-reduce, overlap with backward), and the model
of a DDP step built from those parts (compute + DDP's gradient copies + the α–β all-reduce the
backward does not hide) beside every measured speedup, with the batch from which DDP pays.

Read in this order:

* :mod:`~labkit.ddp.config` (pure) -- what a benchmark asks for, validated before any launch;
* :mod:`~labkit.ddp.models` (rank side, torch) -- the MLP, small CNN and small transformer
  encoder, and seeded synthetic batches;
* :mod:`~labkit.ddp.train` (rank side) -- one optimizer step, DDP's wrapper, replica drift;
* :mod:`~labkit.ddp.formulas` (pure) -- exposed communication, overlap, speedup and efficiency,
  the sum of a DDP step and the crossover batch;
* :mod:`~labkit.ddp.overlap` (pure) -- when each bucket's all-reduce ran against backward:
  hidden and exposed communication, from the measured timeline;
* :mod:`~labkit.ddp.abtest` (pure) -- the bucket A/B, timed in turn, judged beyond its spread;
* :mod:`~labkit.ddp.predict` (pure) -- the model of a DDP step on this machine from its machine
  profile (the co-run slowdown, the all-reduces' transfers in context), and the measured split;
* :mod:`~labkit.ddp.waits` (pure) -- the all-reduces that waited for the scheduler, counted in
  a step's timeline, and the standalone all-reduce's transfer against the profile's;
* :mod:`~labkit.ddp.budget` (pure) -- notebook 05's run time estimated before launch;
* :mod:`~labkit.ddp.worker` (rank side) -- one launch: baseline, DDP and breakdown per batch;
* :mod:`~labkit.ddp.run` (host side) -- :func:`run`, what notebook 05 and ``labkit ddp`` call;
* :mod:`~labkit.ddp.verdicts` (pure) -- the sentences a sweep's numbers say;
* :mod:`~labkit.ddp.report`, :mod:`~labkit.ddp.plots`, :mod:`~labkit.ddp.diff` (``labkit diff``
  of two results files), :mod:`~labkit.ddp.cli`.

``from labkit import ddp; ddp.run(ddp.DDPConfig(batch_size=(64, 1024)), ...)``. Importing this
package imports nothing heavy (no torch), so ``labkit diff`` never pays for it.
"""

from labkit.ddp import (
    abtest,
    budget,
    diff,
    formulas,
    overlap,
    plots,
    predict,
    report,
    verdicts,
    waits,
)
from labkit.ddp.config import DDPConfig
from labkit.ddp.run import run

__all__ = ["DDPConfig", "abtest", "budget", "diff", "formulas", "overlap", "plots", "predict",
           "report", "run", "verdicts", "waits"]
