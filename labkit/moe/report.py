"""What an expert-parallel row holds, and the tables made of MoE rows (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`derived_fields` the fields computed from the routing a launch
drew (loads, drops, the bytes its all-to-alls should move); :func:`select` and :func:`one` the
selections notebooks make; :func:`summary_frame` the table ``labkit moe`` prints and
:func:`load_frame` the load per expert.
"""

from __future__ import annotations

from labkit.moe import formulas
from labkit.moe.budget import LOCAL_STEPS
from labkit.results import DEVICE_MEMORY_COLUMNS, Column, ms, one_row, select_rows, timed_columns

#: what makes a row a different measurement: the world size, the layer, the tokens and the
#: routing rule, and the device
KEY = ("world_size", "num_experts", "top_k", "hidden", "ffn", "tokens_per_rank",
       "capacity_factor", "renormalize", "seed", "device")

#: every field a row can carry (launch fields and provenance are declared elsewhere)
COLUMNS = (
    Column("num_experts", "", "experts E of the layer"),
    Column("top_k", "", "experts each token goes to"),
    Column("hidden", "", "hidden size h of a token"),
    Column("ffn", "", "inner width f of each expert's MLP h -> f -> h"),
    Column("tokens_per_rank", "", "tokens T each rank routes"),
    Column("capacity_factor", "", "an expert takes at most ceil(factor T k / E) pairs from "
                                  "each rank"),
    Column("renormalize", "", "the k chosen gates renormalised to sum to 1 (else the softmax "
                              "probabilities as they are)"),
    Column("steps", "", "steps (forward + backward of the layer), warm-up included"),
    Column("warmup", "", "untimed first steps"),
    Column("measured_steps", "", "timed steps: steps - warmup"),
    Column("seed", "", "seed of the weights and the tokens"),
    Column("tolerance", "", "max_rel_error at or below which a run matches"),
    Column("experts_per_rank", "", "E / P"),
    Column("capacity", "", "the most (token, expert) pairs an expert takes from one rank"),
    Column("num_params", "", "parameters of the whole layer (router and every expert)"),
    Column("params_per_rank", "", "parameters one rank holds: the router and its E/P experts"),
    Column("matches_single_process", "",
           "output, input gradient, router gradient and every expert gradient equal one "
           "process running every expert on the same tokens, in float64 (checked before "
           "timing)"),
    Column("max_rel_error", "", "largest |EP - one process| / max|one process| over those "
                                "tensors, worst rank"),
    Column("routed_by_rank", "", "(token, expert) pairs each rank routed to each expert, "
                                 "before the capacity (a P x E list)"),
    Column("kept_by_rank", "", "the same pairs kept within the capacity (a P x E list)"),
    Column("expert_load_routed", "", "pairs routed to each expert, every rank's (a list)"),
    Column("expert_load_kept", "", "pairs each expert computed (a list)"),
    Column("rank_load_rows", "", "token rows each rank's experts computed (a list)"),
    Column("expert_imbalance", "", "max / mean of expert_load_routed"),
    Column("rank_imbalance", "", "max / mean of rank_load_rows"),
    Column("tokens_dropped", "", "(token, expert) pairs over the capacity, dropped, every "
                                 "rank's"),
    Column("dropped_fraction", "", "tokens_dropped / (P T k)"),
    Column("a2a_calls_measured", "", "all-to-alls of token rows in one step (rank 0), counted"),
    Column("a2a_calls_formula", "", "4: dispatch and combine, forward and backward; 0 on "
                                    "one rank"),
    Column("a2a_tags", "", "which all-to-all each counted call was, in call order"),
    Column("count_exchange_calls", "", "all-to-alls of split sizes in one step (1 on P > 1)"),
    Column("a2a_bytes_by_call_measured", "bytes",
           "bytes leaving each rank in each all-to-all of one step, counted on the wrapped "
           "collective (one list per rank)"),
    Column("a2a_bytes_by_call_formula", "bytes",
           "the same from the routing drawn: kept pairs to experts elsewhere x h x 4 bytes "
           "(dispatch), and back (combine)"),
    Column("a2a_bytes_measured", "bytes", "bytes leaving the ranks in one step, every "
                                          "all-to-all of every rank, counted"),
    Column("a2a_bytes_formula", "bytes", "the same from the routing drawn"),
    Column("a2a_bytes_uniform", "bytes", "the same for an even routing, nothing dropped: "
                                         "4 P T k h 4 bytes (P - 1) / P"),
    Column("expert_flops_by_rank", "FLOP", "12 rows h f of each rank's experts (forward and "
                                           "backward)"),
    Column("router_flops_per_rank", "FLOP", "6 T h E: the router forward and backward"),
    *timed_columns("step_time", "step (forward + backward of the layer)"),
    Column("step_times_s", "s", "every timed step's time, slowest rank (a list)"),
    Column("routing_time_s", "s", "router, softmax, top-k, capacity and the gather of the rows "
                                  "to send, forward and backward: p50 over steps, phase_rank"),
    Column("dispatch_time_s", "s", "the split-size exchange and the dispatch all-to-all, "
                                   "forward and backward: p50, phase_rank"),
    Column("experts_time_s", "s", "the E/P experts on their rows, forward and backward: p50, "
                                  "phase_rank"),
    Column("combine_time_s", "s", "the combine all-to-all and the gate-weighted sum, forward "
                                  "and backward: p50, phase_rank"),
    *(Column(f"{ph}_local_alone_s", "s", f"the {ph} phase's local work (the all-to-alls the "
             f"identity), each rank alone in turn: median of {LOCAL_STEPS - 1} steps after one "
             "untimed, slowest rank (P > 1)")
      for ph in ("routing", "dispatch", "experts", "combine")),
    Column("phase_times_by_rank", "s", "each rank's four phase times (p50 over steps)"),
    Column("phase_rank", "", "the rank whose phases sum to the most: the *_time_s fields"),
    Column("timeline_s", "s",
           "the median timed step (timeline_step) of every rank, on one clock from the first "
           "rank's start: each phase span the layer times, {rank, phase, direction, start_s, "
           "end_s} (a list; its trace: labkit.moe.trace)"),
    Column("timeline_step", "", "which timed step timeline_s shows (1: the first): the "
                                "median of the slowest rank's"),
    Column("a2a_timeline_s", "s",
           "the same step's all-to-alls on every rank, on the same clock: the split sizes' "
           "(tag counts), then dispatch, combine, combine_grad, dispatch_grad, each "
           "{rank, call, tag, start_s, end_s} (a list; None on one rank; the calls that waited "
           "for the scheduler: labkit.moe.waits)"),
    *DEVICE_MEMORY_COLUMNS,
)


