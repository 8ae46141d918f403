"""The solve lab: a distributed Krylov solve of a row-sharded Poisson system, scaled weak,
strong and by throughput, every solve checked by a fresh residual (the gate).

Read in this order:

* :mod:`~labkit.solve.config` (pure) -- what a sweep asks for, validated before any launch;
* :mod:`~labkit.solve.problems` (pure numpy) -- the grid, each rank's rows, the right-hand sides;
* :mod:`~labkit.solve.partition` (pure numpy) -- who owns which row, halos, edge cut, imbalance;
* :mod:`~labkit.solve.formulas` (pure) -- bytes per iteration, the bandwidth floor, speedup;
* :mod:`~labkit.solve.operator` (rank side) -- local CSR, halo exchange, fused all-reduce;
* :mod:`~labkit.solve.transport` (rank side) -- how halos travel: torch.distributed or shm;
* :mod:`~labkit.solve.krylov` (rank side) -- textbook CG, then distributed CG, pipelined CG,
  PCG, BiCGSTAB, GMRES(m) and MINRES;
* :mod:`~labkit.solve.timeline` (rank side) -- when each phase of a few iterations ran;
* :mod:`~labkit.solve.worker` (rank side) -- one launch: every point at one world size;
* :mod:`~labkit.solve.run` (host side) -- :func:`run`, what notebooks 03 and 04 and ``labkit solve``
  call;
* :mod:`~labkit.solve.verdicts` (pure) -- the sentences a sweep's numbers say;
* :mod:`~labkit.solve.memory` (pure) -- notebook 04: an iteration against the copy bandwidth,
  alone and with the ranks sharing the memory system; :mod:`~labkit.solve.memory_sentences`
  (pure) -- what it says of them;
* :mod:`~labkit.solve.crossover` (pure) -- notebook 03: from which size more ranks pay;
* :mod:`~labkit.solve.budget` (pure) -- how long a sweep takes, refused before launch past a
  notebook's budget;
* :mod:`~labkit.solve.trace` (pure) -- those iterations as a Chrome trace (``--trace DIR``);
* :mod:`~labkit.solve.report`, :mod:`~labkit.solve.plots`, :mod:`~labkit.solve.cli`.

``from labkit import solve; solve.run(solve.SolveConfig(total_dof=20_000), ...)``. Importing
this package imports nothing heavy (no torch).
"""

from labkit.solve import (
    budget,
    crossover,
    formulas,
    memory,
    memory_sentences,
    plots,
    report,
    trace,
    verdicts,
)
from labkit.solve.config import SolveConfig
from labkit.solve.run import run

__all__ = ["SolveConfig", "budget", "crossover", "formulas", "memory", "memory_sentences", "plots",
           "report", "run", "trace", "verdicts"]
