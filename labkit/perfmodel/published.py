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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from labkit.errors import UsageError
from labkit.metrics import relative_error_pct

FILE = "published_runs.yaml"
RUN_FIELDS = ("key", "kind", "what", "source", "url", "quantity", "measured", "tolerance_pct",
              "scenario", "assumptions", "missed")
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
        err = relative_error_pct(pred["predicted"], float(run["measured"]))
        rows.append({"run": run["key"], "what": run["what"], "quantity": run["quantity"],
                     "predicted": pred["predicted"], "measured": float(run["measured"]),
                     "unit": pred["unit"], "error_pct": err,
                     "tolerance_pct": float(run["tolerance_pct"]),
                     "holds": abs(err) <= run["tolerance_pct"],
                     "implied_efficiency": pred["implied_efficiency"], "model_fits": pred["fits"],
                     "model": pred["detail"], "missed": run["missed"],
                     "assumptions": run["assumptions"], "source": run["source"],
                     "url": run["url"]})
    df = pd.DataFrame(rows)
    df.attrs.update({"title": raw.get("title", ""), "efficiency": eff,
                     "efficiency_note": raw.get("efficiency_note", "")})
    return df
