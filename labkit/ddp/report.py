"""What a DDP row holds, and the tables made of DDP rows (pure: no torch).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`select` and :func:`one` the selections notebooks make;
:func:`prediction_frame` and :func:`crossover` the model of a DDP step beside the measurement
(:mod:`labkit.ddp.predict`);
the sentences that state a verdict from those numbers live in :mod:`labkit.ddp.verdicts`.

:func:`benchmark_table` copies the layout of PyTorch's ``benchmarks/distributed/ddp/benchmark.py``: one
line per run, ``no ddp`` first, then ``{machines}M/{ranks}G`` (GPUs) or ``.../{ranks}C`` (CPU
ranks), with sec/iter and examples/s per replica (batch per rank / step time) at p50, p75, p90
and p95 of the slowest rank's step times.
"""

from __future__ import annotations

import math

from labkit.ddp.formulas import BENCHMARK
from labkit.metrics import ratio_split
from labkit.results import (
    DEVICE_MEMORY_COLUMNS,
    TIMED_PCTS,
    Column,
    ms,
    one_row,
    select_rows,
    timed_columns,
)

#: what makes a row a different measurement: the benchmark (the model and its sizes, batch per
#: rank, the DDP flags and the device), the variant and the world size
KEY = (*BENCHMARK, "variant", "world_size")


