"""The memory side of the solve (notebook 04): one P-rank row with its inline baseline (rank 0
alone on the whole problem, timed beside the ranks) read as a memory-bound computation, its
laws and its sentences (pure: no torch).

A CG iteration streams its matrix and vectors once and does about one flop per 10 bytes, so its
time is bytes / bandwidth. Which bandwidth depends on where the bytes live: the machine
profile times copies of several sizes, alone and with every rank copying at once, and the
floor of one rank reads them at the copy whose data take the room the whole problem's data
take (its footprint, :func:`~labkit.solve.formulas.footprint_bytes`; the copy:
:func:`~labkit.solve.formulas.copy_size_bytes`). Copies that fit the shared cache side by side
barely slow each other; those that stream from the memory share its bandwidth. Each rank's
share of the work runs ``s`` times slower beside the others than alone, with s a copy's own
co-run slowdown, its rate alone over its rate with every rank copying: the copies the launch
timed beside its solves (:func:`launch_copy_reading`), seconds from the shares; the profile's
at each rank's share of the footprint (:func:`co_run_reading`) are printed beside them, and
are the model's where the launch timed none.
The model of a P-rank iteration divides only the compute
(SpMV and vector updates) of one rank's iteration:

    t_P = (t_1 − compute_1) + s · c_share + t_msg

(the rest of one rank's iteration, the Python loop and the torch calls, is paid by every rank
whole; c_share: a rank's share of the compute alone, measured (:mod:`labkit.solve.shares`),
where a row lacks it compute_1 / P; t_msg: one halo exchange and one all-reduce). A share
alone is not compute_1 / P: it holds 1/P of the data, and where the whole problem's data
about fill the shared cache, a share runs faster than its part of the whole; the row's
``share_fraction`` (P · c_share / compute_1) says by how much.
"""

from __future__ import annotations

from math import nan

from labkit.book.laws import given
from labkit.errors import UsageError
from labkit.solve import verdicts
from labkit.solve.formulas import co_run_slowdown, copy_size_bytes
from labkit.solve.memory_sentences import parts_note, slowdown_source


def row_of(df):
    """The P-rank row of notebook 04's launch; a clear error when its solve failed the gate.

    >>> import pandas as pd
    >>> int(row_of(pd.DataFrame([{"world_size": 2, "gate_passed": True}]))["world_size"])
    2
    """
    from labkit.solve.report import gate_failures, gate_message, passed

    ok = passed(df)
    ok = ok[ok["world_size"] > 1] if len(ok) else ok
    if ok.empty:
        raise UsageError(gate_message(gate_failures(df)) if len(gate_failures(df))
                         else "the launch returned no row of 2 or more ranks")
    return ok.iloc[-1]


def floor_bytes_per_s(profile, footprint_bytes: float) -> float:
    """The copy bandwidth one rank alone gets for an iteration of this footprint: the machine
    profile's copy alone, read at the copy whose data take as much room
    (:func:`~labkit.solve.formulas.copy_size_bytes`), so the caches hold as much of it."""
    return profile.copy_bytes_per_s(size_bytes=copy_size_bytes(footprint_bytes))


def footprint_of(row) -> float:
    """A row's footprint (bytes, every rank's together): ``footprint_bytes`` where it has it;
    an older row's ``bytes_per_iteration`` (the copy that moves the iteration's bytes, as the
    lab read it before it counted footprints).

    >>> footprint_of({"footprint_bytes": 26e6, "bytes_per_iteration": 50e6})
    26000000.0
    >>> footprint_of({"bytes_per_iteration": 50e6})
    50000000.0
    """
    got = row.get("footprint_bytes")
    return float(got if got is not None and got == got else row["bytes_per_iteration"])


