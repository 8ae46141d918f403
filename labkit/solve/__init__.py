"""The solve-scaling lab: a distributed Krylov solve of a row-sharded Poisson system.

Modules, in reading order:

* :mod:`~labkit.solve.config` (pure) -- what a sweep asks for, validated before any launch;
* :mod:`~labkit.solve.problems` (pure numpy) -- the grid, each rank's rows, the right-hand sides;
* :mod:`~labkit.solve.partition` (pure numpy) -- who owns which row, halos, edge cut, imbalance;
* :mod:`~labkit.solve.operator` (rank side) -- local CSR, halo exchange, fused all-reduce;
* :mod:`~labkit.solve.krylov` (rank side) -- textbook CG, then the distributed CG, PCG,
  BiCGSTAB, GMRES(m) and MINRES;
* :mod:`~labkit.solve.measure` (pure) -- bytes per iteration, speedup and efficiency columns;
* :mod:`~labkit.solve.run` (host side) -- :func:`~labkit.solve.run.solve_scaling`, what the
  notebook and ``labkit solve`` call.

Importing this package imports nothing heavy.
"""
