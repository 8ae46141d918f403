"""Rank side: the distributed matrix. Local CSR over owned + halo columns, halo exchange by
point-to-point messages to neighbours only, and inner products by one all-reduce per call.

A vector that goes through :meth:`DistOperator.matvec` lives in an *extended* buffer of
``n_owned + n_halo`` values (:meth:`DistOperator.new_ext`): the exchange writes the neighbours'
values straight into its tail, so no copy is needed before the SpMV. Vector updates and dot
products use the owned head (``v[:n_owned]``) only.

Two matvecs. :meth:`DistOperator.matvec_naive` is the teaching version: exchange the halo,
wait for it, then one SpMV over all rows; every microsecond of message latency is exposed.
:meth:`DistOperator.matvec` (the one the methods use) hides it: the local rows are split once at
setup into *interior* rows (no halo column) and *boundary* rows; it posts the exchange,
computes the interior rows while the messages travel, waits, then computes the boundary rows.

The messages travel through ``transport`` (:mod:`labkit.solve.transport`): torch.distributed,
or shared-memory mailboxes between the ranks of one host; the operator's code is the same.

Every piece of work is charged to a bucket of the operator's :class:`~labkit.timing.Stopwatch`
(``spmv``, ``halo``, ``allreduce``; the Krylov methods add ``vector``). With overlap, ``halo``
and ``allreduce`` hold the *exposed* communication time: posting the messages (gathering the
send buffer) plus the wait that the overlapped work did not cover, not the time the messages
were in flight. On CPU a bucket costs two clock reads (~0.1 us), far below one SpMV.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from labkit.solve.cspmv import unfit
from labkit.solve.formulas import spmv_bytes
from labkit.solve.partition import LocalPart
from labkit.solve.transport import TorchTransport
from labkit.timing import Stopwatch


class DistOperator:
    """``y = A x`` for a row-sharded sparse ``A``; see the module docstring."""

    def __init__(self, local: LocalPart, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                 *, world_size: int, device: torch.device | None = None,
                 dtype: torch.dtype = torch.float64, transport=None):
        self.local = local
        self.comm = transport or TorchTransport()  # see labkit.solve.transport
        self.n_owned, self.n_halo = local.n_owned, local.n_halo
        self.n_ext = self.n_owned + self.n_halo
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        self.nnz = int(len(vals))
        # int32 indices when they fit: 4 bytes less per nonzero, and SpMV is bandwidth bound
        itype = torch.int32 if max(self.nnz, self.n_ext) < 2**31 - 1 else torch.int64
        self.index_bytes = 4 if itype == torch.int32 else 8
        self._itype = itype
        #: why the SpMV-with-dots C pass cannot read this operator's arrays; None where it can
        self.c_pass_unfit = unfit(self.device, dtype, itype)
        if self.c_pass_unfit is not None:
            self.c_pass_unfit += f": {self.nnz:,} entries, {self.n_ext:,} columns"
        indptr, cols, vals = np.asarray(indptr), np.asarray(cols), np.asarray(vals)
        self.A = self._csr(indptr, cols, vals, self.n_ext)
        self._split_rows(indptr, cols, vals)
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
        self._sends = [(buf, q) for (q, _), buf in zip(self._send_idx, self._send_buf)]

    def _csr(self, indptr, cols, vals, ncols) -> torch.Tensor:
        with warnings.catch_warnings():  # "sparse CSR is in beta": known, and it works
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                torch.from_numpy(indptr).to(self._itype), torch.from_numpy(cols).to(self._itype),
                torch.from_numpy(vals).to(self.dtype), size=(len(indptr) - 1, ncols),
                device=self.device, check_invariants=False)

    def _split_rows(self, indptr, cols, vals) -> None:
        """Interior rows (every column owned) and boundary rows (some halo column), each as its
        own CSR, built once. The interior CSR spans all owned rows, with the boundary rows left
        empty, so its SpMV writes straight into the output whatever the partition's shape (a
        scatter of the interior rows through a buffer would move half as many bytes again as
        the SpMV itself); the few boundary rows go through a buffer and a scatter."""
        counts = np.diff(indptr)
        row_of = np.repeat(np.arange(self.n_owned), counts)
        boundary = np.zeros(self.n_owned, dtype=bool)
        boundary[row_of[cols >= self.n_owned]] = True
        inner, bnd = np.flatnonzero(~boundary), np.flatnonzero(boundary)
        self.n_interior, self.n_boundary = len(inner), len(bnd)

        def part(starts, row_counts, ncols):
            # CSR whose row i holds row_counts[i] entries of the local matrix from starts[i] on
            sub = np.concatenate([[0], np.cumsum(row_counts)]).astype(np.int64)
            take = np.repeat(starts - sub[:-1], row_counts) + np.arange(sub[-1])
            return self._csr(sub, cols[take], vals[take], ncols)

        # interior: every owned row, the boundary ones empty; boundary: its rows only
        self._A_int = (part(indptr[:-1], np.where(boundary, 0, counts), self.n_owned)
                       if len(inner) else None)
        self._A_bnd = part(indptr[bnd], counts[bnd], self.n_ext) if len(bnd) else None
        self._bnd_idx = torch.from_numpy(bnd).to(self.device)
        self._y_bnd = torch.empty(len(bnd), dtype=self.dtype, device=self.device)

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
    def post_exchange(self, x_ext: torch.Tensor) -> list:
        """Start filling ``x_ext``'s halo tail from the neighbours: every receive and send as
        one exchange of the transport (neighbours only: one batch on nccl, which deadlocks on
        separately posted pairs), each send buffer gathered from ``x_ext`` as its send is
        posted; returns the requests to :meth:`wait`."""
        if not self._send_idx:
            return []
        owned = x_ext[: self.n_owned]

        def fill(i: int) -> None:
            torch.index_select(owned, 0, self._send_idx[i][1], out=self._send_buf[i])

        with self.sw("halo"):
            return self.comm.exchange_start(
                self._sends, [(x_ext[lo:hi], q) for (q, lo, hi) in self._recv_slices], fill)

    def wait(self, reqs, bucket: str = "halo") -> None:
        """Wait for requests; the time is charged to ``bucket`` (the exposed part only)."""
        if reqs:
            with self.sw(bucket):
                for r in reqs:
                    r.wait()

    def exchange(self, x_ext: torch.Tensor) -> None:
        """Fill ``x_ext``'s halo tail from the neighbours and wait for it (no overlap)."""
        self.wait(self.post_exchange(x_ext))

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` (a few dot products packed together) over ranks: one message, in place."""
        if self.world_size > 1:
            with self.sw("allreduce"):
                self.comm.all_reduce(t)
        return t

    def allreduce_start(self, t: torch.Tensor):
        """Start summing ``t`` in place (``async_op=True``); :meth:`wait` on the result with
        bucket ``"allreduce"`` before reading ``t``. None on one rank."""
        if self.world_size == 1:
            return None
        with self.sw("allreduce"):
            return [self.comm.all_reduce(t, async_op=True)]

    def local_dots(self, pairs) -> torch.Tensor:
        """This rank's dot products of ``[(a, b), ...]`` (owned parts), packed into one tensor
        for one fused all-reduce (:meth:`allreduce` or :meth:`allreduce_start`)."""
        with self.sw("vector"):  # the local dot products are vector work
            return torch.stack([torch.dot(a, b) for a, b in pairs])

    def dots(self, pairs) -> list[float]:
        """Global dot products of ``[(a, b), ...]`` (owned parts) with ONE fused all-reduce."""
        return self.allreduce(self.local_dots(pairs)).tolist()

    # -- the operator ----------------------------------------------------------------------------
    def matvec_naive(self, x_ext: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """NAIVE, kept for teaching: ``out = A x`` after exchanging ``x_ext``'s halo and waiting
        for it; the whole message latency is exposed in ``halo``."""
        self.exchange(x_ext)
        with self.sw("spmv"):
            torch.mv(self.A, x_ext, out=out)
        return out

    def matvec(self, x_ext: torch.Tensor, out: torch.Tensor, overlap=None) -> torch.Tensor:
        """``out = A x`` (owned rows), the halo exchange hidden behind the interior rows: post
        the exchange, SpMV of the interior rows, wait (``halo``: the exposed wait), SpMV of
        the boundary rows. ``overlap``: a zero-argument callable run after the interior rows
        too (more work to hide the messages behind), charged to no bucket of its own."""
        if not self._send_idx and overlap is None:
            with self.sw("spmv"):
                torch.mv(self.A, x_ext, out=out)
            return out
        reqs = self.post_exchange(x_ext)
        with self.sw("spmv"):
            if self._A_int is not None:  # every owned row; the boundary ones come out 0
                torch.mv(self._A_int, x_ext[: self.n_owned], out=out)
        if overlap is not None:
            overlap()
        self.wait(reqs)
        if self._A_bnd is not None:
            with self.sw("spmv"):
                torch.mv(self._A_bnd, x_ext, out=self._y_bnd)
                out.index_copy_(0, self._bnd_idx, self._y_bnd)
        return out

    def matvec_dots(self, x_ext: torch.Tensor, out: torch.Tensor, kernel) -> torch.Tensor:
        """:meth:`matvec` with this rank's ``(x, x)`` and ``(out, x)`` (owned rows) summed in the
        SpMV's own pass (``kernel``: :class:`labkit.solve.cspmv.CPasses`); returns them as
        one tensor for one all-reduce. The boundary rows are written in place, no scatter.
        Arrays the C pass cannot read (:attr:`c_pass_unfit`: indices wider than int32, values
        other than float64): :meth:`matvec` and two torch.dot calls."""
        acc = torch.zeros(2, dtype=self.dtype, device=self.device)
        if self.c_pass_unfit is not None:
            self.matvec(x_ext, out)
            x = x_ext[: self.n_owned]
            return self.local_dots([(x, x), (out, x)])
        if not self._send_idx:
            with self.sw("spmv"):
                kernel.run(self.A, x_ext, out, acc)
            return acc
        reqs = self.post_exchange(x_ext)
        with self.sw("spmv"):
            if self._A_int is not None:  # every owned row; the boundary ones come out 0
                kernel.run(self._A_int, x_ext, out, acc)
        self.wait(reqs)
        if self._A_bnd is not None:
            with self.sw("spmv"):  # (x, x) is counted above unless no row is interior
                kernel.run(self._A_bnd, x_ext, out, acc, rows=self._bnd_idx,
                           count_rr=self._A_int is None)
        return acc

    def residual_norm(self, x: torch.Tensor, b: torch.Tensor) -> float:
        """``||b - A x|| / ||b||`` with a fresh SpMV (``x`` owned part): the solve's gate."""
        x_ext = self.new_ext()
        x_ext[: self.n_owned] = x
        ax = self.new()
        self.matvec(x_ext, ax)
        rr, bb = self.dots([(b - ax, b - ax), (b, b)])
        return float(np.sqrt(rr / bb)) if bb > 0 else float(np.sqrt(rr))

    @property
    def word_bytes(self) -> int:
        """Bytes of one value of the matrix and the vectors."""
        return torch.finfo(self.dtype).bits // 8

    def spmv_bytes(self) -> int:
        """Bytes one local SpMV streams at least: values, column indices, row pointers, the
        extended input vector and the output (every array read or written once:
        :func:`labkit.solve.formulas.spmv_bytes`)."""
        return spmv_bytes(self.nnz, self.n_owned, self.n_halo, index_bytes=self.index_bytes,
                          word=self.word_bytes)