#: every field a row can carry (launch fields and provenance are declared elsewhere)
COLUMNS = (
    Column("model", "", "mlp, cnn or transformer"),
    Column("input_dim", "", "mlp: features; cnn: channels; transformer: features per token"),
    Column("hidden_dim", "", "mlp: units; cnn: channels; transformer: d_model"),
    Column("output_dim", "", "classes"),
    Column("num_layers", "", "hidden Linear, conv or encoder layers"),
    Column("image_size", "", "cnn: image side in pixels (None for other models)"),
    Column("seq_len", "", "transformer: tokens per sample (None for other models)"),
    Column("num_heads", "", "transformer: attention heads (None for other models)"),
    Column("lr", "", "SGD learning rate"),
    Column("seed", "", "seed of the weights and the synthetic data"),
    Column("batch_size", "", "samples per rank per step"),
    Column("global_batch_size", "", "samples per step, all ranks: batch_size x world_size"),
    Column("steps", "", "optimizer steps per run, warm-up included"),
    Column("warmup", "", "untimed first steps"),
    Column("measured_steps", "", "timed steps: steps - warmup"),
    Column("bucket_cap_mb", "MB", "DDP's gradient bucket size"),
    Column("broadcast_buffers", "", "DDP sends rank 0's buffers before every forward"),
    Column("static_graph", "", "DDP was told the graph never changes"),
    Column("gradient_as_bucket_view", "", "gradients are views into DDP's all-reduce buckets"),
    Column("variant", "", "no_ddp (plain model, one process), no_ddp_all_cores (the same with "
                          "every allocated core as a thread) or ddp"),
    Column("ddp", "", "the model was wrapped in DistributedDataParallel"),
    Column("num_params", "", "parameters of the model"),
    Column("grad_bytes", "bytes", "fp32 gradient bytes per step (4 x num_params)"),
    Column("allreduce_bytes_per_step", "bytes", "bytes DDP all-reduces per step (0 without DDP)"),
    *timed_columns("step_time", "DDP or no-DDP step"),
    Column("step_times_s", "s", "every timed step's time, slowest rank (a list)"),
    Column("rank_step_times_s", "s", "every rank's time of every timed step (world_size lists)"),
    Column("samples_per_s_per_replica", "samples/s", "batch_size / step_time_p50_s"),
    Column("samples_per_s", "samples/s", "all ranks: world_size x batch_size / step_time_p50_s"),
    Column("one_thread_paired_p50_s", "s", "no_ddp_all_cores rows: the one-thread no-DDP step "
                                           "timed in turn with the all-cores steps (one, all, "
                                           "...), p50: the threads' speedup's baseline"),
    Column("replica_drift", "", "largest parameter difference between ranks after training"),
    Column("replicas_in_sync", "", "replica_drift == 0: DDP kept every replica identical"),
    Column("params_by_rank", "", "every rank's final parameters (tests only: return_params)"),
    Column("placement", "", "one dict per rank: rank, host, pid, device, threads, problem"),
    Column("placement_ok", "", "no two ranks of the launch share a GPU"),
    *timed_columns("nosync_step_time", "step under no_sync (compute only)"),
    Column("nosync_step_times_s", "s", "every timed no_sync step's time, slowest rank (a list)"),
    *timed_columns("alone_step_time", "plain model's step on rank 0 alone, one a round beside "
                                      "the DDP step (the model's start)"),
    Column("alone_step_times_s", "s", "every timed alone step's time (a list)"),
    *timed_columns("allreduce_time", "standalone all-reduce of the gradients"),
    Column("allreduce_times_s", "s", "every timed all-reduce's time, slowest rank (a list)"),
    Column("allreduce_bytes", "bytes", "bytes of the standalone all-reduce (the gradient bytes)"),
    Column("allreduce_algbw_gb_per_s", "GB/s", "algbw = allreduce_bytes / allreduce_time_p50_s"),
    Column("allreduce_busbw_gb_per_s", "GB/s", "busbw = algbw x 2(N-1)/N (nccl-tests)"),
    Column("exposed_comm_s", "s", "max(0, step_time_p50_s - nosync_step_time_p50_s)"),
    Column("comm_fraction", "", "exposed_comm_s / step_time_p50_s"),
    Column("overlap_fraction", "", "1 - exposed_comm_s / allreduce_time_p50_s, in [0, 1]"),
    Column("speedup", "", "ddp rows: N t1 / tN against 1-rank DDP (p50 step times)"),
    Column("scaling_efficiency", "", "ddp rows: speedup / N = t1 / tN"),
    Column("speedup_vs_no_ddp", "", "N t_no_ddp / tN: throughput against one process without DDP"),
    Column("speedup_vs_all_cores", "",
           "ddp rows: N t_all_cores / tN against one no-DDP process with every core as a thread"),
    *timed_columns("bucket_copy_time", "DDP's gradient copies into its buckets (scaled 1/N) and back"),
    Column("bucket_copy_times_s", "s", "every timed bucket copy's time, slowest rank (a list)"),
    Column("bucket_bytes", "bytes", "sizes of DDP's gradient buckets as its last step used them"),
    Column("allreduce_fit_bytes", "bytes", "sizes of the standalone all-reduces the α–β fit uses"),
    Column("allreduce_fit_times_s", "s", "their p50 times over the slowest rank (a list)"),
    Column("allreduce_fit_transfers_s", "s", "their transfers, slowest rank: the medians of the "
                                             "calls that waited for nothing (a list)"),
    Column("allreduce_alpha_s", "s", "α of the fit: latency of one ring step"),
    Column("allreduce_beta_bytes_per_s", "B/s", "β of the fit: bandwidth"),
    Column("compute_slowdown", "", "the profile's co-run slowdown of N ranks computing at once"),
    Column("model_compute_alone_s", "s", "the plain step the model starts from: "
                                         "alone_step_time_p50_s, else the no-DDP step"),
    Column("model_compute_s", "s", "the model's compute: model_compute_alone_s x compute_slowdown"),
    Column("model_copies_s", "s", "the model's copies: gradient bytes copied at the profile's rate"),
    Column("model_comm_s", "s",
           "the model's all-reduces of one step, in context (busy during backward, idle after): "
           "model_transfers_s + model_scheduler_waits_s"),
    Column("model_transfers_s", "s", "the buckets' all-reduces that waited for nothing, the "
                                     "profile's transfers in context"),
    Column("model_scheduler_waits_s", "s", "allreduces_waited x scheduler_wait_s"),
    Column("scheduler_wait_s", "s", "the profile's scheduler wait: what a call that waited "
                                    "took beyond its transfer (about a tick)"),
    Column("allreduces_counted", "", "buckets' all-reduces in the median timed step (rank 0's "
                                     "timeline; None without one)"),
    Column("allreduces_waited", "", "of them, those that took longer than their transfer + "
                                    "max(1.5 ms, transfer / 4) (labkit.ddp.waits.count)"),
    Column("allreduce_waits_measured_s", "s", "what those took beyond their transfers in the "
                                              "median step, measured"),
    Column("outside_waits", "", "parts of the median step outside the all-reduces that waited "
                                "(labkit.ddp.waits.outside; None without a timeline)"),
    Column("outside_waits_where", "", "those parts, by name (a list)"),
    Column("outside_waits_measured_s", "s", "what those took beyond their medians, measured"),
    Column("model_outside_waits_s", "s", "outside_waits x scheduler_wait_s"),
    Column("model_overlap_window_s", "s", "backward time the model lets the all-reduce hide behind"),
    Column("model_exposed_comm_s", "s", "the model's all-reduce time the window does not hide"),
    Column("predicted_step_time_s", "s",
           "the model: model_compute + model_copies + model_exposed_comm + "
           "model_outside_waits"),
    Column("predicted_step_error_pct", "%",
           "the predicted step time's symmetric error (labkit.book.laws.symmetric_error_pct)"),
    Column("predicted_speedup_vs_no_ddp", "", "N t_no_ddp / predicted_step_time_s"),
    Column("predicted_speedup_error_pct", "%",
           "the predicted speedup's symmetric error against no DDP"),
    Column("predicted_speedup", "", "N t1 / predicted_step_time_s against 1-rank DDP"),
    # the overlap as rank 0's timeline measured it (labkit.ddp.overlap), medians over steps
    Column("comm_total_s", "s", "time some bucket's all-reduce was in flight (union of them)"),
    Column("comm_hidden_s", "s", "of it, the time inside backward (backward still computing)"),
    Column("comm_exposed_s", "s", "of it, the time after backward's last gradient (the step waits)"),
    Column("comm_hidden_share", "", "comm_hidden_s / comm_total_s, measured on the timeline"),
    Column("backward_s", "s", "DDP step: backward's start to its last gradient accumulated"),
    Column("nosync_backward_s", "s", "the same in the no_sync step (no all-reduce beside it)"),
    Column("timeline_backward_start_s", "s", "per timed step: backward's start, from the step's"),
    Column("timeline_backward_end_s", "s", "per timed step: backward's last gradient"),
    Column("timeline_step_end_s", "s", "per timed step: the step's end, from its start"),
    Column("comm_intervals_s", "s",
           "per timed step, per bucket (by index): [launched, completed] from the step's start"),
    # the bucket A/B inside one launch (labkit.ddp.abtest)
    Column("compare_bucket_cap_mb", "MB", "run A's bucket size, timed in the same rounds"),
    Column("compare_step_time_p50_s", "s", "run A's step, p50 over the slowest rank"),
    Column("compare_step_times_s", "s", "run A's step in each round, slowest rank (a list)"),
    # compute rate (labkit.ddp.formulas.mfu, labkit.machine.roofline)
    Column("model_flop_per_step", "FLOP", "one rank's model FLOPs of a step (forward + backward)"),
    Column("model_flop_per_s", "FLOP/s", "model_flop_per_step / step_time_p50_s"),
    Column("peak_flop_per_s", "FLOP/s", "one rank's best measured matrix-product rate (profile)"),
    Column("mfu", "", "model FLOPs utilisation: model_flop_per_s / peak_flop_per_s"),
    Column("catalog_peak_flop_per_s", "FLOP/s", "a GPU's datasheet fp32 peak (catalogue)"),
    Column("mfu_catalog", "", "model_flop_per_s / catalog_peak_flop_per_s"),
    *DEVICE_MEMORY_COLUMNS,
)

