"""The solve lab's verdicts: the sentences notebooks 03 and 04 and ``labkit solve`` print, each
computed from the numbers it is given (pure: pandas only).

:func:`waits_sentence` where a P-rank row's waits went (the messages' own cost, a rank that
always computed more, the ranks arriving at different times); :func:`miss_sentence` which part
of the P-rank iteration outgrew the crossover model where it misses most;
:func:`crossover_sentence` when more ranks start to pay, measured beside predicted (the table
and summary of :func:`labkit.solve.crossover.crossover`); :func:`iteration_parts` the split of an
iteration they read, which :func:`labkit.solve.crossover.crossover` puts on its table too.
"""

from __future__ import annotations


def iteration_parts(row) -> dict:
    """A P-rank row's iteration in three parts, seconds per iteration: ``compute_s`` (SpMV and
    vector updates), ``waits_s`` (the exposed halo and all-reduce time: messages and waiting for
    the other ranks) and ``rest_s`` (the iteration's time less both).

    >>> parts = iteration_parts({"iterations": 100, "spmv_time_s": 0.1, "vector_time_s": 0.04,
    ...                          "halo_time_s": 0.006, "allreduce_time_s": 0.004,
    ...                          "time_per_iteration_s": 1.6e-3})
    >>> {k: round(v * 1e6) for k, v in parts.items()}  # us per iteration
    {'compute_s': 1400, 'waits_s': 100, 'rest_s': 100}
    """
    def get(k):  # rows without the split (torch-sla, hand-made ones) give NaN parts
        v = row.get(k)
        return float("nan") if v is None else float(v)

    its = max(get("iterations"), 1.0)
    compute = (get("spmv_time_s") + get("vector_time_s")) / its
    waits = (get("halo_time_s") + get("allreduce_time_s")) / its
    return {"compute_s": compute, "waits_s": waits,
            "rest_s": float(row["time_per_iteration_s"]) - compute - waits}


def wait_parts(row) -> dict | None:
    """A P-rank row's waits per iteration in their measured terms, seconds: ``messages_s`` (the
    messages' own cost, timed alone: ``message_time_alone_s``), ``imbalance_s`` (a rank that
    always computed more: ``(compute_imbalance - 1) x compute``) and ``arrival_s`` (the rest of
    the waits: the ranks arriving at different times; negative when the messages timed alone
    cost more than the solve's exposed waits). The three sum to ``waits_s`` of
    :func:`iteration_parts`. None where the row has no such measurement (one rank, torch-sla).

    >>> parts = wait_parts({"world_size": 2, "iterations": 100, "halo_time_s": 0.006,
    ...                     "allreduce_time_s": 0.004, "message_time_alone_s": 30e-6,
    ...                     "compute_imbalance": 1.01, "spmv_time_s": 0.1, "vector_time_s": 0.04,
    ...                     "time_per_iteration_s": 1.6e-3})
    >>> {k: round(v * 1e6) for k, v in parts.items()}  # us per iteration
    {'messages_s': 30, 'imbalance_s': 14, 'arrival_s': 56}
    """
    def value(key):  # None for a missing field or NaN (older files, torch-sla rows)
        v = row.get(key)
        return None if v is None or v != v else float(v)

    alone, imbalance = value("message_time_alone_s"), value("compute_imbalance") or 1.0
    if alone is None or int(row["world_size"]) < 2:
        return None
    parts = iteration_parts(row)
    if parts["waits_s"] != parts["waits_s"]:
        return None
    steady = (imbalance - 1.0) * parts["compute_s"]
    return {"messages_s": alone, "imbalance_s": steady,
            "arrival_s": parts["waits_s"] - alone - steady}


