"""What a sharded-data-parallel row holds, and the tables made of them (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`select` and :func:`one` the selections notebooks make;
:func:`summary_frame` the table ``labkit fsdp`` prints; :func:`memory_frame` and
:func:`comm_frame` each law beside what was measured (law, predicted, measured, error).
"""

from __future__ import annotations

import math

from labkit.metrics import relative_error_pct
from labkit.results import DEVICE_MEMORY_COLUMNS, Column, ms, one_row, select_rows, timed_columns

#: what makes a row a different measurement: the variant, the world size, the model, the
#: batch per rank, FSDP's resharding and the device
#: the memory one rank holds over a step, counted (labkit.fsdp.peak), and the activations
PEAK_COLUMNS = (
    Column("peak_bytes_per_rank", "bytes",
           "the most one rank holds during one step, counted at every layer's entry and exit "
           "(forward and backward) and every hand-written reduce-scatter: weights + gradients "
           "+ Adam states + buffers + saved activations, each storage once at its size then"),
    Column("peak_at", "", "where in the step that peak was (the sample's label)"),
    *(Column(f"peak_{k}_bytes", "bytes", f"{k} held at the peak") for k in (
        "params", "gradients", "optimizer", "buffers", "activations")),
    Column("peak_bytes_formula", "bytes", "the variant's schedule of the step "
                                          "(labkit.fsdp.formulas.step_memory), its largest"),
    Column("peak_resharded_bytes_per_rank", "bytes", "fsdp: the counted peak resharding after "
                                                     "forward (NaN for the other variants)"),
    Column("peak_resharded_bytes_formula", "bytes", "fsdp: its step_memory peak"),
    Column("peak_kept_bytes_per_rank", "bytes", "fsdp: the counted peak keeping the gathered "
                                                "weights from forward to backward"),
    Column("peak_kept_bytes_formula", "bytes", "fsdp: its step_memory peak"),
    Column("peak_device_bytes", "bytes", "CUDA: max_memory_allocated over that one step, reset "
                                         "before it (None on a CPU)"),
    Column("activation_bytes_measured", "bytes", "the plain model's saved activations after "
                                                 "forward, this rank's batch (counted)"),
    Column("activation_bytes_formula", "bytes", "L (16 s b h + 4 b s + a b s) + 2 s b h "
                                                "values x 4 bytes"),
    Column("checkpoint_activation_bytes_measured", "bytes", "the same with activation "
                                                            "checkpointing"),
    Column("checkpoint_activation_bytes_formula", "bytes", "(L + 2) s b h values x 4 bytes"),
    *timed_columns("checkpoint_compute_time", "the plain model's step with activation "
                                              "checkpointing"),
    *timed_columns("forward_time", "the plain model's forward alone (what checkpointing "
                                   "runs again)"),
)

KEY = ("variant", "world_size", "hidden", "num_heads", "seq_len", "batch_size", "num_layers",
       "reshard_after_forward", "checkpoint", "device")