#: the variant of the no-DDP run that uses every allocated core as a thread
ALL_CORES = "no_ddp_all_cores"


def select(df, variant: str | tuple | None = None, **equal):
    """The rows of one ``variant`` (``"ddp"``, ``"no_ddp"``, ``"no_ddp_all_cores"``; a tuple of
    them; None: all) and any ``column=value`` given, sorted by batch size and world size.

    ``select(df, "ddp", batch_size=64)`` is the DDP scaling series at 64 samples per rank;
    ``select(df, ("no_ddp", "ddp"))`` leaves out the all-cores run
    (:func:`labkit.results.select_rows`).
    """
    sel = select_rows(df, variant=variant, **equal)
    return sel.sort_values([c for c in ("batch_size", "world_size") if c in sel]).reset_index(
        drop=True)


def one(df, variant: str, **equal):
    """The one row of ``variant`` with the given ``column=value``s (a pandas Series).

    ``one(df, "ddp", world_size=2, batch_size=64)``; none or several such rows: UsageError.
    """
    return one_row(df, variant=variant, **equal)


def by_variant(df, keys=("model", "batch_size", "world_size")):
    """``df`` sorted by ``keys``, then no-DDP, all-cores and DDP runs in that order (the order
    of every table and figure of the lab)."""
    order = df.assign(_v=df["variant"].map({"no_ddp": 0, ALL_CORES: 1, "ddp": 2}).fillna(3))
    return order.sort_values([*keys, "_v"]).drop(columns="_v")


