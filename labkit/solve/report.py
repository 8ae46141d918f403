"""What a solve sweep's rows hold, and the tables made of them (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`passed` the gate filter every table and figure uses;
:func:`series` the selection notebooks make; :func:`print_tables` the table ``labkit solve``
prints; :func:`messages_per_iteration_s` what CG's messages of one iteration cost. The crossover
of a sweep over sizes is :mod:`labkit.solve.crossover`'s.
"""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.results import DEVICE_MEMORY_COLUMNS, Column, select_rows

#: what makes a row a different measurement of the same point: the mode and world size, the
#: problem (dimension, size, right-hand side), the partitioner, method, engine and transport
KEY = ("mode", "world_size", "dof_per_rank", "partitioner", "method", "dim", "rhs", "engine",
       "transport", "kernels", "fixed_iterations")

COLUMNS = (
    Column("mode", "", "weak (DOF per rank fixed), strong (total DOF fixed) or throughput"),
    Column("dim", "", "2: 5-point Poisson, 3: 7-point Poisson"),
    Column("grid", "", "interior grid points per side"),
    Column("dof_global", "", "unknowns of the whole system"),
    Column("dof_per_rank", "", "unknowns per rank (rounded)"),
    Column("dof_requested", "", "the size asked for: total DOF (strong) or DOF per rank"),
    Column("partitioner", "", "who owns which row: simple, coordinate or metis"),
    Column("method", "", "the Krylov method"),
    Column("engine", "", "labkit, or torch-sla for comparison"),
    Column("transport", "", "what carried halos and all-reduces: shm or torch (None at 1 rank)"),
    Column("rhs", "", "right-hand side: random, ones or manufactured"),
    Column("rhs_is_eigenvector", "", "the manufactured rhs is an eigenvector: CG takes 1 iteration"),
    Column("rtol", "", "stopping tolerance on the relative residual"),
    Column("restart", "", "GMRES restart length (None for other methods)"),
    Column("warmup", "", "untimed solves per point"),
    Column("repeat", "", "timed solves per point, at least"),
    Column("solves_timed", "", "timed solves of the point: repeat, or more where they were short "
           "(labkit.solve.config.timed_solves)"),
    Column("owned_rows_per_rank", "", "rows each rank owns"),
    Column("halo_values_per_rank", "", "values each rank receives per SpMV"),
    Column("halo_values", "", "values all ranks receive per SpMV"),
    Column("edge_cut", "", "matrix couplings between rows of different ranks"),
    Column("load_imbalance", "", "max rows per rank / mean rows per rank (1 is balanced)"),
    Column("global_nnz", "", "non-zeros of the whole matrix"),
    Column("iterations", "", "iterations to rtol (median over repeats)"),
    Column("iterations_per_repeat", "", "iterations of each timed solve"),
    Column("converged", "", "every timed solve reached rtol"),
    Column("solve_time_s", "s", "solve time, median over repeats of the slowest rank"),
    Column("solve_time_min_s", "s", "fastest repeat"),
    Column("solve_time_cv", "", "coefficient of variation of the repeats"),
    Column("solve_time_rank_spread", "", "(slowest - fastest rank) / slowest, median repeat"),
    Column("time_per_iteration_s", "s", "solve_time_s / iterations"),
    Column("spmv_time_s", "s", "local matrix-vector products, mean over ranks"),
    Column("halo_time_s", "s", "halo exchange waits, mean over ranks"),
    Column("allreduce_time_s", "s", "all-reduce waits (dot products), mean over ranks"),
    Column("vector_time_s", "s", "vector updates and local dots, mean over ranks"),
    Column("other_time_s", "s", "solve time not in the four parts above"),
    Column("message_time_alone_s", "s", "one halo exchange + one all-reduce with no work "
           "between (CG's messages of one iteration, alone); waits beyond it are ranks arriving "
           "at different times"),
    Column("compute_imbalance", "", "SpMV + vector time of the busiest rank / mean over ranks "
           "(1: the waits are jitter and message cost, not a rank that always computes more)"),
    Column("bytes_per_iteration", "bytes", "bytes an iteration streams, all ranks"),
    Column("spmv_bytes_per_iteration", "bytes", "the part of them its SpMVs stream, all ranks"),
    Column("footprint_bytes", "bytes", "the data an iteration holds, all ranks: matrix, the "
           "vectors it touches, the halo (labkit.solve.formulas.footprint_bytes)"),
    Column("halo_bytes_per_iteration", "bytes", "halo bytes received per iteration, all ranks"),
    Column("copy_bandwidth_gb_per_s", "GB/s", "copy bandwidth of all ranks at once, same size"),
    Column("achieved_gb_per_s", "GB/s", "bytes_per_iteration / time_per_iteration_s"),
    Column("bandwidth_floor_s", "s", "bytes_per_iteration / copy bandwidth: the fastest iteration"),
    Column("bandwidth_fraction", "", "bandwidth_floor_s / time_per_iteration_s (1: at the floor)"),
    Column("throughput_dof_per_s", "DOF/s", "dof_global / solve_time_s"),
    Column("dof_iterations_per_s", "DOF/s", "dof_global x iterations / solve_time_s"),
    Column("rel_residual", "", "||b - Ax|| / ||b|| from a fresh SpMV (worst repeat)"),
    Column("gate_tol", "", "gate_factor x rtol: the residual a row must reach to pass"),
    Column("gate_passed", "", "rel_residual <= gate_tol (failed rows get no speedup)"),
    Column("maxiter", "", "iteration cap"),
    Column("kernels", "", "how CG's vector updates ran: plain (one pass each) or fused (one pass)"),
    Column("kernels_requested", "", "the kernels asked for (fused falls back to plain)"),
    Column("kernels_notice", "", "why fused kernels were not available, if they were not"),
    Column("spmv_dots", "", "fused CG: the dots (r, r), (w, r) summed in the SpMV's own pass "
                            "(labkit.solve.cspmv, True), else in a pass of their own on the "
                            "CPU or two torch.dot calls on a GPU (False)"),
    Column("spmv_dots_notice", "", "why the SpMV-with-dots pass did not run, if it did not"),
    Column("compile_time_s", "s", "compiling the fused kernels, once per launch, never timed"),
    Column("fixed_iterations", "", "HPCG-style: exactly this many iterations (no convergence claim)"),
    Column("minimal_bytes_per_iteration", "bytes",
           "the fewest bytes a correct iteration of the method must move, all ranks"),
    Column("minimal_floor_s", "s", "minimal_bytes_per_iteration / copy bandwidth: a true limit"),
    Column("minimal_bandwidth_fraction", "",
           "minimal_floor_s / time_per_iteration_s (1: no implementation can be faster)"),
    Column("copy_bandwidth_alone_gb_per_s", "GB/s",
           "one rank's copy bandwidth with the others idle (mean over ranks), same size"),
    *DEVICE_MEMORY_COLUMNS,
    Column("baseline", "", "strong: inline when rank 0 timed the whole problem alone beside "
           "this row's solves (the t1 of its speedup), else empty (t1 from the 1-rank row)"),
    Column("baseline_solve_time_s", "s", "inline baseline: rank 0's solve alone (median)"),
    Column("baseline_iterations", "", "inline baseline: iterations of rank 0's solve alone"),
    Column("baseline_time_per_iteration_s", "s", "inline baseline: its time per iteration"),
    Column("baseline_compute_time_s", "s",
           "inline baseline: its SpMV and vector time (no messages), per solve"),
    Column("baseline_spmv_time_s", "s", "inline baseline: its SpMV time, per solve"),
    Column("baseline_vector_time_s", "s", "inline baseline: its vector updates' time, per solve"),
    Column("share_alone_compute_per_iteration_s", "s",
           "a rank's share (its rows, no messages) computing alone, per iteration: the "
           "slowest rank's median (points with a baseline, more than one rank)"),
    Column("share_together_compute_per_iteration_s", "s",
           "the same with every rank computing its share at once"),
    Column("share_alone_spmv_per_iteration_s", "s",
           "the SpMV's part of share_alone_compute_per_iteration_s (the rest: vector updates)"),
    Column("share_together_spmv_per_iteration_s", "s",
           "the SpMV's part of share_together_compute_per_iteration_s"),
    Column("share_corun_slowdown", "", "together / alone: the co-run slowdown of the solve's "
           "own compute"),
    Column("share_iterations_timed", "", "iterations of one timed sample of a share"),
    Column("speedup", "", "strong: t1/tN; weak: N t1/tN; throughput: thrN/thr1"),
    Column("efficiency", "", "strong: t1/(N tN); weak: t1/tN; throughput: thrN/(N thr1)"),
    Column("efficiency_per_iteration", "", "efficiency on time per iteration"),
    # the last timed solve's first and last iterations, phase by phase (labkit.solve.timeline)
    Column("timeline_iterations", "", "iterations timeline_s holds, of the last timed solve: "
                                      "the first 2 and the last 3 (passes of the loop, from 1)"),
    Column("timeline_s", "s", "their phases (rank, iteration, phase: spmv/halo/allreduce/vector, "
                              "start_s, end_s) from the solve's start, every rank on one clock"),
    Column("timeline_iterations_s", "s", "their spans (rank, iteration, start_s, end_s), same clock"),
)