def derived_fields(row: dict) -> dict:
    """The fields computed from the routing a launch drew (``kept_by_rank``,
    ``routed_by_rank``) and its shape: loads, imbalance, drops, bytes and FLOPs.

    >>> d = derived_fields({"world_size": 2, "tokens_per_rank": 4, "top_k": 2, "hidden": 2,
    ...                     "ffn": 8, "num_experts": 4, "a2a_bytes_by_call_measured": [[0], [0]],
    ...                     "routed_by_rank": [[2, 3, 2, 1], [0, 3, 1, 2]],
    ...                     "kept_by_rank": [[2, 2, 2, 1], [0, 2, 1, 2]]})
    >>> d["expert_load_routed"], d["rank_load_rows"], d["tokens_dropped"], round(d["expert_imbalance"], 2)
    ([2, 6, 3, 3], [6, 6], 2, 1.71)
    """
    p, t, k, h = (int(row[c]) for c in ("world_size", "tokens_per_rank", "top_k", "hidden"))
    routed, kept = row["routed_by_rank"], row["kept_by_rank"]
    exp_routed = [sum(r[e] for r in routed) for e in range(len(routed[0]))]
    exp_kept = [sum(r[e] for r in kept) for e in range(len(kept[0]))]
    between = formulas.rows_between(kept, world_size=p)
    rank_rows = [sum(between[s][d] for s in range(p)) for d in range(p)]
    dropped = sum(exp_routed) - sum(exp_kept)
    return {
        "expert_load_routed": exp_routed,
        "expert_load_kept": exp_kept,
        "rank_load_rows": rank_rows,
        "expert_imbalance": formulas.imbalance(exp_routed),
        "rank_imbalance": formulas.imbalance(rank_rows),
        "tokens_dropped": dropped,
        "dropped_fraction": dropped / (p * t * k),
        "a2a_bytes_measured": sum(sum(c) for c in row["a2a_bytes_by_call_measured"]),
        "a2a_bytes_formula": sum(formulas.step_bytes(kept, rank=r, hidden=h) for r in range(p)),
        "a2a_bytes_uniform": 4 * p * formulas.uniform_bytes(tokens=t, top_k=k, hidden=h,
                                                            world_size=p),
        "expert_flops_by_rank": [formulas.expert_flops(rows=n, hidden=h, ffn=int(row["ffn"]))
                                 for n in rank_rows],
        "router_flops_per_rank": formulas.router_flops(tokens=t, hidden=h,
                                                       num_experts=int(row["num_experts"])),
    }