def on_gpu(row) -> bool:
    """The run of ``row`` (a dict or a DataFrame row) was on CUDA devices."""
    return str(row.get("device") or "").startswith("cuda")


def top_world_size(df, world_size: int | None = None) -> int:
    """``world_size``, or the largest world size of the DDP rows when it is None."""
    ddp = select_rows(df, variant="ddp")
    return int(ddp["world_size"].max()) if world_size is None else int(world_size)


def run_label(row, *, compact: bool = False) -> str:
    """What a row's run was: a figure's label, or (``compact``) the benchmark table's, in
    PyTorch's layout (machines M, GPUs G or CPU ranks C).

    >>> rows = [{"variant": "no_ddp"}, {"variant": ALL_CORES, "threads_per_rank": 4},
    ...         {"variant": "ddp", "world_size": 2, "device": "cuda:0"}]
    >>> [run_label(r) for r in rows]
    ['no DDP', 'no DDP, 4 threads', 'DDP N=2']
    >>> [run_label(r, compact=True) for r in rows]
    ['no ddp', 'no ddp/4T', '1M/2G']
    """
    if row["variant"] == "no_ddp":
        return "no ddp" if compact else "no DDP"
    if row["variant"] == ALL_CORES:
        threads = int(row.get("threads_per_rank") or 0)
        return f"no ddp/{threads}T" if compact else f"no DDP, {threads} threads"
    ranks = int(row["world_size"])
    if compact:
        return f"{int(row.get('nnodes') or 1)}M/{ranks}{'G' if on_gpu(row) else 'C'}"
    return f"DDP N={ranks}"


def benchmark_table(df) -> str:
    """One block per (model, batch per rank), PyTorch's layout. ``df``: :func:`labkit.ddp.run.run`
    rows."""
    if df.empty:
        return "(no rows)"
    lines = []
    for (model, batch), part in by_variant(df).groupby(["model", "batch_size"], sort=False):
        first = part.iloc[0]
        lines.append(f"Benchmark: {model} with batch size {batch} per rank "
                     f"({first['num_params'] / 1e6:.2f} M parameters, "
                     f"{first['grad_bytes'] / 1e6:.1f} MB of gradients per step)")
        lines.append("")
        prefix = f"{0:4d} {'ranks'} -- {'':>8s}:  "
        lines.append(" " * len(prefix)
                     + "  ".join([f"{'sec/iter':>13s}{'ex/sec':>11s}"] * len(TIMED_PCTS)))
        for _, r in part.iterrows():
            unit = "GPUs " if on_gpu(r) else "ranks"
            cells = []
            for p in TIMED_PCTS:
                t = r[f"step_time_p{p}_s"]
                cells.append(f"p{p}: {t:7.4f}s {r['batch_size'] / t:8.0f}/s")
            label = run_label(r, compact=True)
            lines.append(f"{int(r['world_size']):4d} {unit} -- {label:>8s}:  " + "  ".join(cells))
        lines.append("")
    return "\n".join(lines).rstrip()


