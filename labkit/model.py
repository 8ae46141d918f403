"""A DP×TP×PP performance model of one training step, every formula stated (pure: no torch).

A cluster of ``N = nodes × G`` GPUs runs a layout ``DP × TP × PP = N`` (TP innermost, inside a
node; then DP; then PP, Megatron's rank order) on a global batch of ``B`` sequences of ``s``
tokens cut into ``M`` microbatches per data-parallel replica. Per GPU and per step::

    compute   T_c  = F / (N · peak · efficiency)          F = 6 · params · B · s (or given)
    bubble    T_b  = (P − 1) / (v · M) · T_c              fraction of the step: (P−1)/(v·M + P − 1)
    DP        T_dp = ring all-reduce of params · bytes / (TP · PP) over DP ranks
    TP        T_tp = M · 4 · (L / PP) · ring all-reduce of b · s · h · bytes over TP ranks
                     (2 all-reduces per layer forward, 2 backward; b = B / (DP · M))
    PP        T_pp = 2 · M · (α + b · s · h · bytes / β)   (activations forward, gradients back)
    step      T    = T_c + T_b + T_dp + T_tp + T_pp        (nothing overlapped: an upper bound)
    efficiency     = T_c / T        throughput = B / T samples/s

Two fixes against the analytic tool we learn from (mlsysim, seed 002): its compute time is not
divided across pipeline stages, and its bubble *time* is (P−1)/(v·M+P−1) · T_compute, the
bubble *fraction* applied to the whole unsplit compute. Here T_c is each GPU's share and the
bubble adds (P−1)/(v·M) of it, so the bubble is (P−1)/(v·M+P−1) of the step, as measured.
:func:`mlsysim_bubble_time` keeps the old formula, labelled, for the comparison.

Collective costs are the α–β ring model of :mod:`labkit.comm` (the collectives lab fits α and
β on this machine; the catalog holds datasheet values for real fabrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import comm
from .bubbles import bubble_time, interleaved_bubble_fraction  # shared with the pipeline lab
from .catalog import Accelerator, Fabric, ModelSpec
from .errors import UsageError

SCHEDULES = ("gpipe", "1f1b", "interleaved")
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


# --- collectives over a catalog link --------------------------------------------------------------

def allreduce_time(size_bytes: float, n: int, link: Fabric, algorithm: str = "ring") -> float:
    """All-reduce of ``size_bytes`` over ``n`` GPUs on ``link`` (α = latency, β = bandwidth).

    ring: 2(n−1)·α + 2(n−1)/n · S/β;  tree (naive, reduce then broadcast): 2⌈log2 n⌉·(α + S/β).
    Ring all-reduce of 140 GB (70B gradients in bf16) over 32 nodes at 50 GB/s, α = 0:
    2 · 31/32 · 140e9 / 50e9 = 5.425 s.

    >>> link = Fabric("x", "x", bandwidth_gb_per_s=50, latency_us=0)
    >>> allreduce_time(140e9, 32, link)
    5.425
    >>> allreduce_time(140e9, 32, link, "tree")
    28.0
    """
    if algorithm == "ring":
        return comm.ring_allreduce_time(n, size_bytes, link.alpha_s, link.beta_bytes_per_s)
    if algorithm == "tree":
        return comm.tree_allreduce_time(n, size_bytes, link.alpha_s, link.beta_bytes_per_s)
    raise UsageError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")


def allgather_time(size_bytes: float, n: int, link: Fabric) -> float:
    """All-gather, S = the gathered output: (n−1)·α + (n−1)/n · S/β.

    >>> allgather_time(8e9, 8, Fabric("x", "x", 50, 0))
    0.14
    """
    return comm.collective_time("all_gather", n, size_bytes, link.alpha_s, link.beta_bytes_per_s)


def reduce_scatter_time(size_bytes: float, n: int, link: Fabric) -> float:
    """Reduce-scatter, S = the input: (n−1)·α + (n−1)/n · S/β (half a ring all-reduce).

    >>> reduce_scatter_time(8e9, 8, Fabric("x", "x", 50, 0))
    0.14
    """
    return comm.collective_time("reduce_scatter", n, size_bytes, link.alpha_s, link.beta_bytes_per_s)


def all_to_all_time(size_bytes: float, n: int, link: Fabric) -> float:
    """All-to-all, S = each rank's send buffer: (n−1)·α + (n−1)/n · S/β (pairwise exchange).

    >>> all_to_all_time(8e9, 8, Fabric("x", "x", 50, 10))
    0.14007
    """
    return comm.collective_time("all_to_all", n, size_bytes, link.alpha_s, link.beta_bytes_per_s)


def p2p_time(size_bytes: float, link: Fabric) -> float:
    """One point-to-point message: α + S/β.

    >>> round(p2p_time(1e9, Fabric("x", "x", 50, 5)), 9)
    0.020005
    """
    return link.alpha_s + size_bytes / link.beta_bytes_per_s


# --- pipeline bubble (bubble_time(P, M, T) = (P−1)/M · T is labkit.bubbles') ----------------

def _int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < lo:
        raise UsageError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def bubble_fraction(num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of a pipelined step (GPipe and 1F1B alike; interleaved with v chunks per GPU):
    (P − 1) / (v·M + P − 1), from :mod:`labkit.bubbles` (the pipeline lab measures it).
    P = 8, M = 16: 7/23 ≈ 30 %; interleaved v = 2: 7/39.

    >>> bubble_fraction(8, 16) == 7 / 23, round(bubble_fraction(8, 16, 2), 4)
    (True, 0.1795)
    """
    return interleaved_bubble_fraction(num_stages, num_microbatches, virtual_stages)


