"""The memory side of the solve (notebook 04): one P-rank row with its inline baseline (rank 0
alone on the whole problem, timed beside the ranks) read as a memory-bound computation, its
laws and its sentences (pure: no torch).

A CG iteration streams its matrix and vectors once and does about one flop per 10 bytes, so its
time is bytes / bandwidth. Which bandwidth depends on where the bytes live: the machine
profile times copies of several sizes, alone and with every rank copying at once, and every
number here reads them at the copy that moves the same bytes
(:func:`~labkit.solve.formulas.copy_size_bytes`): the floor of one rank at the whole problem's
bytes, the ranks' sharing at each rank's. Copies that fit the shared cache side by side barely
slow each other; those that stream from the memory share its bandwidth. Each rank's share of the
work runs ``s`` times slower beside the others than alone, with s the larger of 1 and the rate
one rank alone streamed its bytes at over the rate each rank gets with every rank copying at
that size (:func:`co_run_reading`). The model of a P-rank iteration divides only the compute
(SpMV and vector updates) of one rank's iteration:

    t_P = (t_1 − compute_1) + s · compute_1 / P + t_msg

(the rest of one rank's iteration, the Python loop and the torch calls, is paid by every rank
whole; t_msg: one halo exchange and one all-reduce).
"""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.solve import verdicts
from labkit.solve.formulas import co_run_slowdown, copy_size_bytes, shared_bandwidth_slowdown


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


def floor_bytes_per_s(profile, bytes_per_iteration: float) -> float:
    """The copy bandwidth one rank alone gets for an iteration of these bytes: the machine
    profile's copy alone, read at the copy that moves them (so the caches serve it as they
    serve the iteration)."""
    return profile.copy_bytes_per_s(size_bytes=copy_size_bytes(bytes_per_iteration))


def co_run_reading(profile, *, bytes_per_iteration: float, ranks: int,
                   demand_bytes_per_s: float) -> dict:
    """s of P ranks sharing the memory system, read off the machine profile at the size of
    each rank's share: ``bytes_per_rank`` (an iteration's ``bytes_per_iteration`` over the
    ranks), ``copy_size_bytes`` (the copy that moves them), ``together_bytes_per_s`` (the rate
    each rank copies at that size with every rank copying), ``copy_slowdown`` (the copy's own
    co-run slowdown there), ``demand_bytes_per_s`` (given: the rate one rank alone streamed its
    bytes at) and ``slowdown`` (:func:`~labkit.solve.formulas.shared_bandwidth_slowdown`,
    times ranks / cores past the cores).

    >>> class Prof:  # copies of 1 and 32 MiB: 100 and 44 GB/s alone, 98 and 24 together
    ...     cores = 2
    ...     def copy_bytes_per_s(self, *, together=False, size_bytes=None):
    ...         small = size_bytes <= 1 << 20
    ...         return (98e9 if small else 24e9) if together else (100e9 if small else 44e9)
    >>> r = co_run_reading(Prof(), bytes_per_iteration=2e6, ranks=2, demand_bytes_per_s=60e9)
    >>> r["copy_size_bytes"], round(r["copy_slowdown"], 2), r["slowdown"]
    (500000.0, 1.02, 1.0)
    >>> r = co_run_reading(Prof(), bytes_per_iteration=200e6, ranks=2, demand_bytes_per_s=36e9)
    >>> round(r["copy_slowdown"], 2), r["slowdown"]
    (1.83, 1.5)
    """
    per_rank = float(bytes_per_iteration) / ranks
    size = copy_size_bytes(per_rank)
    together = profile.copy_bytes_per_s(together=True, size_bytes=size)
    alone = profile.copy_bytes_per_s(size_bytes=size)
    share = shared_bandwidth_slowdown(demand_bytes_per_s=demand_bytes_per_s,
                                      together_bytes_per_s=together)
    return {"ranks": int(ranks), "bytes_per_rank": per_rank, "copy_size_bytes": size,
            "together_bytes_per_s": together, "copy_slowdown": alone / together,
            "demand_bytes_per_s": float(demand_bytes_per_s),
            "slowdown": co_run_slowdown(share, ranks=ranks, cores=profile.cores)}


