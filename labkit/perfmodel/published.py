"""The model beside published measurements: large training runs and nccl-tests (pure: no torch).

``data/published_runs.yaml`` lists each measurement with its source: Megatron-LM's
1T GPT on 3,072 A100 (163 TFLOP/s per GPU, 52 % of peak), Llama 3 405B on 8,192 and 16,384
H100 (43 % and 41 % BF16 MFU), and nccl-tests all-reduce bus bandwidth on 8 H100 over NVLink
(about 370 GB/s at 10 GB, 150 GB/s at 58 MB, against 450 GB/s nominal, as the scaling book
measured). :func:`table` prices each with the model and prints prediction, measurement, error
and, where the error is large, the terms the model misses (written beside each run).

Training runs use one compute efficiency for all (``efficiency_assumption`` in the file): the
model does not predict how fast one GPU's kernels run; ``implied_efficiency`` is the value
that would make the model match the measurement.

Each run is scored by :func:`labkit.book.laws.check` as a ``published`` law (another machine's
number, with its source). Bus bandwidth is a rate: a relative tolerance (``tolerance_pct``, at
most 25 %). MFU and HFU are fractions of the peak in [0, 1]: an absolute tolerance
(``tolerance_abs``, at most 0.05), because a miss of 0.05 means 5 % of the peak whatever the
level, where a relative band would be narrower for a run at 30 % than for one at 50 %.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from labkit.book import laws
from labkit.errors import UsageError

FILE = "published_runs.yaml"
RUN_FIELDS = ("key", "kind", "what", "source", "url", "quantity", "measured", "scenario",
              "assumptions", "missed")
#: the tolerance each quantity is held to: relative for rates, absolute for fractions
TOLERANCE_FIELD = {"busbw_gb_per_s": "tolerance_pct", "mfu": "tolerance_abs",
                   "hfu": "tolerance_abs"}
TRAINING_SCENARIO = ("model", "node", "nodes", "tp", "pp", "global_batch_size", "seq_len",
                     "precision", "microbatches", "schedule", "virtual_stages", "recompute",
                     "zero_stage", "dp_overlap")


def load(folder=None) -> dict:
    """The published-runs file, validated: every run has its fields and a source."""
    from labkit.perfmodel.catalog import _read_yaml, data_dir

    path = Path(folder or data_dir()) / FILE
    raw = _read_yaml(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("runs"), list) or not raw["runs"]:
        raise UsageError(f"{path.name}: must hold a non-empty list 'runs'")
    eff = raw.get("efficiency_assumption")
    if not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise UsageError(f"{path.name}: efficiency_assumption must be in (0, 1]")
    for i, run in enumerate(raw["runs"]):
        missing = [f for f in RUN_FIELDS if not run.get(f) and run.get(f) != 0]
        if missing:
            raise UsageError(f"{path.name}: run {i} ({run.get('key', '?')}) lacks {', '.join(missing)}")
        want = TOLERANCE_FIELD.get(run["quantity"])
        other = ({"tolerance_pct", "tolerance_abs"} - {want}).pop() if want else None
        if want is None or not isinstance(run.get(want), (int, float)) or other in run:
            raise UsageError(f"{path.name}: run {run['key']}: {run['quantity']} is held to "
                             f"{want or 'tolerance_pct or tolerance_abs'} (a number), not {other}")
        if run["kind"] == "training":
            absent = [f for f in TRAINING_SCENARIO if f not in run["scenario"]]
            if absent:
                raise UsageError(f"{path.name}: run {run['key']}: scenario lacks {', '.join(absent)}")
    return raw


def _training(run: dict, efficiency: float):
    from labkit.perfmodel import catalog, model

    s = run["scenario"]
    spec = catalog.model_preset(s["model"])
    if "num_layers" in s:
        spec = dataclasses.replace(spec, num_layers=int(s["num_layers"]))
    work = model.Workload(spec, s["global_batch_size"], s["seq_len"], s["precision"], efficiency,
                          zero_stage=s["zero_stage"], recompute=s["recompute"],
                          dp_overlap=s["dp_overlap"])
    cluster = model.Cluster.from_catalog(s["node"], s["nodes"], inter_fabric=s.get("fabric"))
    dp = cluster.world_size // (s["tp"] * s["pp"])
    layout = model.Layout(dp, s["tp"], s["pp"], s["microbatches"], s["schedule"],
                          s["virtual_stages"])
    return model.predict(work, cluster, layout)


def predict_run(run: dict, efficiency: float) -> dict:
    """The model's value of the run's ``quantity`` and what it rests on."""
    from labkit.collectives import formulas as collectives
    from labkit.perfmodel import catalog, topology

    if run["kind"] == "collective":
        s = run["scenario"]
        nd = catalog.node(s["node"])
        shape = topology.group_shape(size=s["ranks"], stride=1, gpus_per_node=nd.gpus_per_node)
        c = topology.collective(op=s["op"], size_bytes=s["size_bytes"], shape=shape,
                                intra=catalog.fabric(nd.intra_fabric),
                                inter=catalog.fabric(nd.inter_fabric))
        busbw = collectives.busbw_gb_per_s(op=s["op"], ranks=s["ranks"],
                                           size_bytes=s["size_bytes"], time_s=c.time_s)
        return {"predicted": busbw, "unit": "GB/s", "implied_efficiency": None,
                "fits": None, "detail": f"{c.algorithm} over {c.link}: {c.time_s * 1e3:.3f} ms"}
    p = _training(run, efficiency)
    value = getattr(p, run["quantity"])
    return {"predicted": value, "unit": "", "implied_efficiency": efficiency * run["measured"] / value,
            "fits": p.fits,
            "detail": (f"step {p.step_time_s:.2f} s = compute {p.compute_s:.2f} + bubble "
                       f"{p.bubble_s:.2f} + DP {p.dp_comm_s:.2f} ({p.dp_algorithm}) + TP "
                       f"{p.tp_comm_s:.2f} + PP {p.pp_comm_s:.2f}; {p.verdict()}")}


def table(folder=None, efficiency: float | None = None):
    """Every published run beside the model: prediction, measurement, error %, whether it
    holds within the run's tolerance, the implied efficiency, and the missed terms."""
    import pandas as pd

    raw = load(folder)
    eff = efficiency or raw["efficiency_assumption"]
    rows = []
    for run in raw["runs"]:
        pred = predict_run(run, eff)
        law = laws.check(run["key"], predicted=pred["predicted"], measured=float(run["measured"]),
                         kind="published", unit=pred["unit"], source=run["source"],
                         tolerance_pct=run.get("tolerance_pct"),
                         tolerance_abs=run.get("tolerance_abs"))
        rows.append({"run": run["key"], "what": run["what"], "quantity": run["quantity"],
                     "predicted": pred["predicted"], "measured": float(run["measured"]),
                     "unit": pred["unit"], "error_pct": law["error_pct"],
                     "error_abs": law["error_abs"], "tolerance_pct": law["tolerance_pct"],
                     "tolerance_abs": law["tolerance_abs"], "holds": law["holds"],
                     "implied_efficiency": pred["implied_efficiency"], "model_fits": pred["fits"],
                     "model": pred["detail"], "missed": run["missed"],
                     "assumptions": run["assumptions"], "source": run["source"],
                     "url": run["url"]})
    df = pd.DataFrame(rows)
    df.attrs.update({"title": raw.get("title", ""), "efficiency": eff,
                     "efficiency_note": raw.get("efficiency_note", "")})
    return df


def law(row, name: str | None = None) -> dict:
    """A :func:`table` row as a ``published`` law (:func:`labkit.book.laws.check`): its source,
    its tolerance, and the terms the model misses as the note.

    >>> r = law(table().set_index("run", drop=False).loc["nccl_allreduce_8xh100_10gb"])
    >>> r["kind"], r["tolerance_pct"], r["source"].startswith("Austin")
    ('published', 25.0, True)
    """
    get = row.get if isinstance(row, dict) else row.__getitem__
    tol_abs = get("tolerance_abs")
    tol_abs = None if tol_abs is None or tol_abs != tol_abs else float(tol_abs)
    return laws.check(name or f"{get('quantity')} of {get('what')}", predicted=get("predicted"),
                      measured=get("measured"), kind="published", unit=get("unit"),
                      source=get("source"), note=get("missed"),
                      tolerance_pct=None if tol_abs is not None else get("tolerance_pct"),
                      tolerance_abs=tol_abs)
