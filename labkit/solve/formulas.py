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

from labkit.metrics import speedup, strong_efficiency, throughput_efficiency, weak_efficiency

#: vector streams of n_owned doubles per iteration (see each method in labkit.solve.krylov)
VECTOR_STREAMS = {
    "cg": 15,        # p, s: 3 + 3; x, r: 3 + 3; dots (r, r) + (w, r): 1 + 2
    "pipecg": 21,    # z, s, p, x, r, w: 6 x 3; dots (r, r) + (w, r): 1 + 2
    "pcg": 20,       # cg + u = r / diag: 3; dots (r, u), (w, u), (r, r): 2 + 2 + 1
    "bicgstab": 27,  # p: 6; s: 3; x: 6; r: 3; dots: 2 + 4 + 3
    "minres": 22,    # v: 2; y: 3 + 3; w: 3 + 3 + 2; x: 3; dots (v, y) + (r2, r2): 2 + 1
}
#: with the fused kernels (labkit.solve.fused): the four updates in one pass (x, p, s, r, w read
#: once; x, p, s, r written once: 9), the two dots as two torch.dot calls ((r, r): 1, (w, r): 2;
#: one pass over r and w, 2, where the kernels have one)
FUSED_VECTOR_STREAMS = {"cg": 12}
#: of these, the fused update's own: read x, p, s, r, w, write x, p, s, r (the dots' 3 streams
#: go when the SpMV sums them in its pass, labkit.solve.cspmv)
FUSED_UPDATE_STREAMS = 9
#: the fewest vector streams a correct iteration of the method must move besides its SpMV: every
#: vector the recurrences update is read and written once, the others read once, and the dot
#: products ride on passes that happen anyway (a fused SpMV can sum (r, r) and (w, r) as it
#: writes w). CG (Chronopoulos-Gear): read x, p, s, r, w, write x, p, s, r.
MINIMAL_VECTOR_STREAMS = {"cg": 9, "pcg": 11, "pipecg": 13}
SPMVS_PER_ITERATION = {"cg": 1, "pipecg": 1, "pcg": 1, "bicgstab": 2, "gmres": 1, "minres": 1}
#: vectors of n_owned values an iteration of the method touches (each read or written at least
#: once an iteration; see labkit.solve.krylov): its footprint besides the matrix. GMRES holds its
#: basis too (:func:`vectors_held`).
VECTORS_HELD = {
    "cg": 5,        # x, r, w, p, s
    "pcg": 7,       # cg + u = M^-1 r and the inverse diagonal
    "pipecg": 7,    # x, r, w, n, z, s, p
    "bicgstab": 7,  # x, r, r_hat, p, s, v, t
    "minres": 8,    # x, v, r1, r2, y, w, w1, w2
    "gmres": 3,     # x, w, r, besides the basis
}


def gmres_cycle(restart: int = 30, iterations: int | None = None) -> int:
    """GMRES(m)'s cycle, the basis vectors it builds before it restarts: ``m = min(restart,
    iterations)`` (a solve of fewer iterations never fills a cycle).

    >>> gmres_cycle(30), gmres_cycle(30, iterations=5)
    (30, 5)
    """
    return min(restart, iterations) if iterations else restart


def vector_streams(method: str, restart: int = 30, iterations: int | None = None) -> float:
    """Vector streams per iteration. GMRES(m), CGS2: step j reads the j+1 basis vectors four
    times (two projections, two updates) plus ~9 streams, on average ``2 (m + 1) + 9`` over a
    cycle of ``m = min(restart, iterations)`` steps, plus ~1 for the solution update.

    >>> vector_streams("cg"), vector_streams("gmres", restart=30)
    (15, 72)
    """
    if method == "gmres":
        return 2 * (gmres_cycle(restart, iterations) + 1) + 10
    return VECTOR_STREAMS[method]


def vectors_held(method: str, restart: int = 30, iterations: int | None = None) -> int:
    """Vectors an iteration touches (:data:`VECTORS_HELD`); GMRES(m) also its m + 1 basis
    vectors, ``m = min(restart, iterations)``.

    >>> vectors_held("cg"), vectors_held("gmres", restart=30), vectors_held("gmres", iterations=5)
    (5, 34, 9)
    """
    if method == "gmres":
        return VECTORS_HELD["gmres"] + gmres_cycle(restart, iterations) + 1
    return VECTORS_HELD[method]


