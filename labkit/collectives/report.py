"""What a collectives sweep's rows hold, and the table made of them (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`series` the selection notebooks make; :func:`nccl_tests_table`
the table ``labkit collectives`` prints, in nccl-tests' layout.
"""

from __future__ import annotations

from labkit.results import DEVICE_MEMORY_COLUMNS, Column, select_rows

#: what makes a row a different measurement of the same point: the op, the world, the size
#: and element type, the backend and node count
KEY = ("op", "world_size", "size_bytes", "dtype", "backend", "nnodes")

COLUMNS = (
    Column("op", "", "the collective: all_reduce, all_gather, reduce_scatter, broadcast, "
                     "all_to_all"),
    Column("size_bytes", "bytes", "S: the whole buffer (all-gather output, reduce-scatter input)"),
    Column("count", "", "elements in the whole buffer"),
    Column("dtype", "", "element type: float32, float64, int32, int64"),
    Column("redop", "", "reduction: sum for all_reduce and reduce_scatter, else none"),
    Column("root", "", "root rank of a broadcast (-1: no root)"),
    Column("iters", "", "timed calls per size"),
    Column("time_p50_s", "s", "median call time (a call's time is the slowest rank's)"),
    Column("time_p10_s", "s", "10th percentile of the call times"),
    Column("transfer_s", "s", "the transfer: the median of the calls that waited for nothing "
                              "(labkit.machine.formulas.transfer_of); the model is fitted to it"),
    Column("time_p90_s", "s", "90th percentile of the call times"),
    Column("time_mean_s", "s", "mean call time"),
    Column("algbw_gb_per_s", "GB/s", "algorithm bandwidth S / time_p50_s"),
    Column("busbw_gb_per_s", "GB/s", "bus bandwidth: algbw x factor(op, N), nccl-tests' busbw"),
    Column("wrong", "", "elements that differ from the exact answer, all ranks (None: not checked)"),
    Column("busy_time_p50_s", "s", "median all-reduce time while a thread in every rank keeps "
                                    "its core computing (None: not measured)"),
    Column("busy_time_p10_s", "s", "10th percentile of the busy call times"),
    Column("busy_transfer_s", "s", "the transfer of the busy calls (as transfer_s)"),
    Column("busy_time_p90_s", "s", "90th percentile of the busy call times"),
    Column("busy_matmuls", "", "matrix products rank 0's busy thread finished while timed"),
    Column("timeline_s", "s", "the first timed calls of every rank: {rank, call, start_s, "
                              "end_s}, on one clock from the sweep's start (the trace)"),
    Column("busy_timeline_s", "s", "the same for the busy calls (None: not measured)"),
    Column("regime", "", "bandwidth (on the α–β line) or latency (below it: the floor)"),
    Column("alpha_s", "s", "per-message latency α fitted to the op's bandwidth regime"),
    Column("beta_gb_per_s", "GB/s", "link bandwidth β fitted to the op's bandwidth regime"),
    Column("floor_s", "s", "the latency floor: the median time over its sizes (the latency "
           "regime's; with one line through the whole sweep, those its latency term decides)"),
    Column("model_time_s", "s", "the regime-aware model: the α–β line, or the floor below it"),
    Column("model_busbw_gb_per_s", "GB/s", "the model's busbw at this size"),
    Column("model_error_pct", "%", "100 (model_time_s - time_p50_s) / time_p50_s"),
    Column("crossover_bytes", "bytes", "S* of the bandwidth regime's line: above it the "
                                       "bandwidth term dominates"),
    Column("naive_time_s", "s", "one α–β line fitted through every size, at this size"),
    Column("naive_error_pct", "%", "100 (naive_time_s - time_p50_s) / time_p50_s"),
    *DEVICE_MEMORY_COLUMNS,
)


def series(df, op: str, **equal):
    """The rows of one op (and any ``column=value`` given), by world size, then size.

    ``series(df, "all_reduce", world_size=2)`` is one all-reduce size sweep
    (:func:`labkit.results.select_rows`).
    """
    return select_rows(df, op=op, **equal).sort_values(["world_size", "size_bytes"],
                                                       kind="stable")


def wrong_elements(df) -> int:
    """Wrong elements over every checked row (0 when nothing was checked)."""
    if df.empty or "wrong" not in df:
        return 0
    return int(df["wrong"].fillna(0).sum())


def nccl_tests_table(df, *, warmup: int | None = None) -> str:
    """The sweep as nccl-tests prints it, one block per (op, world size): size, count, type,
    redop, root, time (p50, p10, p90), algbw, busbw, #wrong, and the regime-aware model's time
    and error; under each block the bandwidth regime's fit (α, β, S*), the latency regime's
    floor, the median errors of the model and of one line through every size, and the average
    bus bandwidth.
    ``warmup``: the untimed calls per size, for the block header (rows do not carry it).
    """
    lines = []
    for (op, n), part in df.groupby(["op", "world_size"], sort=False):
        r0 = part.iloc[0]
        lines.append(
            f"\n# {op}  world_size {n}  backend {r0.backend}  threads/rank {r0.threads_per_rank}"
            f"  iters {r0.iters}" + (f"  warmup {warmup}" if warmup is not None else "")
            + ("   [oversubscribed: timings not representative]" if r0.oversubscribed else ""))
        lines.append(f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>5} {'root':>4} "
                     f"{'time(us)':>9} {'p10(us)':>9} {'p90(us)':>9} {'algbw':>7} {'busbw':>7} "
                     f"{'#wrong':>6} {'model(us)':>9} {'err(%)':>7}")
        lines.append(f"# {'(B)':>10} {'(elem)':>10} {'':>8} {'':>5} {'':>4} {'':>9} {'':>9} "
                     f"{'':>9} {'(GB/s)':>7} {'(GB/s)':>7}")
        for r in part.itertuples():
            wrong = "N/A" if r.wrong is None or r.wrong != r.wrong else str(int(r.wrong))
            lines.append(
                f"  {r.size_bytes:>10} {r.count:>10} {r.dtype:>8} {r.redop:>5} {r.root:>4} "
                f"{r.time_p50_s * 1e6:>9.1f} {r.time_p10_s * 1e6:>9.1f} "
                f"{r.time_p90_s * 1e6:>9.1f} {r.algbw_gb_per_s:>7.3f} {r.busbw_gb_per_s:>7.3f} "
                f"{wrong:>6} {r.model_time_s * 1e6:>9.1f} {r.model_error_pct:>7.1f}")
        band = part[part.regime == "bandwidth"] if "regime" in part else part.iloc[:0]
        if len(band):
            lines.append(f"# α–β fit on the bandwidth regime (>= {int(band.size_bytes.min())} B):"
                         f" α = {r0.alpha_s * 1e6:.1f} us, β = {r0.beta_gb_per_s:.3f} GB/s; "
                         f"S* = {r0.crossover_bytes / 1024:.0f} KiB")
        else:
            lines.append("# no bandwidth regime: no α–β line fits the largest sizes")
        if len(band) < len(part):
            below = f"< {int(band.size_bytes.min())} B" if len(band) else "every size"
            lines.append(f"# latency regime ({below}): floor {r0.floor_s * 1e6:.1f} us "
                         "(median p50)")
        lines.append(f"# median |model error| {part.model_error_pct.abs().median():.1f}%, one "
                     f"line through every size {part.naive_error_pct.abs().median():.1f}%")
        lines.append(f"# Avg bus bandwidth    : {part.busbw_gb_per_s.mean():.4f} GB/s")
    return "\n".join(lines)

