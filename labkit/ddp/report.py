"""Text reports of DDP rows (pure: no torch): PyTorch's benchmark layout, scaling, placement.

The first table copies the layout of PyTorch's ``benchmarks/distributed/ddp/benchmark.py``: one
line per run, ``no ddp`` first, then ``{machines}M/{ranks}G`` (GPUs) or ``.../{ranks}C`` (CPU
ranks), with sec/iter and examples/s per replica (batch per rank / step time) at p50, p75, p90
and p95 of the slowest rank's step times.
"""

from __future__ import annotations

import math

PCTS = (50, 75, 90, 95)


def _sorted(df):
    order = df.assign(_v=(df["variant"] == "ddp").astype(int))
    return order.sort_values(["model", "batch_size", "world_size", "_v"]).drop(columns="_v")


def _label(row) -> str:
    if row["variant"] == "no_ddp":
        return "no ddp"
    on_gpu = str(row.get("device") or "").startswith("cuda")
    return f"{int(row.get('nnodes') or 1)}M/{int(row['world_size'])}{'G' if on_gpu else 'C'}"


def benchmark_table(df) -> str:
    """One block per (model, batch per rank), PyTorch's layout. ``df`` = :func:`ddp_scaling` rows."""
    if df.empty:
        return "(no rows)"
    lines = []
    for (model, batch), part in _sorted(df).groupby(["model", "batch_size"], sort=False):
        first = part.iloc[0]
        lines.append(f"Benchmark: {model} with batch size {batch} per rank "
                     f"({first['num_params'] / 1e6:.2f} M parameters, "
                     f"{first['grad_bytes'] / 1e6:.1f} MB of gradients per step)")
        lines.append("")
        prefix = f"{0:4d} {'ranks'} -- {'':>8s}:  "
        lines.append(" " * len(prefix) + "  ".join([f"{'sec/iter':>13s}{'ex/sec':>11s}"] * len(PCTS)))
        for _, r in part.iterrows():
            unit = "GPUs " if str(r.get("device") or "").startswith("cuda") else "ranks"
            cells = []
            for p in PCTS:
                t = r[f"step_time_p{p}_s"]
                cells.append(f"p{p}: {t:7.4f}s {r['batch_size'] / t:8.0f}/s")
            lines.append(f"{int(r['world_size']):4d} {unit} -- {_label(r):>8s}:  " + "  ".join(cells))
        lines.append("")
    return "\n".join(lines).rstrip()


def _ms(v) -> float:
    return v * 1e3 if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def scaling_frame(df):
    """Speedup, efficiency and where the time goes, one row per run (times in ms)."""
    import pandas as pd

    out = []
    for _, r in _sorted(df).iterrows():
        out.append({
            "model": r["model"],
            "batch": int(r["batch_size"]),
            "world_size": int(r["world_size"]),
            "variant": r["variant"],
            "step_p50_ms": _ms(r["step_time_p50_s"]),
            "samples_per_s": r["samples_per_s"],
            "speedup": r.get("speedup", math.nan),
            "efficiency": r.get("scaling_efficiency", math.nan),
            "vs_no_ddp": r.get("speedup_vs_no_ddp", math.nan),
            "compute_ms": _ms(r.get("nosync_step_time_p50_s", math.nan)),
            "exposed_comm_ms": _ms(r.get("exposed_comm_s", math.nan)),
            "allreduce_ms": _ms(r.get("allreduce_time_p50_s", math.nan)),
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
    for ws, part in df[df["variant"] == "ddp"].groupby("world_size"):
        table = part.iloc[0].get("placement") or []
        lines.append(f"placement, world_size {ws}:")
        for p in table:
            flag = f"   PROBLEM: {p['problem']}" if p.get("problem") else ""
            lines.append(f"  rank {p['rank']} (local {p['local_rank']}) on {p['host']} pid "
                         f"{p['pid']}: {p['device']} {p['device_name']}, {p['threads']} thread(s), "
                         f"CUDA_VISIBLE_DEVICES={p.get('cuda_visible_devices')}{flag}")
    return "\n".join(lines)