def point(row, *, profile, message_s: float) -> dict:
    """The numbers of notebook 04 from one P-rank strong row with an inline baseline, per
    iteration: ``t1_s`` and ``compute1_s`` (rank 0 alone), ``tp_s`` and ``computep_s`` (the P
    ranks, compute averaged over ranks), ``floor_bytes_per_s`` (:func:`floor_bytes_per_s` of
    the whole problem's bytes), ``floor1_s`` (those bytes at it: a 1-rank launch's floor up to
    the halo's few bytes), ``fraction1`` (floor1 / t1), ``minimal_floor1_s`` (the fewest bytes
    a correct iteration moves, at their own copy's rate), ``measured_slowdown``
    (P · compute_P / compute_1: each rank's share beside the others over the same share
    alone), ``reading`` (:func:`co_run_reading`, one rank alone streaming the problem's bytes
    in compute_1) and its ``slowdown``, ``model_tp_s`` (the model above, with ``message_s``),
    ``speedup`` (t1 / tP), ``split_us`` (the P-rank iteration in its measured terms) and
    ``ranks``.

    One rank alone streams 50 MB in 3.4 ms of compute (14.7 GB/s) where each rank gets 10 GB/s
    with both copying: s = 1.47, t_2 = 0.1 + 1.47 x 3.4 / 2 + 0.05 = 2.65 ms.

    >>> class Prof:  # 25 GB/s alone at every size, 10 GB/s each with both copying
    ...     cores = 2
    ...     def copy_bytes_per_s(self, *, together=False, size_bytes=None):
    ...         return 10e9 if together else 25e9
    >>> row = {"world_size": 2, "iterations": 100, "time_per_iteration_s": 2.4e-3,
    ...        "spmv_time_s": 0.13, "vector_time_s": 0.09, "halo_time_s": 0.004,
    ...        "allreduce_time_s": 0.004, "message_time_alone_s": 50e-6,
    ...        "compute_imbalance": 1.0, "baseline_time_per_iteration_s": 3.5e-3,
    ...        "baseline_iterations": 100, "baseline_compute_time_s": 0.34,
    ...        "bytes_per_iteration": 50e6, "minimal_bytes_per_iteration": 38e6}
    >>> m = point(row, profile=Prof(), message_s=50e-6)
    >>> round(m["slowdown"], 3), round(m["measured_slowdown"], 3), round(m["model_tp_s"] * 1e6)
    (1.471, 1.294, 2650)
    >>> round(m["fraction1"], 2), round(m["speedup"], 2)
    (0.57, 1.46)
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
    nbytes = float(row["bytes_per_iteration"])
    bw = floor_bytes_per_s(profile, nbytes)
    minimal = row.get("minimal_bytes_per_iteration")
    minimal_floor = (float(minimal) / floor_bytes_per_s(profile, float(minimal))
                     if minimal is not None and minimal == minimal else None)
    reading = co_run_reading(profile, bytes_per_iteration=nbytes, ranks=p,
                             demand_bytes_per_s=nbytes / compute1)
    slowdown = reading["slowdown"]
    model = (t1 - compute1) + slowdown * compute1 / p + message_s
    return {"ranks": p, "t1_s": t1, "compute1_s": compute1, "tp_s": tp, "computep_s": computep,
            "floor_bytes_per_s": bw, "floor1_s": nbytes / bw, "fraction1": nbytes / bw / t1,
            "minimal_floor1_s": minimal_floor,
            "measured_slowdown": p * computep / compute1, "slowdown": slowdown,
            "reading": reading, "message_s": message_s, "model_tp_s": model, "speedup": t1 / tp,
            "split_us": verdicts.iteration_split_us(row)}


def laws(m: dict, *, dof: int) -> list[dict]:
    """The memory laws, as keyword arguments of :func:`labkit.book.laws.check`: one rank at the
    copy-bandwidth floor (a time), each rank's co-run slowdown against the machine profile's
    (a ratio), the P-rank iteration (a time, with its measured split), and the naive
    "P ranks, P times faster" (shown to fail, with the measured reason).

    >>> m = {"ranks": 2, "t1_s": 3.5e-3, "floor1_s": 3.4e-3, "slowdown": 1.25,
    ...      "measured_slowdown": 1.3, "model_tp_s": 2.3e-3, "tp_s": 2.4e-3, "speedup": 1.46,
    ...      "message_s": 50e-6, "split_us": None}
    >>> [(law["kind"], law["law"]) for law in laws(m, dof=250_000)]  # doctest: +NORMALIZE_WHITESPACE
    [('model', '1 rank at the copy-bandwidth floor, 250,000 DOF'),
     ('model', 'co-run slowdown of 2 ranks computing at once'),
     ('model', "2 ranks' iteration at 250,000 DOF"),
     ('naive', '2 ranks are 2x faster than one')]
    """
    p, us = m["ranks"], 1e6
    return [
        {"law": f"1 rank at the copy-bandwidth floor, {dof:,} DOF", "kind": "model",
         "predicted": m["floor1_s"] * 1e3, "measured": m["t1_s"] * 1e3, "unit": "ms",
         "tolerance_pct": 25},
        {"law": f"co-run slowdown of {p} ranks computing at once", "kind": "model",
         "predicted": m["slowdown"], "measured": m["measured_slowdown"], "tolerance_pct": 25},
        {"law": f"{p} ranks' iteration at {dof:,} DOF", "kind": "model",
         "predicted": m["model_tp_s"] * us, "measured": m["tp_s"] * us, "unit": "us",
         "tolerance_pct": 25, "split": m["split_us"]},
        {"law": f"{p} ranks are {p}x faster than one", "kind": "naive", "predicted": float(p),
         "measured": m["speedup"], "tolerance_pct": 25,
         "note": f"each rank computed its share {m['measured_slowdown']:.2f}x slower beside the "
                 f"other{'s' if p > 2 else ''} than alone, and the messages cost "
                 f"{m['message_s'] * us:.0f} us per iteration"},
    ]


def floor_sentence(m: dict) -> str:
    """How close one rank runs to the copy bandwidth, computed from :func:`point`'s numbers.

    >>> print(floor_sentence({"fraction1": 0.8, "t1_s": 3e-3, "floor1_s": 2.4e-3,
    ...                       "minimal_floor1_s": 1.8e-3}))  # doctest: +NORMALIZE_WHITESPACE
    1 rank alone runs its iteration at 0.80 of the copy bandwidth (3.00 ms against a floor of
    2.40 ms): slower than copying its bytes. The fewest bytes a correct iteration moves would
    allow 1.80 ms, 1.67x faster than measured.
    >>> floor_sentence({"fraction1": 1.1, "t1_s": 2e-3, "floor1_s": 2.2e-3,
    ...                 "minimal_floor1_s": None}).split("): ")[1]
    "faster than one copy of its bytes (the machine profile's copy of as many bytes ran slower: the machine's state changed between them, or the caches served more of the iteration's bytes than of the copy's)."
    """
    f = m["fraction1"]
    if round(f, 2) == 1.0:
        how = "as fast as one copy of its bytes."
    elif f < 1:
        how = "slower than copying its bytes."
    else:
        how = ("faster than one copy of its bytes (the machine profile's copy of as many bytes "
               "ran slower: the machine's state changed between them, or the caches served more "
               "of the iteration's bytes than of the copy's).")
    text = (f"1 rank alone runs its iteration at {f:.2f} of the copy bandwidth "
            f"({m['t1_s'] * 1e3:.2f} ms against a floor of {m['floor1_s'] * 1e3:.2f} ms): {how}")
    least = m.get("minimal_floor1_s")
    if least and m["t1_s"] / least >= 1.005:
        text += (f" The fewest bytes a correct iteration moves would allow {least * 1e3:.2f} ms, "
                 f"{m['t1_s'] / least:.2f}x faster than measured.")
    elif least:
        text += (f" The fewest bytes a correct iteration moves would allow {least * 1e3:.2f} ms:"
                 " no faster than measured (these kernels move no more than that).")
    return text


def co_run_sentence(m: dict) -> str:
    """What sharing the memory system did to the P ranks, computed from :func:`point`'s numbers.

    >>> print(co_run_sentence({"ranks": 2, "measured_slowdown": 1.3, "slowdown": 1.25,
    ...                        "speedup": 1.46}))  # doctest: +NORMALIZE_WHITESPACE
    Beside each other, 2 ranks computed their shares 1.30x slower than alone (the model's s:
    1.25x), so the speedup of 2 ranks is 1.46, not 2.
    >>> co_run_sentence({"ranks": 2, "measured_slowdown": 0.9, "slowdown": 1.25,
    ...                  "speedup": 2.1}).split(", so")[0]
    "Beside each other, 2 ranks computed their shares 0.90x the time alone: faster (each rank's share fits a cache the whole problem did not) (the model's s: 1.25x)"
    """
    s, p = m["measured_slowdown"], m["ranks"]
    how = (f"{s:.2f}x slower than alone" if s >= 1 else
           f"{s:.2f}x the time alone: faster (each rank's share fits a cache the whole "
           "problem did not)")
    return (f"Beside each other, {p} ranks computed their shares {how} (the model's s: "
            f"{m['slowdown']:.2f}x), so the speedup of {p} ranks is {m['speedup']:.2f}, not {p}.")


def reading_sentence(r: dict, *, cores: int | None = None) -> str:
    """Which size of the machine profile's copies the model read, and why its s is what it is,
    computed from :func:`co_run_reading`'s numbers (``cores``: say so when the ranks outnumber
    them).

    >>> r = {"ranks": 2, "bytes_per_rank": 25e6, "copy_size_bytes": 12.5e6,
    ...      "together_bytes_per_s": 43e9, "copy_slowdown": 1.8, "demand_bytes_per_s": 44e9,
    ...      "slowdown": 44 / 43}
    >>> print(reading_sentence(r))  # doctest: +NORMALIZE_WHITESPACE
    The model reads the machine profile's copies at 11.9 MiB per rank, the copy that moves the
    25 MB each rank's iteration moves: copies of this size slow each other 1.80x (they share the
    memory's bandwidth), and each rank copies at 43.0 GB/s with 2 ranks copying at once. One rank
    alone streamed its iteration's bytes at 44.0 GB/s, 1.02x that: each rank's share asks more
    of the memory than it gets beside the others, s = 1.02.
    >>> print(reading_sentence({**r, "bytes_per_rank": 4e6, "copy_size_bytes": 2e6,
    ...                         "copy_slowdown": 1.04, "together_bytes_per_s": 95e9,
    ...                         "demand_bytes_per_s": 60e9, "slowdown": 1.0}))
    ... # doctest: +NORMALIZE_WHITESPACE
    The model reads the machine profile's copies at 1.91 MiB per rank, the copy that moves the
    4 MB each rank's iteration moves: copies of this size barely slow each other (1.04x: the
    caches hold every rank's), and each rank copies at 95.0 GB/s with 2 ranks copying at once.
    One rank alone streamed its iteration's bytes at 60.0 GB/s, 0.63x that: no more than each
    rank gets beside the others, so the ranks do not wait for the memory, s = 1.00.
    >>> reading_sentence({**r, "ranks": 4, "slowdown": 2.05}, cores=2).split(": ")[-1]
    "each rank's share asks more of the memory than it gets beside the others, and 4 ranks take turns on 2 cores, s = 2.05."
    """
    p, b, d = r["ranks"], r["together_bytes_per_s"], r["demand_bytes_per_s"]
    copy = r["copy_slowdown"]
    # within 10 % of alone: no memory traffic between the ranks' copies worth the name
    where = (f"barely slow each other ({copy:.2f}x: the caches hold every rank's)" if copy <= 1.1
             else f"slow each other {copy:.2f}x (they share the memory's bandwidth)")
    why = ("each rank's share asks more of the memory than it gets beside the others" if d > b
           else "no more than each rank gets beside the others, so the ranks do not wait for "
                "the memory")
    if cores is not None and p > cores:
        why += f", and {p} ranks take turns on {cores} cores"
    return (f"The model reads the machine profile's copies at "
            f"{r['copy_size_bytes'] / 2 ** 20:.3g} MiB per rank, the copy that moves the "
            f"{r['bytes_per_rank'] / 1e6:.3g} MB each rank's iteration moves: copies of this size "
            f"{where}, and each rank copies at {b / 1e9:.1f} GB/s with {p} ranks copying at once. "
            f"One rank alone streamed its iteration's bytes at {d / 1e9:.1f} GB/s, {d / b:.2f}x "
            f"that: {why}, s = {r['slowdown']:.2f}.")