COLUMNS = (
    Column("variant", "", "ddp, zero1 (sharded optimizer, by hand), zero2 (and sharded "
                          "gradients, by hand) or fsdp (FSDP2 fully_shard)"),
    Column("stage", "", "the ZeRO stage the variant is: ddp, zero1, zero2 or zero3"),
    Column("hidden", "", "hidden size h; the MLP is 4h wide"),
    Column("num_heads", "", "attention heads"),
    Column("seq_len", "", "tokens per sequence s"),
    Column("batch_size", "", "sequences per rank per step"),
    Column("num_layers", "", "transformer layers (one FSDP unit each)"),
    Column("steps", "", "training steps per variant, warm-up included"),
    Column("warmup", "", "untimed first steps"),
    Column("measured_steps", "", "timed steps: steps - warmup"),
    Column("lr", "", "Adam learning rate"),
    Column("seed", "", "seed of the weights and the data"),
    Column("reshard_after_forward", "", "fsdp frees gathered parameters after forward (ZeRO-3)"),
    Column("checkpoint", "", "activation checkpointing in every variant (each layer keeps its "
                             "input, runs its forward again in backward)"),
    Column("num_params", "", "parameters Ψ of the model, counted"),
    Column("matches_single_process", "",
           "outputs, gradients (or gradient shards) and parameters after one Adam step equal "
           "one process's on all ranks' batches, within tolerance (checked before timing)"),
    Column("max_rel_error", "", "largest |sharded - one process| / max|one process|, worst rank"),
    Column("tolerance", "", "max_rel_error at or below which a run matches"),
    Column("param_bytes_per_rank", "bytes", "weights this rank holds, summed over its local "
                                            "tensors (shards for fsdp)"),
    Column("grad_bytes_per_rank", "bytes", "gradients this rank holds after a step, local"),
    Column("optimizer_bytes_per_rank", "bytes", "Adam states (m, v, step) this rank holds, local"),
    Column("state_bytes_per_rank", "bytes", "param + grad + optimizer bytes this rank holds"),
    Column("param_bytes_formula", "bytes", "4 Ψ, divided by N for zero3"),
    Column("grad_bytes_formula", "bytes", "4 Ψ, divided by N for zero2 and zero3"),
    Column("optimizer_bytes_formula", "bytes", "8 Ψ (fp32 m and v), divided by N for zero1-3"),
    Column("state_bytes_formula", "bytes", "the sum: 16 Ψ (ddp), 8 Ψ + 8 Ψ/N (zero1), "
                                           "16 Ψ/N (zero3)"),
    Column("ddp_param_bytes_per_rank", "bytes", "DDP's param_bytes_per_rank in the same launch "
                                                "(NaN without a ddp run)"),
    Column("ddp_grad_bytes_per_rank", "bytes", "DDP's grad_bytes_per_rank, same launch"),
    Column("ddp_optimizer_bytes_per_rank", "bytes", "DDP's optimizer_bytes_per_rank, same launch"),
    Column("ddp_state_bytes_per_rank", "bytes", "DDP's state_bytes_per_rank, same launch"),
    Column("state_ratio_vs_ddp", "", "state_bytes_per_rank / ddp_state_bytes_per_rank"),
    Column("allreduce_bytes_measured", "bytes", "all-reduce buffers of one step, counted"),
    Column("allgather_bytes_measured", "bytes", "all-gather outputs of one step, counted"),
    Column("reduce_scatter_bytes_measured", "bytes", "reduce-scatter inputs of one step, counted"),
    Column("collective_calls_measured", "", "collectives in one step, counted"),
    Column("collective_calls_formula", "", "zero1: 2; zero3: 3 per layer (2 without "
                                           "resharding); NaN for ddp (bucketed)"),
    Column("comm_bytes_measured", "bytes", "volume of one step, counted: 2 x all-reduce + "
                                           "all-gather + reduce-scatter bytes"),
    Column("comm_bytes_formula", "bytes", "2 x 4 Ψ (ddp, zero1), 3 x 4 Ψ (zero3; 2 x 4 Ψ "
                                          "without resharding after forward); 0 on one rank, "
                                          "but for DDP, which all-reduces there too"),
    Column("ddp_comm_bytes_measured", "bytes", "DDP's comm_bytes_measured, same launch"),
    Column("comm_ratio_vs_ddp", "", "comm_bytes_measured / ddp_comm_bytes_measured (1.5 for "
                                    "zero3)"),
    *timed_columns("step_time", "training step"),
    Column("step_times_s", "s", "every timed step's time, slowest rank (a list)"),
    Column("timeline_s", "s", "zero1, zero2, fsdp at N > 1 (no checkpointing): the timed step "
                              "of median length, every rank's layers' forward and backward "
                              "compute and each collective as rank, name, cat, start_s, end_s "
                              "on one clock (a list; the Chrome trace's slices)"),
    Column("timeline_step", "", "which timed step timeline_s shows (1 = the first)"),
    Column("timeline_step_time_s", "s", "that step's time, slowest rank"),
    Column("collectives_time_alone_s", "s", "the step's collectives (its sizes, in its order) "
                                            "with nothing around them, p50 of the slowest rank "
                                            "(NaN on one rank)"),
    Column("local_step_time_p50_s", "s", "FSDP2's step with its collectives replaced by local "
                                         "copies (nothing on the wire), every rank at once, p50 "
                                         "of the slowest rank: its own work beside the plain "
                                         "model's step (NaN but for FSDP2 on 2+ ranks)"),
    *timed_columns("compute_time", "the plain model's step on this rank's batch (no "
                                   "communication)"),
    Column("comm_time_s", "s", "step_time_p50_s - compute_time_p50_s (at least 0)"),
    Column("step_ratio_vs_ddp", "", "step_time_p50_s / DDP's, same launch"),
    Column("alpha_s", "s", "per-message latency α, fitted to an all-reduce sweep in the launch"),
    Column("beta_gb_per_s", "GB/s", "link bandwidth β, same fit"),
    Column("link_sweep", "", "the sweep behind α and β: size_bytes and time_p50_s per size"),
    Column("compute_flop_per_s", "FLOP/s",
           "forward + backward FLOP/s of one whole layer on one rank alone (the ranks "
           "taking turns), slowest rank"),
    Column("flops_per_rank", "FLOP", "3 L (24 b s h^2 + 4 b s^2 h), b per rank"),
    Column("optimizer_time_s", "s", "the variant's Adam arithmetic, one rank alone (the ranks "
           "taking turns): torch.optim.Adam over all Ψ (ddp; fsdp where its own work is "
           "measured, against the plain model's step and its Adam), adam_update over the "
           "rank's Ψ/N slice (zero1, zero2; fsdp without its own work)"),
    Column("predicted_compute_s", "s", "flops_per_rank / compute_flop_per_s: one rank's "
                                       "forward + backward alone (Adam: optimizer_time_s)"),
    Column("predicted_comm_s", "s", "the variant's collectives, α–β ring model, one after the "
                                    "other"),
    Column("predicted_step_s", "s", "predicted_compute_s + predicted_comm_s"),
    Column("prediction_error_pct", "%", "100 (predicted_step_s - step_time_p50_s) / "
                                        "step_time_p50_s"),
    *DEVICE_MEMORY_COLUMNS,
    *PEAK_COLUMNS,
)

