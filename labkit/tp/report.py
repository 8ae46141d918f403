"""What a tensor-parallel row holds, and the tables made of TP rows (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`select` and :func:`one` the selections notebooks make;
:func:`summary_frame` the table ``labkit tp`` prints; :func:`laws_frame` each law beside what
was measured (law, predicted, measured, error). :func:`prediction_fields` and
:func:`add_compute_time` build the fields of a row that this lab's worker and the FSDP lab's
(same model, same prediction) share.
"""

from __future__ import annotations

import math

from labkit.metrics import relative_error_pct
from labkit.results import DEVICE_MEMORY_COLUMNS, Column, ms, one_row, select_rows, timed_columns

#: what makes a row a different measurement: the variant, the world size, the model and
#: batch, and the device
KEY = ("variant", "world_size", "hidden", "num_heads", "seq_len", "batch_size", "num_layers",
       "device")


#: every field a row can carry (launch fields and provenance are declared elsewhere)
COLUMNS = (
    Column("variant", "", "naive (f and g written by hand), library "
                          "(torch.distributed.tensor.parallel) or sp (by hand, with sequence "
                          "parallelism)"),
    Column("hidden", "", "hidden size h; the MLP is 4h wide"),
    Column("num_heads", "", "attention heads, split across the ranks"),
    Column("seq_len", "", "tokens per sequence s"),
    Column("batch_size", "", "sequences per step b; every rank sees all of them"),
    Column("num_layers", "", "transformer layers (attention block + MLP block each)"),
    Column("steps", "", "training steps per variant, warm-up included"),
    Column("warmup", "", "untimed first steps"),
    Column("measured_steps", "", "timed steps: steps - warmup"),
    Column("lr", "", "SGD learning rate"),
    Column("seed", "", "seed of the weights and the data"),
    Column("num_params", "", "parameters of the whole model, counted"),
    Column("num_params_formula", "", "L (12 h^2 + 13 h)"),
    Column("params_per_rank", "", "parameters one rank holds, counted from its local shards"),
    Column("params_per_rank_formula", "", "L ((12 h^2 + 7 h) / P + 6 h)"),
    Column("matches_single_process", "",
           "output, input gradient and every weight-gradient slice equal one process's, "
           "within tolerance (checked before timing)"),
    Column("max_rel_error", "", "largest |TP - one process| / max|one process| over those "
                                "tensors, worst rank"),
    Column("tolerance", "", "max_rel_error at or below which a run matches"),
    Column("allreduce_calls_measured", "", "all-reduces in one training step, counted"),
    Column("allreduce_calls_formula", "", "4 L: per layer 2 forward (g), 2 backward (f); "
                                          "0 on one rank; sp: 1 (the gradients every rank "
                                          "keeps whole)"),
    Column("allreduce_bytes_formula", "bytes", "bytes all-reduced per step: 4 L b s h x 4; sp: "
                                               "6 h L x 4"),
    Column("allgather_calls_measured", "", "all-gathers in one training step, counted"),
    Column("allgather_calls_formula", "", "sp: 6 L (per layer 2 forward, 4 backward); 0 else"),
    Column("allgather_bytes_measured", "bytes", "the all-gathers' output buffers of one step, "
                                                "counted"),
    Column("allgather_bytes_formula", "bytes", "sp: 6 L b s h x 4 bytes; 0 else"),
    Column("reduce_scatter_calls_measured", "", "reduce-scatters in one training step, counted"),
    Column("reduce_scatter_calls_formula", "", "sp: 4 L (per layer 2 forward, 2 backward); "
                                               "0 else"),
    Column("reduce_scatter_bytes_measured", "bytes", "the reduce-scatters' input buffers of one "
                                                     "step, counted"),
    Column("reduce_scatter_bytes_formula", "bytes", "sp: 4 L b s h x 4 bytes; 0 else"),
    Column("comm_bytes_measured", "bytes",
           "bytes of every collective of one training step (sum of the buffers, nccl-tests' "
           "S), counted; naive and library: all-reduced"),
    Column("comm_bytes_formula", "bytes", "4 L b s h x 4 bytes; sp: (10 L b s h + 6 h L) x 4"),
    Column("bytes_per_allreduce", "bytes", "one all-reduced activation: b s h x 4 bytes (sp: "
                                           "one all-gather's output, one reduce-scatter's "
                                           "input)"),
    Column("other_collective_calls", "", "collectives outside the variant's formula in one "
                                         "step: other than all-reduce (naive, library), than "
                                         "all-gather, reduce-scatter and all-reduce (sp); "
                                         "0 expected"),
    *timed_columns("step_time", "training step"),
    Column("step_times_s", "s", "every timed step's time, slowest rank (a list)"),
    *timed_columns("compute_time", "the same step with f and g off (no communication)"),
    Column("compute_time_rank_p50_s", "s", "the step with f and g off: each rank's own p50 (a "
                                           "list by rank): flops_per_rank / it is the rank's "
                                           "compute rate"),
    Column("comm_time_s", "s", "step_time_p50_s - compute_time_p50_s (at least 0): what "
                               "communication, and the library's bookkeeping, add"),
    Column("allreduce_time_in_step_s", "s",
           "naive: time inside f's and g's all-reduces per step (sp: inside its all-gathers, "
           "reduce-scatters and all-reduce), mean over timed steps, the rank that spent the "
           "longest there (NaN for library)"),
    Column("allreduce_wait_in_step_s", "s",
           "naive: of allreduce_time_in_step_s, the wait for the later rank to enter (from "
           "every rank's entry and exit times of every call)"),
    Column("allreduce_message_in_step_s", "s",
           "naive: of allreduce_time_in_step_s, the messages themselves (from the last rank's "
           "entry to the exit)"),
    Column("timeline_s", "s", "naive and sp at P > 1: the timed step of median length, every "
                              "rank's compute, waits for the later rank and messages as "
                              "rank, name, cat, start_s, end_s on one clock (a list; the "
                              "Chrome trace's slices)"),
    Column("timeline_step", "", "which timed step timeline_s shows (1 = the first)"),
    Column("timeline_step_time_s", "s", "that step's time, slowest rank"),
    Column("collective_calls_s", "s", "naive and sp at P > 1: every timed step's collectives "
           "in call order, each its cat and message_s (from the last rank's entry to the last "
           "exit; a list): the time-inside law counts their scheduler waits"),
    Column("own_work_hidden_used", "", "library at P > 1: the small hidden size its own work "
           "was timed at (own_work_hidden rounded up to whole heads)"),
    Column("own_work_naive_step_s", "s", "the teaching version's step at that size (p50 of "
           "the rounds, slowest rank)"),
    Column("own_work_library_step_s", "s", "the library's step at that size (p50, same rounds)"),
    Column("library_own_work_s", "s", "the median of the rounds' library step less the "
           "teaching version's at that size: DTensor's own work on P ranks"),
    Column("alpha_s", "s", "per-message latency α, fitted to an all-reduce sweep in the launch"),
    Column("beta_gb_per_s", "GB/s", "link bandwidth β, same fit"),
    Column("link_sweep", "", "the sweep behind α and β: size_bytes and time_p50_s per size"),
    Column("compute_flop_per_s", "FLOP/s",
           "forward + backward FLOP/s of a rank's share (1/P) of one layer, each rank alone, "
           "slowest rank (measured in the launch)"),
    Column("flops_per_rank", "FLOP", "3 L (24 b s h^2 + 4 b s^2 h) / P"),
    Column("predicted_compute_s", "s", "flops_per_rank / compute_flop_per_s: the compute "
                                       "of one rank alone"),
    Column("predicted_comm_s", "s", "4 L ring all-reduces of b s h x 4 bytes (α, β)"),
    Column("predicted_step_s", "s", "predicted_compute_s + predicted_comm_s"),
    Column("prediction_error_pct", "%", "100 (predicted_step_s - step_time_p50_s) / "
                                        "step_time_p50_s"),
    Column("baseline_in_launch", "", "a 1-rank row measured by rank 0 alone inside a launch "
                                     "of more ranks (the others waiting); absent otherwise"),
    Column("speedup_vs_1_rank", "", "step_time_p50_s of the 1-rank run of the same variant / "
                                    "this one's (NaN without a 1-rank run)"),
    *DEVICE_MEMORY_COLUMNS,
    Column("activation_bytes_measured", "bytes",
           "what autograd saved for backward on this rank in one step, each storage once, "
           "parameters left out (the teaching version; NaN for the library's DTensors)"),
    Column("activation_bytes_formula", "bytes", "L (s b h (4 + 12/P) + 4 b s + a b s / P) + "
                                                "2 s b h values x 4 bytes; sp: (L (16 s b h + "
                                                "4 b s + a b s) + 2 s b h) / P values x 4"),
    Column("activation_korthikanti_bytes", "bytes", "Korthikanti et al. as published, no "
                                                    "sequence parallelism: L s b h (10 + 24/P "
                                                    "+ 5 a s / (h P)) bytes (16-bit)"),
    Column("activation_korthikanti_fp32_bytes", "bytes", "the paper's terms in the lab's: 4 "
                                                         "bytes a value, no dropout, flash "
                                                         "attention: L s b h (16 + 48/P)"),
    Column("activation_korthikanti_sp_bytes", "bytes", "Korthikanti et al. as published, with "
                                                       "sequence parallelism: L s b h (34 + "
                                                       "5 a s / h) / P bytes (16-bit)"),
    Column("activation_korthikanti_sp_fp32_bytes", "bytes", "the same in the lab's terms (4 "
                                                            "bytes a value, no dropout, flash "
                                                            "attention): L s b h 64 / P"),
)