def co_run_reading(profile, *, footprint_bytes: float, ranks: int,
                   bytes_per_iteration: float | None = None,
                   share_alone_s: float | None = None) -> dict:
    """s of P ranks sharing the memory system, read off the machine profile at each rank's
    share of the footprint: ``footprint_per_rank`` (the iteration's ``footprint_bytes`` over the
    ranks), ``copy_size_bytes`` (the copy whose data take that room), ``alone_bytes_per_s`` and
    ``together_bytes_per_s`` (that copy's rate alone and with every rank copying),
    ``copy_slowdown`` (their ratio, at least 1), ``bandwidth_fraction`` (a share's floor,
    its part of ``bytes_per_iteration`` at the copy's rate alone, over its compute alone
    ``share_alone_s``: how far below the copy's rate it runs; 1 where either is not given)
    and ``slowdown`` (:func:`~labkit.solve.formulas.co_run_slowdown`: the copy's slowdown,
    times ranks / cores past the cores).

    >>> class Prof:  # copies of 1 and 32 MiB: 100 and 44 GB/s alone, 98 and 24 together
    ...     cores = 2
    ...     def copy_bytes_per_s(self, *, together=False, size_bytes=None):
    ...         small = size_bytes <= 1 << 20
    ...         return (98e9 if small else 24e9) if together else (100e9 if small else 44e9)
    >>> r = co_run_reading(Prof(), footprint_bytes=2e6, ranks=2)
    >>> r["copy_size_bytes"], round(r["slowdown"], 2)
    (500000.0, 1.02)
    >>> round(co_run_reading(Prof(), footprint_bytes=200e6, ranks=2)["slowdown"], 2)
    1.83

    Each share's 100 MB per iteration at 44 GB/s alone is a floor of 2.27 ms; a share that
    alone took 3.0 ms ran at 0.76 of the copy's rate, and slows as the copies do:

    >>> r = co_run_reading(Prof(), footprint_bytes=200e6, ranks=2, bytes_per_iteration=200e6,
    ...                    share_alone_s=3.0e-3)
    >>> round(r["bandwidth_fraction"], 2), round(r["slowdown"], 2)
    (0.76, 1.83)
    """
    per_rank = float(footprint_bytes) / ranks
    size = copy_size_bytes(per_rank)
    together = profile.copy_bytes_per_s(together=True, size_bytes=size)
    alone = profile.copy_bytes_per_s(size_bytes=size)
    copy = max(1.0, alone / together)
    fraction, floor = 1.0, None
    if bytes_per_iteration is not None and share_alone_s is not None and share_alone_s > 0:
        floor = float(bytes_per_iteration) / ranks / alone
        fraction = floor / float(share_alone_s)
    return {"ranks": int(ranks), "footprint_per_rank": per_rank, "copy_size_bytes": size,
            "alone_bytes_per_s": alone, "together_bytes_per_s": together, "copy_slowdown": copy,
            "share_floor_s": floor, "share_alone_s": share_alone_s,
            "bandwidth_fraction": fraction,
            "slowdown": co_run_slowdown(copy, ranks=ranks, cores=profile.cores)}


def launch_copy_reading(row, *, ranks: int, cores: int) -> dict | None:
    """s of P ranks sharing the memory system, read off the copies the launch itself timed
    beside its solves (a buffer of the iteration's bytes per rank over 2, each rank's best
    copy of those before and after the solves, alone in turn and all at once:
    ``copy_bandwidth_alone_gb_per_s``, ``copy_bandwidth_gb_per_s`` summed over ranks):
    ``buffer_bytes`` (half a rank's bytes per iteration: a copy moves its buffer twice),
    ``alone_bytes_per_s`` and ``together_bytes_per_s`` (each rank's),
    ``copy_slowdown`` (their ratio, at least 1) and ``slowdown``
    (:func:`~labkit.solve.formulas.co_run_slowdown`); None where the row lacks them. Why the
    launch's: the shared cache and memory of the 2-vCPU VM go between a state where two
    ranks' traffic barely competes and one where it costs 1.3-1.4x (a neighbour's), and the
    profile, timed a minute or more before the notebook, was in the other state in 8 of 18
    lab runs; these copies are timed seconds from the shares.

    >>> r = launch_copy_reading({"copy_bandwidth_alone_gb_per_s": 20.0,
    ...                          "copy_bandwidth_gb_per_s": 32.0, "bytes_per_iteration": 50e6},
    ...                         ranks=2, cores=2)
    >>> r["buffer_bytes"], round(r["copy_slowdown"], 2), round(r["slowdown"], 2)
    (12500000.0, 1.25, 1.25)
    >>> launch_copy_reading({"copy_bandwidth_gb_per_s": 32.0}, ranks=2, cores=2) is None
    True
    """
    alone = row.get("copy_bandwidth_alone_gb_per_s")
    together = row.get("copy_bandwidth_gb_per_s")
    if not (given(alone) and given(together)) or min(float(alone), float(together)) <= 0:
        return None
    each = float(together) / ranks
    copy = max(1.0, float(alone) / each)
    # the worker sized the buffers at the method's bytes per iteration before its iterations
    # were known: the same for CG, read here at the row's (GMRES's grow with its iterations)
    return {"ranks": int(ranks), "cores": int(cores),
            "buffer_bytes": float(row["bytes_per_iteration"]) / ranks / 2,
            "alone_bytes_per_s": float(alone) * 1e9, "together_bytes_per_s": each * 1e9,
            "copy_slowdown": copy, "slowdown": co_run_slowdown(copy, ranks=ranks, cores=cores)}


