"""mlsysim 0.3.0 beside this model: the same scenarios through both engines, term by term.

mlsysim (PyPI ``mlsysim==0.3.0``, the optional extra ``pip install -e ".[mlsysim]"``) is an
analytic systems model; its ``DistributedModel`` prices a DP×TP×PP training step. This module
runs a :class:`Scenario` through both engines and puts each term beside the other with the
difference and its cause (:func:`compare`); :func:`side_by_side` does it for mlsysim's
tutorial scenario (Llama-3-70B on 32 DGX H100, global batch 256, fp16, sequence 2048,
efficiency 0.5; five layouts on three fabrics), live when mlsysim is installed, else from the
table recorded with it (``data/reference/mlsysim_side_by_side.yaml``, written by
``python benchmarks/perfmodel_bench.py --record``).

What mlsysim 0.3.0 computes (``mlsysim/engine/solvers/distributed.py``), and how it maps here:

* compute: step FLOPs 3 × forward (4 × with recomputation) of the local batch, shared by the
  TP·PP·EP replica, at peak · efficiency: the same as ``compute_s`` here. The replica's time
  is max(compute, memory traffic) + a dispatch tax (10 µs) + 3 × 10 µs per layer; a replica
  that does not fit its memory has its traffic priced at the PCIe offload bandwidth.
* bubble: replica time · (P−1)/(v·M), the same formula (fixed there 2026-09-15).
* DP: gradients / (TP·PP) all-reduced; DP ranks per node = g // (TP·PP·EP) (the replica is
  innermost, placement ``tp,pp,dp`` here); hierarchical (intra reduce-scatter, inter ring on
  1/k, intra all-gather) when the group spans nodes with k > 1, else a ring; the overlap hides
  a fraction of it with no window; gradient accumulation divides it.
* TP: 4 all-reduces per layer per stage of the whole local batch (one per layer, not one per
  microbatch); no extra ones for recomputation.
* PP: the pipeline sends are not priced. EP: an all-to-all (not modelled here).
* memory: weights, gradients, 12 B/param Adam sharded by TP·PP and ZeRO; activations
  34·s·b·h (selective, its default) or 2·s·b·h (full) per layer divided by TP, for P
  microbatches in flight; plus a 5 % gradient bucket and 2 pipeline buffers; capacity in GiB.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import UsageError
from labkit.metrics import relative_error_pct

VERSION = "0.3.0"
RECORDED = "mlsysim_side_by_side"  # data/reference/<RECORDED>.yaml
#: labkit catalog key -> mlsysim registry name
MODELS = {"Llama-3-8B": "Llama3_8B", "Llama-3-70B": "Llama3_70B", "Llama-3-405B": "Llama3_405B",
          "GPT-3-175B": "GPT3", "Mixtral-8x7B": "Mixtral_8x7B", "DeepSeek-V3": "DeepSeek_V3"}
NODES = {"DGX_H100": "DGX_H100", "DGX_A100": "DGX_A100"}
FABRICS = {"IB_NDR": "InfiniBand_NDR", "IB_HDR": "InfiniBand_HDR", "100GbE": "Ethernet_100G",
           "RoCE_400G": "RoCE_400G"}
TERMS = (("compute_s", "s"), ("replica_s", "s"), ("bubble_s", "s"), ("dp_comm_s", "s"),
         ("tp_comm_s", "s"), ("pp_comm_s", "s"), ("step_time_s", "s"), ("mfu", ""),
         ("memory_gb", "GB"))
COLUMNS = ("scenario", "fabric", "dp", "tp", "pp", "microbatches", "term", "unit", "labkit",
           "mlsysim", "diff_pct", "same_formula", "cause")


def available() -> bool:
    """Is mlsysim 0.3.0 importable here?"""
    if importlib.util.find_spec("mlsysim") is None:
        return False
    from importlib.metadata import version

    return version("mlsysim") == VERSION


def require() -> None:
    """Refuse, in one line, when mlsysim 0.3.0 is not installed."""
    if importlib.util.find_spec("mlsysim") is None:
        raise UsageError(f"mlsysim is not installed: pip install -e \".[mlsysim]\" "
                         f"(mlsysim=={VERSION}, pure Python)")
    if not available():
        from importlib.metadata import version

        raise UsageError(f"mlsysim {version('mlsysim')} is installed; the comparison is written "
                         f"for mlsysim=={VERSION}")


@dataclass(frozen=True)
class Scenario:
    """One training step both engines price: a catalog model, node and fabric and a layout."""

    name: str
    model: str = "Llama-3-70B"
    node: str = "DGX_H100"
    nodes: int = 32
    fabric: str = "IB_NDR"
    global_batch_size: int = 256
    seq_len: int = 2048
    precision: str = "fp16"
    efficiency: float = 0.5
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: str = "none"  # none/selective here = mlsysim's default; full = its recomputation
    dp_overlap: float = 0.0  # > 0: mlsysim's overlap_comm with overlap_efficiency = this
    placement: str = "tp,dp,pp"

    @property
    def dp(self) -> int:
        from labkit.perfmodel import catalog

        return catalog.node(self.node).gpus_per_node * self.nodes // (self.tp * self.pp)


def tutorial_scenarios() -> list[Scenario]:
    """mlsysim's tutorial setting (Llama-3-70B, 32 DGX H100, batch 256, fp16, seq 2048,
    efficiency 0.5): pure DP, TP 8, TP 8 × PP 4, TP 4 × PP 2, TP 8 × PP 8, each on 100 GbE,
    InfiniBand HDR and NDR (15 rows)."""
    layouts = [("pure DP", 1, 1, 1), ("TP8", 8, 1, 1), ("TP8 PP4", 8, 4, 32),
               ("TP4 PP2", 4, 2, 8), ("TP8 PP8", 8, 8, 32)]
    return [Scenario(f"{name}, {fab}", fabric=fab, tp=tp, pp=pp, microbatches=m)
            for fab in ("100GbE", "IB_HDR", "IB_NDR") for name, tp, pp, m in layouts]


def modifier_scenarios() -> list[Scenario]:
    """The step modifiers on TP 8 × PP 4 over NDR: overlap 0.85, ZeRO-1, ZeRO-3, full
    recomputation, and the tutorial layouts placed as mlsysim places them (``tp,pp,dp``)."""
    base = Scenario("TP8 PP4, IB_NDR", tp=8, pp=4, microbatches=32)
    return [dataclasses.replace(base, name="TP8 PP4, overlap 0.85", dp_overlap=0.85),
            dataclasses.replace(base, name="TP8 PP4, ZeRO-1", zero_stage=1),
            dataclasses.replace(base, name="TP8 PP4, ZeRO-3", zero_stage=3),
            dataclasses.replace(base, name="TP8 PP4, full recomputation", recompute="full"),
            Scenario("TP4 PP2, IB_NDR, placement tp,pp,dp", tp=4, pp=2, microbatches=8,
                     placement="tp,pp,dp")]


# --- the two engines ------------------------------------------------------------------------

def run_labkit(s: Scenario) -> dict:
    """This model's terms for ``s`` (seconds, GB) and the prediction."""
    from labkit.perfmodel import catalog, model

    work = model.Workload(catalog.model_preset(s.model), s.global_batch_size, s.seq_len,
                          s.precision, s.efficiency, zero_stage=s.zero_stage,
                          recompute=s.recompute, dp_overlap=s.dp_overlap)
    cluster = model.Cluster.from_catalog(s.node, s.nodes, inter_fabric=s.fabric)
    layout = model.Layout(s.dp, s.tp, s.pp, s.microbatches,
                          "interleaved" if s.virtual_stages > 1 else "1f1b", s.virtual_stages,
                          s.placement)
    p = model.predict(work, cluster, layout)
    return {"compute_s": p.compute_s, "replica_s": p.compute_s, "bubble_s": p.bubble_s,
            "dp_comm_s": p.dp_comm_s, "tp_comm_s": p.tp_comm_s, "pp_comm_s": p.pp_comm_s,
            "step_time_s": p.step_time_s, "mfu": p.mfu, "memory_gb": p.memory["total"] / 1e9,
            "prediction": p, "fits": p.fits}