def activation_frame(row):
    """The saved activations of one rank beside the formulas: the lab's exact count,
    Korthikanti et al.'s terms in the lab's units and as published (with sequence parallelism
    for an ``sp`` row), each with its difference from the measurement (%) and what it leaves
    out or adds."""
    import pandas as pd

    from labkit.book.laws import symmetric_error_pct

    m = row["activation_bytes_measured"]
    sp = "_sp" if row["variant"] == "sp" else ""
    how = ", with sequence parallelism" if sp else ""
    cases = (
        ("the lab's count", row["activation_bytes_formula"],
         "every saved tensor of the layer, the loss"),
        (f"Korthikanti{how}, fp32, no dropout, flash", row[f"activation_korthikanti{sp}_fp32_bytes"],
         "leaves out the LayerNorms' statistics, the log-sum-exp and the loss"),
        (f"Korthikanti{how}, as published (16-bit)", row[f"activation_korthikanti{sp}_bytes"],
         "2 bytes a value, dropout masks, the s x s softmax kept"),
    )
    return pd.DataFrame([{"variant": row["variant"], "formula": name, "MB": v / 1e6,
                          "measured_MB": m / 1e6, "error_pct": symmetric_error_pct(v, m),
                          "difference": why}
                         for name, v, why in cases])


