"""The context-parallel lab: causal and full self-attention over a sequence of S tokens split
into P blocks, computed by ring attention: each rank keeps its queries, the K/V blocks travel
round the ring (``batch_isend_irecv``), partial results merge by the online softmax. Causal
masks get the load-balanced split too (2P chunks, rank r holds r and 2P-1-r). Each launch
checks the ring against ``scaled_dot_product_attention`` in one process, counts the bytes sent
against 2 (P-1)/P of K's, measures what autograd saves per rank, and times the pass beside its
compute and its messages.

Read in this order:

* :mod:`~labkit.cp.formulas` (pure) -- the split, the blocks per ring step, bytes, saved
  bytes, the step model;
* :mod:`~labkit.cp.config` (pure) -- what a benchmark asks for, validated before any launch;
* :mod:`~labkit.cp.ring` (rank side, no torch.distributed) -- the arithmetic: block attention,
  the online-softmax merge, the ring loop, and every rank simulated in one process;
* :mod:`~labkit.cp.comm` (rank side) -- the ring over torch.distributed, sends counted;
* :mod:`~labkit.cp.timeline` (rank side) -- each ring step's moments on the rank's clock;
* :mod:`~labkit.cp.worker` (rank side) -- one launch: check, counts, memory, timings;
* :mod:`~labkit.cp.run` (host side) -- :func:`run`, what the notebook and ``labkit cp`` call;
* :mod:`~labkit.cp.exchanges` (pure) -- the K/V exchanges of a measured pass that waited for
  the scheduler;
* :mod:`~labkit.cp.verdicts` (pure) -- laws and sentences; :mod:`~labkit.cp.trace` (pure) --
  the median timed pass of every rank as a Chrome trace; :mod:`~labkit.cp.budget` (pure) --
  how long a launch runs, estimated before it; :mod:`~labkit.cp.report`,
  :mod:`~labkit.cp.plots`, :mod:`~labkit.cp.cli`.

Importing this package imports nothing heavy (no torch).
"""

from labkit.cp import budget, exchanges, formulas, plots, report, trace, verdicts
from labkit.cp.config import CPConfig
from labkit.cp.run import run

__all__ = ["CPConfig", "budget", "exchanges", "formulas", "plots", "report", "run", "trace",
           "verdicts"]