def run_mlsysim(s: Scenario) -> dict:
    """mlsysim 0.3.0's terms for ``s``: ``DistributedModel().solve`` on its registry's model,
    node and fabric."""
    require()
    import warnings

    from mlsysim.engine.solvers import DistributedModel
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Fabrics, Nodes
    from mlsysim.systems.types import Fleet

    for what, key, table in (("model", s.model, MODELS), ("node", s.node, NODES),
                             ("fabric", s.fabric, FABRICS)):
        if key not in table:
            raise UsageError(f"no mlsysim counterpart for {what} {key!r}; mapped: "
                             f"{', '.join(sorted(table))}")
    node = getattr(Nodes, NODES[s.node])
    fleet = Fleet(name=f"{s.nodes} x {s.node}", node=node, count=s.nodes,
                  fabric=getattr(Fabrics, FABRICS[s.fabric]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = DistributedModel().solve(
            getattr(Models.Language, MODELS[s.model]), fleet, batch_size=s.global_batch_size,
            precision=s.precision, efficiency=s.efficiency, tp_size=s.tp, pp_size=s.pp,
            v_stages=s.virtual_stages, microbatch_count=s.microbatches, seq_len=s.seq_len,
            zero_stage=s.zero_stage, activation_recomputation=s.recompute == "full",
            overlap_comm=s.dp_overlap > 0, overlap_efficiency=s.dp_overlap or 0.85)
    prof = r.node_profile
    n = fleet.total_accelerators
    peak = node.accelerator.compute.precision_flops.get(s.precision,
                                                        node.accelerator.compute.peak_flops)
    step = r.step_latency_total.m_as("s")
    # model FLOPs as mlsysim counts them: 3 × the forward's 2 · (active) params per token
    flops = (3 * getattr(Models.Language, MODELS[s.model]).inference_flops.m_as("flop")
             * s.global_batch_size * s.seq_len)
    return {"compute_s": prof.latency_compute.m_as("s"), "replica_s": prof.latency.m_as("s"),
            "bubble_s": r.pipeline_bubble_latency.m_as("s"),
            "dp_comm_s": r.dp_communication_latency.m_as("s") * (1 - s.dp_overlap)
            if s.dp_overlap > 0 else r.dp_communication_latency.m_as("s"),
            "tp_comm_s": r.tp_communication_latency.m_as("s"), "pp_comm_s": 0.0,
            "step_time_s": step, "mfu": flops / (step * n * peak.m_as("flop/s")),
            "memory_gb": prof.memory_footprint.m_as("GB"), "fits": bool(prof.feasible),
            "dp_ranks_per_node": max(1, node.accelerators_per_node // (s.tp * s.pp)),
            "memory_s": prof.latency_memory.m_as("s"),
            "overhead_s": prof.latency_overhead.m_as("s")}


# --- term by term -----------------------------------------------------------------------------

def _cause(term: str, s: Scenario, lab: dict, ms: dict) -> tuple[bool, str]:
    """(same formula?, the cause of the difference) for one term."""
    p = lab["prediction"]
    if term == "compute_s":
        if s.recompute == "selective":
            return False, "labkit counts selective recomputation's attention FLOPs (4·B·s²·h·L); mlsysim none"
        return True, "same: F_hw / (N · peak · efficiency); peak 989.4 (datasheet) vs 989 TFLOP/s"
    if term == "replica_s":
        if ms["memory_s"] > ms["compute_s"]:
            return False, (f"mlsysim: the replica does not fit, so its memory traffic is priced "
                           f"at PCIe offload bandwidth ({ms['memory_s']:.2f} s > compute); "
                           "labkit marks the layout out of memory instead")
        return False, (f"mlsysim adds {ms['overhead_s'] * 1e3:.2f} ms of dispatch and per-layer "
                       "framework tax; labkit has no such term")
    if term == "bubble_s":
        if s.pp == 1:
            return True, "no pipeline: no bubble"
        return True, "same: (P−1)/(v·M) × compute; mlsysim multiplies its replica time (with its overheads)"
    if term == "dp_comm_s":
        notes = []
        k_lab, k_ms = p.dp_ranks_per_node, ms["dp_ranks_per_node"]
        if p.dp == 1:
            return True, "no data parallelism"
        if k_lab != k_ms:
            notes.append(f"placement: labkit {p.placement} puts {k_lab} DP rank(s) per node, "
                         f"mlsysim (replica innermost) {k_ms}")
        if p.dp_algorithm not in ("ring", "hierarchical"):
            notes.append(f"labkit picked {p.dp_algorithm} (faster than ring here)")
        if s.zero_stage == 3:
            notes.append("labkit adds ZeRO-3's 2·M weight all-gathers; mlsysim prices ZeRO in memory only")
        if s.dp_overlap > 0 and p.dp_comm_s > p.dp_comm_total_s * (1 - s.dp_overlap) * 1.001:
            notes.append("labkit hides the DP traffic only behind the last microbatch's backward; "
                         "mlsysim hides the fraction with no limit")
        if notes:
            return False, "; ".join(notes)
        return True, (f"same: {p.dp_algorithm} all-reduce of params·bytes/(TP·PP), {k_lab} rank(s) "
                      "per node; α of NVLink 1 µs (labkit) vs 0.5 µs (mlsysim)")
    if term == "tp_comm_s":
        if s.tp == 1:
            return True, "no tensor parallelism"
        notes = []
        if s.microbatches > 1:
            notes.append(f"labkit: {s.microbatches} microbatches × 4 all-reduces per layer (α paid "
                         "per microbatch); mlsysim: 4 per layer of the whole local batch")
        if s.recompute == "full":
            notes.append("labkit adds the 2 forward all-reduces of the recomputed forward")
        if not notes:
            return True, "same: 4 · L/P ring all-reduces of b·s·h·bytes; α of NVLink 1 vs 0.5 µs"
        return False, "; ".join(notes)
    if term == "pp_comm_s":
        if s.pp == 1:
            return True, "no pipeline"
        return False, "mlsysim does not price the pipeline's activation sends (2·v·M p2p here)"
    if term == "memory_gb":
        return False, ("same weights, gradients and Adam states; mlsysim adds a 5 % gradient bucket "
                       "and 2 pipeline buffers (and compares with GiB: 80 GiB = 85.9 GB)")
    if term == "mfu":
        return False, "F / (step · N · peak): follows the step time"
    return False, "the sum of the terms above"  # the step


def compare(scenarios) -> list[dict]:
    """Both engines on each scenario: one row per (scenario, term) with both values, the
    difference in % of mlsysim's and its cause (:data:`COLUMNS`). Needs mlsysim."""
    require()
    rows = []
    for s in scenarios:
        lab, ms = run_labkit(s), run_mlsysim(s)
        for term, unit in TERMS:
            same, cause = _cause(term, s, lab, ms)
            rows.append({"scenario": s.name, "fabric": s.fabric, "dp": s.dp, "tp": s.tp,
                         "pp": s.pp, "microbatches": s.microbatches, "term": term, "unit": unit,
                         "labkit": float(lab[term]), "mlsysim": float(ms[term]),
                         "diff_pct": relative_error_pct(float(lab[term]), float(ms[term])),
                         "same_formula": same, "cause": cause})
    return rows


def recorded(folder=None):
    """The side-by-side table recorded with mlsysim 0.3.0 (a DataFrame; ``attrs`` says when)."""
    from labkit.perfmodel.catalog import load_reference

    return load_reference(RECORDED, folder)


#: what a live comparison costs on a 2-core machine: importing mlsysim (pint, scipy) takes most
#: of it; each scenario adds a little
LIVE_IMPORT_S = 9.0
LIVE_PER_SCENARIO_S = 0.06


def live_estimate_s(n_scenarios: int | None = None) -> float:
    """Seconds a live comparison of ``n_scenarios`` (default: all 20) takes here, estimated.

    >>> round(live_estimate_s(20), 1)
    10.2
    """
    n = len(tutorial_scenarios() + modifier_scenarios()) if n_scenarios is None else n_scenarios
    return LIVE_IMPORT_S + LIVE_PER_SCENARIO_S * n


def check_engine(engine: str, *, budget_s: float) -> bool:
    """Whether ``engine`` ("recorded" or "live") runs mlsysim now; refused in one line before
    anything is imported when unknown, when mlsysim is missing, or when the live estimate
    exceeds ``budget_s``.

    >>> check_engine("recorded", budget_s=8)
    False
    >>> check_engine("live", budget_s=8)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: engine 'live': about 10 s to import and run mlsysim 0.3.0 here, over this notebook's 8 s budget; use engine 'recorded' (its stored terms) or labkit model --compare mlsysim for one scenario
    """
    if engine not in ("recorded", "live"):
        raise UsageError(f"engine {engine!r}: 'recorded' or 'live'")
    if engine == "recorded":
        return False
    est = live_estimate_s()
    if est > budget_s:
        raise UsageError(f"engine 'live': about {est:.0f} s to import and run mlsysim {VERSION} "
                         f"here, over this notebook's {budget_s:g} s budget; use engine "
                         "'recorded' (its stored terms) or labkit model --compare mlsysim for "
                         "one scenario")
    require()
    return True


def side_by_side(scenarios=None, *, live: bool | None = None):
    """The comparison as a DataFrame: computed now by both engines when mlsysim 0.3.0 is
    installed (or ``live=True``), else this model's terms computed now beside mlsysim's
    recorded ones; ``df.attrs["engine"]`` says which."""
    import pandas as pd

    if live is None:
        live = available()
    if live:
        scenarios = scenarios or tutorial_scenarios() + modifier_scenarios()
        df = pd.DataFrame(compare(scenarios), columns=list(COLUMNS))
        df.attrs["engine"] = f"live: mlsysim {VERSION} run now, beside this model"
        return df
    df = recorded()
    if scenarios is not None:
        df = df[df.scenario.isin([s.name for s in scenarios])].reset_index(drop=True)
    by_name = {s.name: s for s in scenarios or tutorial_scenarios() + modifier_scenarios()}
    now = {name: run_labkit(by_name[name]) for name in dict.fromkeys(df.scenario)
           if name in by_name}
    df["labkit"] = [float(now[r.scenario][r.term]) if r.scenario in now else r.labkit
                    for r in df.itertuples()]
    df["diff_pct"] = [relative_error_pct(a, b) for a, b in zip(df.labkit, df.mlsysim)]
    df.attrs["engine"] = (f"this model now beside mlsysim {VERSION}'s terms as "
                          f"{df.attrs.get('source', 'recorded')} "
                          f"(data/reference/{RECORDED}.yaml)")
    return df


def record(path=None) -> Path:
    """Write the live side-by-side table to ``data/reference/mlsysim_side_by_side.yaml``."""
    import time

    import yaml

    from labkit.perfmodel.catalog import data_dir

    df = side_by_side(live=True)
    path = Path(path) if path else data_dir() / "reference" / f"{RECORDED}.yaml"
    rows = [[(round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for v in r]
            for r in df[list(COLUMNS)].itertuples(index=False)]
    doc = {
        "name": RECORDED,
        "title": "This model beside mlsysim 0.3.0, term by term",
        "source": (f"recorded with mlsysim {VERSION} (PyPI) by benchmarks/perfmodel_bench.py "
                   f"--record on {time.strftime('%Y-%m-%d')}"),
        "url": "https://pypi.org/project/mlsysim/0.3.0/",
        "notes": ("labkit.perfmodel.mlsysim_engine.compare on tutorial_scenarios() and "
                  "modifier_scenarios(); diff_pct = 100 (labkit - mlsysim) / mlsysim; "
                  "times in s per step, memory in GB per GPU"),
        "columns": list(COLUMNS),
        "rows": [[bool(v) if isinstance(v, bool) else v for v in r] for r in rows],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200, allow_unicode=True,
                                   default_flow_style=None))
    return path


def agreement_law(side, *, scenario: str, term: str, law: str, tolerance_pct: float) -> dict:
    """One term of :func:`side_by_side` as an ``agreement`` law (one engine against another,
    no measurement): labkit's value as the prediction, mlsysim's as the reference, the cause
    of any difference as the note."""
    from labkit.book import laws

    part = side[(side.scenario == scenario) & (side.term == term)]
    if part.empty:
        raise UsageError(f"no term {term!r} of scenario {scenario!r} in the side-by-side table")
    r = part.iloc[0]
    return laws.check(law, predicted=float(r.labkit), measured=float(r.mlsysim), kind="agreement",
                      unit=r.unit, tolerance_pct=tolerance_pct, note=str(r.cause))


def largest_same_formula_gap(side):
    """The term, among those both engines price with one formula (and mlsysim not at zero),
    where they differ most (symmetric error); a row of ``side`` with ``gap_pct`` added."""
    from labkit.book import laws

    same = side[side.same_formula & (side.mlsysim != 0)]
    if same.empty:
        raise UsageError("no nonzero term with the same formula in the side-by-side table")
    gaps = [laws.symmetric_error_pct(a, b) for a, b in zip(same.labkit, same.mlsysim)]
    i = max(range(len(gaps)), key=lambda k: abs(gaps[k]))
    row = same.iloc[i].copy()
    row["gap_pct"] = gaps[i]
    return row
