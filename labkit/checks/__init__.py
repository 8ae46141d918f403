"""The checks: what this machine offers a launch, where each rank runs, and whether the solve
operator's transports deliver every message (notebook 01, ``labkit env``, ``labkit placement``).

Read in this order:

* :mod:`~labkit.checks.config` (pure) -- the placement check, the transport check and the
  selftest (a launch that fails on purpose), validated before any launch;
* :mod:`~labkit.checks.placement_worker`, :mod:`~labkit.checks.transport_worker`,
  :mod:`~labkit.checks.selftest_worker` (rank side) -- one launch each;
* :mod:`~labkit.checks.run` (host side) -- :func:`env_info`, :func:`run` (the placement
  check) and :func:`transport_check`;
* :mod:`~labkit.checks.formulas` (pure) -- what notebook 01 costs, estimated before it launches;
* :mod:`~labkit.checks.verdicts` (pure) -- notebook 01's law rows and the sentences it prints
  about this machine's profile;
* :mod:`~labkit.checks.report`, :mod:`~labkit.checks.plots`, :mod:`~labkit.checks.cli`.

``from labkit import checks; checks.run(checks.PlacementConfig(), launch=LaunchOptions(nprocs=2))``.
Importing this package imports nothing heavy (no torch).
"""

from labkit.checks import formulas, plots, report, verdicts
from labkit.checks.config import PlacementConfig, SelftestConfig, TransportCheckConfig
from labkit.checks.run import env_info, run, transport_check

__all__ = ["PlacementConfig", "SelftestConfig", "TransportCheckConfig", "env_info", "formulas",
           "plots", "report", "run", "transport_check", "verdicts"]
