"""Poisson problems on a grid, built row by row: each rank makes only the rows it owns (pure numpy).

The matrix is the unscaled finite-difference Laplacian with Dirichlet boundaries on the interior
points of an ``nx x ny`` (2-D, 5-point) or ``nx x ny x nz`` (3-D, 7-point) grid: ``2 * dim`` on
the diagonal, ``-1`` for each grid neighbour. Global row ``g`` is the point
``(i, j[, k])`` with ``g = i + nx * (j + ny * k)`` (x fastest). Symmetric positive definite.

Right-hand sides:

* ``random`` (default): uniform in [-1, 1), a hash of (seed, global row), so every partition
  and world size solves the very same system without anyone holding the global vector;
* ``ones``: ``b = A @ 1`` (as HPCG does): the exact solution is all ones;
* ``manufactured``: ``f = sin(pi x) sin(pi y) [sin(pi z)]`` sampled on the grid. **A trap**,
  kept for teaching: that vector is an exact eigenvector of the discrete Laplacian, so the
  Krylov space has dimension 1 and CG stops after one iteration. A timing of it measures set-up
  and overhead, not a solve. Rows solved with it carry ``rhs_is_eigenvector: true``.
"""

from __future__ import annotations

import math

import numpy as np

from labkit.solve.partition import Partition, grid_neighbours


def sqrt_condition_number(dims: tuple[int, ...]) -> float:
    """sqrt(kappa) of this module's matrix on the grid ``dims``, exactly: its eigenvalues are
    sums over the axes of ``4 sin^2(k pi / (2 (n + 1)))``, ``k = 1..n``, so

        kappa = sum_i 4 sin^2(n_i pi / (2 (n_i + 1))) / sum_i 4 sin^2(pi / (2 (n_i + 1))).

    CG's iteration count grows like sqrt(kappa) (its bound: ``sqrt(kappa) ln(2 / rtol) / 2``),
    which tends to the grid side, ``DOF^(1/dim)`` up to a constant, as the grid grows; on a small
    grid the ``n + 1`` and the boundary rows make it grow more slowly than that. A 3 x 3 grid
    has eigenvalues 4 -+ 2 sqrt(2) at its ends (kappa = 5.83):

    >>> round(sqrt_condition_number((3, 3)) ** 2, 2)
    5.83
    """
    lo = sum(4 * math.sin(math.pi / (2 * (n + 1))) ** 2 for n in dims)
    hi = sum(4 * math.sin(n * math.pi / (2 * (n + 1))) ** 2 for n in dims)
    return math.sqrt(hi / lo)


def poisson_rows(dims: tuple[int, ...], rows: np.ndarray, col_of):
    """CSR pieces (indptr, global columns mapped by ``col_of``, values) for ``rows`` of A.

    ``col_of`` maps an array of global column ids to the caller's numbering (identity for the
    global matrix, owned+halo local ids on a rank). Within a row the columns are sorted.

    >>> indptr, cols, vals = poisson_rows((3, 3), np.array([4]), lambda g: g)
    >>> cols.tolist(), vals.tolist()
    ([1, 3, 4, 5, 7], [-1.0, -1.0, 4.0, -1.0, -1.0])
    """
    rows = np.asarray(rows, dtype=np.int64)
    nbrs = grid_neighbours(dims, rows)  # (len(rows), 2 * dim), -1 outside the grid
    allc = np.concatenate([nbrs, rows[:, None]], axis=1)
    vals = np.full(allc.shape, -1.0)
    vals[:, -1] = 2.0 * len(dims)
    valid = allc >= 0
    mapped = np.full(allc.shape, np.iinfo(np.int64).max, dtype=np.int64)
    mapped[valid] = col_of(allc[valid])
    order = np.argsort(mapped, axis=1, kind="stable")  # invalid ones sort last
    mapped = np.take_along_axis(mapped, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    valid = np.take_along_axis(valid, order, axis=1)
    counts = valid.sum(axis=1)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, mapped[valid], vals[valid]


def global_matrix(dims: tuple[int, ...]):
    """The whole matrix as scipy CSR: for tests, scipy's CG and brute-force checks only."""
    import scipy.sparse as sp

    n = math.prod(dims)
    indptr, cols, vals = poisson_rows(dims, np.arange(n), lambda g: g)
    return sp.csr_matrix((vals, cols, indptr), shape=(n, n))


def _hash_uniform(seed: int, gids: np.ndarray) -> np.ndarray:
    """Uniform [-1, 1) from splitmix64(seed, global id): the same value for a row on any rank."""
    with np.errstate(over="ignore"):
        z = gids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
        z = (z + np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (2.0 / 2**53) - 1.0


def rhs(kind: str, dims: tuple[int, ...], rows: np.ndarray, seed: int = 0) -> np.ndarray:
    """This rank's entries of the right-hand side ``kind`` (see the module docstring).

    >>> b = rhs("ones", (3, 3), np.arange(9))
    >>> b.reshape(3, 3).tolist()[1]
    [1.0, 0.0, 1.0]
    """
    rows = np.asarray(rows, dtype=np.int64)
    if kind == "random":
        return _hash_uniform(seed, rows)
    if kind == "ones":  # row sums of A: 2 dim minus the neighbours inside the grid
        return 2.0 * len(dims) - (grid_neighbours(dims, rows) >= 0).sum(axis=1)
    if kind == "manufactured":
        f = np.ones(len(rows))
        for axis, coord in enumerate(grid_coords(dims, rows).T):
            h = 1.0 / (dims[axis] + 1)
            f *= np.sin(np.pi * (coord + 1) * h)
        return 2.0 * len(dims) * np.pi**2 * f  # the seed's 2 pi^2 scale (irrelevant to CG)
    raise ValueError(f"unknown rhs {kind!r}")


def grid_coords(dims: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """(len(rows), dim) integer grid coordinates of global rows (x fastest)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), len(dims)), dtype=np.int64)
    rest = rows
    for axis, n in enumerate(dims):
        out[:, axis] = rest % n
        rest = rest // n
    return out


def local_system(dims: tuple[int, ...], part: Partition, rank: int, rhs_kind: str, seed: int):
    """Everything rank ``rank`` needs: its :class:`~labkit.solve.partition.LocalPart`, its CSR
    rows over owned + halo columns (local ids: owned first, then halo) and its part of ``b``."""
    local = part.local(rank)
    indptr, cols, vals = poisson_rows(dims, local.owned, local.local_ids)
    return local, (indptr, cols, vals), rhs(rhs_kind, dims, local.owned, seed)
