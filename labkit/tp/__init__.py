"""The tensor-parallel lab: a stack of Megatron transformer layers split across P ranks, the
attention by heads and the MLP by its 4h units, first by hand (the f and g all-reduces as
autograd functions: the teaching version) then by ``torch.distributed.tensor.parallel``. Each
launch checks both against one process, counts their all-reduces against 4 L b·s·h, and puts
the step time beside a prediction from the compute rate and α–β measured in the same launch.
A third variant adds sequence parallelism to the teaching version (Korthikanti et al. 2022):
what TP keeps whole on every rank split by the sequence, its activation bytes counted beside
both of the paper's formulas.

Read in this order:

* :mod:`~labkit.tp.config` (pure) -- what a benchmark asks for, validated before any launch;
* :mod:`~labkit.tp.formulas` (pure) -- parameters, FLOPs, all-reduced bytes, the step time,
  and when TP pays (the break-even hidden size);
* :mod:`~labkit.tp.models` (rank side) -- the layer whole, the teaching version with f and g,
  the library version with ColwiseParallel / RowwiseParallel; :mod:`~labkit.tp.comm` (rank
  side) -- the hand-written versions' collectives, counted and timed; :mod:`~labkit.tp.sp`
  (rank side) -- the teaching version with sequence parallelism (all-gathers and
  reduce-scatters along the sequence);
* :mod:`~labkit.tp.measure` (rank side) -- collectives counted, α–β and compute rate measured
  (the FSDP lab uses it too);
* :mod:`~labkit.tp.worker` (rank side) -- one launch: reference, checks, counts, timings;
* :mod:`~labkit.tp.run` (host side) -- :func:`run`, what notebook 09 and ``labkit tp`` call;
* :mod:`~labkit.tp.timeline` (pure) -- the time inside the collectives split into the messages
  and the wait for the later rank, from every rank's entries and exits; a timed step as
  slices on one clock, which :mod:`~labkit.tp.trace` (pure) writes as a Chrome trace;
  :mod:`~labkit.tp.waits` (pure) -- which collectives of that step waited for the scheduler
  (the FSDP lab counts its own so too);
* :mod:`~labkit.tp.verdicts` (pure) -- the laws and sentences of notebook 09, the step model in
  context (the machine profile's co-run slowdown and collectives' transfers, the scheduler
  waits counted in the row's median step); :mod:`~labkit.tp.library` (pure) -- the library's
  row: DTensor's own work, and its step priced with the teaching version's waits;
  :mod:`~labkit.tp.rates` (pure) -- each rank's
  compute rate beside the profile's matrix products; :mod:`~labkit.tp.activations` (pure) -- what a rank
  saves for backward, with and without sequence parallelism, beside Korthikanti et al.;
* :mod:`~labkit.tp.budget` (pure) -- notebook 09's time estimated, too long refused;
* :mod:`~labkit.tp.report`, :mod:`~labkit.tp.plots`, :mod:`~labkit.tp.cli`.

``from labkit import tp; tp.run(tp.TPConfig(hidden=256), ...)``. Importing this package
imports nothing heavy (no torch).
"""

from labkit.tp import (
    activations,
    budget,
    formulas,
    library,
    plots,
    rates,
    report,
    timeline,
    verdicts,
    waits,
)
from labkit.tp.config import TPConfig
from labkit.tp.run import run

__all__ = ["TPConfig", "activations", "budget", "formulas", "library", "plots", "rates",
           "report", "run", "timeline", "verdicts", "waits"]
