"""The performance model: one training step of a DP x TP x PP layout predicted from catalogued
hardware, every formula stated, and checked against this machine's measurements, against
mlsysim 0.3.0 and against published runs (notebook 08).

A pure model: nothing here launches (``measure_local``, which measures this machine for the
``local`` catalog entry, is the one exception, imported on demand). Read in this order:

* :mod:`~labkit.perfmodel.catalog` -- accelerators, fabrics, nodes, models and published
  timings, each number with its source (``data/*.yaml``);
* :mod:`~labkit.perfmodel.topology` -- collectives with topology: rank placement (Megatron's
  order by default), ranks per node, hierarchical / ring / tree / double-binary-tree
  all-reduce, all-gather, reduce-scatter, all-to-all, and the algorithm NCCL would pick;
* :mod:`~labkit.perfmodel.model` -- the step: compute, bubble, DP/TP/PP communication with
  overlap, ZeRO 1-3, recomputation, MFU and HFU, memory and cost; bubbles by
  :mod:`labkit.pipeline.formulas`;
* :mod:`~labkit.perfmodel.prediction` -- what a prediction holds (every term, memory, MFU)
  and its verdict;
* :mod:`~labkit.perfmodel.layouts` -- the layout search (every DP x TP x PP = N, ranked) and
  one layout across fabrics;
* :mod:`~labkit.perfmodel.calibrate` -- the model beside measured collective, pipeline and DDP
  rows;
* :mod:`~labkit.perfmodel.published` -- the model beside published runs (Megatron-LM 1T,
  Llama 3 405B, nccl-tests on 8 H100), ``data/published_runs.yaml``;
* :mod:`~labkit.perfmodel.mlsysim_engine` -- mlsysim 0.3.0 as an optional second engine, term
  by term (the extra ``.[mlsysim]``; a recorded table without it);
* :mod:`~labkit.perfmodel.plots`, :mod:`~labkit.perfmodel.widgets` (the layout explorer),
  :mod:`~labkit.perfmodel.cli` (``labkit model``, ``search``, ``catalog``, ``calibrate``).

``from labkit.perfmodel import catalog, model``. Importing this package imports nothing heavy
(no torch, no mlsysim).
"""

from labkit.perfmodel import (
    calibrate,
    catalog,
    layouts,
    mlsysim_engine,
    model,
    plots,
    published,
    topology,
    widgets,
)

__all__ = ["calibrate", "catalog", "layouts", "mlsysim_engine", "model", "plots", "published",
           "topology", "widgets"]