#: the table ``labkit solve`` prints, one per mode (the seed's columns plus iterations and time
#: per iteration, bandwidth fraction, gate)
TABLE_COLUMNS = ("ranks", "DOF(global)", "DOF/rank", "engine", "transport", "partitioner",
                 "method", "time(s)", "iterations", "ms/it", "rel.res", "DOF/s", "efficiency",
                 "bw.frac", "gate")

#: the parts of a solve's time, in the order the figure stacks them
TIME_SPLIT = ("spmv_time_s", "halo_time_s", "allreduce_time_s", "vector_time_s", "other_time_s")

TRAP_NOTE = (
    "note: --rhs manufactured is f = sin(pi x) sin(pi y), an exact eigenvector of the discrete "
    "Laplacian: the Krylov space has dimension 1, so CG converges in 1 iteration and these times "
    "measure overhead, not a solve. Use --rhs random (default) or ones.")


def passed(df):
    """Rows that passed the gate: the only ones efficiency, tables and figures use."""
    if df.empty or "gate_passed" not in df:
        return df
    return df[df["gate_passed"].astype(bool)]


def gate_failures(df):
    """Rows whose fresh residual ||b - A x|| / ||b|| was over the gate (``gate_passed`` false)."""
    if df.empty or "gate_passed" not in df:
        return df.iloc[:0]
    return df[~df["gate_passed"].astype(bool)]