def activation_frames(rows):
    """:func:`activation_frame` of each row, one table (TP without and with sequence
    parallelism, one under the other)."""
    import pandas as pd

    return pd.concat([activation_frame(r) for r in rows], ignore_index=True)


def rate_frame(one, row, prof):
    """:func:`labkit.tp.rates.rate_rows` as a table in GFLOP/s."""
    import pandas as pd

    from labkit.tp.rates import rate_rows

    return pd.DataFrame([{"compute": r["what"], "matrix n": r["matrix_n"],
                          "measured GFLOP/s": r["measured_flop_per_s"] / 1e9,
                          "profile's products GFLOP/s": r["profile_flop_per_s"] / 1e9,
                          "measured / profile": r["measured_over_profile"]}
                         for r in rate_rows(one, row, prof)])


def select(df, variant: str | None = None, **equal):
    """The rows of ``variant`` (None: all) with the given ``column=value``s, by world size."""
    return select_rows(df, variant=variant, **equal).sort_values(
        ["variant", "world_size"]).reset_index(drop=True)


def one(df, variant: str, **equal):
    """The one row of ``variant`` with the given ``column=value``s (a pandas Series);
    none or several: UsageError."""
    return one_row(df, variant=variant, **equal)


def summary_frame(df, prof=None):
    """One line per run: the check, the all-reduces counted against the formula, and where the
    step's time goes (ms) beside the prediction: the in-context model with a machine profile
    ``prof`` (:func:`labkit.tp.library.model_context`), else the launch's own (alone, α–β)."""
    import pandas as pd

    from labkit.book.laws import symmetric_error_pct
    from labkit.tp.library import bookkeeping_s, model_context

    extra = bookkeeping_s(df) if prof is not None else math.nan
    out = []
    for _, r in select(df).iterrows():
        if prof is not None:
            predicted = model_context(r, df, prof, bookkeeping=extra)["step_s"]
        else:
            predicted = r["predicted_step_s"]
        out.append({
            "variant": r["variant"], "ranks": int(r["world_size"]),
            "matches": bool(r["matches_single_process"]),
            "collectives": f"{_calls(r, 'measured')}/{_calls(r, 'formula')}",
            "MB_measured": r["comm_bytes_measured"] / 1e6,
            "MB_formula": r["comm_bytes_formula"] / 1e6,
            "step_ms": ms(r["step_time_p50_s"]),
            "compute_ms": ms(r["compute_time_p50_s"]),
            "comm_ms": ms(r["comm_time_s"]),
            "predicted_ms": ms(predicted),
            "error_pct": symmetric_error_pct(predicted, r["step_time_p50_s"]),
            "speedup_vs_1": r.get("speedup_vs_1_rank", math.nan),
        })
    return pd.DataFrame(out)


def _calls(r, kind: str) -> int:
    """A row's collectives per step, ``measured`` or by ``formula``, every operation."""
    counts = (r.get(f"{op}_calls_{kind}") for op in ("allreduce", "allgather", "reduce_scatter"))
    return sum(int(v) for v in counts if v is not None and v == v)  # NaN: not measured