def point(row, *, profile, message_s: float) -> dict:
    """The numbers of notebook 04 from one P-rank strong row with an inline baseline, per
    iteration: ``t1_s`` and ``compute1_s`` (rank 0 alone), ``tp_s`` and ``computep_s`` (the P
    ranks, compute averaged over ranks), ``floor_bytes_per_s`` (:func:`floor_bytes_per_s` of
    the whole problem's footprint, :func:`footprint_of`), ``floor1_s`` (the iteration's bytes at
    it: a 1-rank launch's floor up to the halo's few bytes), ``fraction1`` (floor1 / t1),
    ``minimal_floor1_s`` (the fewest bytes a correct iteration moves, at the same rate),
    ``share_alone_s`` (c_share: the share's compute alone, per iteration, or compute_1 / P where
    the row has no share timed), ``share_fraction`` (P · c_share / compute_1, nan without),
    ``measured_slowdown`` (the share's compute with every rank at it over the same share alone;
    without a share timed, P · compute_P / compute_1), ``reading`` (:func:`co_run_reading` at
    each rank's share of the footprint) and its ``profile_slowdown``, ``launch_reading``
    (:func:`launch_copy_reading`, None without the launch's copies), ``slowdown`` (the
    launch's copies' where the row has them, else the profile's), ``model_tp_s`` (the model
    above, with ``message_s``),
    ``speedup`` (t1 / tP), ``split_us`` (the P-rank iteration in its measured terms),
    ``split1_ms`` (one rank's iteration alone: SpMV, vector updates and the rest, where the row
    times them apart; else None) and ``ranks``.

    Copies of 13 MB per rank run 1.25x slower with both ranks copying. Without its shares timed,
    a share is compute_1 / 2 = 1.7 ms streaming at the copy's rate: s = 1.25 and t_2 = 0.1 +
    1.25 x 1.7 + 0.05 = 2.28 ms. With a share alone timed at 1.6 ms against its floor of 1.0
    ms (25 MB at 25 GB/s), it ran at 0.63 of the copy's rate and slows as the copies do:
    t_2 = 0.1 + 1.25 x 1.6 + 0.05 = 2.15 ms.

    >>> class Prof:  # 25 GB/s alone at every size, 20 GB/s each with both copying
    ...     cores = 2
    ...     def copy_bytes_per_s(self, *, together=False, size_bytes=None):
    ...         return 20e9 if together else 25e9
    >>> row = {"world_size": 2, "iterations": 100, "time_per_iteration_s": 2.4e-3,
    ...        "spmv_time_s": 0.13, "vector_time_s": 0.09, "halo_time_s": 0.004,
    ...        "allreduce_time_s": 0.004, "message_time_alone_s": 50e-6,
    ...        "compute_imbalance": 1.0, "baseline_time_per_iteration_s": 3.5e-3,
    ...        "baseline_iterations": 100, "baseline_compute_time_s": 0.34,
    ...        "bytes_per_iteration": 50e6, "footprint_bytes": 26e6,
    ...        "minimal_bytes_per_iteration": 38e6}
    >>> m = point(row, profile=Prof(), message_s=50e-6)
    >>> round(m["slowdown"], 3), round(m["measured_slowdown"], 3), round(m["model_tp_s"] * 1e6)
    (1.25, 1.294, 2275)
    >>> round(m["fraction1"], 2), round(m["speedup"], 2)
    (0.57, 1.46)
    >>> m = point({**row, "share_alone_compute_per_iteration_s": 1.6e-3,
    ...            "share_together_compute_per_iteration_s": 2.1e-3}, profile=Prof(),
    ...           message_s=50e-6)
    >>> round(m["measured_slowdown"], 3), round(m["share_fraction"], 3), round(m["model_tp_s"] * 1e6)
    (1.312, 0.941, 2150)
    >>> round(m["reading"]["bandwidth_fraction"], 3), m["slowdown"]
    (0.625, 1.25)
    >>> m["split1_ms"] is None  # the baseline's SpMV and vector time not kept apart
    True

    Where the launch timed its own copies (each rank 20 GB/s alone, 18 GB/s with both at it),
    s is theirs, 1.11, the profile's 1.25 kept beside it: t_2 = 0.1 + 1.11 x 1.6 + 0.05 ms:

    >>> m = point({**row, "copy_bandwidth_alone_gb_per_s": 20.0, "copy_bandwidth_gb_per_s": 36.0,
    ...            "share_alone_compute_per_iteration_s": 1.6e-3,
    ...            "share_together_compute_per_iteration_s": 2.1e-3}, profile=Prof(),
    ...           message_s=50e-6)
    >>> round(m["slowdown"], 3), round(m["profile_slowdown"], 3), round(m["model_tp_s"] * 1e6)
    (1.111, 1.25, 1928)
    >>> m = point({**row, "baseline_spmv_time_s": 0.25, "baseline_vector_time_s": 0.09},
    ...           profile=Prof(), message_s=50e-6)
    >>> {k: round(v, 2) for k, v in m["split1_ms"].items()}  # sums to t1 = 3.5 ms
    {'SpMV': 2.5, 'vector updates': 0.9, 'the rest (the loop, the calls)': 0.1}
    """
    need = ("baseline_time_per_iteration_s", "baseline_compute_time_s", "baseline_iterations")
    if int(row["world_size"]) < 2 or any(row.get(k) is None or row.get(k) != row.get(k)
                                         for k in need):
        raise UsageError("the memory comparison needs a strong row of 2 or more ranks with its "
                         "inline baseline (baseline='inline')")
    p = int(row["world_size"])
    its, its1 = max(float(row["iterations"]), 1.0), max(float(row["baseline_iterations"]), 1.0)
    t1 = float(row["baseline_time_per_iteration_s"])
    compute1 = float(row["baseline_compute_time_s"]) / its1
    tp = float(row["time_per_iteration_s"])
    computep = (float(row["spmv_time_s"]) + float(row["vector_time_s"])) / its
    nbytes, footprint = float(row["bytes_per_iteration"]), footprint_of(row)
    bw = floor_bytes_per_s(profile, footprint)
    minimal = row.get("minimal_bytes_per_iteration")
    minimal_floor = (float(minimal) / bw if minimal is not None and minimal == minimal else None)
    alone = row.get("share_alone_compute_per_iteration_s")
    together = row.get("share_together_compute_per_iteration_s")
    timed = alone is not None and alone == alone and together is not None and alone > 0
    share = float(alone) if timed else compute1 / p
    reading = co_run_reading(profile, footprint_bytes=footprint, ranks=p,
                             bytes_per_iteration=nbytes if timed else None,
                             share_alone_s=share if timed else None)
    launch = launch_copy_reading(row, ranks=p, cores=profile.cores)
    slowdown = (launch or reading)["slowdown"]
    model = (t1 - compute1) + slowdown * share + message_s
    # one rank's iteration alone in its parts, where rank 0's solve alone timed them apart
    spmv1, vector1 = row.get("baseline_spmv_time_s"), row.get("baseline_vector_time_s")
    split1 = parts1 = None
    if given(spmv1) and given(vector1):
        spmv1, vector1 = float(spmv1) / its1, float(vector1) / its1
        split1 = {"SpMV": spmv1 * 1e3, "vector updates": vector1 * 1e3,
                  "the rest (the loop, the calls)": (t1 - compute1) * 1e3}
        spmv_bytes = row.get("spmv_bytes_per_iteration")
        if given(spmv_bytes):  # each part against its own bytes' floor
            parts1 = {"SpMV": (spmv1, float(spmv_bytes) / bw),
                      "vector updates": (vector1, (nbytes - float(spmv_bytes)) / bw)}
    return {"ranks": p, "t1_s": t1, "compute1_s": compute1, "tp_s": tp, "computep_s": computep,
            "slowdown_split": slowdown_split(row) if timed else None,
            "share_alone_s": share, "share_fraction": p * share / compute1 if timed else nan,
            "floor_bytes_per_s": bw, "floor1_s": nbytes / bw, "fraction1": nbytes / bw / t1,
            "minimal_floor1_s": minimal_floor,
            "measured_slowdown": float(together) / share if timed else p * computep / compute1,
            "slowdown": slowdown, "launch_reading": launch,
            "profile_slowdown": reading["slowdown"], "reading": reading,
            "message_s": message_s, "model_tp_s": model, "speedup": t1 / tp,
            "split_us": verdicts.iteration_split_us(row), "split1_ms": split1,
            "parts1": parts1}