def series(df, mode: str, **equal):
    """The passed rows of one mode (and any ``column=value`` given), sorted by world size.

    ``series(df, "strong", partitioner="simple")`` is a strong-scaling series.
    """
    return select_rows(passed(df), mode=mode, **equal).sort_values("world_size")


def gate_message(bad) -> str:
    """One line naming the points that failed the gate."""
    pts = ", ".join(f"{r.mode}/P={r.world_size}/{r.partitioner}/{r.method} "
                    f"(rel.res {r.rel_residual:.2e} > {r.gate_tol:.1e})" for r in bad.itertuples())
    return f"gate failed for {len(bad)} point(s): {pts}"


def print_tables(df, file=None) -> None:
    """The seed's table, one per mode: ranks, DOF, time, iterations, time/iteration, rel.res,
    DOF/s, efficiency (plus partitioner/method/gate when there are several)."""
    from labkit.tables import print_frame

    for mode in ("weak", "strong", "throughput"):
        part = select_rows(df, mode=mode).sort_values(["partitioner", "method", "world_size"])
        if part.empty:
            continue
        part = part.copy()
        for col in ("time_per_iteration_s", "bandwidth_fraction", "iterations"):
            if col not in part:  # torch-sla rows have no per-iteration columns
                part[col] = None
        t = part.drop(columns=["efficiency"]).assign(
            ranks=part["world_size"], time_s=part["solve_time_s"].round(4),
            ms_per_it=(part["time_per_iteration_s"].astype(float) * 1e3).round(3),
            rel_res=part["rel_residual"].map(lambda v: f"{v:.2e}"),
            dof_per_s=part["throughput_dof_per_s"].map(lambda v: f"{v:,.0f}"),
            dof_g=part["dof_global"].map(lambda v: f"{v:,}"),
            dof_r=part["dof_per_rank"].map(lambda v: f"{v:,}"),
            eff=part["efficiency"].map(lambda v: "-" if v is None or v != v else f"{100 * v:.1f}%"),
            bw=part["bandwidth_fraction"].astype(float).round(2),
            gate=part["gate_passed"].map(lambda v: "ok" if v else "FAILED"),
            transport=part["transport"].map(lambda v: v if isinstance(v, str) else "-")
            if "transport" in part else "-")
        t = t.rename(columns={"dof_g": "DOF(global)", "dof_r": "DOF/rank", "time_s": "time(s)",
                              "ms_per_it": "ms/it", "rel_res": "rel.res", "dof_per_s": "DOF/s",
                              "eff": "efficiency", "bw": "bw.frac"})
        print("=" * 78, file=file)
        print(f"{mode.upper()} SCALING", file=file)
        print("=" * 78, file=file)
        print_frame(t, TABLE_COLUMNS, file=file)