def iteration_split_us(row) -> dict | None:
    """A P-rank row's measured iteration in the terms that sum to it, in µs: compute (SpMV and
    vector updates), messages, imbalance, arrival (:func:`wait_parts`) and the rest: the
    ``split`` of a law on that iteration. None where the row has no wait split.

    >>> row = {"world_size": 2, "iterations": 100, "halo_time_s": 0.006,
    ...        "allreduce_time_s": 0.004, "message_time_alone_s": 30e-6,
    ...        "compute_imbalance": 1.01, "spmv_time_s": 0.1, "vector_time_s": 0.04,
    ...        "time_per_iteration_s": 1.6e-3}
    >>> {k: round(v) for k, v in iteration_split_us(row).items()}
    {'compute': 1400, 'messages': 30, 'imbalance': 14, 'arrival': 56, 'rest': 100}
    >>> round(sum(iteration_split_us(row).values()))  # the measured 1.6 ms
    1600
    """
    waits = wait_parts(row)
    if waits is None:
        return None
    parts = iteration_parts(row)
    return {"compute": parts["compute_s"] * 1e6, "messages": waits["messages_s"] * 1e6,
            "imbalance": waits["imbalance_s"] * 1e6, "arrival": waits["arrival_s"] * 1e6,
            "rest": parts["rest_s"] * 1e6}


def waits_sentence(row) -> str:
    """Where a P-rank row's waits went, computed from the row: the messages' own cost (timed
    alone, no work between them: ``message_time_alone_s``), a rank that always computed more
    (``compute_imbalance``), and the rest: the ranks arriving at different times.

    >>> row = {"world_size": 2, "iterations": 100, "halo_time_s": 0.006,
    ...        "allreduce_time_s": 0.004, "message_time_alone_s": 30e-6,
    ...        "compute_imbalance": 1.01, "spmv_time_s": 0.1, "vector_time_s": 0.04,
    ...        "time_per_iteration_s": 1.6e-3}
    >>> print(waits_sentence(row))  # doctest: +NORMALIZE_WHITESPACE
    2 ranks waited 100 us per iteration (6.2% of it) at the halo exchange and the all-reduce:
    the messages alone cost 30 us, the busiest rank computed 1.01x the mean (14 us more), and
    the other 56 us is the ranks arriving at different times: a hiccup on any core (an
    interrupt, another job) stalls every rank at the next message.
    >>> waits_sentence({"world_size": 2, "message_time_alone_s": float("nan")})  # torch-sla
    ''
    """
    split = wait_parts(row)
    if split is None:
        return ""
    waits, us = iteration_parts(row)["waits_s"], 1e6
    alone, steady, rest = split["messages_s"], split["imbalance_s"], split["arrival_s"]
    compute = iteration_parts(row)["compute_s"]
    imbalance = 1.0 + steady / compute if compute > 0 else 1.0
    head = (f"{int(row['world_size'])} ranks waited {waits * us:.0f} us per iteration "
            f"({waits / float(row['time_per_iteration_s']):.1%} of it) at the halo exchange and "
            f"the all-reduce: the messages alone cost {alone * us:.0f} us, the busiest rank "
            f"computed {imbalance:.2f}x the mean ({steady * us:.0f} us more)")
    if rest <= 0:
        return head + ", which accounts for all of it."
    return (head + f", and the other {rest * us:.0f} us is the ranks arriving at different "
            "times: a hiccup on any core (an interrupt, another job) stalls every rank at the "
            "next message.")


