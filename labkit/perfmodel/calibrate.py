"""The model against this machine: fill the ``local`` catalog entry from measured rows, and put
the model's prediction beside each measurement with its error (pure: no torch).

Rows come from the collectives lab (``op, world_size, size_bytes, time_p50_s, busbw_gb_per_s``)
and the pipeline lab (``schedule, num_stages, num_microbatches, step_time_s``, and
``bubble_fill_drain`` or ``bubble_measured``). The collective prediction is the α–β ring model
of :mod:`labkit.collectives.formulas`::

    t(op, N, S) = steps(op, N)·α + factor(op, N)·S/β     (all-reduce: 2(N−1)·α + 2(N−1)/N·S/β)

and the pipeline prediction is the bubble fraction (P − 1)/(v·M + P − 1) of :mod:`labkit.perfmodel.model`.
error % = 100 · (model − measured) / measured.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from labkit.collectives import formulas as collectives
from labkit.errors import UsageError
from labkit.metrics import model_error_pct
from labkit.pipeline.formulas import bubble_fraction


def _rows(rows) -> list[dict]:
    if rows is None:
        return []
    if hasattr(rows, "to_dict"):  # a DataFrame
        return rows.to_dict("records")
    return [dict(r) for r in rows]


def fit_local(collective_rows, op: str = "all_reduce", world_size: int | None = None,
              min_fit_bytes: int = 0) -> tuple[float, float]:
    """α (s) and β (B/s) fitted to the ``op`` rows of one world size (default: the largest > 1)."""
    rows = [r for r in _rows(collective_rows) if r.get("op") == op and r.get("world_size", 1) > 1]
    if not rows:
        raise UsageError(f"no {op} rows with world_size > 1 to fit alpha and beta from")
    n = world_size or max(r["world_size"] for r in rows)
    used = [r for r in rows if r["world_size"] == n and r["size_bytes"] >= min_fit_bytes]
    if not used:
        raise UsageError(f"no {op} rows at world_size {n} (and size >= {min_fit_bytes} B)")
    return collectives.fit_alpha_beta(op, n, sizes=[r["size_bytes"] for r in used],
                                      times=[r["time_p50_s"] for r in used])


def local_from_rows(collective_rows, compute_flop_per_s: float, *, memory_gb: float,
                    name: str, measured: str, min_fit_bytes: int = 0) -> dict:
    """The ``local`` entry: α, β fitted to the all-reduce rows, the measured compute rate."""
    rows = [r for r in _rows(collective_rows) if r.get("op") == "all_reduce"]
    alpha, beta = fit_local(rows, min_fit_bytes=min_fit_bytes)
    n = max(r["world_size"] for r in rows)
    if not compute_flop_per_s > 0 or not memory_gb > 0:
        raise UsageError("compute_flop_per_s and memory_gb must be > 0")
    return {"name": name, "alpha_s": alpha, "beta_bytes_per_s": beta,
            "compute_flop_per_s": float(compute_flop_per_s), "memory_gb": float(memory_gb),
            "world_size": int(n), "measured": measured}


def overlap_from_ddp_rows(ddp_rows) -> tuple[float, int]:
    """The DP overlap measured by the DDP lab: the median ``overlap_fraction`` (1 − exposed
    all-reduce / standalone all-reduce) of its DDP rows with more than one rank, and how many.

    >>> overlap_from_ddp_rows([{"ddp": True, "world_size": 2, "overlap_fraction": f}
    ...                        for f in (0.1, 0.3, 0.2)])
    (0.2, 3)
    """
    vals = [float(r["overlap_fraction"]) for r in _rows(ddp_rows)
            if r.get("world_size", 1) > 1 and r.get("ddp", True)
            and isinstance(r.get("overlap_fraction"), (int, float))
            and math.isfinite(r["overlap_fraction"])]
    if not vals:
        raise UsageError("no DDP rows with world_size > 1 and an overlap_fraction (run "
                         "`labkit ddp --nproc 2 --json FILE`)")
    return statistics.median(vals), len(vals)


def write_local(entry: dict, path: str | os.PathLike | None = None) -> Path:
    """Write ``entry`` as ``data/local.yaml`` (atomically; the folder must exist). Fields the
    entry lacks that the file already holds (the measured DP overlap) are kept."""
    import yaml

    from labkit.perfmodel.catalog import LOCAL_FIELDS, _load, data_dir, validate_entry

    path = Path(path) if path else data_dir() / "local.yaml"
    if path.is_file():
        old = (yaml.safe_load(path.read_text()) or {}).get("local") or {}
        entry = {**{k: v for k, v in old.items() if k in LOCAL_FIELDS}, **entry}
    clean = {k: float(f"{entry[k]:.4g}") if isinstance(entry[k], float) else entry[k]
             for k in LOCAL_FIELDS if k in entry}
    clean["sources"] = {"*": "measured on this machine, as fields 'measured' and "
                             "'dp_overlap_measured' say"}
    validate_entry("local entry", clean, LOCAL_FIELDS)
    if not path.parent.is_dir():
        raise UsageError(f"{path}: folder {path.parent} does not exist")
    head = ("# This machine, measured by labkit.perfmodel.measure_local.measure_local(); regenerate with\n"
            "#   labkit calibrate --measure --write\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(head + yaml.safe_dump({"local": clean}, sort_keys=False, width=100))
    os.replace(tmp, path)
    _load.cache_clear()
    return path


def pipeline_step_time(row: dict, compute_flop_per_s: float, alpha_s: float,
                       beta_bytes_per_s: float) -> float:
    """The 3-D model applied to a pipeline-lab row (``layers`` × Linear(h, h), ``batch``, P, M, v):
    T = T_stage · (1 + (P−1)/(v·M)) + 2·v·M·(α + (B/M)·h·4/β), T_stage = 6·(L/P)·h²·B / rate.
    8 layers of 256, batch 64, P = 2, M = 4 at 40 GFLOP/s, α = 0: T_stage = 2.517 ms, ×(1 + 1/4).

    >>> row = dict(layers=8, hidden=256, batch=64, num_stages=2, num_microbatches=4)
    >>> round(pipeline_step_time(row, 40e9, 0.0, 1e18) * 1e3, 2)
    3.15
    """
    p, m = int(row["num_stages"]), int(row["num_microbatches"])
    v = int(row.get("virtual_stages", 1) or 1)
    h, batch, layers = int(row["hidden"]), int(row["batch"]), int(row["layers"])
    stage = 6.0 * layers / p * h * h * batch / compute_flop_per_s
    send = alpha_s + batch / m * h * 4 / beta_bytes_per_s
    return stage * (1 + (p - 1) / (v * m)) + (2 * v * m * send if p > 1 else 0.0)


def calibration_check(collective_rows=None, pipeline_rows=None, *, alpha_s: float | None = None,
                      beta_bytes_per_s: float | None = None, compute_flop_per_s: float | None = None,
                      min_fit_bytes: int = 0):
    """The model beside each measurement, with its error.

    α and β default to a fit over the collective rows themselves (per op and world size), so the
    errors show how well the *shape* of the α–β law holds; pass ``alpha_s``/``beta_bytes_per_s``
    (for example the committed ``local`` entry) to test a prediction made beforehand.
    Pipeline rows get the bubble fraction (P−1)/(v·M+P−1) beside the measured fill and drain
    bubble (``bubble_fill_drain``; ``bubble_measured``, all idle time, for rows without it) and, when
    ``compute_flop_per_s``, ``alpha_s`` and ``beta_bytes_per_s`` are given, the predicted step time
    (:func:`pipeline_step_time`) beside ``step_time_s``.
    Returns a DataFrame with ``lab, what, world_size, quantity, measured, model, error_pct``.

    >>> rows = [{"op": "all_reduce", "world_size": 2, "size_bytes": s,
    ...          "time_p50_s": collectives.allreduce_time(size_bytes=s, ranks=2, alpha_s=1e-4,
    ...                                                 beta_bytes_per_s=1e9)} for s in (8, 1e6, 1e8)]
    >>> df = calibration_check(rows, alpha_s=1e-4, beta_bytes_per_s=1e9)
    >>> float(df.error_pct.abs().max()) < 1e-9
    True
    """
    import pandas as pd

    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in _rows(collective_rows):
        groups.setdefault((r["op"], int(r["world_size"])), []).append(r)
    for (op, n), part in sorted(groups.items()):
        if n < 2:
            continue
        if alpha_s is None or beta_bytes_per_s is None:
            used = [r for r in part if r["size_bytes"] >= min_fit_bytes] or part
            a, b = collectives.fit_alpha_beta(op, n, sizes=[r["size_bytes"] for r in used],
                                              times=[r["time_p50_s"] for r in used])
        else:
            a, b = alpha_s, beta_bytes_per_s
        for r in sorted(part, key=lambda r: r["size_bytes"]):
            t = collectives.collective_time(op=op, ranks=n, size_bytes=r["size_bytes"],
                                            alpha_s=a, beta_bytes_per_s=b)
            out.append({"lab": "collectives", "what": op, "world_size": n,
                        "size_bytes": r["size_bytes"], "quantity": "time_s",
                        "measured": r["time_p50_s"], "model": t,
                        "error_pct": model_error_pct(model_s=t, measured_s=r["time_p50_s"]),
                        "alpha_s": a, "beta_gb_per_s": b / 1e9})
    for r in _rows(pipeline_rows):
        p, m = int(r["num_stages"]), int(r["num_microbatches"])
        v = int(r.get("virtual_stages", 1) or 1)
        f = bubble_fraction(num_stages=p, num_microbatches=m, virtual_stages=v,
                            schedule="interleaved" if v > 1 else "1f1b")
        # the schedule's bubble (fill and drain idle, read off the timeline) is what the formula
        # describes; all idle time (bubble_measured) also holds message and scheduling waits
        fill_drain = r.get("bubble_fill_drain")
        meas = float(fill_drain if fill_drain is not None and fill_drain == fill_drain
                     else r["bubble_measured"])
        out.append({"lab": "pipeline", "what": r.get("schedule", ""), "world_size": p,
                    "num_stages": p, "num_microbatches": m, "quantity": "bubble_fraction",
                    "measured": meas, "model": f,
                    "error_pct": (model_error_pct(model_s=f, measured_s=meas) if meas > 0
                                  else math.nan),
                    "error_points": 100 * (f - meas)})
        if compute_flop_per_s and alpha_s is not None and beta_bytes_per_s and "hidden" in r:
            t = pipeline_step_time(r, compute_flop_per_s, alpha_s, beta_bytes_per_s)
            out.append({"lab": "pipeline", "what": r.get("schedule", ""), "world_size": p,
                        "num_stages": p, "num_microbatches": m, "quantity": "step_time_s",
                        "measured": float(r["step_time_s"]), "model": t,
                        "error_pct": model_error_pct(model_s=t,
                                                     measured_s=float(r["step_time_s"]))})
    if not out:
        raise UsageError("no measured rows to check (collective rows need world_size > 1)")
    return pd.DataFrame(out)


def summary(check) -> dict:
    """Median absolute error % per lab: ``{"collectives": 12.3, "pipeline": 4.5}``."""
    res = {}
    for lab, part in check.groupby("lab"):
        vals = [abs(e) for e in part.error_pct if e == e]
        res[lab] = statistics.median(vals) if vals else math.nan
    return res
