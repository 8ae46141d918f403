"""The memory side of the solve (notebook 04): one P-rank row with its inline baseline (rank 0
alone on the whole problem, timed beside the ranks) read as a memory-bound computation, its
laws and its sentences (pure: no torch).

A CG iteration streams its matrix and vectors once and does about one flop per 10 bytes, so its
time is bytes / bandwidth. Alone, one rank gets the copy bandwidth one core can pull; P ranks
streaming at once share the memory system, and each rank's share of the work runs ``s`` times
slower than it would alone: ``s`` is the machine profile's co-run copy slowdown. The model of a
P-rank iteration divides only the compute (SpMV and vector updates) of one rank's iteration:

    t_P = (t_1 − compute_1) + s · compute_1 / P + t_msg

(the rest of one rank's iteration, the Python loop and the torch calls, is paid by every rank
whole; t_msg: one halo exchange and one all-reduce).
"""

from __future__ import annotations

from labkit.errors import UsageError
from labkit.solve import verdicts


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


def point(row, *, slowdown: float, message_s: float) -> dict:
    """The numbers of notebook 04 from one P-rank strong row with an inline baseline, per
    iteration: ``t1_s`` and ``compute1_s`` (rank 0 alone), ``tp_s`` and ``computep_s`` (the P
    ranks, compute averaged over ranks), ``floor1_s`` (the whole problem's bytes at one rank's
    copy bandwidth alone: a 1-rank launch's floor up to the halo's few bytes), ``fraction1``
    (floor1 / t1), ``minimal_floor1_s``, ``measured_slowdown`` (P · compute_P / compute_1:
    each rank's share beside the others over the same share alone), ``model_tp_s`` (the model
    above, with the given ``slowdown`` and ``message_s``), ``speedup`` (t1 / tP), ``split_us``
    (the P-rank iteration in its measured terms) and ``ranks``.

    >>> row = {"world_size": 2, "iterations": 100, "time_per_iteration_s": 2.4e-3,
    ...        "spmv_time_s": 0.13, "vector_time_s": 0.09, "halo_time_s": 0.004,
    ...        "allreduce_time_s": 0.004, "message_time_alone_s": 50e-6,
    ...        "compute_imbalance": 1.0, "baseline_time_per_iteration_s": 3.5e-3,
    ...        "baseline_iterations": 100, "baseline_compute_time_s": 0.34,
    ...        "bytes_per_iteration": 50e6, "minimal_bytes_per_iteration": 38e6,
    ...        "copy_bandwidth_alone_gb_per_s": 14.0}
    >>> m = point(row, slowdown=1.25, message_s=50e-6)
    >>> round(m["measured_slowdown"], 3), round(m["model_tp_s"] * 1e6), round(m["speedup"], 2)
    (1.294, 2275, 1.46)
    >>> round(m["fraction1"], 2)
    1.02
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
    bw = float(row["copy_bandwidth_alone_gb_per_s"]) * 1e9
    floor1 = float(row["bytes_per_iteration"]) / bw
    minimal = row.get("minimal_bytes_per_iteration")
    minimal_floor = float(minimal) / bw if minimal is not None and minimal == minimal else None
    model = (t1 - compute1) + slowdown * compute1 / p + message_s
    return {"ranks": p, "t1_s": t1, "compute1_s": compute1, "tp_s": tp, "computep_s": computep,
            "floor1_s": floor1, "fraction1": floor1 / t1, "minimal_floor1_s": minimal_floor,
            "measured_slowdown": p * computep / compute1, "slowdown": slowdown,
            "message_s": message_s, "model_tp_s": model, "speedup": t1 / tp,
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
    ...                 "minimal_floor1_s": None}).split(": ")[1]
    "faster than one copy of its bytes (the copy beside it ran below the memory's bandwidth, or caches served part of the bytes)."
    """
    f = m["fraction1"]
    if round(f, 2) == 1.0:
        how = "as fast as one copy of its bytes."
    elif f < 1:
        how = "slower than copying its bytes."
    else:
        how = ("faster than one copy of its bytes (the copy beside it ran below the memory's "
               "bandwidth, or caches served part of the bytes).")
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
    Beside each other, 2 ranks computed their shares 1.30x slower than alone (the machine
    profile's copies: 1.25x), so the speedup of 2 ranks is 1.46, not 2.
    >>> co_run_sentence({"ranks": 2, "measured_slowdown": 0.9, "slowdown": 1.25,
    ...                  "speedup": 2.1}).split(", so")[0]
    "Beside each other, 2 ranks computed their shares 0.90x the time alone: faster (each rank's share fits a cache the whole problem did not) (the machine profile's copies: 1.25x)"
    """
    s, p = m["measured_slowdown"], m["ranks"]
    how = (f"{s:.2f}x slower than alone" if s >= 1 else
           f"{s:.2f}x the time alone: faster (each rank's share fits a cache the whole "
           "problem did not)")
    return (f"Beside each other, {p} ranks computed their shares {how} (the machine profile's "
            f"copies: {m['slowdown']:.2f}x), so the speedup of {p} ranks is {m['speedup']:.2f}, "
            f"not {p}.")