def iteration_exponent(df) -> float:
    """The measured growth of CG's iteration count with the problem size: the slope of
    log(iterations) against log(DOF) over every size of the run (passed rows, one per size;
    the count does not depend on the rank count). Theory: 1/dim (iterations ∝ the grid side).

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"dof_global": [1_000, 10_000, 100_000], "iterations": [50, 158, 500]})
    >>> round(iteration_exponent(rows), 2)
    0.5
    """
    import numpy as np

    sizes = _growth_sizes(df)
    return float(np.polyfit(np.log(sizes["dof_global"].astype(float)),
                            np.log(sizes["iterations"].astype(float)), 1)[0])


def kappa_exponent(df) -> float:
    """The model's growth of CG's iteration count with the size: the slope of log sqrt(kappa)
    (:func:`labkit.solve.problems.sqrt_condition_number`, exact for each row's ``grid``)
    against log(DOF) over the same sizes as :func:`iteration_exponent`. It tends to 1/dim as
    the grids grow; on 2-D grids of 44 to 284 points a side it is 0.495 already:

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"dof_global": [1_980, 80_088], "grid": [(44, 45), (282, 284)]})
    >>> round(kappa_exponent(rows), 3)
    0.495
    """
    import numpy as np

    from labkit.solve.problems import sqrt_condition_number

    sizes = _growth_sizes(df)
    kappa = [sqrt_condition_number(tuple(int(n) for n in g)) for g in sizes["grid"]]
    return float(np.polyfit(np.log(sizes["dof_global"].astype(float)), np.log(kappa), 1)[0])


def _growth_sizes(df):
    """The rows the iteration growth is read off: passed, one per size, smallest first."""
    sizes = passed(df).drop_duplicates("dof_global").sort_values("dof_global")
    if len(sizes) < 2:
        raise UsageError("the iteration growth needs at least two sizes")
    return sizes


def iteration_exponent_split(df) -> dict:
    """:func:`iteration_exponent` taken apart by size, the law's measured split: a least-squares
    slope is Σ_i w_i (y_i − ȳ) with w_i = (x_i − x̄) / Σ_j (x_j − x̄)² (x: log DOF, y: log
    iterations), so each size's term is its pull on the fitted exponent, and the terms sum to it.
    A size whose count sits off the line drags the slope its way: 60 iterations at 1,000 DOF,
    above the square root's 50, pull the exponent below 1/2 from the small end.

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"dof_global": [1_000, 10_000, 100_000], "iterations": [60, 158, 500]})
    >>> split = iteration_exponent_split(rows)
    >>> {k: round(v, 3) + 0.0 for k, v in split.items()}
    ... # doctest: +NORMALIZE_WHITESPACE
    {'1,000 DOF (60 iterations)': 0.224, '10,000 DOF (158 iterations)': 0.0,
     '100,000 DOF (500 iterations)': 0.237}
    >>> round(sum(split.values()), 6) == round(iteration_exponent(rows), 6)
    True
    """
    import numpy as np

    sizes = _growth_sizes(df)
    x = np.log(sizes["dof_global"].astype(float).to_numpy())
    y = np.log(sizes["iterations"].astype(float).to_numpy())
    w = (x - x.mean()) / float(((x - x.mean()) ** 2).sum())
    return {f"{int(d):,} DOF ({int(k)} iterations)": float(t) + 0.0 for d, k, t in
            zip(sizes["dof_global"], sizes["iterations"], w * (y - y.mean()))}


