"""Helpers shared by the solve-scaling lab's tests (test_solve*.py): a one-rank operator built in
this process and scipy's CG with its iteration count.
"""

from __future__ import annotations

import scipy.sparse.linalg as spla
import torch

from labkit.solve.operator import DistOperator
from labkit.solve.partition import make_partition
from labkit.solve.problems import local_system


def one_rank(dims, rhs_kind="random", dtype=torch.float64):
    part = make_partition("simple", dims, 1)
    local, (indptr, cols, vals), b = local_system(dims, part, 0, rhs_kind, 0)
    return (DistOperator(local, indptr, cols, vals, world_size=1, dtype=dtype),
            torch.from_numpy(b).to(dtype))


def scipy_cg(A, b, rtol=1e-8):
    its = [0]

    def count(_):
        its[0] += 1

    x, info = spla.cg(A, b, rtol=rtol, maxiter=100 * A.shape[0], callback=count)
    assert info == 0
    return x, its[0]