ORDER = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}


def select(df, variant: str | None = None, **equal):
    """The rows of ``variant`` (None: all) with the given ``column=value``s, ddp first."""
    sel = select_rows(df, variant=variant, **equal)
    sel = sel.assign(_o=sel["variant"].map(ORDER))
    return sel.sort_values(["world_size", "_o"]).drop(columns="_o").reset_index(drop=True)


def one(df, variant: str, **equal):
    """The one row of ``variant`` with the given ``column=value``s; none or several:
    UsageError."""
    return one_row(df, variant=variant, **equal)


def summary_frame(df, prof=None):
    """One line per run: the check, the state held and the bytes moved against DDP's, the step
    time beside its prediction (MB, ms): the in-context model with a machine profile ``prof``
    (:func:`labkit.fsdp.model.context`), else the launch's own (alone, α–β)."""
    import pandas as pd

    from labkit.book.laws import symmetric_error_pct
    from labkit.fsdp.model import context

    out = []
    for _, r in select(df).iterrows():
        predicted = context(r, prof)["step_s"] if prof is not None else r["predicted_step_s"]
        out.append({
            "variant": r["variant"], "ranks": int(r["world_size"]),
            "matches": bool(r["matches_single_process"]),
            "state_MB": r["state_bytes_per_rank"] / 1e6,
            "x_ddp_state": r["state_ratio_vs_ddp"],
            "comm_MB": r["comm_bytes_measured"] / 1e6,
            "x_ddp_comm": r["comm_ratio_vs_ddp"],
            "step_ms": ms(r["step_time_p50_s"]),
            "compute_ms": ms(r["compute_time_p50_s"]),
            "predicted_ms": ms(predicted),
            "error_pct": symmetric_error_pct(predicted, r["step_time_p50_s"]),
        })
    return pd.DataFrame(out)


