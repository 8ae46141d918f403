"""Expert parallelism beside mlsysim 0.3.0: the terms both engines price, and how they differ.

mlsysim's ``DistributedModel.solve(ep_size=...)`` prices expert parallelism; it has no context
parallelism (no ``cp_size``; its ring-attention helper sizes a chunk, it prices no step), so
only EP is compared. What 0.3.0 computes (``mlsysim/engine/solvers/distributed.py``):

* the replica is TP·PP·EP GPUs, DP = N / (TP·PP·EP), each replica's local batch B / DP;
* EP: **one** all-to-all per step of local batch · s · h · bytes · k over the EP group, always
  on the inter-node fabric: (EP−1)/EP · S/β + (EP−1)·α (``calc_all_to_all_time``);
* memory: every parameter, dense ones too, sharded over TP·PP·EP.

This model (:mod:`labkit.perfmodel.ep_cp`) carves EP out of DP (DP stays N / (TP·PP)), prices
4 all-to-alls per layer per microbatch of the rank's microbatch tokens · k · h · bytes over the
placed EP group (NVLink when it sits in a node), and shards only the experts over EP. The
all-to-all formula itself is the same: :func:`compare`'s ``all_to_all_s`` prices mlsysim's
message on mlsysim's link with this model's formula.

Recorded like :mod:`labkit.perfmodel.mlsysim_engine`: ``data/reference/mlsysim_experts.yaml``
(written by :func:`record` with mlsysim installed), read by :func:`side_by_side` without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.errors import UsageError
from labkit.metrics import relative_error_pct
from labkit.perfmodel import mlsysim_engine

RECORDED = "mlsysim_experts"  # data/reference/<RECORDED>.yaml
TERMS = (("compute_s", "s"), ("all_to_alls", ""), ("all_to_all_mb", "MB"),
         ("all_to_all_s", "s"), ("ep_comm_s", "s"), ("weights_gb", "GB"))
COLUMNS = ("scenario", "model", "ep", "term", "unit", "labkit", "mlsysim", "diff_pct",
           "same_formula", "cause")


@dataclass(frozen=True)
class ExpertScenario(mlsysim_engine.Scenario):
    """A mixture of experts on a catalog cluster with EP ranks per expert group (TP·PP·EP
    divides the GPUs), one microbatch: the engines' common scenario, with experts."""

    model: str = "Mixtral-8x7B"
    ep: int = 8


def expert_scenarios() -> list[ExpertScenario]:
    """Mixtral 8x7B and DeepSeek-V3 on EP 8 (one expert group per DGX H100), mlsysim's
    tutorial setting otherwise (32 nodes, batch 256, fp16, sequence 2048, efficiency 0.5)."""
    return [ExpertScenario("Mixtral-8x7B, EP 8"),
            ExpertScenario("DeepSeek-V3, EP 8", model="DeepSeek-V3")]


