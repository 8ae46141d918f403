"""Rank side: CG's passes over memory in C: the SpMV with its two dots, the fused update.

In the Chronopoulos-Gear CG (:func:`labkit.solve.krylov.cg`) the SpMV ``w = A r`` is followed by
the dot products ``(r, r)`` and ``(w, r)``: with ``torch.mv`` and two ``torch.dot`` calls, r is
read again twice and w once after the SpMV wrote it (3 streams of 8 bytes per row). Row by row,
the SpMV already holds ``r[i]`` (its diagonal entry's column) and ``w[i]`` (the sum it just
formed), so ``spmv_dots`` below adds ``r[i]²`` and ``w[i] r[i]`` as it goes: the dots cost no
bytes. It also writes the boundary rows straight to their place (no buffer and scatter), and it
fetches the matrix's two streams (values, column indices) 2 KB ahead of the row it is on, since
without that a CSR SpMV reads well below the copy bandwidth of one thread.

``cg_update`` is CG's four vector updates in one loop (:mod:`labkit.solve.fused` says why), and
``dots2`` the two dots in one pass where the SpMV cannot carry them: a ctypes call costs
microseconds where ``torch.compile``'s guards cost tens of them and its compile seconds per
launch. With these passes a CG iteration moves the fewest bytes
:func:`labkit.solve.formulas.minimal_bytes_per_iteration` counts. What each choice measured is
in ``docs/measurements.md`` (solve).

The C source is compiled once per machine with the system's C compiler (``cc``, or ``$CC``)
into a cache folder and loaded with ctypes (no torch headers: it compiles in a fraction of a
second). :func:`load` returns None and the reason where there is no compiler, the machine is
not a CPU, or the arrays are not float64 with int32 indices; the caller keeps torch's ops.
Plain C with no ``-ffast-math`` and no contraction of a multiply and an add into one rounding
(``-ffp-contract=off``): the sums run in row order, as a reader would write them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <stdint.h>

/* y[row(i)] = sum_k vals[k] x[cols[k]] over row i's entries; row(i) = rows ? rows[i] : i.
   acc[0] += x[row(i)]^2 when count_rr, acc[1] += y[row(i)] x[row(i)]: the dots (r, r) and
   (w, r) of CG, with x = r and y = w, in the same pass. */
void spmv_dots(int64_t nrows, const int32_t *indptr, const int32_t *cols, const double *vals,
               const double *x, double *y, const int64_t *rows, int count_rr, double *acc) {
    double rr = 0.0, wr = 0.0;
    const int64_t last = nrows > 0 ? (int64_t)indptr[nrows] - 1 : 0;
    for (int64_t i = 0; i < nrows; i++) {
        /* the matrix streams fetched 2 KB ahead (never past their last entry): the hardware
           prefetcher alone left this loop at ~15 GB/s against a ~27 GB/s copy (2M rows:
           10.7 -> 7.6 ms per pass) */
        int64_t v = (int64_t)indptr[i] + 256, c = (int64_t)indptr[i] + 512;
        __builtin_prefetch(&vals[v < last ? v : last]);
        __builtin_prefetch(&cols[c < last ? c : last]);
        double s = 0.0;
        for (int32_t k = indptr[i]; k < indptr[i + 1]; k++) s += vals[k] * x[cols[k]];
        int64_t r = rows ? rows[i] : i;
        y[r] = s;
        double xr = x[r];
        if (count_rr) rr += xr * xr;
        wr += s * xr;
    }
    acc[0] += rr;
    acc[1] += wr;
}

/* CG's four updates, element by element in the textbook loop's order: x with the previous
   iteration's p and alpha, then p = u + beta p, s = w + beta s, r -= alpha s. u may be r
   itself (no preconditioner): u[i] is read before r[i] is written. */
void cg_update(int64_t n, double *x, double *p, double *s, double *r, const double *u,
               const double *w, double alpha_old, double alpha, double beta) {
    for (int64_t i = 0; i < n; i++) {
        double pi = p[i], si = s[i];
        x[i] += alpha_old * pi;
        pi = u[i] + beta * pi;
        si = w[i] + beta * si;
        p[i] = pi;
        s[i] = si;
        r[i] -= alpha * si;
    }
}

/* acc = [(r, r), (w, r)] in one pass over r and w */
void dots2(int64_t n, const double *r, const double *w, double *acc) {
    double rr = 0.0, wr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        rr += r[i] * r[i];
        wr += w[i] * r[i];
    }
    acc[0] = rr;
    acc[1] = wr;
}
"""