def footprint_bytes(method: str, *, nnz: int, rows: int, halo: int = 0, restart: int = 30,
                    iterations: int | None = None, index_bytes: int = 4, word: int = 8) -> int:
    """The data one rank's iteration holds: its matrix (values, column indices, row pointers),
    the vectors it touches (:func:`vectors_held`) and the halo's values. Unlike the bytes it
    moves (:func:`bytes_per_iteration`), each counted once: a vector read three times an
    iteration takes its room once, and where the footprint fits the caches the re-reads come
    from them.

    A 500 x 500 grid's CG on one rank (1,248,000 nonzeros): 16 MB of matrix and five vectors of
    2 MB, where the iteration moves 50 MB.

    >>> footprint_bytes("cg", nnz=1_248_000, rows=250_000)
    25976004
    """
    return (matrix_bytes(nnz, rows, index_bytes=index_bytes, word=word)
            + (vectors_held(method, restart, iterations) * rows + halo) * word)


def matrix_bytes(nnz: int, rows: int, *, index_bytes: int = 4, word: int = 8) -> int:
    """A local CSR matrix's arrays: values, column indices and row pointers.

    >>> matrix_bytes(33, 9)
    436
    """
    return nnz * (word + index_bytes) + (rows + 1) * index_bytes


def spmv_bytes(nnz: int, rows: int, halo: int, index_bytes: int = 4, word: int = 8) -> int:
    """Bytes one local SpMV streams at least (see the module docstring).

    5-point 3x3 grid, one rank (nnz 33, 9 rows), int32 indices:
    33 * 12 + 10 * 4 + 9 * 8 + 9 * 8 = 580.

    >>> spmv_bytes(33, 9, 0)
    580
    """
    return (matrix_bytes(nnz, rows, index_bytes=index_bytes, word=word)
            + (rows + halo) * word + rows * word)


def bytes_per_iteration(method: str, spmv: int, rows: int, *, restart: int = 30,
                        iterations: int | None = None, word: int = 8,
                        fused: bool = False, spmv_dots: bool = False,
                        one_pass_dots: bool = True) -> float:
    """One rank's bytes per iteration as this implementation moves them: SpMVs plus vector
    streams (the fused kernels' count with ``fused``; with ``spmv_dots`` too, the dots ride
    on the SpMV's pass and only the fused update's 9 streams remain: the minimal count;
    ``one_pass_dots=False`` where the fused kernels keep two torch.dot calls, as on a GPU).

    5-point 3x3 grid, one rank: 580 + 15 x 8 x 9 plain, 580 + 11 x 8 x 9 fused:

    >>> bytes_per_iteration("cg", 580, 9), bytes_per_iteration("cg", 580, 9, fused=True)
    (1660, 1372)
    >>> bytes_per_iteration("cg", 0, 400_000, fused=True, one_pass_dots=False) == 12 * 8 * 400_000
    True
    >>> bytes_per_iteration("cg", 580, 9, fused=True, spmv_dots=True)
    1228
    """
    if fused and spmv_dots and method in FUSED_VECTOR_STREAMS:
        return SPMVS_PER_ITERATION[method] * spmv + FUSED_UPDATE_STREAMS * word * rows
    if fused and method in FUSED_VECTOR_STREAMS:
        # the dots' own pass reads r once instead of twice
        streams = FUSED_VECTOR_STREAMS[method] - (1 if one_pass_dots else 0)
    else:
        streams = vector_streams(method, restart, iterations)
    return SPMVS_PER_ITERATION[method] * spmv + streams * word * rows


