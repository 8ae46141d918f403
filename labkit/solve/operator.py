"""Rank side: the distributed matrix. Local CSR over owned + halo columns, halo exchange by
point-to-point messages to neighbours only, and inner products by one all-reduce per call.

A vector that goes through :meth:`DistOperator.matvec` lives in an *extended* buffer of
``n_owned + n_halo`` values (:meth:`DistOperator.new_ext`): the exchange writes the neighbours'
values straight into its tail, so no copy is needed before the SpMV. Vector updates and dot
products use the owned head (``v[:n_owned]``) only.

Every piece of work is charged to a bucket of the operator's :class:`~labkit.timing.Stopwatch`
(``spmv``, ``halo``, ``allreduce``; the Krylov methods add ``vector``). On CPU a bucket costs
two clock reads (~0.1 us), far below one SpMV.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.distributed as dist

from ..timing import Stopwatch
from .partition import LocalPart


class DistOperator:
    """``y = A x`` for a row-sharded sparse ``A``; see the module docstring."""

    def __init__(self, local: LocalPart, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                 *, world_size: int, device: torch.device | None = None,
                 dtype: torch.dtype = torch.float64):
        self.local = local
        self.n_owned, self.n_halo = local.n_owned, local.n_halo
        self.n_ext = self.n_owned + self.n_halo
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        self.nnz = int(len(vals))
        # int32 indices when they fit: 4 bytes less per nonzero, and SpMV is bandwidth bound
        itype = torch.int32 if max(self.nnz, self.n_ext) < 2**31 - 1 else torch.int64
        self.index_bytes = 4 if itype == torch.int32 else 8
        with warnings.catch_warnings():  # "sparse CSR is in beta": known, and it works
            warnings.simplefilter("ignore", UserWarning)
            self.A = torch.sparse_csr_tensor(
                torch.from_numpy(np.asarray(indptr)).to(itype),
                torch.from_numpy(np.asarray(cols)).to(itype),
                torch.from_numpy(np.asarray(vals)).to(dtype),
                size=(self.n_owned, self.n_ext), device=self.device, check_invariants=False)
        self.diag = self._diagonal(indptr, cols, vals)
        self.sw = Stopwatch(self.device)
        # one send buffer per neighbour, and the halo slice each neighbour's values land in
        self._send_idx, self._send_buf, self._recv_slices = [], [], []
        off = self.n_owned
        for q, count in zip(local.neighbours, local.recv_counts):
            idx = torch.from_numpy(local.send[q]).to(self.device)
            self._send_idx.append((q, idx))
            self._send_buf.append(torch.empty(len(idx), dtype=dtype, device=self.device))
            self._recv_slices.append((q, off, off + count))
            off += count

    def _diagonal(self, indptr, cols, vals) -> torch.Tensor:
        row_of = np.repeat(np.arange(self.n_owned), np.diff(indptr))
        on_diag = cols == row_of
        d = np.zeros(self.n_owned)
        d[row_of[on_diag]] = vals[on_diag]
        return torch.from_numpy(d).to(self.device, self.dtype)

    # -- vectors ---------------------------------------------------------------------------------
    def new_ext(self) -> torch.Tensor:
        """A zeroed extended vector (owned head + halo tail)."""
        return torch.zeros(self.n_ext, dtype=self.dtype, device=self.device)

    def new(self) -> torch.Tensor:
        return torch.zeros(self.n_owned, dtype=self.dtype, device=self.device)

    # -- communication ---------------------------------------------------------------------------
    def exchange(self, x_ext: torch.Tensor) -> None:
        """Fill ``x_ext``'s halo tail from the neighbours (isend/irecv, neighbours only)."""
        if not self._send_idx:
            return
        with self.sw("halo"):
            owned = x_ext[: self.n_owned]
            reqs = []
            for (q, lo, hi) in self._recv_slices:
                reqs.append(dist.irecv(x_ext[lo:hi], src=q))
            for (q, idx), buf in zip(self._send_idx, self._send_buf):
                torch.index_select(owned, 0, idx, out=buf)
                reqs.append(dist.isend(buf, dst=q))
            for r in reqs:
                r.wait()

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` (a few dot products packed together) over ranks: one message, in place."""
        if self.world_size > 1:
            with self.sw("allreduce"):
                dist.all_reduce(t)
        return t

    def dots(self, pairs) -> list[float]:
        """Global dot products of ``[(a, b), ...]`` (owned parts) with ONE fused all-reduce."""
        with self.sw("vector"):  # the local dot products are vector work
            buf = torch.stack([torch.dot(a, b) for a, b in pairs])
        return self.allreduce(buf).tolist()

    # -- the operator ----------------------------------------------------------------------------
    def matvec(self, x_ext: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out = A x`` (owned rows); exchanges ``x_ext``'s halo first."""
        self.exchange(x_ext)
        with self.sw("spmv"):
            torch.mv(self.A, x_ext, out=out)
        return out

    def residual_norm(self, x: torch.Tensor, b: torch.Tensor) -> float:
        """``||b - A x|| / ||b||`` with a fresh SpMV (``x`` owned part): the solve's gate."""
        x_ext = self.new_ext()
        x_ext[: self.n_owned] = x
        ax = self.new()
        self.matvec(x_ext, ax)
        rr, bb = self.dots([(b - ax, b - ax), (b, b)])
        return float(np.sqrt(rr / bb)) if bb > 0 else float(np.sqrt(rr))

    def spmv_bytes(self) -> int:
        """Bytes one local SpMV streams at least: values, column indices, row pointers, the
        extended input vector and the output (every array read or written once)."""
        f = torch.finfo(self.dtype).bits // 8
        return (self.nnz * (f + self.index_bytes) + (self.n_owned + 1) * self.index_bytes
                + self.n_ext * f + self.n_owned * f)