def slowdown_split(row) -> dict | None:
    """The measured co-run slowdown of a share (together / alone) taken apart by part:
    1 (the share alone) + what the SpMV took beyond its time alone + what the vector updates
    did, each over the share's time alone (so the terms sum to the ratio). None where the
    row does not keep the SpMV's part.

    >>> slowdown_split({"share_alone_compute_per_iteration_s": 2e-3,
    ...                 "share_together_compute_per_iteration_s": 2.6e-3,
    ...                 "share_alone_spmv_per_iteration_s": 1.4e-3,
    ...                 "share_together_spmv_per_iteration_s": 1.6e-3})
    {'alone': 1.0, 'the SpMV beside the others': 0.1, 'the vector updates beside them': 0.2}
    """
    keys = ("share_alone_compute_per_iteration_s", "share_together_compute_per_iteration_s",
            "share_alone_spmv_per_iteration_s", "share_together_spmv_per_iteration_s")
    if not all(given(row.get(k)) for k in keys):
        return None
    a, t, spmv_a, spmv_t = (float(row[k]) for k in keys)
    return {"alone": 1.0, "the SpMV beside the others": round((spmv_t - spmv_a) / a, 12),
            "the vector updates beside them": round(((t - spmv_t) - (a - spmv_a)) / a, 12)}