def scaling_frame(df):
    """Speedup, efficiency and where the time goes, one row per run (times in ms)."""
    import pandas as pd

    out = []
    for _, r in by_variant(df).iterrows():
        out.append({
            "model": r["model"],
            "batch": int(r["batch_size"]),
            "world_size": int(r["world_size"]),
            "variant": r["variant"],
            "step_p50_ms": ms(r["step_time_p50_s"]),
            "samples_per_s": r["samples_per_s"],
            "speedup": r.get("speedup", math.nan),
            "efficiency": r.get("scaling_efficiency", math.nan),
            "vs_no_ddp": r.get("speedup_vs_no_ddp", math.nan),
            **({"vs_all_cores": r.get("speedup_vs_all_cores", math.nan)}
               if "speedup_vs_all_cores" in df else {}),
            "compute_ms": ms(r.get("nosync_step_time_p50_s", math.nan)),
            "exposed_comm_ms": ms(r.get("exposed_comm_s", math.nan)),
            "allreduce_ms": ms(r.get("allreduce_time_p50_s", math.nan)),
            "overlap": r.get("overlap_fraction", math.nan),
            "busbw_gb_s": r.get("allreduce_busbw_gb_per_s", math.nan),
            "in_sync": r.get("replicas_in_sync", "") if r["variant"] == "ddp" else "",
            "oversubscribed": bool(r.get("oversubscribed", False)),
        })
    return pd.DataFrame(out)


SCALING_LEGEND = (
    "speedup = N t1 / tN (aggregate samples/s against 1-rank DDP)   efficiency = speedup / N\n"
    "vs_no_ddp = N t_no_ddp / tN   compute = step under no_sync   exposed_comm = t_ddp - t_compute\n"
    "overlap = 1 - exposed_comm / allreduce   busbw = algbw x 2(N-1)/N, algbw = grad bytes / allreduce")


def placement_table(df) -> str:
    """One line per rank of every launch (the check that catches two ranks on one GPU)."""
    lines = []
    for ws, part in select_rows(df, variant="ddp").groupby("world_size"):
        table = part.iloc[0].get("placement") or []
        lines.append(f"placement, world_size {ws}:")
        for p in table:
            flag = f"   PROBLEM: {p['problem']}" if p.get("problem") else ""
            lines.append(f"  rank {p['rank']} (local {p['local_rank']}) on {p['host']} pid "
                         f"{p['pid']}: {p['device']} {p['device_name']}, {p['threads']} thread(s), "
                         f"CUDA_VISIBLE_DEVICES={p.get('cuda_visible_devices')}{flag}")
    return "\n".join(lines)


def prediction_frame(df, world_size: int | None = None):
    """The model of a DDP step beside the measurement, one row per batch per rank, at
    ``world_size`` ranks (default: the largest): the no-DDP step alone, the model's compute
    (that x the co-run slowdown), copies, all-reduce in context and the window, predicted and
    measured DDP step (ms), the measured compute (``no_sync`` step on N ranks), predicted and
    measured speedup against no DDP and the error (%). ``df``: :func:`labkit.ddp.run.run` rows
    with the model (:func:`labkit.ddp.predict.add_prediction_columns`)."""
    import pandas as pd

    n = top_world_size(df, world_size)
    base = select_rows(df, variant="no_ddp").set_index("batch_size")["step_time_p50_s"]
    out = []
    for _, r in select(df, "ddp", world_size=n).iterrows():
        b = int(r["batch_size"])
        out.append({
            "batch": b,
            "no_ddp_ms": ms(base.get(b, math.nan)),
            "slowdown": r.get("compute_slowdown", math.nan),
            "compute_ms": ms(r.get("model_compute_s", math.nan)),
            "copies_ms": ms(r.get("model_copies_s", math.nan)),
            "allreduce_ms": ms(r.get("model_comm_s", math.nan)),
            "window_ms": ms(r.get("model_overlap_window_s", math.nan)),
            "outside_waits_ms": ms(r.get("model_outside_waits_s", 0.0)),
            "predicted_ms": ms(r.get("predicted_step_time_s", math.nan)),
            "measured_ms": ms(r["step_time_p50_s"]),
            "measured_compute_ms": ms(r.get("nosync_step_time_p50_s", math.nan)),
            "predicted": r.get("predicted_speedup_vs_no_ddp", math.nan),
            "measured": r.get("speedup_vs_no_ddp", math.nan),
            "error_pct": r.get("predicted_speedup_error_pct", math.nan),
        })
    return pd.DataFrame(out)


