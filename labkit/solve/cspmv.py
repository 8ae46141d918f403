"""Rank side: CG's SpMV and its two dot products in one pass over memory, a C loop.

In the Chronopoulos-Gear CG (:func:`labkit.solve.krylov.cg`) the SpMV ``w = A r`` is followed by
the dot products ``(r, r)`` and ``(w, r)``: with ``torch.mv`` and two ``torch.dot`` calls, r is
read again twice and w once after the SpMV wrote it (3 streams of 8 bytes per row). Row by row,
the SpMV already holds ``r[i]`` (its diagonal entry's column) and ``w[i]`` (the sum it just
formed), so the loop below adds ``r[i]²`` and ``w[i] r[i]`` as it goes: the dots cost no bytes.
It also writes the boundary rows straight to their place (no buffer and scatter), and it
fetches the matrix's two streams (values, column indices) 2 KB ahead of the row it is on:
``torch.mv`` on a CSR matrix got 0.58-0.75 of the copy bandwidth on one thread here, and this
loop without the prefetch no more (2M rows, one pass: torch.mv 11.1 ms, the loop 9.7-10.7 ms,
with the prefetch 7.6-8.0 ms; 7 interleaved rounds).

With this pass and the fused update of :mod:`labkit.solve.fused`, a CG iteration moves the
fewest bytes :func:`labkit.solve.formulas.minimal_bytes_per_iteration` counts. Measured at 2M
rows, one thread, 3 rounds in one process, medians: 16.6 ms per iteration with the fused update,
``torch.mv`` and the dots' own pass; 14.5 ms with this pass before the prefetch (the textbook
loop: 19.5 ms). With the prefetch ``benchmarks/solve_memory_bench.py`` measured 12.0-12.2 ms
per iteration at 2M DOF, 1.08x the minimal-bytes floor (1.05x at 501,264 DOF).

The C source is compiled once per machine with the system's C compiler (``cc``, or ``$CC``)
into a cache folder and loaded with ctypes (no torch headers: it compiles in a fraction of a
second). :func:`load` returns None and the reason where there is no compiler, the machine is
not a CPU, or the arrays are not float64 with int32 indices; the caller keeps ``torch.mv``.
Plain C with no ``-ffast-math``: the sums run in row order, as a reader would write them.
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
"""

_P = ctypes.c_void_p
#: no -march=native: a cache shared by the nodes of a cluster must run on all of them
_FLAGS = ("-O3", "-fPIC", "-shared")


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
    lib = folder / f"spmv_dots_{tag}.so"
    if not lib.exists():
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / "spmv_dots.c", Path(tmp) / "spmv_dots.so"
            src.write_text(SOURCE)
            subprocess.run([cc, *_FLAGS, str(src), "-o", str(out)], check=True,
                           capture_output=True, timeout=120)
            os.replace(out, lib)  # atomic: ranks compiling at once leave one good file
    return lib


class SpmvDots:
    """The compiled pass: :meth:`run` computes ``y = A x`` over a CSR's rows and adds the rows'
    ``(x, x)`` and ``(y, x)`` to ``acc``."""

    def __init__(self, fn):
        self._fn = fn

    def run(self, csr: torch.Tensor, x: torch.Tensor, y: torch.Tensor, acc: torch.Tensor, *,
            rows: torch.Tensor | None = None, count_rr: bool = True) -> None:
        indptr, cols, vals = csr.crow_indices(), csr.col_indices(), csr.values()
        self._fn(ctypes.c_int64(len(indptr) - 1), _P(indptr.data_ptr()), _P(cols.data_ptr()),
                 _P(vals.data_ptr()), _P(x.data_ptr()), _P(y.data_ptr()),
                 _P(rows.data_ptr()) if rows is not None else None, ctypes.c_int(count_rr),
                 _P(acc.data_ptr()))


def unfit(device: torch.device, dtype: torch.dtype, index_dtype: torch.dtype) -> str | None:
    """Why the C pass cannot run on arrays of this device and these types (it reads raw CPU
    memory as double values and int32 indices); None where it can."""
    if device.type != "cpu":
        return f"the C pass runs on the CPU only (device {device})"
    if dtype != torch.float64 or index_dtype != torch.int32:
        return f"the C pass takes float64 values and int32 indices ({dtype}, {index_dtype})"
    return None


def load(device: torch.device, dtype: torch.dtype, index_dtype: torch.dtype
         ) -> tuple[SpmvDots | None, str | None]:
    """(the compiled pass, None), or (None, why not)."""
    why = unfit(device, dtype, index_dtype)
    if why is not None:
        return None, why
    try:
        fn = ctypes.CDLL(str(_compile())).spmv_dots
    except (OSError, subprocess.SubprocessError) as e:
        text = getattr(e, "stderr", b"") or b""
        why = text.decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
        return None, f"no C compiler pass ({type(e).__name__}: {why[0][:200]})"
    fn.restype = None
    fn.argtypes = [ctypes.c_int64, _P, _P, _P, _P, _P, _P, ctypes.c_int, _P]
    return SpmvDots(fn), None
