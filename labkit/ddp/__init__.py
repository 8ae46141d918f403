"""The data-parallel training lab (issue 4), split by side.

* :mod:`labkit.ddp.config` (pure): :class:`~labkit.ddp.config.DDPConfig`, validated on the host.
* :mod:`labkit.ddp.models` (rank side, torch): the synthetic MLP, a small CNN, a small transformer
  encoder, and seeded synthetic batches.
* :mod:`labkit.ddp.train` (rank side): one optimizer step, the phases a launch times.
* :mod:`labkit.ddp.analysis` (pure): bus bandwidth, exposed communication, overlap, speedup.
* :mod:`labkit.ddp.run` (host side): :func:`~labkit.ddp.run.ddp_scaling`, the function notebooks
  and ``labkit ddp`` call; :mod:`labkit.ddp.diff` (pure): ``labkit diff`` of two result files.

This package's ``__init__`` imports nothing, so ``labkit diff`` never pays for torch.
"""