PREDICTION_LEGEND = (
    "compute = no_ddp (one process alone) x slowdown (the profile's, N ranks computing at once)\n"
    "predicted step = compute + copies + max(0, allreduce during backward - window) + "
    "allreduce after it + outside_waits\n"
    "allreduce = DDP's buckets all-reduced in context (the profile's transfers: busy while "
    "backward runs where a core is spare for it, else idle, one after the other), plus the "
    "profile's scheduler wait for each that waited in the median step (counted from rank 0's "
    "timeline); window = 0 without a spare core\n"
    "copies = DDP's gradient copies at the profile's rate; outside_waits = the profile's "
    "scheduler wait for each part of the median step outside the all-reduces that waited\n"
    "predicted / measured = N t_no_ddp / (predicted / measured step)   "
    "error = the larger relative error, + when the model is larger")


def _choice_split(frame, at: int | None, ranks: int) -> dict | None:
    """The measured ratio of the choice law at its worst batch (``at``) in measured factors:
    DDP's speedup there (:func:`labkit.metrics.ratio_split`) where the model chose DDP, its
    inverse factor by factor where it chose the one process; None where it chose the better."""
    if at is None:
        return None
    r = frame.iloc[at]
    split = ratio_split(ranks=ranks, base_s=r["no_ddp_ms"], compute_s=r["measured_compute_ms"],
                        step_s=r["measured_ms"], names=("t_no_DDP", "t_c", "t_DDP"))
    if split is None or r["predicted"] > 1.0:
        return split
    return {f"1 / ({k})": 1.0 / v for k, v in split.items()}


def crossover(df, world_size: int | None = None) -> dict:
    """Where DDP starts to pay, measured and predicted, at ``world_size`` ranks (default: the
    largest), from a batch sweep with the model.

    ``measured``: :func:`labkit.ddp.formulas.crossover_batch` of the measured speedups (NaN
    where the sweep does not bracket it); ``predicted``:
    :func:`labkit.ddp.formulas.predicted_crossover_batch` from straight lines fitted to the
    no-DDP step times and to the model's compute (:func:`~labkit.ddp.formulas.fit_step_time`)
    and the median over batches of what DDP adds in the model (copies, exposed all-reduce and
    the waits counted outside it); where either step does not grow with the batch across the sweep (a few small
    batches on a busy machine), there is no line to extend, and ``predicted`` is read along the
    model's own speedups as ``measured`` is (``predicted_from``: ``"lines"`` or ``"sweep"``).
    ``choice``: the measured throughput of the model's choice (DDP or not) over the better one
    at the worst batch, ``choice_batch`` that batch (None: the model chose the better
    everywhere; :func:`labkit.ddp.predict.choice_cost`). Also the fits (None where there are
    none), that median, the batches and both speedup series."""
    import numpy as np

    from labkit.ddp import formulas
    from labkit.ddp.predict import choice_cost
    from labkit.errors import UsageError

    n = top_world_size(df, world_size)
    frame = prediction_frame(df, n).dropna(subset=["no_ddp_ms", "compute_ms", "predicted_ms"])
    if len(frame) < 2:
        raise UsageError("a crossover needs a sweep of at least two batch sizes with the "
                         "no-DDP baseline and the model")
    b = frame["batch"].tolist()
    s = float(np.median(frame["slowdown"]))
    added = float(np.median(frame["predicted_ms"] - frame["compute_ms"]) / 1e3)
    choice = choice_cost(frame["predicted"], frame["measured"])
    try:
        noddp = formulas.fit_step_time(b, frame["no_ddp_ms"] / 1e3)
        compute = formulas.fit_step_time(b, frame["compute_ms"] / 1e3)
        predicted, source = formulas.predicted_crossover_batch(
            ranks=n, noddp_fixed_s=noddp[0], noddp_per_sample_s=noddp[1],
            compute_fixed_s=compute[0], compute_per_sample_s=compute[1], comm_s=added), "lines"
    except UsageError:  # a step that did not grow with the batch: no line to extend
        noddp = compute = None
        predicted, source = formulas.crossover_batch(b, frame["predicted"]), "sweep"
    return {"choice_split": _choice_split(frame, choice[1], n),
        "world_size": n, "batches": b,
        "measured_speedups": frame["measured"].tolist(),
        "predicted_speedups": frame["predicted"].tolist(),
        "measured": formulas.crossover_batch(b, frame["measured"]),
        "predicted": predicted, "predicted_from": source,
        "choice": choice[0], "choice_batch": None if choice[1] is None else b[choice[1]],
        "noddp_fit": noddp, "compute_fit": compute, "slowdown": s, "added_s": added,
    }


