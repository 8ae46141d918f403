"""Rank side: the same matrix and right-hand side solved by torch-sla (optional extra), for a
side-by-side table. ``pip install torch-sla -c constraints.txt``.

torch-sla's ``DSparseTensor.partition`` wants the global matrix on every rank (fine at lab
sizes) and picks its own row ownership; labkit rebuilds a :class:`~labkit.solve.partition.Partition`
from that ownership so the gate (a fresh labkit SpMV), the halo and the edge cut are computed the
same way for both engines. ``solve_distributed_shard`` does not report its iteration count, so
the rows of this engine carry ``iterations: null`` (and no per-iteration columns).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.distributed as dist

from labkit.solve.partition import Partition
from labkit.solve.problems import global_matrix, grid_coords, rhs

_METHOD = {"simple": "simple", "coordinate": "rcb", "metis": "metis"}


class SlaProblem:
    """torch-sla's distributed matrix for the grid ``dims``, partitioned by ``kind``, its
    tensors and device mesh on ``device`` (the rank's: nccl carries CUDA tensors only)."""

    def __init__(self, dims: tuple, kind: str, world_size: int, rhs_kind: str, seed: int, *,
                 device: torch.device):
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch_sla import DSparseTensor, SparseTensor
        except ImportError:
            raise RuntimeError("--engine torch-sla needs torch-sla: "
                               "pip install torch-sla -c constraints.txt") from None
        A = global_matrix(dims).tocoo()
        At = SparseTensor(torch.from_numpy(A.data).to(device),
                          torch.from_numpy(A.row.astype(np.int64)).to(device),
                          torch.from_numpy(A.col.astype(np.int64)).to(device), A.shape)
        coords = None
        if kind == "coordinate":
            coords = torch.from_numpy(
                grid_coords(dims, np.arange(A.shape[0])).astype(np.float64)).to(device)
        mesh = init_device_mesh(device.type, (world_size,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.D = DSparseTensor.partition(At, mesh, partition_method=_METHOD[kind],
                                             coords=coords)
        self.owned = self.D._spec.placement.partition.owned_nodes.cpu().numpy().astype(np.int64)
        self.order = np.argsort(self.owned, kind="stable")  # their order -> sorted (labkit's)
        self.b = torch.from_numpy(rhs(rhs_kind, dims, self.owned, seed)).to(device)
        self._order = torch.from_numpy(self.order).to(device)
        owners = [None] * world_size
        dist.all_gather_object(owners, self.owned.tolist())
        parts = np.empty(math.prod(dims), dtype=np.int64)
        for r, gids in enumerate(owners):
            parts[gids] = r
        self.partition = Partition(kind, dims, world_size, parts)

    def solve(self, method: str, rtol: float, maxiter: int, restart: int) -> torch.Tensor:
        """x on this rank's owned rows, in labkit's (sorted global id) order."""
        kw = {"restart": restart} if method == "gmres" else {}
        name, pre = ("cg", "jacobi") if method == "pcg" else (method, None)
        x = self.D.solve_distributed_shard(self.b, method=name, preconditioner=pre, rtol=rtol,
                                           atol=0.0, maxiter=maxiter, **kw)
        x = x.to_local() if hasattr(x, "to_local") else x
        return x[self._order.to(x.device)]

    def b_sorted(self) -> torch.Tensor:
        return self.b[self._order]