_P = ctypes.c_void_p
#: no -march=native: a cache shared by the nodes of a cluster must run on all of them
_FLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "labkit"


def _compile() -> Path:
    """The shared library of :data:`SOURCE` for this machine, compiled on first use."""
    cc = os.environ.get("CC", "cc")
    key = "\n".join([SOURCE, cc, *_FLAGS, os.uname().machine])
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"cg_passes_{tag}.so"
    if not lib.exists():
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / "cg_passes.c", Path(tmp) / "cg_passes.so"
            src.write_text(SOURCE)
            subprocess.run([cc, *_FLAGS, str(src), "-o", str(out)], check=True,
                           capture_output=True, timeout=120)
            os.replace(out, lib)  # atomic: ranks compiling at once leave one good file
    return lib


class CPasses:
    """The compiled passes, over contiguous float64 CPU tensors (the callers make sure: the
    operator's arrays through :func:`unfit`, CG's vectors through ``Kernels.fits``; the
    vectors are the operator's own, contiguous by construction): :meth:`run`, the SpMV with
    its dots; :meth:`update`, CG's four updates; :meth:`dots`, ``(r, r)`` and ``(w, r)`` in
    one pass."""

    def __init__(self, lib):
        self._spmv, self._update, self._dots = lib.spmv_dots, lib.cg_update, lib.dots2

    def run(self, csr: torch.Tensor, x: torch.Tensor, y: torch.Tensor, acc: torch.Tensor, *,
            rows: torch.Tensor | None = None, count_rr: bool = True) -> None:
        """``y = A x`` over the CSR's rows (row i written to ``y[rows[i]]`` with ``rows``),
        the rows' ``(x, x)`` (with ``count_rr``) and ``(y, x)`` added to ``acc``."""
        indptr, cols, vals = csr.crow_indices(), csr.col_indices(), csr.values()
        self._spmv(ctypes.c_int64(len(indptr) - 1), _P(indptr.data_ptr()), _P(cols.data_ptr()),
                   _P(vals.data_ptr()), _P(x.data_ptr()), _P(y.data_ptr()),
                   _P(rows.data_ptr()) if rows is not None else None, ctypes.c_int(count_rr),
                   _P(acc.data_ptr()))

    def update(self, x, p, s, r, u, w, alpha_old: float, alpha: float, beta: float) -> None:
        """``x += alpha_old p; p = u + beta p; s = w + beta s; r -= alpha s``, in place."""
        self._update(ctypes.c_int64(len(x)), _P(x.data_ptr()), _P(p.data_ptr()),
                     _P(s.data_ptr()), _P(r.data_ptr()), _P(u.data_ptr()), _P(w.data_ptr()),
                     alpha_old, alpha, beta)

    def dots(self, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``tensor([(r, r), (w, r)])``, one pass."""
        acc = torch.empty(2, dtype=torch.float64)
        self._dots(ctypes.c_int64(len(r)), _P(r.data_ptr()), _P(w.data_ptr()),
                   _P(acc.data_ptr()))
        return acc


def unfit(device: torch.device, dtype: torch.dtype, index_dtype: torch.dtype) -> str | None:
    """Why the C pass cannot run on arrays of this device and these types (it reads raw CPU
    memory as double values and int32 indices); None where it can."""
    if device.type != "cpu":
        return f"the C pass runs on the CPU only (device {device})"
    if dtype != torch.float64 or index_dtype != torch.int32:
        return f"the C pass takes float64 values and int32 indices ({dtype}, {index_dtype})"
    return None


def load(device: torch.device, dtype: torch.dtype, index_dtype: torch.dtype
         ) -> tuple[CPasses | None, str | None]:
    """(the compiled passes, None), or (None, why not)."""
    why = unfit(device, dtype, index_dtype)
    if why is not None:
        return None, why
    try:
        lib = ctypes.CDLL(str(_compile()))
    except (OSError, subprocess.SubprocessError) as e:
        text = getattr(e, "stderr", b"") or b""
        why = text.decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
        return None, f"no C compiler pass ({type(e).__name__}: {why[0][:200]})"
    lib.spmv_dots.restype = lib.cg_update.restype = lib.dots2.restype = None
    lib.spmv_dots.argtypes = [ctypes.c_int64, _P, _P, _P, _P, _P, _P, ctypes.c_int, _P]
    lib.cg_update.argtypes = [ctypes.c_int64, *[_P] * 6, *[ctypes.c_double] * 3]
    lib.dots2.argtypes = [ctypes.c_int64, _P, _P, _P]
    return CPasses(lib), None