def mlsysim_bubble_time(compute_unsplit_s: float, num_stages: int, num_microbatches: int,
                        virtual_stages: int = 1) -> float:
    """NOT our model: mlsysim's bubble time, (P−1)/(v·M+P−1) · T_compute, with T_compute not
    divided by P. Kept only to show the error: for T = 64 s, P = 8, M = 16 it says 19.5 s,
    where the stage compute is 64/8 = 8 s and the bubble is 7/16 · 8 = 3.5 s.

    >>> round(mlsysim_bubble_time(64.0, 8, 16), 2), bubble_time(8, 16, 64.0 / 8)
    (19.48, 3.5)
    """
    return bubble_fraction(num_stages, num_microbatches, virtual_stages) * compute_unsplit_s


# --- cluster, layout, workload --------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` accelerators; ``intra`` links GPUs of a node, ``inter`` nodes."""

    nodes: int
    gpus_per_node: int
    accelerator: Accelerator
    intra: Fabric
    inter: Fabric
    cpu_cores_per_node: int = 0
    name: str = ""

    def __post_init__(self):
        _int("nodes", self.nodes)
        _int("gpus_per_node", self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_catalog(cls, node: str = "DGX_H100", nodes: int = 32, inter_fabric: str | None = None,
                     intra_fabric: str | None = None, accelerator: str | None = None) -> Cluster:
        """A cluster of catalog nodes, optionally with another fabric or accelerator."""
        from . import catalog

        nd = catalog.node(node)
        return cls(nodes, nd.gpus_per_node, catalog.accelerator(accelerator or nd.accelerator),
                   catalog.fabric(intra_fabric or nd.intra_fabric),
                   catalog.fabric(inter_fabric or nd.inter_fabric), nd.cpu_cores,
                   f"{nodes} x {node}")


@dataclass(frozen=True)
class Layout:
    """DP × TP × PP, ``num_microbatches`` per replica, schedule gpipe | 1f1b | interleaved."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    num_microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "num_microbatches", "virtual_stages"):
            _int(name, getattr(self, name))
        if self.schedule not in SCHEDULES:
            raise UsageError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if (self.virtual_stages > 1) != (self.schedule == "interleaved"):
            raise UsageError("virtual_stages > 1 goes with schedule 'interleaved' (and only with it)")

    def check(self, cluster: Cluster) -> None:
        """Refuse a layout that does not tile the cluster, or a TP group that leaves its node."""
        n = self.dp * self.tp * self.pp
        if n != cluster.world_size:
            raise UsageError(f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {n}, but the "
                             f"cluster has world_size {cluster.world_size} GPUs")
        if cluster.gpus_per_node % self.tp:
            raise UsageError(f"tp = {self.tp} does not divide gpus_per_node = "
                             f"{cluster.gpus_per_node}: a TP group must stay inside one node")


@dataclass(frozen=True)
class Workload:
    """What one training step computes: a model, ``global_batch_size`` sequences of ``seq_len``."""

    model: ModelSpec
    global_batch_size: int = 256
    seq_len: int | None = None  # None: the model's own context length
    precision: str = "bf16"
    efficiency: float = 0.4  # achieved / peak FLOP/s on the compute (Llama 3: 38-43 % on H100)
    flops_per_step: float | None = None  # None: 6 · params · tokens
    optimizer_bytes_per_param: float | None = None  # None: Adam, 12 (mixed) or 8 (fp32)
    flash_attention: bool = True
    zero1: bool = False  # shard the optimizer states over DP (ZeRO stage 1 / distributed optimizer)

    def __post_init__(self):
        _int("global_batch_size", self.global_batch_size)
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", self.model.seq_len)
        _int("seq_len", self.seq_len)
        if self.precision not in BYTES:
            raise UsageError(f"precision must be one of {', '.join(BYTES)}, got {self.precision!r}")
        if not 0 < self.efficiency <= 1:
            raise UsageError(f"efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.flops_per_step is not None and not self.flops_per_step > 0:
            raise UsageError(f"flops_per_step must be > 0, got {self.flops_per_step!r}")
        if self.optimizer_bytes_per_param is None:
            object.__setattr__(self, "optimizer_bytes_per_param", 8.0 if BYTES[self.precision] == 4 else 12.0)
        elif self.optimizer_bytes_per_param < 0:
            raise UsageError("optimizer_bytes_per_param must be >= 0")

    @property
    def flops(self) -> float:
        """F = 6 · params · tokens (2 forward + 4 backward FLOPs per parameter per token)."""
        return self.flops_per_step or 6.0 * self.model.params * self.global_batch_size * self.seq_len


# --- memory ---------------------------------------------------------------------------------------

def memory_per_gpu(work: Workload, layout: Layout) -> dict:
    """Bytes per GPU: weights, gradients, optimizer states and activations (first stage, fullest).

    weights = gradients = params · bytes / (TP · PP); optimizer = params · k / (TP · PP) with
    k = 12 for mixed-precision Adam (fp32 master, m, v), divided by DP too with ``zero1``;
    activations = (L/PP) · in-flight microbatches · s·b·h·(34 + 5·a·s/h) / TP bytes
    (Korthikanti et al. 2022, TP with sequence parallelism; flash attention drops 5·a·s/h),
    in flight: M (GPipe), min(M, P) (1F1B), min(M, P)·(1 + (P−1)/(P·v)) (interleaved).
    Llama-3-70B, TP = 8, PP = 4, b = 1, s = 8192, M = 32: 4 · 70.6e9 · 16 / 32 / 1e9 = 35.3 GB
    of states and 20 layers · 4 · 8192 · 8192 · 34 / 8 = 22.8 GB of activations.

    >>> from labkit.catalog import model_preset
    >>> m = memory_per_gpu(Workload(model_preset("Llama-3-70B")), Layout(8, 8, 4, 32))
    >>> round((m["weights"] + m["gradients"] + m["optimizer"]) / 1e9, 1), round(m["activations"] / 1e9, 1)
    (35.3, 22.8)
    """
    mdl, tp, pp, m = work.model, layout.tp, layout.pp, layout.num_microbatches
    b = work.global_batch_size / (layout.dp * m)
    shard = work.model.params / (tp * pp)
    per_layer = work.seq_len * b * mdl.hidden_size * 34.0
    if not work.flash_attention:
        per_layer += work.seq_len * b * mdl.hidden_size * 5.0 * mdl.num_heads * work.seq_len / mdl.hidden_size
    if layout.schedule == "gpipe":
        in_flight = float(m)
    else:
        in_flight = float(min(m, pp))
        if layout.schedule == "interleaved":
            in_flight *= 1 + (pp - 1) / (pp * layout.virtual_stages)
    out = {
        "weights": shard * BYTES[work.precision],
        "gradients": shard * BYTES[work.precision],
        "optimizer": shard * work.optimizer_bytes_per_param / (layout.dp if work.zero1 else 1),
        "activations": mdl.num_layers / pp * in_flight * per_layer / tp,
    }
    out["total"] = sum(out.values())
    return out


# --- one step -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step (seconds per GPU per step, bytes per GPU)."""

    dp: int
    tp: int
    pp: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    microbatch_size: float
    compute_s: float
    bubble_s: float
    dp_comm_s: float
    tp_comm_s: float
    pp_comm_s: float
    step_time_s: float
    bubble_fraction: float
    scaling_efficiency: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float
    memory: dict = field(default_factory=dict)
    memory_capacity_bytes: float = 0.0
    dp_link: str = ""
    world_size: int = 1

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.memory_capacity_bytes

    def verdict(self) -> str:
        """'fits' or the out-of-memory sentence with the breakdown."""
        gb = {k: v / 1e9 for k, v in self.memory.items()}
        if self.fits:
            return f"fits: {gb['total']:.1f} GB of {self.memory_capacity_bytes / 1e9:.0f} GB"
        return (f"out of memory: needs {gb['total']:.1f} GB > {self.memory_capacity_bytes / 1e9:.0f}"
                f" GB (weights {gb['weights']:.1f}, gradients {gb['gradients']:.1f}, optimizer "
                f"{gb['optimizer']:.1f}, activations {gb['activations']:.1f})")

    def row(self) -> dict:
        """A flat dict (the memory in GB as ``memory_*_gb``) for a DataFrame."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "memory"}
        d.update({f"memory_{k}_gb": v / 1e9 for k, v in self.memory.items()})
        d["memory_capacity_gb"] = d.pop("memory_capacity_bytes") / 1e9
        d["fits"] = self.fits
        return d


def predict(work: Workload, cluster: Cluster, layout: Layout) -> Prediction:
    """Predict one training step of ``work`` on ``cluster`` with ``layout`` (formulas above).

    Llama-3-70B, 256 sequences of 8192 tokens, 32 DGX H100 (256 GPUs, IB NDR), DP 8 × TP 8 ×
    PP 4, M = 32, 40 % of the bf16 peak: compute 6·70.6e9·256·8192 / (256·989.4e12·0.4) = 8.77 s,
    bubble 3/32 of it = 0.82 s.

    >>> from labkit.catalog import model_preset
    >>> p = predict(Workload(model_preset("Llama-3-70B")), Cluster.from_catalog("DGX_H100", 32),
    ...             Layout(8, 8, 4, 32))
    >>> round(p.compute_s, 2), round(p.bubble_s, 2), round(p.bubble_fraction, 4), p.fits
    (8.77, 0.82, 0.0857, True)
    """
    layout.check(cluster)
    mdl, g = work.model, cluster.gpus_per_node
    dp, tp, pp, m, v = layout.dp, layout.tp, layout.pp, layout.num_microbatches, layout.virtual_stages
    if work.global_batch_size % (dp * m):
        raise UsageError(f"global_batch_size {work.global_batch_size} is not divisible by "
                         f"dp x num_microbatches = {dp} x {m}")
    if mdl.num_layers % (pp * v):
        raise UsageError(f"num_stages: {mdl.num_layers} layers do not split evenly over "
                         f"pp x virtual_stages = {pp} x {v} model chunks")
    if layout.schedule == "interleaved" and m % pp:
        raise UsageError(f"num_microbatches {m} must be a multiple of pp = {pp} for interleaving")
    n = cluster.world_size
    peak = cluster.accelerator.peak(work.precision)
    b = work.global_batch_size // (dp * m)
    act_bytes = b * work.seq_len * mdl.hidden_size * BYTES[work.precision]

    compute = work.flops / (n * peak * work.efficiency)
    bubble = bubble_time(pp, v * m, compute)  # (P−1)/(v·M) · T_c
    # TP innermost, then DP: a DP group spans tp·dp consecutive ranks; inside a node if they fit
    dp_link = cluster.intra if g % (tp * dp) == 0 else cluster.inter
    dp_comm = allreduce_time(mdl.params * BYTES[work.precision] / (tp * pp), dp, dp_link)
    tp_comm = m * 4 * (mdl.num_layers / pp) * allreduce_time(act_bytes, tp, cluster.intra) if tp > 1 else 0.0
    pp_link = cluster.intra if tp * dp * pp <= g else cluster.inter
    pp_comm = 2 * m * p2p_time(act_bytes, pp_link) if pp > 1 else 0.0
    step = compute + bubble + dp_comm + tp_comm + pp_comm
    return Prediction(
        dp, tp, pp, m, layout.schedule, v, b, compute, bubble, dp_comm, tp_comm, pp_comm, step,
        bubble_fraction(pp, m, v), compute / step, work.global_batch_size / step,
        work.global_batch_size * work.seq_len / step, work.flops / (step * n * peak),
        memory_per_gpu(work, layout), cluster.accelerator.memory_gb * 1e9, dp_link.key, n)


def run_cost(pred: Prediction, cluster: Cluster, steps: int = 1) -> dict:
    """Wall time, GPU-hours and service units of ``steps`` steps on whole nodes.

    gpu_hours = N · T · steps / 3600; SU = (cores + 2 · GPUs) · hours (Rivanna's rate, seed 001).
    """
    from .metrics import service_units

    steps = _int("steps", steps)
    wall = pred.step_time_s * steps
    return {"steps": steps, "wall_time_s": wall, "gpu_hours": pred.world_size * wall / 3600,
            "su": service_units(wall, cores=cluster.nodes * cluster.cpu_cores_per_node,
                                gpus=pred.world_size)}


# --- layout search --------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search(work: Workload, cluster: Cluster, microbatches=(1, 2, 4, 8, 16, 32, 64),
           schedule: str = "1f1b"):
    """Every DP × TP × PP = N; the feasible ones ranked by throughput, the others explained.

    For each (DP, TP, PP) the microbatch count with the highest throughput that fits in memory
    is kept. A layout is rejected, with the reason in ``reason``, when TP does not divide the GPUs
    per node, the layers do not split over PP, no M divides the batch, or no M fits in memory.
    Returns a DataFrame: feasible rows first (``rank`` 1, 2, ...), then rejected ones.
    """
    import pandas as pd

    n, g = cluster.world_size, cluster.gpus_per_node
    ms = sorted({_int("num_microbatches", m) for m in microbatches})
    rows = []
    for tp in _divisors(n):
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            base = {"dp": dp, "tp": tp, "pp": pp}
            if g % tp:
                rows.append({**base, "fits": False,
                             "reason": f"TP={tp} does not divide {g} GPUs per node (TP would cross nodes)"})
                continue
            if work.model.num_layers % pp:
                rows.append({**base, "fits": False, "reason": f"{work.model.num_layers} layers "
                             f"do not split evenly over PP={pp} stages"})
                continue
            preds = [predict(work, cluster, Layout(dp, tp, pp, m, schedule))
                     for m in ms if work.global_batch_size % (dp * m) == 0]
            if not preds:
                rows.append({**base, "fits": False, "reason": f"global batch {work.global_batch_size}"
                             f" is not divisible by DP={dp} x M for any M in {ms}"})
                continue
            fitting = [p for p in preds if p.fits]
            if fitting:
                best = max(fitting, key=lambda p: (p.samples_per_s, -p.num_microbatches))
                rows.append({**best.row(), "reason": best.verdict()})
            else:
                least = min(preds, key=lambda p: p.memory["total"])
                rows.append({**least.row(), "reason": f"{least.verdict()} at best (M={least.num_microbatches})"})
    df = pd.DataFrame(rows)
    df["fits"] = df["fits"].astype(bool)
    ok = df[df.fits].sort_values("samples_per_s", ascending=False)
    ok.insert(0, "rank", range(1, len(ok) + 1))
    out = pd.concat([ok, df[~df.fits]], ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out


def fabric_sweep(work: Workload, layout: Layout, fabrics, node: str = "DGX_H100", nodes: int = 32):
    """The same layout on each inter-node fabric: one predicted row per fabric key."""
    import pandas as pd

    rows = []
    for key in fabrics:
        cl = Cluster.from_catalog(node, nodes, inter_fabric=key)
        p = predict(work, cl, layout)
        rows.append({"fabric": key, "bandwidth_gb_per_s": cl.inter.bandwidth_gb_per_s,
                     "latency_us": cl.inter.latency_us, **p.row()})
    return pd.DataFrame(rows)