def laws(m: dict, *, dof: int) -> list[dict]:
    """The memory laws, as keyword arguments of :func:`labkit.book.laws.check`: the naive
    roofline reading "one rank takes its copy-bandwidth floor" (a floor bounds the iteration,
    it counts only the bytes: a ``naive`` law, its note the part furthest below a copy), each
    rank's co-run slowdown against the model's s (a ratio; its note says which copies gave
    it: :func:`~labkit.solve.memory_sentences.slowdown_source`), the P-rank iteration (a
    time, with its measured split), and the naive "P ranks, P times faster" (shown to fail,
    with the measured reason).

    >>> m = {"ranks": 2, "t1_s": 3.5e-3, "floor1_s": 3.4e-3, "slowdown": 1.25,
    ...      "measured_slowdown": 1.3, "model_tp_s": 2.3e-3, "tp_s": 2.4e-3, "speedup": 1.46,
    ...      "message_s": 50e-6, "split_us": None}
    >>> [(law["kind"], law["law"]) for law in laws(m, dof=250_000)]  # doctest: +NORMALIZE_WHITESPACE
    [('naive', '1 rank at the copy-bandwidth floor, 250,000 DOF'),
     ('model', 'co-run slowdown of 2 ranks computing at once'),
     ('model', "2 ranks' iteration at 250,000 DOF"),
     ('naive', '2 ranks are 2x faster than one')]
    """
    p, us = m["ranks"], 1e6
    f = m.get("share_fraction")
    return [
        {"law": f"1 rank at the copy-bandwidth floor, {dof:,} DOF", "kind": "naive",
         "predicted": m["floor1_s"] * 1e3, "measured": m["t1_s"] * 1e3, "unit": "ms",
         "tolerance_pct": 25, "split": m.get("split1_ms"),
         "note": parts_note(m) or "a floor counts the bytes only, not the work between them"},
        {"law": f"co-run slowdown of {p} ranks computing at once", "kind": "model",
         "predicted": m["slowdown"], "measured": m["measured_slowdown"], "tolerance_pct": 25,
         "split": m.get("slowdown_split"), "note": slowdown_source(m)},
        {"law": f"{p} ranks' iteration at {dof:,} DOF", "kind": "model",
         "predicted": m["model_tp_s"] * us, "measured": m["tp_s"] * us, "unit": "us",
         "tolerance_pct": 25, "split": m["split_us"]},
        {"law": f"{p} ranks are {p}x faster than one", "kind": "naive", "predicted": float(p),
         "measured": m["speedup"], "tolerance_pct": 25,
         "note": (f"each rank computed its share {m['measured_slowdown']:.2f}x slower beside the "
                  f"other{'s' if p > 2 else ''} than alone"
                  + (f", a share alone took {m['share_fraction']:.2f} of one rank's compute / {p}"
                     if f is not None and f == f else "")
                  + f", and the messages cost {m['message_s'] * us:.0f} us per iteration")},
    ]
