"""The solve lab's arithmetic: bytes per iteration, the bandwidth floor, speedup and efficiency
columns (pure: no torch).

**Bytes per iteration** is a lower bound on memory traffic: every array an iteration touches is
read or written exactly once per use (the STREAM/HPCG convention). One local SpMV streams
``nnz (8 + i) + (rows + 1) i + 8 (rows + halo) + 8 rows`` bytes for ``i``-byte indices (values,
column indices, row pointers, input, output); vector updates and local dot products stream
``VECTOR_STREAMS[method] * 8 * rows`` bytes (``x += a p`` is 3 streams: read x, read p, write x).
The **bandwidth floor** is bytes per iteration / copy bandwidth measured in the same launch on a
buffer of the same size (so cache effects are the same), and the **bandwidth fraction** is
floor / measured time per iteration (1.0: as fast as copying those bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..metrics import speedup, strong_efficiency, throughput_efficiency, weak_efficiency

#: vector streams of n_owned doubles per iteration (see each method in labkit.solve.krylov)
VECTOR_STREAMS = {
    "cg": 15,        # p, s: 3 + 3; x, r: 3 + 3; dots (r, r) + (w, r): 1 + 2
    "pipecg": 21,    # z, s, p, x, r, w: 6 x 3; dots (r, r) + (w, r): 1 + 2
    "pcg": 20,       # cg + u = r / diag: 3; dots (r, u), (w, u), (r, r): 2 + 2 + 1
    "bicgstab": 27,  # p: 6; s: 3; x: 6; r: 3; dots: 2 + 4 + 3
    "minres": 22,    # v: 2; y: 3 + 3; w: 3 + 3 + 2; x: 3; dots (v, y) + (r2, r2): 2 + 1
}
SPMVS_PER_ITERATION = {"cg": 1, "pipecg": 1, "pcg": 1, "bicgstab": 2, "gmres": 1, "minres": 1}


def vector_streams(method: str, restart: int = 30, iterations: int | None = None) -> float:
    """Vector streams per iteration. GMRES(m), CGS2: step j reads the j+1 basis vectors four
    times (two projections, two updates) plus ~9 streams, on average ``2 (m + 1) + 9`` over a
    cycle of ``m = min(restart, iterations)`` steps, plus ~1 for the solution update.

    >>> vector_streams("cg"), vector_streams("gmres", restart=30)
    (15, 72)
    """
    if method == "gmres":
        m = min(restart, iterations) if iterations else restart
        return 2 * (m + 1) + 10
    return VECTOR_STREAMS[method]


def spmv_bytes(nnz: int, rows: int, halo: int, index_bytes: int = 4, word: int = 8) -> int:
    """Bytes one local SpMV streams at least (see the module docstring).

    5-point 3x3 grid, one rank (nnz 33, 9 rows), int32 indices:
    33 * 12 + 10 * 4 + 9 * 8 + 9 * 8 = 580.

    >>> spmv_bytes(33, 9, 0)
    580
    """
    return nnz * (word + index_bytes) + (rows + 1) * index_bytes + (rows + halo) * word + rows * word


def bytes_per_iteration(method: str, spmv: int, rows: int, *, restart: int = 30,
                        iterations: int | None = None, word: int = 8) -> float:
    """One rank's bytes per iteration: SpMVs plus vector streams.

    >>> bytes_per_iteration("cg", 580, 9)
    1660
    """
    return SPMVS_PER_ITERATION[method] * spmv + vector_streams(method, restart, iterations) * word * rows


def bandwidth_columns(bytes_per_iteration_total: float, time_per_iteration_s: float,
                      copy_gb_per_s: float) -> dict:
    """Achieved GB/s, the floor time per iteration and the fraction of the copy bandwidth.

    ``achieved = bytes / t``; ``floor = bytes / copy bandwidth``; ``fraction = floor / t``.

    >>> c = bandwidth_columns(80e6, 0.01, 10.0)
    >>> c["achieved_gb_per_s"], c["bandwidth_floor_s"], c["bandwidth_fraction"]
    (8.0, 0.008, 0.8)
    """
    achieved = bytes_per_iteration_total / time_per_iteration_s / 1e9
    floor = bytes_per_iteration_total / (copy_gb_per_s * 1e9)
    return {"achieved_gb_per_s": achieved, "bandwidth_floor_s": floor,
            "bandwidth_fraction": floor / time_per_iteration_s}


#: rows in one scaling series share these; the 1-rank row of a series is its baseline
SERIES = ("mode", "dim", "dof_requested", "partitioner", "method", "rhs", "engine")


def _series(row: dict) -> tuple:
    return tuple(row.get(k) for k in SERIES)


def add_scaling_columns(rows: Sequence[dict], baselines: Sequence[dict] = ()) -> list[dict]:
    """Speedup and efficiency of each row against the 1-rank row of its series.

    ``rows`` are the new rows; ``baselines`` older rows (from the results file) consulted when
    a series has no 1-rank row among ``rows``. Rows that failed the gate get no efficiency and
    are never a baseline. Per mode, with t = solve_time_s, thr = throughput_dof_per_s:

    * strong: speedup s = t1 / tN, efficiency E = s / N;
    * weak: efficiency E = t1 / tN (ideal: flat time), speedup = N t1 / tN (scaled speedup);
    * throughput: speedup = thrN / thr1, efficiency E = (thrN / N) / thr1.

    ``efficiency_per_iteration`` repeats the formula on time per iteration: in weak mode CG
    needs more iterations on the bigger grid, which is the algorithm, not the parallel code.

    >>> rows = [{"mode": "strong", "world_size": n, "solve_time_s": t, "time_per_iteration_s": t,
    ...          "throughput_dof_per_s": 1 / t, "gate_passed": True} for n, t in ((1, 2.0), (2, 1.25))]
    >>> [round(r["efficiency"], 2) for r in add_scaling_columns(rows)]
    [1.0, 0.8]
    """
    base: dict[tuple, dict] = {}
    for row in list(baselines) + list(rows):
        if row.get("world_size") == 1 and row.get("gate_passed"):
            base[_series(row)] = row
    out = []
    for row in rows:
        row = dict(row)
        b = base.get(_series(row))
        row.update(speedup=None, efficiency=None, efficiency_per_iteration=None)
        if b is not None and row.get("gate_passed"):
            n, mode = int(row["world_size"]), row["mode"]
            t1, tn = b["solve_time_s"], row["solve_time_s"]
            i1, i_n = b.get("time_per_iteration_s"), row.get("time_per_iteration_s")
            per_it = i1 is not None and i_n is not None  # torch-sla reports no iterations
            if mode == "strong":
                row.update(speedup=speedup(t1, tn), efficiency=strong_efficiency(t1, tn, n),
                           efficiency_per_iteration=strong_efficiency(i1, i_n, n) if per_it else None)
            elif mode == "weak":
                row.update(speedup=n * speedup(t1, tn), efficiency=weak_efficiency(t1, tn),
                           efficiency_per_iteration=weak_efficiency(i1, i_n) if per_it else None)
            else:
                thr1, thrn = b["throughput_dof_per_s"], row["throughput_dof_per_s"]
                row.update(speedup=thrn / thr1, efficiency=throughput_efficiency(thr1, thrn, n),
                           efficiency_per_iteration=weak_efficiency(i1, i_n) if per_it else None)
        out.append(row)
    return out