def run_labkit(s: ExpertScenario) -> dict:
    """This model's terms for ``s``; ``all_to_all_s`` is mlsysim's message on mlsysim's link
    priced with this model's formula (:func:`labkit.perfmodel.topology.link_time`)."""
    from labkit.perfmodel import catalog, ep_cp, model, topology

    work = model.Workload(catalog.model_preset(s.model), s.global_batch_size, s.seq_len,
                          s.precision, s.efficiency)
    cluster = model.Cluster.from_catalog(s.node, s.nodes, inter_fabric=s.fabric)
    layout = model.Layout(cluster.world_size // (s.tp * s.pp), s.tp, s.pp, 1, ep=s.ep)
    p = model.predict(work, cluster, layout)
    calls = ep_cp.all_to_alls(num_microbatches=1, layers_per_stage=work.model.num_layers / s.pp)
    return {"compute_s": p.compute_s, "all_to_alls": calls,
            "all_to_all_mb": p.ep_all_to_all_bytes / 1e6,
            "all_to_all_s": topology.link_time(op="all_to_all", size_bytes=_mlsysim_bytes(s),
                                               ranks=s.ep, link=cluster.inter),
            "ep_comm_s": p.ep_comm_s, "weights_gb": p.memory["weights"] / 1e9,
            "ep_link": p.ep_link, "prediction": p}


def _mlsysim_bytes(s: ExpertScenario) -> float:
    """mlsysim's all-to-all message: its replica's local batch · s · h · bytes · k."""
    from labkit.perfmodel import catalog
    from labkit.perfmodel.model import BYTES

    spec, nd = catalog.model_preset(s.model), catalog.node(s.node)
    dp = nd.gpus_per_node * s.nodes // (s.tp * s.pp * s.ep)
    local = max(1, s.global_batch_size // dp)
    return local * s.seq_len * spec.hidden_size * BYTES[s.precision] * spec.experts_per_token


def run_mlsysim(s: ExpertScenario) -> dict:
    """mlsysim 0.3.0's terms for ``s`` (``DistributedModel().solve(ep_size=s.ep)``)."""
    mlsysim_engine.require()
    import warnings

    from mlsysim.engine.solvers import DistributedModel
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Fabrics, Nodes
    from mlsysim.systems.types import Fleet

    node = getattr(Nodes, mlsysim_engine.NODES[s.node])
    fleet = Fleet(name=f"{s.nodes} x {s.node}", node=node, count=s.nodes,
                  fabric=getattr(Fabrics, mlsysim_engine.FABRICS[s.fabric]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = DistributedModel().solve(
            getattr(Models.Language, mlsysim_engine.MODELS[s.model]), fleet,
            batch_size=s.global_batch_size, precision=s.precision, efficiency=s.efficiency,
            tp_size=s.tp, pp_size=s.pp, ep_size=s.ep, seq_len=s.seq_len)
    ep_s = r.ep_communication_latency.m_as("s")
    from mlsysim.engine.solvers.training import TrainingMemoryModel

    # the weights alone, as DistributedModel's replica profile shards them
    mem = TrainingMemoryModel().solve(
        getattr(Models.Language, mlsysim_engine.MODELS[s.model]), node.accelerator,
        batch_size=s.global_batch_size, seq_len=s.seq_len, precision=s.precision,
        tp_size=s.tp, pp_size=s.pp, dp_size=fleet.total_accelerators // (s.tp * s.pp * s.ep),
        ep_size=s.ep)
    return {"compute_s": r.node_profile.latency_compute.m_as("s"), "all_to_alls": 1,
            "all_to_all_mb": _mlsysim_bytes(s) / 1e6, "all_to_all_s": ep_s, "ep_comm_s": ep_s,
            "weights_gb": mem.weights.m_as("GB")}


def _cause(term: str, s: ExpertScenario, lab: dict) -> tuple[bool, str]:
    if term == "compute_s":
        return True, "same: F / (N · peak · efficiency), F from the active parameters"
    if term == "all_to_all_s":
        return True, (f"same α–β formula, (EP−1)/EP · S/β + (EP−1)·α, on mlsysim's message and "
                      f"link ({s.fabric})")
    if term == "all_to_alls":
        return False, ("labkit: 2 forward + 2 backward per MoE layer per microbatch; mlsysim: "
                       "one per step")
    if term == "all_to_all_mb":
        return False, ("labkit: the rank's microbatch tokens (EP carved out of DP); mlsysim: "
                       "its replica's local batch (EP beside DP)")
    if term == "ep_comm_s":
        return False, (f"labkit: {lab['ep_link']} (the EP group placed on a node); mlsysim: "
                       "the inter-node fabric always; and the count and message above")
    return False, "labkit shards only the experts over EP, mlsysim every parameter"


def compare(scenarios=None) -> list[dict]:
    """Both engines on each scenario, one row per (scenario, term) (:data:`COLUMNS`)."""
    mlsysim_engine.require()
    rows = []
    for s in scenarios or expert_scenarios():
        lab, ms = run_labkit(s), run_mlsysim(s)
        for term, unit in TERMS:
            same, cause = _cause(term, s, lab)
            rows.append({"scenario": s.name, "model": s.model, "ep": s.ep, "term": term,
                         "unit": unit, "labkit": float(lab[term]), "mlsysim": float(ms[term]),
                         "diff_pct": relative_error_pct(float(lab[term]), float(ms[term])),
                         "same_formula": same, "cause": cause})
    return rows


def side_by_side(*, live: bool | None = None):
    """The comparison as a DataFrame: both engines now when mlsysim 0.3.0 is installed (or
    ``live=True``), else this model's terms now beside mlsysim's recorded ones."""
    import pandas as pd

    from labkit.perfmodel.catalog import load_reference

    if live is None:
        live = mlsysim_engine.available()
    if live:
        df = pd.DataFrame(compare(), columns=list(COLUMNS))
        df.attrs["engine"] = f"live: mlsysim {mlsysim_engine.VERSION} run now, beside this model"
        return df
    df = load_reference(RECORDED)
    by_name = {s.name: s for s in expert_scenarios()}
    now = {name: run_labkit(by_name[name]) for name in dict.fromkeys(df.scenario)
           if name in by_name}
    df["labkit"] = [float(now[r.scenario][r.term]) if r.scenario in now else r.labkit
                    for r in df.itertuples()]
    df["diff_pct"] = [relative_error_pct(a, b) for a, b in zip(df.labkit, df.mlsysim)]
    df.attrs["engine"] = (f"this model now beside mlsysim {mlsysim_engine.VERSION}'s terms as "
                          f"{df.attrs.get('source', 'recorded')} (data/reference/{RECORDED}.yaml)")
    return df


def differences(side, scenario: str) -> str:
    """The EP term's differences, named and computed from the table: count, message, link,
    and what they make of the step's EP time.

    >>> import pandas as pd
    >>> rows = [("all_to_alls", 128, 1), ("all_to_all_mb", 33.6, 268.4), ("all_to_all_s", 4.7e-3,
    ...          4.7e-3), ("ep_comm_s", 0.0125, 4.7e-3)]
    >>> side = pd.DataFrame([{"scenario": "x", "term": t, "labkit": a, "mlsysim": b,
    ...                       "cause": "labkit: NVLink4 (the EP group placed on a node); ..."}
    ...                      for t, a, b in rows])
    >>> print(differences(side, "x"))
    x: labkit prices 128 all-to-alls per step of 33.6 MB each, mlsysim 1 of 268 MB (0.125x the message, 128x the count); one all-to-all of mlsysim's message on its link costs 4.7 ms in both engines (the same formula); the EP term is 12.5 ms against 4.7 ms (2.66x), the link: labkit: NVLink4 (the EP group placed on a node).
    """
    part = side[side.scenario == scenario].set_index("term")
    if part.empty:
        raise UsageError(f"no scenario {scenario!r} in the expert side-by-side table")
    lab, ms = part["labkit"], part["mlsysim"]
    link = str(part.loc["ep_comm_s", "cause"]).split(";")[0]
    same = math.isclose(lab["all_to_all_s"], ms["all_to_all_s"], rel_tol=0.01)
    return (f"{scenario}: labkit prices {lab['all_to_alls']:.0f} all-to-alls per step of "
            f"{lab['all_to_all_mb']:.3g} MB each, mlsysim {ms['all_to_alls']:.0f} of "
            f"{ms['all_to_all_mb']:.3g} MB ({lab['all_to_all_mb'] / ms['all_to_all_mb']:.3g}x the "
            f"message, {lab['all_to_alls'] / ms['all_to_alls']:.3g}x the count); one all-to-all "
            f"of mlsysim's message on its link costs {ms['all_to_all_s'] * 1e3:.3g} ms in "
            f"{'both engines (the same formula)' if same else 'mlsysim, ' + format(lab['all_to_all_s'] * 1e3, '.3g') + ' ms here'}"
            f"; the EP term is {lab['ep_comm_s'] * 1e3:.3g} ms against "
            f"{ms['ep_comm_s'] * 1e3:.3g} ms ({lab['ep_comm_s'] / ms['ep_comm_s']:.3g}x), the "
            f"link: {link}.")


def record(path=None):
    """Write the live table to ``data/reference/mlsysim_experts.yaml`` (needs mlsysim)."""
    import time
    from pathlib import Path

    import yaml

    from labkit.perfmodel.catalog import data_dir

    df = side_by_side(live=True)
    path = Path(path) if path else data_dir() / "reference" / f"{RECORDED}.yaml"
    rows = [[(round(v, 9) if isinstance(v, float) and math.isfinite(v) else v) for v in r]
            for r in df[list(COLUMNS)].itertuples(index=False)]
    doc = {"name": RECORDED,
           "title": "Expert parallelism: this model beside mlsysim 0.3.0",
           "source": (f"recorded with mlsysim {mlsysim_engine.VERSION} (PyPI) by "
                      f"labkit.perfmodel.mlsysim_experts.record() on {time.strftime('%Y-%m-%d')}"),
           "url": "https://pypi.org/project/mlsysim/0.3.0/",
           "notes": ("expert_scenarios(); diff_pct = 100 (labkit - mlsysim) / mlsysim; "
                     "all_to_all_s prices mlsysim's message on its link with each engine"),
           "columns": list(COLUMNS),
           "rows": [[bool(v) if isinstance(v, bool) else v for v in r] for r in rows]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200, allow_unicode=True,
                                   default_flow_style=None))
    return path
