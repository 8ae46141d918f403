"""The expert-parallel lab: a mixture-of-experts layer of E experts (each an MLP h -> f -> h)
behind a linear router (softmax, top k, gates renormalised over the k chosen unless told not
to, a capacity per expert with the pairs over it dropped and counted), its experts sharded over
P ranks (E/P each), the tokens dispatched to their experts and combined back by all-to-all.
Each launch checks the layer against one process running every expert on the same tokens,
counts every all-to-all's bytes against the routing it drew, and times the step's four phases
beside a model of the step from the machine profile.

Read in this order:

* :mod:`~labkit.moe.config` (pure) -- what a benchmark asks for, validated before any launch;
* :mod:`~labkit.moe.formulas` (pure) -- capacity, load, bytes per all-to-all, FLOPs, the step;
* :mod:`~labkit.moe.layer` (rank side) -- routing, dispatch, experts, combine, the reference;
* :mod:`~labkit.moe.worker` (rank side) -- one launch: check, counts, timings;
* :mod:`~labkit.moe.run` (host side) -- :func:`run`, what the notebook and ``labkit moe`` call;
* :mod:`~labkit.moe.waits` (pure) -- the all-to-alls of a measured step that waited for the
  scheduler;
* :mod:`~labkit.moe.verdicts` (pure) -- the step model from the machine profile, the laws and
  sentences;
* :mod:`~labkit.moe.trace` (pure) -- the median timed step of every rank as a Chrome trace;
* :mod:`~labkit.moe.budget` (pure) -- how long notebook 10 runs, estimated before launch;
* :mod:`~labkit.moe.report`, :mod:`~labkit.moe.plots`, :mod:`~labkit.moe.cli`.

``from labkit import moe; moe.run(moe.MoEConfig(num_experts=4, top_k=2), ...)``. Importing this
package imports nothing heavy (no torch).
"""

from labkit.moe import budget, formulas, plots, report, trace, verdicts, waits
from labkit.moe.config import MoEConfig
from labkit.moe.run import run

__all__ = ["MoEConfig", "budget", "formulas", "plots", "report", "run", "trace", "verdicts",
           "waits"]
