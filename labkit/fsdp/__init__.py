"""The sharded-data-parallel lab: the tensor-parallel lab's model trained with Adam under DDP
(every rank holds everything), under hand-written ZeRO-1 (Adam's moments sharded: the
teaching version) and ZeRO-2 (the gradients too), and under FSDP2's ``fully_shard`` (ZeRO-3:
weights, gradients and optimizer states sharded). Each launch checks every variant against one
process, takes the bytes each rank holds from its local tensors, counts what it holds over a
step (its peak, saved activations included) and the bytes each step moves, beside the ZeRO
formulas and DDP's own numbers, measures activation checkpointing on the plain model, and puts
every step time beside its prediction.

Read in this order:

* :mod:`~labkit.fsdp.config` (pure) -- what a benchmark asks for, validated before any launch;
* :mod:`~labkit.fsdp.formulas` (pure) -- bytes held per ZeRO stage (Ψ·(w + g + k)/N style,
  fp32 here), bytes moved (FSDP: 1.5x DDP), what a rank holds over a step, the step time;
* :mod:`~labkit.fsdp.shard` (rank side) -- DDP, the ZeRO-1 and ZeRO-2 optimizers, FSDP2, held
  bytes;
* :mod:`~labkit.fsdp.peak` (rank side) -- what a rank holds over one step, sampled;
* :mod:`~labkit.fsdp.record` (rank side) -- when each layer's forward and backward and each
  collective of a timed step ran, stamped; :mod:`~labkit.fsdp.trace` (pure) -- that step on
  one clock, and as a Chrome trace;
* :mod:`~labkit.fsdp.worker` (rank side) -- one launch: reference, checks, counts, timings;
* :mod:`~labkit.fsdp.run` (host side) -- :func:`run`, what notebook 09 and ``labkit fsdp`` call;
* :mod:`~labkit.fsdp.model` (pure) -- the step model in context (the machine profile's co-run
  slowdown and collectives' transfers, the scheduler waits counted in the row's median step);
* :mod:`~labkit.fsdp.verdicts` (pure) -- notebook 09's laws and sentences;
* :mod:`~labkit.fsdp.report`, :mod:`~labkit.fsdp.plots`, :mod:`~labkit.fsdp.widgets` (memory
  per GPU under DP / ZeRO-1/2/3 / TP), :mod:`~labkit.fsdp.cli`.

``from labkit import fsdp; fsdp.run(fsdp.FSDPConfig(hidden=256), ...)``. Importing this
package imports nothing heavy (no torch).
"""

from labkit.fsdp import formulas, model, plots, report, verdicts, widgets
from labkit.fsdp.config import FSDPConfig
from labkit.fsdp.run import run

__all__ = ["FSDPConfig", "formulas", "model", "plots", "report", "run", "verdicts", "widgets"]
