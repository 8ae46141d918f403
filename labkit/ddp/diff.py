"""A/B comparison of two DDP result files (pure: no torch), like PyTorch's ``ddp/diff.py``.

``labkit diff A.json B.json`` prints both runs' settings side by side, then per benchmark
(model, batch per rank) and world size the p75 and p95 step times of both with the % change of
B's throughput against A's::

    delta = (ex/s_B / ex/s_A - 1) x 100 = (t_A / t_B - 1) x 100     (positive: B is faster)

A file with no DDP rows is refused (:class:`~labkit.errors.UsageError`, exit 2); two files of
different models are compared anyway, with a loud warning.
"""

from __future__ import annotations

from pathlib import Path

from labkit.ddp.report import on_gpu
from labkit.errors import ResultsFileError, UsageError
from labkit.results import read_rows

SETTINGS = ("model", "batch_size", "input_dim", "hidden_dim", "output_dim", "num_layers",
            "bucket_cap_mb", "broadcast_buffers", "static_graph", "gradient_as_bucket_view",
            "steps", "warmup", "backend", "device_name", "threads_per_rank", "torch_version",
            "labkit_version", "git_commit", "hostname", "timestamp")
PCTS = (75, 95)


def delta_pct(t_a: float, t_b: float) -> float:
    """Throughput change of B against A in %, from step times: (t_A / t_B - 1) x 100.

    >>> round(delta_pct(0.100, 0.104), 1)
    -3.8
    """
    if not (t_a > 0 and t_b > 0):
        raise UsageError(f"step times must be > 0, got {t_a!r} and {t_b!r}")
    return (t_a / t_b - 1.0) * 100.0


def load_ddp_rows(path) -> list[dict]:
    """The DDP rows of a results file; a missing file or one without DDP rows is refused."""
    if not Path(path).is_file():
        raise ResultsFileError(f"{path}: no such results file")
    rows = [r for r in read_rows(path)
            if r.get("variant") in ("ddp", "no_ddp") and "step_time_p75_s" in r]
    if not rows:
        raise UsageError(f"{path}: not a DDP result (no rows written by `labkit ddp`)")
    return rows


def _values(rows: list[dict], key: str) -> str:
    vals = []
    for r in rows:
        v = str(r.get(key))
        if v not in vals:
            vals.append(v)
    return ", ".join(vals)


def _latest(rows: list[dict], notes: list[str], name: str) -> dict:
    """One row per (batch, variant, world size): the newest, saying so if there were more."""
    out: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: str(r.get("timestamp"))):
        k = (r["batch_size"], r["variant"], r["world_size"])
        if k in out:
            notes.append(f"{name} holds several runs of batch {k[0]}, {k[1]}, {k[2]} rank(s): "
                         "comparing the newest")
        out[k] = r
    return out


def compare(path_a, path_b):
    """(settings, table, warnings) for two result files.

    ``settings``: DataFrame [setting, A, B, same]. ``table``: one row per (batch_size, variant,
    world_size) present in both, with A's and B's p75/p95 step times and samples/s per replica
    and the deltas (``delta_p75_pct``, ``delta_p95_pct``). ``warnings``: strings to show loudly.
    """
    import pandas as pd

    rows_a, rows_b = load_ddp_rows(path_a), load_ddp_rows(path_b)
    notes: list[str] = []
    models_a, models_b = _values(rows_a, "model"), _values(rows_b, "model")
    if models_a != models_b:
        notes.insert(0, f"the two files hold different models ({models_a} vs {models_b}): "
                        "the deltas compare different workloads, not a setting")
    settings = pd.DataFrame([{"setting": k, "A": _values(rows_a, k), "B": _values(rows_b, k)}
                             for k in SETTINGS])
    settings["same"] = settings["A"] == settings["B"]
    a, b = _latest(rows_a, notes, "A"), _latest(rows_b, notes, "B")
    table = []
    for k in sorted(set(a) & set(b), key=lambda k: (k[0], k[2], k[1] == "ddp")):
        ra, rb = a[k], b[k]
        row = {"batch_size": k[0], "variant": k[1], "world_size": k[2],
               "model_a": ra["model"], "model_b": rb["model"],
               "nnodes": rb.get("nnodes", 1), "device": rb.get("device")}
        for p in PCTS:
            ta, tb = ra[f"step_time_p{p}_s"], rb[f"step_time_p{p}_s"]
            row.update({f"a_p{p}_s": ta, f"b_p{p}_s": tb,
                        f"b_p{p}_samples_per_s": rb["batch_size"] / tb,
                        f"delta_p{p}_pct": delta_pct(ta, tb)})
        table.append(row)
    if not table:
        notes.append("no (batch, variant, world size) appears in both files: nothing to compare")
    return settings, pd.DataFrame(table), notes


def format_diff(settings, table) -> str:
    """PyTorch diff.py's layout: settings side by side, then p75/p95 per world size."""
    w = max(len(s) for s in settings["setting"]) + 1
    va = max(20, *(len(v) for v in settings["A"]))
    vb = max(20, *(len(v) for v in settings["B"]))
    lines = [" " * w + f"{'A':>{va + 2}}      {'B':>{vb}}",
             " " * w + f"  {'-' * va}      {'-' * vb}"]
    for _, s in settings.iterrows():
        mark = "  vs  " if s["same"] else " <vs> "
        lines.append(f"{s['setting'] + ':':<{w}}  {s['A']:>{va}}{mark}{s['B']:>{vb}}")
    groups = table.groupby(["batch_size", "model_a", "model_b"], sort=False) if len(table) else []
    for (batch, ma, mb), part in groups:
        model = ma if ma == mb else f"{ma} (A) vs {mb} (B)"
        head = f"{'A sec/iter':>15s}  {'B sec/iter':>10s}{'B ex/sec':>12s}{'diff':>9s}"
        lines += ["", f"Benchmark: {model} with batch size {batch} per rank", "",
                  " " * 23 + "  ".join([head] * len(PCTS))]
        for _, r in part.iterrows():
            unit = "GPUs " if on_gpu(r) else "ranks"
            label = "no ddp" if r["variant"] == "no_ddp" else "ddp"
            cells = [f"p{p}: {r[f'a_p{p}_s']:9.4f}s  {r[f'b_p{p}_s']:9.4f}s "
                     f"{r[f'b_p{p}_samples_per_s']:9.0f}/s  {r[f'delta_p{p}_pct']:+6.1f}%"
                     for p in PCTS]
            lines.append(f"{int(r['world_size']):4d} {unit} -- {label:>6s}:  " + "  ".join(cells))
    lines += ["", "diff = (t_A / t_B - 1) x 100: change of B's throughput against A's "
                  "(positive: B is faster)"]
    return "\n".join(lines)
