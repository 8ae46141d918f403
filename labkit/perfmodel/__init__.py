"""The performance model: one training step of a DP x TP x PP layout predicted from catalogued
hardware, every formula stated, and checked against this machine's measurements, against
against published runs (notebook 08), and against mlsysim 0.3.0 (the appendix, notebook 90).

A pure model: nothing here launches; this machine's numbers come from the run's machine profile
(:mod:`labkit.machine`). Read in this order:

* :mod:`~labkit.perfmodel.catalog` -- accelerators, fabrics, nodes, models and published
  timings, each number with its source (``data/*.yaml``);
* :mod:`~labkit.perfmodel.topology` -- collectives with topology: rank placement (Megatron's
  order by default), ranks per node, hierarchical / ring / tree / double-binary-tree
  all-reduce, all-gather, reduce-scatter, all-to-all, and the algorithm NCCL would pick;
* :mod:`~labkit.perfmodel.model` -- the step: compute, bubble, DP/TP/PP communication with
  overlap, ZeRO 1-3, recomputation, MFU and HFU, memory and cost; bubbles by
  :mod:`labkit.pipeline.formulas`;
* :mod:`~labkit.perfmodel.ep_cp` -- the fourth and fifth dimensions: expert parallelism (the
  all-to-alls over the expert group, expert weights sharded) and context parallelism (the K/V
  ring over the context group, activations divided);
* :mod:`~labkit.perfmodel.prediction` -- what a prediction holds (every term, memory, MFU)
  and its verdict;
* :mod:`~labkit.perfmodel.layouts` -- the layout search (every DP x TP x PP = N, ranked) and
  one layout across fabrics;
* :mod:`~labkit.perfmodel.modelcheck` -- the model, with this run's machine profile, beside
  measured collective, pipeline and DDP rows;
* :mod:`~labkit.perfmodel.verdicts` -- the sentences the notebooks print, computed from the
  numbers;
* :mod:`~labkit.perfmodel.published` -- the model beside published runs (Megatron-LM 1T,
  Llama 3 405B, nccl-tests on 8 H100), ``data/published_runs.yaml``;
* :mod:`~labkit.perfmodel.mlsysim_engine` -- mlsysim 0.3.0 as an optional second engine, term
  by term (the extra ``.[mlsysim]``; a recorded table without it), and
  :mod:`~labkit.perfmodel.mlsysim_experts` for expert parallelism;
* :mod:`~labkit.perfmodel.plots`, :mod:`~labkit.perfmodel.widgets` (the layout explorer),
  :mod:`~labkit.perfmodel.cli` (``labkit model``, ``search``, ``catalog``, ``model-check``).

``from labkit.perfmodel import catalog, model``. Importing this package imports nothing heavy
(no torch, no mlsysim).
"""

from labkit.perfmodel import (
    catalog,
    layouts,
    mlsysim_engine,
    model,
    modelcheck,
    plots,
    published,
    topology,
    verdicts,
    widgets,
)

__all__ = ["catalog", "layouts", "mlsysim_engine", "model", "modelcheck", "plots", "published",
           "topology", "verdicts", "widgets"]