def select(df, **equal):
    """The rows with the given ``column=value``s, by world size."""
    return select_rows(df, **equal).sort_values("world_size").reset_index(drop=True)


def one(df, **equal):
    """The one row with the given ``column=value``s (a pandas Series); none or several:
    UsageError."""
    return one_row(df, **equal)


def summary_frame(df, prof=None):
    """One line per run: the check, drops and imbalance, the all-to-all bytes counted against
    the routing's formula, and the step (ms) with its four phases; with a machine profile
    ``prof``, the model's step beside it (:func:`labkit.moe.verdicts.context`)."""
    import pandas as pd

    from labkit.book.laws import symmetric_error_pct

    out = []
    for _, r in select(df).iterrows():
        line = {
            "ranks": int(r["world_size"]),
            "matches": bool(r["matches_single_process"]),
            "dropped": int(r["tokens_dropped"]),
            "expert_imbalance": r["expert_imbalance"],
            "rank_imbalance": r["rank_imbalance"],
            "a2a": f"{int(r['a2a_calls_measured'])}/{int(r['a2a_calls_formula'])}",
            "kB_measured": r["a2a_bytes_measured"] / 1e3,
            "kB_formula": r["a2a_bytes_formula"] / 1e3,
            "step_ms": ms(r["step_time_p50_s"]),
            **{f"{ph}_ms": ms(r[f"{ph}_time_s"]) for ph in formulas.PHASES},
        }
        if prof is not None:
            from labkit.moe.verdicts import context

            ctx = context(r, prof)
            line["predicted_ms"] = ms(ctx["step"])
            line["error_pct"] = symmetric_error_pct(ctx["step"], r["step_time_p50_s"])
            got = ctx["waits"]
            line["a2a_waited"] = f"{got['count']}/{got['calls']}" if got else "-"
        out.append(line)
    return pd.DataFrame(out)


SUMMARY_LEGEND = (
    "dropped = (token, expert) pairs over the capacity; imbalance = max / mean load; "
    "a2a = all-to-alls of rows counted/formula (dispatch and combine, forward and backward); "
    "kB = bytes leaving the ranks per step, counted on the collective / from the routing drawn\n"
    "the phases (routing, dispatch, experts, combine; each forward + backward) are those of the "
    "rank whose phases sum to the most; predicted = the machine profile's model "
    "(labkit.moe.verdicts); a2a_waited = all-to-alls of the median step that waited for the "
    "scheduler / all of them (labkit.moe.waits)")


def load_frame(row):
    """Per expert: the pairs routed to it, kept, dropped, and the rank that holds it."""
    import pandas as pd

    p, e = int(row["world_size"]), int(row["num_experts"])
    return pd.DataFrame([{
        "expert": i, "rank": formulas.owner(i, num_experts=e, world_size=p),
        "routed": int(row["expert_load_routed"][i]), "kept": int(row["expert_load_kept"][i]),
        "dropped": int(row["expert_load_routed"][i] - row["expert_load_kept"][i]),
        "capacity_all_ranks": int(row["capacity"]) * p} for i in range(e)])
