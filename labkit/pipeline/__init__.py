"""The pipeline lab: a stack of layers cut into P stages, one per rank, run with GPipe, 1F1B,
interleaved 1F1B and zero bubble (ZB-H1) over M microbatches. Every forward and backward of
every microbatch is timed on every rank; the timeline is split into compute, the fill/drain
bubble (idle waiting for another rank's compute) and the rest, and set beside the formula
(P−1)/(P−1+M); the step beside (M + P − 1) × t_slot(M) and beside the step model of this
machine (each block's time alone, the machine profile's co-run slowdown and message
transfers, and its scheduler wait on each message that waited in the measured step, played
through the schedule); every step checked against one process.

Read in this order:

* :mod:`~labkit.pipeline.formulas` (pure) -- the bubble in both conventions, the predicted
  step, the timeline split, blocks alone and the co-run replay;
* :mod:`~labkit.pipeline.activations` (pure) -- the activations a stage holds: formula,
  laws, sentence;
* :mod:`~labkit.pipeline.rates` (pure) -- how fast a stage computes a microbatch against its
  size, beside the machine profile's matrix product of as many operations;
* :mod:`~labkit.pipeline.schedules` (pure) -- the ideal schedule each rank runs, simulated, and
  the step model;
* :mod:`~labkit.pipeline.messages` (pure) -- a measured step's messages, and which of them
  waited for the scheduler;
* :mod:`~labkit.pipeline.config` (pure) -- what a sweep asks for, validated before any launch,
  and its estimated time (refused over the notebook's budget);
* :mod:`~labkit.pipeline.worker` (rank side) -- one launch: every (schedule, M) at one P;
* :mod:`~labkit.pipeline.run` (host side) -- :func:`run`, what notebook 07 and
  ``labkit pipeline`` call;
* :mod:`~labkit.pipeline.verdicts` (pure) -- the sentences a sweep's rows say;
* :mod:`~labkit.pipeline.imbalance` (pure) -- what a measured bubble is made of (the schedule,
  the stages' unequal means, unequal blocks within a stage, the messages and waits, the other
  steps), and the bubble laws with that split;
* :mod:`~labkit.pipeline.report`, :mod:`~labkit.pipeline.plots`, :mod:`~labkit.pipeline.cli`,
  :mod:`~labkit.pipeline.widgets` (the bubbles explorer).

``from labkit import pipeline; pipeline.run(pipeline.PipelineConfig(microbatches=(2, 4)))``.
Importing this package imports nothing heavy (no torch).
"""

from labkit.pipeline import activations, formulas, plots, rates, report, schedules, verdicts
from labkit.pipeline.config import PipelineConfig
from labkit.pipeline.run import run

__all__ = ["PipelineConfig", "activations", "formulas", "plots", "rates", "report", "run",
           "schedules", "verdicts"]