def miss_sentence(table, ranks: int) -> str:
    """Why the model misses where it misses most (a size it predicts, not the calibration one):
    which part of the measured P-rank iteration outgrew the model's, computed from the row.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"dof_global": [2_000, 50_000], "calibration": [True, False],
    ...                   "error_pct": [0.0, 30.0], "tp_per_iteration_s": [150e-6, 430e-6],
    ...                   "model_tp_per_iteration_s": [150e-6, 300e-6],
    ...                   "excess_compute_s": [0.0, 95e-6], "excess_waits_s": [0.0, 30e-6],
    ...                   "excess_rest_s": [0.0, 5e-6]})
    >>> print(miss_sentence(t, 2))  # doctest: +NORMALIZE_WHITESPACE
    Largest miss at 50,000 DOF: the model gives 2 ranks 300 us per iteration, they took 430 us
    (+130 us): compute +95 us against the model's share, waits +30 us against the smallest
    size's, the rest +5 us. The largest part: compute.
    """
    cand = table[~table["calibration"]]
    if cand.empty:
        return "Only the calibration size: nothing predicted."
    r = cand.loc[cand["error_pct"].abs().idxmax()]
    us = 1e6
    parts = {"compute": r["excess_compute_s"], "waits": r["excess_waits_s"],
             "the rest": r["excess_rest_s"]}
    main = max(parts, key=lambda k: abs(parts[k]))
    return (f"Largest miss at {r['dof_global']:,.0f} DOF: the model gives {ranks} ranks "
            f"{r['model_tp_per_iteration_s'] * us:.0f} us per iteration, they took "
            f"{r['tp_per_iteration_s'] * us:.0f} us "
            f"({(r['tp_per_iteration_s'] - r['model_tp_per_iteration_s']) * us:+.0f} us): compute "
            f"{parts['compute'] * us:+.0f} us against the model's share, waits "
            f"{parts['waits'] * us:+.0f} us against the smallest size's, the rest "
            f"{parts['the rest'] * us:+.0f} us. The largest part: {main}.")


def crossover_sentence(summary: dict, table) -> str:
    """What the sweep says about when more ranks pay, computed from its numbers.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"dof_global": [10_000, 40_000], "speedup_per_iteration": [0.8, 1.3]})
    >>> crossover_sentence({"ranks": 2, "predicted_crossover_dof": 20_000.0,
    ...                     "measured_crossover_dof": 18_000.0}, t)
    '2 ranks start to pay at about 18,000 DOF (predicted 20,000: 1.11x off).'
    >>> crossover_sentence({"ranks": 2, "predicted_crossover_dof": 5_000.0,
    ...                     "measured_crossover_dof": None},
    ...                    t.assign(speedup_per_iteration=[1.2, 1.5]))
    '2 ranks already pay at the smallest size, 10,000 DOF (predicted crossover 5,000).'
    """
    p, pred = summary["ranks"], summary["predicted_crossover_dof"]
    meas = summary["measured_crossover_dof"]
    said = f"{pred:,.0f}" if pred != float("inf") else "never"
    if meas is not None:
        off = (f": {max(pred, meas) / min(pred, meas):.2f}x off" if pred != float("inf")
               else "")
        return f"{p} ranks start to pay at about {meas:,.0f} DOF (predicted {said}{off})."
    lo = table.sort_values("dof_global").iloc[0]
    hi = table.sort_values("dof_global").iloc[-1]
    if lo["speedup_per_iteration"] >= 1:
        return (f"{p} ranks already pay at the smallest size, {lo['dof_global']:,.0f} DOF "
                f"(predicted crossover {said}).")
    return (f"{p} ranks do not pay up to the largest size, {hi['dof_global']:,.0f} DOF "
            f"(predicted crossover {said}).")


def transport_sentence(*, shm_s: float, torch_s: float, used: str) -> str:
    """CG's messages of one iteration on the two transports, and which one the solve used.

    >>> print(transport_sentence(shm_s=50e-6, torch_s=900e-6, used="shm"))
    ... # doctest: +NORMALIZE_WHITESPACE
    CG's messages of one iteration (a halo exchange and an all-reduce): shm 50 us,
    torch.distributed 900 us, 18.0x more than shm. This solve's transport: shm.
    >>> print(transport_sentence(shm_s=50e-6, torch_s=40e-6, used="torch").split(": ")[1])
    shm 50 us, torch.distributed 40 us, 0.80x shm (less than shm). This solve's transport
    """
    ratio = torch_s / shm_s
    how = f"{ratio:.1f}x more than shm" if ratio >= 1 else f"{ratio:.2f}x shm (less than shm)"
    return (f"CG's messages of one iteration (a halo exchange and an all-reduce): shm "
            f"{shm_s * 1e6:.0f} us, torch.distributed {torch_s * 1e6:.0f} us, {how}. This "
            f"solve's transport: {used}.")