SUMMARY_LEGEND = (
    "state = weights + gradients + Adam states this rank holds (local shards); comm = volume "
    "of one step (all-reduce 2S, all-gather S, reduce-scatter S)\n"
    "x_ddp = against DDP in the same launch; predicted = F/R + the variant's collectives "
    "(α–β fitted in the launch); error = the larger relative error, + when the prediction is "
    "larger")
#: the legend of :func:`summary_frame` with a machine profile
SUMMARY_LEGEND_IN_CONTEXT = SUMMARY_LEGEND.replace(
    "predicted = F/R + the variant's collectives (α–β fitted in the launch)",
    "predicted = (F/R + the variant's Adam) alone x the co-run slowdown + the variant's "
    "collectives in context (the "
    "machine profile's transfers, + its scheduler wait for each collective of the median step "
    "that waited; DDP, whose all-reduces are not stamped: the profile's average all-reduce)")


LAWS = {"ddp": ("4 Ψ", "4 Ψ", "8 Ψ"), "zero1": ("4 Ψ", "4 Ψ", "8 Ψ / N"),
        "zero2": ("4 Ψ", "4 Ψ / N", "8 Ψ / N"),
        "zero3": ("4 Ψ / N", "4 Ψ / N", "8 Ψ / N")}


def memory_frame(df):
    """Per variant and kind (weights, gradients, Adam states, all): the law (fp32, Adam), its
    bytes, the bytes measured from the local tensors, the error (%), and DDP's measured bytes."""
    import pandas as pd

    out = []
    for _, r in select(df).iterrows():
        laws = LAWS[r["stage"]]
        for kind, law, col in (("weights", laws[0], "param"), ("gradients", laws[1], "grad"),
                               ("Adam states", laws[2], "optimizer"),
                               ("all", "sum", "state")):
            pred, meas = r[f"{col}_bytes_formula"], r[f"{col}_bytes_per_rank"]
            out.append({"variant": r["variant"], "ranks": int(r["world_size"]), "kind": kind,
                        "law": law, "predicted_MB": pred / 1e6, "measured_MB": meas / 1e6,
                        "error_pct": relative_error_pct(pred, meas),
                        "ddp_MB": r.get(f"ddp_{col}_bytes_per_rank", math.nan) / 1e6})
    return pd.DataFrame(out)


def comm_frame(df):
    """Per variant: the collectives of a step (law), the volume it predicts, the volume
    counted, the error (%), and the ratio to DDP's counted volume."""
    import pandas as pd

    law = {"ddp": "all-reduce of 4 Ψ: 2 x 4 Ψ",
           "zero1": "reduce-scatter 4 Ψ + all-gather 4 Ψ",
           "zero2": "per layer: reduce-scatter + all-gather: 2 x 4 Ψ",
           "zero3": "per layer: 2 all-gathers + 1 reduce-scatter: 3 x 4 Ψ"}
    out = []
    for _, r in select(df).iterrows():
        text = law[r["stage"]]
        if r["stage"] == "zero3" and not r.get("reshard_after_forward", True):
            text = "per layer: 1 all-gather + 1 reduce-scatter: 2 x 4 Ψ"
        out.append({"variant": r["variant"], "ranks": int(r["world_size"]),
                    "law": text, "predicted_MB": r["comm_bytes_formula"] / 1e6,
                    "measured_MB": r["comm_bytes_measured"] / 1e6,
                    "error_pct": relative_error_pct(r["comm_bytes_formula"],
                                               r["comm_bytes_measured"]),
                    "x_ddp": r["comm_ratio_vs_ddp"]})
    return pd.DataFrame(out)