def minimal_bytes_per_iteration(method: str, spmv: int, rows: int, *,
                                word: int = 8) -> float | None:
    """The fewest bytes a correct iteration of ``method`` must move on one rank: its SpMVs plus
    :data:`MINIMAL_VECTOR_STREAMS` (None for the methods it does not cover). A floor built on
    it is a limit no implementation can beat, unlike one built on this implementation's bytes.

    5-point 3x3 grid, one rank: 580 + 9 x 8 x 9 = 1228 bytes, where the textbook loop moves 1660.

    >>> minimal_bytes_per_iteration("cg", 580, 9)
    1228
    """
    if method not in MINIMAL_VECTOR_STREAMS:
        return None
    return SPMVS_PER_ITERATION[method] * spmv + MINIMAL_VECTOR_STREAMS[method] * word * rows


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
SERIES = ("mode", "dim", "dof_requested", "partitioner", "method", "rhs", "engine", "kernels",
          "fixed_iterations")


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
    A strong row that carries its own t1 (``baseline_solve_time_s``: rank 0 alone, measured
    side by side with the row's solves) is measured against that t1, not a 1-rank row's.

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
        if row.get("mode") == "strong" and row.get("baseline_solve_time_s") is not None:
            b = {"solve_time_s": row["baseline_solve_time_s"],
                 "time_per_iteration_s": row.get("baseline_time_per_iteration_s")}
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


def memory_bytes_per_rank(dof_global: int, world_size: int, *, dim: int = 2,
                          partitioned: bool = False, krylov_vectors: int = 12) -> float:
    """Bytes one rank holds at its peak, estimated before a launch (checked against the machine).

    ``n = dof_global / P`` rows per rank, ``nnz = (2 dim + 1) n``. The rank builds its CSR rows
    with int64 indices and float64 values, with up to three copies alive while it converts
    (``3 nnz (8 + 8)``), keeps ``krylov_vectors`` vectors of n doubles (CG's x, r, p, w, ...;
    GMRES adds its basis), and with a coordinate or METIS partition every rank holds the owner of
    every row (``8 dof_global``). Python, torch and gloo add ~0.4 GB, counted once.

    1M DOF on 2 ranks, 2-D: 0.4e9 + 3 x 2.5e6 x 16 + 12 x 8 x 5e5 = 0.568 GB.

    >>> round(memory_bytes_per_rank(1_000_000, 2) / 1e9, 3)
    0.568
    """
    n = dof_global / world_size
    nnz = (2 * dim + 1) * n
    return 0.4e9 + 3 * nnz * 16 + krylov_vectors * 8 * n + (8 * dof_global if partitioned else 0)


# -- when do more ranks pay? -----------------------------------------------------------------
# One rank's CG iteration costs t1 = c + k N: k seconds per DOF (the memory traffic), and c a
# fixed cost per iteration (a dozen torch calls, the Python loop) that no rank count divides.
# P ranks split the k N part, but ranks streaming memory at once share the memory system: each
# rank's share runs s times slower than it would alone (s, the co-run slowdown, from the
# machine profile). They also pay a larger fixed cost c_P: c plus one halo exchange and one
# (fused) all-reduce per iteration (t_msg) plus what else a rank of many does per iteration
# (the split SpMV's second call, packing the halo, ranks waiting for each other).
# tP = c_P + s k N / P, and more ranks pay once k N (1 - s/P) > c_P - c. The naive model takes
# c_P = c + t_msg and s = 1; the full one reads c_P off the smallest size, where k N / P is
# small, and carries s.

def predicted_iteration_s(*, seconds_per_iteration_1: float, ranks: int, fixed_s: float,
                          fixed_p_s: float, slowdown: float = 1.0) -> float:
    """t_P = c_P + s (t1 − c) / P: a P-rank iteration from the 1-rank one, with c = ``fixed_s``
    (one rank), c_P = ``fixed_p_s`` (P ranks) and s = ``slowdown`` (each rank's share of the
    divided work, run with all ranks at once, over the same work run alone).

    1 ms per iteration on one rank, 100 µs of it fixed, 2 ranks with 300 µs fixed, each rank's
    share 1.4x slower beside the other: 300 + 1.4 x 900 / 2 = 930 µs.

    >>> round(predicted_iteration_s(seconds_per_iteration_1=1e-3, ranks=2, fixed_s=1e-4,
    ...                             fixed_p_s=3e-4, slowdown=1.4) * 1e6)
    930
    """
    t1, c = seconds_per_iteration_1, min(fixed_s, seconds_per_iteration_1)
    return fixed_p_s + slowdown * (t1 - c) / ranks


def predicted_speedup(*, seconds_per_iteration_1: float, ranks: int, fixed_s: float,
                      fixed_p_s: float, slowdown: float = 1.0) -> float:
    """s_P = t1 / t_P with t_P of :func:`predicted_iteration_s`.

    1 ms per iteration on one rank, 100 µs of it fixed, 2 ranks with 300 µs fixed:
    1 / (0.3 + 0.9 / 2) = 1.333 with no co-run slowdown, 1 / 0.93 = 1.075 with 1.4.

    >>> round(predicted_speedup(seconds_per_iteration_1=1e-3, ranks=2, fixed_s=1e-4,
    ...                         fixed_p_s=3e-4), 3)
    1.333
    >>> round(predicted_speedup(seconds_per_iteration_1=1e-3, ranks=2, fixed_s=1e-4,
    ...                         fixed_p_s=3e-4, slowdown=1.4), 3)
    1.075
    """
    return seconds_per_iteration_1 / predicted_iteration_s(
        seconds_per_iteration_1=seconds_per_iteration_1, ranks=ranks, fixed_s=fixed_s,
        fixed_p_s=fixed_p_s, slowdown=slowdown)


def co_run_slowdown(copy_slowdown: float, *, ranks: int, cores: int) -> float:
    """How much slower each of ``ranks`` ranks computes its share beside the others than
    alone: as much as copies slow each other (``copy_slowdown``, alone over together, at least
    1: the copies notebook 04's launch timed beside its solves, or the machine profile's at the
    share's footprint), times ranks / cores past the cores (ranks take turns on a core); 1 for
    one rank. The whole share, not only its bytes at the copy's rate: a share that alone runs
    below that rate (its SpMV's gathers) waits on the same memory for the rest, and slows as
    much. In 18 lab runs at 250,000 DOF the shares slowed 1.31-1.54x where the profile's
    copies slowed 1.18-1.52x (14 of them at least as much); scaling the slowdown by the share's
    fraction of the copy's rate predicted 1.11-1.40x.

    >>> [co_run_slowdown(1.25, ranks=n, cores=2) for n in (1, 2, 4)]
    [1.0, 1.25, 2.5]
    """
    if ranks < 2:
        return 1.0
    return max(1.0, float(copy_slowdown)) * max(1.0, ranks / cores)


def copy_size_bytes(footprint_bytes: float) -> float:
    """The copy whose data take the room an iteration's data take (its footprint,
    :func:`footprint_bytes`): a buffer of half of it (a copy holds its source and its
    destination), so the caches hold as much of the copy as of the iteration. The iteration's
    floor reads the machine profile's copies at this size: the rate at which data of that size
    stream, cache and memory as they share them. (Read at the copy that moves the iteration's
    bytes instead, 25 MB buffers for a 250,000-DOF CG iteration's 50 MB, the floor came out
    1.3-1.8x slower than the iteration here: the iteration re-reads its few vectors from the
    cache, and holds 26 MB, not 50.) The co-run slowdown reads these copies only where
    notebook 04's launch timed none of its own: the VM's shared cache and memory change state
    between the profile and the notebook, and the launch's copies, timed seconds from the
    shares, follow them (:func:`labkit.solve.memory.launch_copy_reading`).

    One rank's 13.5 MB of matrix and vectors: the copy of a 6.75 MB buffer.

    >>> copy_size_bytes(13.5e6)
    6750000.0
    """
    return float(footprint_bytes) / 2


def fixed_cost_at(*, seconds_per_iteration: float, dof: float, ranks: int,
                  seconds_per_dof_iteration: float, slowdown: float = 1.0) -> float:
    """c_P = t_P − s k N / P: the part of a P-rank iteration that does not shrink with the size.

    130 µs per iteration at 2,000 DOF on 2 ranks, k = 5 ns: 130 − 5 = 125 µs (s = 1).

    >>> round(fixed_cost_at(seconds_per_iteration=130e-6, dof=2_000, ranks=2,
    ...                     seconds_per_dof_iteration=5e-9) * 1e6, 3)
    125.0
    """
    return seconds_per_iteration - slowdown * seconds_per_dof_iteration * dof / ranks


def fit_iteration_time(dofs, seconds) -> tuple[float, float]:
    """Least-squares (c, k) of t1 = c + k N over 1-rank sizes, in relative error (each size
    counts alike: the largest, out of cache, would otherwise decide k alone); c >= 0 and k > 0.

    >>> c, k = fit_iteration_time([1e4, 1e5, 1e6], [20e-6 + 5e-9 * n for n in (1e4, 1e5, 1e6)])
    >>> round(c * 1e6, 3), round(k * 1e9, 3)
    (20.0, 5.0)

    A noisy machine can time a larger size no slower than a smaller one: a line with k <= 0
    would say the work shrinks as it grows, so the fit goes through the origin instead.

    >>> c, k = fit_iteration_time([2e3, 1e4], [300e-6, 290e-6])
    >>> c, k > 0
    (0.0, True)
    """
    import numpy as np

    n, t = np.asarray(dofs, dtype=float), np.asarray(seconds, dtype=float)
    a = np.column_stack([np.ones_like(n), n]) / t[:, None]
    (c, k), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if c < 0 or k <= 0:  # no fixed cost, or no growth: refit through the origin
        c, k = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    return float(c), float(k)


def crossover_dof(*, seconds_per_dof_iteration: float, ranks: int, added_s: float,
                  slowdown=1.0, lo: float = 1.0, hi: float = 1e12) -> float:
    """The size N* where P ranks tie with one: k N (1 − s/P) = c_P − c, so
    N* = (c_P − c) / (k (1 − s/P)), with ``added_s`` = c_P − c the fixed cost per iteration
    that P ranks add and s = ``slowdown`` the co-run slowdown of their divided work; infinite
    when s >= P (the ranks never pay). ``slowdown`` may be a function of N (the slowdown read
    at the size each rank's share then has): N* is then the smallest N in [``lo``, ``hi``]
    where k N (1 − s(N)/P) reaches c_P − c (a scan, 32 points a decade, then bisection).

    k = 4 ns per DOF per iteration, 2 ranks adding 40 µs: N* = 40e-6 / (4e-9 / 2) = 20,000;
    with each rank's share 1.4x slower beside the other: 40e-6 / (4e-9 x 0.3) = 33,333.

    >>> round(crossover_dof(seconds_per_dof_iteration=4e-9, ranks=2, added_s=40e-6))
    20000
    >>> round(crossover_dof(seconds_per_dof_iteration=4e-9, ranks=2, added_s=40e-6, slowdown=1.4))
    33333
    >>> crossover_dof(seconds_per_dof_iteration=4e-9, ranks=2, added_s=40e-6, slowdown=2.0)
    inf

    A slowdown of 1 up to 10,000 DOF and of 1.4 beyond: past 20,000, so 33,333 again.

    >>> round(crossover_dof(seconds_per_dof_iteration=4e-9, ranks=2, added_s=40e-6,
    ...                     slowdown=lambda n: 1.0 if n <= 10_000 else 1.4))
    33333
    """
    if ranks < 2:
        raise ValueError("a crossover needs at least 2 ranks")
    if not callable(slowdown):
        gain = 1 - slowdown / ranks
        return added_s / (seconds_per_dof_iteration * gain) if gain > 0 else float("inf")
    import math

    def pays(n):
        return seconds_per_dof_iteration * n * (1 - slowdown(n) / ranks) >= added_s

    steps = int(32 * math.log10(hi / lo))
    grid = [lo * (hi / lo) ** (i / steps) for i in range(steps + 1)]
    if pays(grid[0]):
        return grid[0]
    for a, b in zip(grid, grid[1:]):
        if pays(b):
            for _ in range(60):  # bisection in log N
                mid = math.sqrt(a * b)
                a, b = (a, mid) if pays(mid) else (mid, b)
            return b
    return float("inf")


def measured_crossover(dofs, speedups) -> float | None:
    """The size from which on more ranks pay: between the largest size that loses and the next
    one (which wins), where the speedup crosses 1, interpolated linearly in log(DOF); None when
    every size loses or every size wins. (A noisy win below a loss does not count as the
    crossover: the sizes past N* must all win.)

    0.6 at 10k, 1.2 at 40k: 1 is 2/3 of the way, 10k x 4^(2/3) = 25,198.

    >>> round(measured_crossover([10_000, 40_000, 160_000], [0.6, 1.2, 1.7]))
    25198
    >>> round(measured_crossover([5_000, 10_000, 40_000], [1.05, 0.6, 1.2]))
    25198
    >>> measured_crossover([10_000, 40_000], [1.3, 1.5]) is None
    True
    """
    import math

    pts = sorted(zip(dofs, speedups))
    losing = [i for i, (_, s) in enumerate(pts) if s < 1]
    if not losing or losing[-1] == len(pts) - 1:
        return None
    (n0, s0), (n1, s1) = pts[losing[-1]], pts[losing[-1] + 1]
    f = (1 - s0) / (s1 - s0)
    return math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0)))