def threads_frame(df, world_size: int | None = None, *, slowdown: float = 1.0):
    """The whole-machine comparison, one row per batch that has the all-cores run: the no-DDP
    step with one thread (the baseline row's, and the one timed in turn with the all-cores
    steps) and with every core as a thread, the threads' speedup (all cores against the
    one-thread steps timed in turn with them)
    beside the model's (k threads, each ``slowdown`` times slower than one alone: the machine
    profile's co-run slowdown), the DDP step at ``world_size`` ranks (default: the largest) and
    N ranks' throughput against the all-cores process, measured and predicted (the model's DDP
    step against the model's threads; NaN without the model), and each measurement's split into
    measured factors (``thread_split``: k x 1 / each thread's slowdown beside the others;
    ``ranks_split``: :func:`labkit.metrics.ratio_split`)."""
    import pandas as pd

    n = top_world_size(df, world_size)
    out = []
    for _, w in select(df, ALL_CORES).iterrows():
        b = int(w["batch_size"])
        one_thread = select(df, "no_ddp", batch_size=b)
        ranks = select(df, "ddp", batch_size=b, world_size=n)
        if one_thread.empty or ranks.empty:
            continue
        t1, tt, r = one_thread.iloc[0]["step_time_p50_s"], w["step_time_p50_s"], ranks.iloc[0]
        # the one-thread steps timed in turn with the all-cores ones, where the row has them
        paired = float(w.get("one_thread_paired_p50_s", math.nan))
        t1_paired = paired if math.isfinite(paired) else t1
        k = int(w["threads_per_rank"])
        pred_threads = k / slowdown
        pred_step = r.get("predicted_step_time_s", math.nan)
        thread_split = {f"{k} threads": float(k),
                        "1 / each thread's slowdown beside the others": t1_paired / (k * tt)}
        ranks_split = ratio_split(ranks=n, base_s=tt, step_s=r["step_time_p50_s"],
                                  compute_s=r.get("nosync_step_time_p50_s", math.nan),
                                  names=("t_all_cores", "t_c", "t_DDP"))
        out.append({"batch": b, "threads": k, "one_thread_ms": ms(t1),
                    "one_thread_paired_ms": ms(t1_paired),
                    "all_cores_ms": ms(tt), "thread_speedup": t1_paired / tt,
                    "predicted_thread_speedup": pred_threads,
                    "ddp_ms": ms(r["step_time_p50_s"]),
                    "measured": n * tt / r["step_time_p50_s"],
                    "predicted": n * (t1 / pred_threads) / pred_step,
                    "thread_split": thread_split, "ranks_split": ranks_split})
    return pd.DataFrame(out)