def eigenvector_trap(dims: tuple, *, rtol: float = 1e-8) -> dict:
    """scipy's CG, on the host, on the grid ``dims`` with the manufactured right-hand side f
    (``rhs="manufactured"``): f is an eigenvector of A (A f = lambda f, lambda = f.Af / f.f), so
    the Krylov space has dimension 1 and any CG stops after one iteration. Returns
    ``iterations``, ``solve_time_s``, ``rel_residual`` (||b - A x|| / ||b||) and
    ``eigen_residual`` (||A f - lambda f|| / ||lambda f||: 0 up to rounding).

    >>> r = eigenvector_trap((30, 30))
    >>> r["iterations"], r["rel_residual"] < 1e-8, r["eigen_residual"] < 1e-12
    (1, True, True)
    """
    import math
    import time

    import numpy as np
    import scipy.sparse.linalg as spla

    from labkit.solve.problems import global_matrix, rhs

    a = global_matrix(tuple(dims))
    f = rhs("manufactured", tuple(dims), np.arange(math.prod(dims)))
    af = a @ f
    lam = float(f @ af) / float(f @ f)
    count = [0]
    t0 = time.perf_counter()
    x, _ = spla.cg(a, f, rtol=rtol, atol=0.0, callback=lambda _: count.__setitem__(0, count[0] + 1))
    seconds = time.perf_counter() - t0
    return {"iterations": count[0], "solve_time_s": seconds,
            "rel_residual": float(np.linalg.norm(f - a @ x) / np.linalg.norm(f)),
            "eigen_residual": float(np.linalg.norm(af - lam * f) / np.linalg.norm(lam * f))}


def partition_table(dims: tuple, partitioners, ranks):
    """Edge cut, halo and load balance of each partitioner at each rank count on the grid
    ``dims``, one row each (``world_size``, ``partitioner``, ``dof_global``, ``edge_cut``,
    ``halo_values`` over all ranks, ``halo_bytes_per_spmv`` = 8 x halo values,
    ``load_imbalance``). A partition is arithmetic on the grid: computed here, on the host, with
    no launch, so it can look at rank counts this machine cannot run.

    >>> t = partition_table((4, 4), ["simple", "coordinate"], [2, 4])
    >>> t[["world_size", "partitioner", "edge_cut", "halo_values"]].values.tolist()
    [[2, 'simple', 4, 8], [2, 'coordinate', 4, 8], [4, 'simple', 12, 24], [4, 'coordinate', 8, 16]]
    """
    import math

    import pandas as pd

    from labkit.solve.partition import make_partition, partition_stats

    rows = []
    for p in ranks:
        for kind in partitioners:
            s = partition_stats(make_partition(kind, tuple(dims), int(p)))
            rows.append({"world_size": int(p), "partitioner": kind, "dof_global": math.prod(dims),
                         "edge_cut": s["edge_cut"], "halo_values": s["halo_values"],
                         "halo_bytes_per_spmv": 8 * s["halo_values"],
                         "load_imbalance": s["load_imbalance"]})
    return pd.DataFrame(rows)


def messages_per_iteration_s(row, *, profile=None) -> tuple[float, str]:
    """CG's messages of one iteration (one halo exchange, one fused 2-value all-reduce) as the
    transport the P-rank ``row`` used costs them, and where the number comes from: on ``shm``
    the row's own ``message_time_alone_s`` (timed in the solve's launch, no work between the
    messages); on ``torch`` the machine profile's in-context times (``profile.message_s`` of one
    rank's halo bytes plus ``profile.allreduce_s`` of the 16-byte all-reduce, peers idle: CG
    overlaps no message with work), the row's own where no profile is given.

    >>> row = {"transport": "shm", "message_time_alone_s": 45e-6, "world_size": 2,
    ...        "halo_bytes_per_iteration": 16_000}
    >>> messages_per_iteration_s(row)
    (4.5e-05, 'shm, timed in the solve launch')
    >>> class Prof:  # the machine profile's interface, on synthetic numbers
    ...     def message_s(self, size_bytes, *, busy=False): return 100e-6 + size_bytes / 1e9
    ...     def allreduce_s(self, size_bytes, *, ranks=2, busy=False): return 300e-6
    >>> t, src = messages_per_iteration_s({**row, "transport": "torch"}, profile=Prof())
    >>> round(t * 1e6), src
    (408, 'torch, the machine profile')
    """
    ranks = int(row["world_size"])
    if row.get("transport") == "torch" and profile is not None:
        halo = float(row["halo_bytes_per_iteration"]) / ranks
        return (profile.message_s(halo) + profile.allreduce_s(16, ranks=ranks),
                "torch, the machine profile")
    return float(row["message_time_alone_s"]), f"{row.get('transport')}, timed in the solve launch"