SUMMARY_LEGEND = (
    "collectives = counted/formula (naive and library: 4 all-reduces per layer, g after "
    "attention and after the MLP forward, f before each backward; sp: 6 all-gathers and 4 "
    "reduce-scatters per layer, 1 all-reduce of the whole-kept gradients)\n"
    "compute = the same step with f and g off; comm = step - compute; predicted = F/R + the "
    "variant's ring collectives (α, β fitted in the launch); error = the larger relative "
    "error, + when the prediction is larger")
#: the legend of :func:`summary_frame` with a machine profile
SUMMARY_LEGEND_IN_CONTEXT = SUMMARY_LEGEND.replace(
    "predicted = F/R + the variant's ring collectives (α, β fitted in the launch)",
    "predicted = F/R alone x the co-run slowdown + the variant's collectives in context (the "
    "machine profile's all-reduce transfers, an all-gather or a reduce-scatter a multiple of "
    "one, + the profile's scheduler wait for each message of the median step that waited; "
    "the library, whose collectives are not stamped: their transfers + the teaching "
    "version's waits a step, its mean over its timed steps, else the profile's average "
    "all-reduce), + "
    "DTensor's own work for the library (measured on P ranks at a small hidden size, else its "
    "bookkeeping on 1 rank)")


def prediction_fields(*, link: dict, compute_flop_per_s: float, flops_per_rank: float,
                      predicted: dict) -> dict:
    """The fields a row carries about its step's prediction: the α–β fit of the launch
    (``link``, :func:`labkit.tp.measure.fit_link`), the measured compute rate, one rank's
    FLOPs and the predicted times (``predicted``: ``compute_s``, ``comm_s``, ``step_s``).

    >>> f = prediction_fields(link={"alpha_s": 1e-5, "beta_bytes_per_s": 2e9, "sweep": []},
    ...                       compute_flop_per_s=1e10, flops_per_rank=1e8,
    ...                       predicted={"compute_s": 0.01, "comm_s": 0.002, "step_s": 0.012})
    >>> f["beta_gb_per_s"], f["predicted_step_s"]
    (2.0, 0.012)
    """
    return {"alpha_s": link["alpha_s"],
            "beta_gb_per_s": link["beta_bytes_per_s"] / 1e9,
            "link_sweep": link["sweep"],
            "compute_flop_per_s": compute_flop_per_s,
            "flops_per_rank": flops_per_rank,
            "predicted_compute_s": predicted["compute_s"],
            "predicted_comm_s": predicted["comm_s"],
            "predicted_step_s": predicted["step_s"]}


def add_compute_time(rows: list[dict], compute: dict) -> None:
    """Put the compute-only timings (``compute_time_*``) on every row, and ``comm_time_s``:
    the p50 step time less the compute-only p50 (at least 0).

    >>> rows = [{"step_time_p50_s": 0.05}, {"step_time_p50_s": 0.02}]
    >>> add_compute_time(rows, {"compute_time_p50_s": 0.03})
    >>> [round(r["comm_time_s"], 6) for r in rows]
    [0.02, 0.0]
    """
    for row in rows:
        row.update(compute)
        row["comm_time_s"] = max(0.0, row["step_time_p50_s"] - compute["compute_time_p50_s"])


def laws_frame(row):
    """Each law of :mod:`labkit.tp.formulas` with its numbers, beside what the run measured:
    ``quantity, law, predicted, measured, error_pct`` (one row of :func:`labkit.tp.run.run`)."""
    import pandas as pd

    r = row
    L, b, s, h, p = (int(r[k]) for k in ("num_layers", "batch_size", "seq_len", "hidden",
                                         "world_size"))
    lines = [
        ("all-reduces per step", f"4 L = 4 x {L}" if p > 1 else "0 on one rank",
         r["allreduce_calls_formula"], r["allreduce_calls_measured"]),
        ("bytes all-reduced per step", f"4 L b s h x 4 B = 4 x {L} x {b} x {s} x {h} x 4",
         r["comm_bytes_formula"], r["comm_bytes_measured"]),
        ("parameters per rank", f"L ((12 h^2 + 7 h)/P + 6 h), P = {p}",
         r["params_per_rank_formula"], r["params_per_rank"]),
        ("step time (s)", "F/R + 4 L t_ar(b s h x 4 B)", r["predicted_step_s"],
         r["step_time_p50_s"]),
    ]
    return pd.DataFrame([{"quantity": q, "law": law, "predicted": pred, "measured": meas,
                          "error_pct": relative_error_pct(pred, meas)}
                         for q, law, pred, meas in lines])
