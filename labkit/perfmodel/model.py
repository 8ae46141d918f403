"""A DP×TP×PP performance model of one training step, every formula stated (pure: no torch).

A cluster of ``N = nodes × G`` GPUs runs a layout ``DP × TP × PP = N`` on a global batch of
``B`` sequences of ``s`` tokens cut into ``M`` microbatches per data-parallel replica (for
PP = 1 the M microbatches are gradient accumulation: one optimizer step, one DP all-reduce).
Ranks are placed in Megatron's order by default (TP innermost, then DP, then PP:
:mod:`~labkit.perfmodel.topology`), which decides how many ranks of each group share a node.
Per GPU and per step::

    compute   T_c  = F_hw / (N · peak · efficiency)     F = 6 · params · B · s (model FLOPs)
              F_hw = F (+ 4·B·s²·h·L selective recomputation, + F/3 full recomputation)
    bubble    T_b  = (P − 1) / (v · M) · T_c            fraction of the step: (P−1)/(v·M + P − 1)
    DP        T_dp = all-reduce of params · bytes / (TP · PP) over the DP group, placed
                     (hierarchical when the group holds k > 1 GPUs of each of several nodes);
                     ZeRO-1/2 reduce-scatter + all-gather (the same bytes); ZeRO-3 adds 2·M
                     all-gathers of the weights (forward and backward of each microbatch)
              exposed = T_dp − min(f · T_dp, backward of the last microbatch)   f = overlap
    TP        T_tp = M · 4 · (L / PP) · all-reduce of b · s · h · bytes over the TP group
                     (2 forward, 2 backward per layer; 6 with full recomputation; b = B/(DP·M))
    PP        T_pp = 2 · v · M · (α + b · s · h · bytes / β)    (activations forward, grads back)
    step      T    = T_c + T_b + exposed T_dp + T_tp + T_pp
    MFU = F / (T · N · peak)    HFU = F_hw / (T · N · peak)    throughput = B / T samples/s

mlsysim 0.3.0 uses the same compute split and bubble: its ``_replica_profile`` shares a
step's FLOPs over the TP·PP·EP replica, and its bubble is compute · (P−1)/(v·M); its code
marks both as fixed on 2026-09-15. Versions before 0.3.0 did not divide compute across
pipeline stages and priced the bubble as the *fraction* (P−1)/(v·M+P−1) of the undivided
compute; :func:`mlsysim_bubble_time` keeps that older formula, labelled, to show the size of
the error. Where the two models still differ, :mod:`~labkit.perfmodel.mlsysim_engine` says why.

Collective costs are the α–β model of :mod:`labkit.collectives.formulas` (the collectives lab
fits α and β on this machine; the catalog holds datasheet values for real fabrics), placed by
:mod:`~labkit.perfmodel.topology`.

Expert parallelism (EP, the experts' all-to-all and their sharded weights) and context
parallelism (CP, the K/V ring, activations / CP) are two more terms, in
:mod:`~labkit.perfmodel.ep_cp`: a ``Layout(..., cp=, ep=)`` with CP = EP = 1 is the 3-D model
above, unchanged (a mixture of experts then computes with its active parameters and stores all
of them, sharded by TP·PP). Limits, stated: SHARP in-network reductions, kernel launch and
framework overheads, stragglers and congestion are not modelled; the compute efficiency is an
input.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.errors import UsageError
from labkit.metrics import positive_count, service_units
from labkit.perfmodel import ep_cp, topology
from labkit.perfmodel.catalog import Accelerator, Fabric, ModelSpec
from labkit.perfmodel.prediction import Prediction
from labkit.perfmodel.topology import link_time  # noqa: F401  (the model's collective over a link)
from labkit.pipeline.formulas import bubble_fraction, bubble_time, interleavable  # pipeline's

SCHEDULES = ("gpipe", "1f1b", "interleaved")
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


def p2p_time(size_bytes: float, link: Fabric) -> float:
    """One point-to-point message: α + S/β.

    >>> round(p2p_time(1e9, Fabric("x", "x", 50, 5)), 9)
    0.020005
    """
    return link.alpha_s + size_bytes / link.beta_bytes_per_s


# --- pipeline bubble: labkit.pipeline.formulas' bubble_fraction and bubble_time ----------------

def _bubble(p: int, m: int, v: int) -> float:
    return bubble_fraction(num_stages=p, num_microbatches=m,
                           schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)


def mlsysim_bubble_time(compute_unsplit_s: float, num_stages: int, num_microbatches: int,
                        virtual_stages: int = 1) -> float:
    """NOT our model, and no longer mlsysim's: the bubble of mlsysim versions before 0.3.0,
    (P−1)/(v·M+P−1) · T_compute with T_compute not divided by P. 0.3.0 prices it as ours does
    (compute · (P−1)/(v·M) on the replica's split compute). Kept to show the old error: for
    T = 64 s, P = 8, M = 16 it says 19.5 s, where the stage compute is 64/8 = 8 s and the
    bubble is 7/16 · 8 = 3.5 s.

    >>> t = bubble_time(num_stages=8, num_microbatches=16, stage_compute_s=64.0 / 8)
    >>> round(mlsysim_bubble_time(64.0, 8, 16), 2), t
    (19.48, 3.5)
    """
    return _bubble(num_stages, num_microbatches, virtual_stages) * compute_unsplit_s


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
        positive_count("nodes", self.nodes)
        positive_count("gpus_per_node", self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_catalog(cls, node: str = "DGX_H100", nodes: int = 32, inter_fabric: str | None = None,
                     intra_fabric: str | None = None, accelerator: str | None = None) -> Cluster:
        """A cluster of catalog nodes, optionally with another fabric or accelerator (an
        inter-node fabric between nodes, an intra-node one inside: each checked)."""
        from labkit.perfmodel import catalog

        nd = catalog.node(node)
        return cls(nodes, nd.gpus_per_node, catalog.accelerator(accelerator or nd.accelerator),
                   catalog.fabric(intra_fabric or nd.intra_fabric, scope="intra"),
                   catalog.fabric(inter_fabric or nd.inter_fabric, scope="inter"), nd.cpu_cores,
                   f"{nodes} x {node}")


@dataclass(frozen=True)
class Layout:
    """DP × TP × PP, ``num_microbatches`` per replica, schedule gpipe | 1f1b | interleaved.

    ``placement`` orders the dimensions, innermost first (Megatron's ``tp,dp,pp`` by default);
    ``tp_across_nodes`` allows a TP group to span nodes (priced on the inter-node link).
    ``cp`` context-parallel ranks share each sequence (DP × TP × PP × CP = N, the CP ranks
    next to TP); ``ep`` of the DP ranks form an expert group (EP divides DP):
    :mod:`~labkit.perfmodel.ep_cp`.

    >>> Layout(4, 2, 1, cp=2, ep=2).strides()
    {'tp': 1, 'dp': 2, 'pp': 16}
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    num_microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    placement: str = topology.MEGATRON
    tp_across_nodes: bool = False
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "num_microbatches", "virtual_stages", "cp", "ep"):
            positive_count(name, getattr(self, name))
        if self.dp % self.ep:
            raise UsageError(f"ep {self.ep} must divide dp {self.dp}: an expert group is made of "
                             "data-parallel ranks")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "interleaved" and self.virtual_stages < 2:
            raise UsageError("schedule interleaved needs virtual_stages V with V >= 2 (model "
                             f"chunks per GPU); got virtual_stages {self.virtual_stages}")
        if self.schedule != "interleaved" and self.virtual_stages > 1:
            raise UsageError(f"virtual_stages {self.virtual_stages} needs schedule interleaved "
                             f"(V model chunks per GPU; got schedule {self.schedule})")
        object.__setattr__(self, "placement", ",".join(topology.parse_placement(self.placement)))

    def strides(self) -> dict[str, int]:
        """Neighbour distances of the tp, dp and pp dimensions; ``dp`` is the DP·CP block."""
        return topology.strides(dp=self.dp * self.cp, tp=self.tp, pp=self.pp,
                                placement=self.placement)

    def shape(self, dim: str, gpus_per_node: int) -> topology.GroupShape:
        """Where the ``dim`` group sits on nodes of ``gpus_per_node`` GPUs: tp, pp, dp (the
        DP·CP ranks that all-reduce the gradients), or cp, ep, edp
        (:func:`labkit.perfmodel.ep_cp.block_shape`)."""
        stride = self.strides()["dp" if dim in ("cp", "ep", "edp") else dim]
        if dim in ("cp", "ep", "edp"):
            return ep_cp.block_shape(dim=dim, cp=self.cp, ep=self.ep, dp=self.dp, stride=stride,
                                     gpus_per_node=gpus_per_node)
        size = self.dp * self.cp if dim == "dp" else getattr(self, dim)
        return topology.group_shape(size=size, stride=stride, gpus_per_node=gpus_per_node)

    def check(self, cluster: Cluster) -> None:
        """Refuse a layout that does not tile the cluster, or a TP group that leaves its node
        (unless ``tp_across_nodes``)."""
        n = self.dp * self.tp * self.pp * self.cp
        if n != cluster.world_size:
            cp = f" x cp {self.cp}" if self.cp > 1 else ""
            raise UsageError(f"dp {self.dp} x tp {self.tp} x pp {self.pp}{cp} = {n}, but "
                             f"{cluster.name or 'the cluster'} has {cluster.world_size} GPUs "
                             "(world_size)")
        g = cluster.gpus_per_node
        if not self.tp_across_nodes and not self.shape("tp", g).inside_one_node:
            why = (f"which {self.tp} does not divide" if g % self.tp
                   else f"placement {self.placement}")
            raise UsageError(f"tp {self.tp} spans nodes of {g} GPUs (gpus_per_node, {why}): a TP "
                             "group must stay inside one node unless tp_across_nodes (then "
                             "priced on the inter-node link)")


@dataclass(frozen=True)
class Workload:
    """What one training step computes: a model, ``global_batch_size`` sequences of ``seq_len``,
    and the step modifiers: ZeRO stage, activation recomputation, DP overlap with backward."""

    model: ModelSpec
    global_batch_size: int = 256
    seq_len: int | None = None  # None: the model's own context length
    precision: str = "bf16"
    efficiency: float = 0.4  # achieved / peak FLOP/s on the compute (Llama 3: 38-43 % on H100)
    flops_per_step: float | None = None  # None: 6 · params · tokens
    optimizer_bytes_per_param: float | None = None  # None: Adam, 12 (mixed) or 8 (fp32)
    flash_attention: bool = True
    zero1: bool = False  # shorthand for zero_stage = 1 (the distributed optimizer)
    zero_stage: int = 0  # 0: none; 1: optimizer states; 2: + gradients; 3: + weights over DP
    recompute: str = "none"  # activation recomputation: none | selective | full
    dp_overlap: float = 0.0  # share of the DP communication hidden behind backward, in [0, 1]

    def __post_init__(self):
        positive_count("global_batch_size", self.global_batch_size)
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", self.model.seq_len)
        positive_count("seq_len", self.seq_len)
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
        if self.zero_stage not in ZERO_STAGES:
            raise UsageError(f"zero_stage must be one of 0, 1, 2, 3, got {self.zero_stage!r}")
        if self.zero1 and self.zero_stage == 0:
            object.__setattr__(self, "zero_stage", 1)
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if isinstance(self.dp_overlap, bool) or not 0 <= self.dp_overlap <= 1:
            raise UsageError(f"dp_overlap must be in [0, 1], got {self.dp_overlap!r}")

    @property
    def flops(self) -> float:
        """Model FLOPs F = 6 · params · tokens (2 forward + 4 backward per parameter per token;
        a mixture of experts counts its active parameters)."""
        return self.flops_per_step or 6.0 * self.model.flop_params * self.global_batch_size * self.seq_len

    @property
    def hardware_flops(self) -> float:
        """FLOPs the GPUs execute: F plus recomputation. Selective recomputes the attention
        core's forward, 4·b·s²·h per layer per sequence (QKᵀ and the weighted sum of V); full
        recomputes the whole forward, F/3. Llama-3-70B, 256 × 2048 tokens: selective adds
        4 · 256 · 2048² · 8192 · 80 / (6 · 70.6e9 · 256 · 2048) = 1.27 %.

        >>> from labkit.perfmodel.catalog import model_preset
        >>> w = Workload(model_preset("Llama-3-70B"), seq_len=2048, recompute="selective")
        >>> f = Workload(w.model, seq_len=2048, recompute="full")
        >>> round(w.hardware_flops / w.flops - 1, 4), round(f.hardware_flops / f.flops, 4)
        (0.0127, 1.3333)
        """
        extra = 0.0
        if self.recompute == "selective":
            m = self.model
            extra = 4.0 * self.global_batch_size * self.seq_len ** 2 * m.hidden_size * m.num_layers
        elif self.recompute == "full":
            extra = self.flops / 3
        return self.flops + extra


# --- memory ---------------------------------------------------------------------------------------

def memory_per_gpu(work: Workload, layout: Layout) -> dict:
    """Bytes per GPU: weights, gradients, optimizer states and activations (first stage, fullest).

    weights = gradients = params · bytes / (TP · PP); optimizer = params · k / (TP · PP) with
    k = 12 for mixed-precision Adam (fp32 master, m, v); ZeRO divides by DP the optimizer
    (stage ≥ 1), the gradients (≥ 2) and the weights (3). A mixture of experts stores all its
    parameters. activations = (L/PP) · in-flight microbatches · per-layer bytes / TP
    (Korthikanti et al. 2022, TP with sequence parallelism), per layer per microbatch:
    s·b·h·34 (+ 5·a·s²·b without flash attention) with no recomputation, s·b·h·34 selective,
    s·b·h·2 full (only the layer's input is kept); in flight: M (GPipe), min(M, P) (1F1B),
    min(M, P)·(1 + (P−1)/(P·v)) (interleaved). With CP the states are those of DP·CP replicas
    and the activations are divided by CP; with EP the experts are sharded over TP·PP·EP
    (:func:`labkit.perfmodel.ep_cp.state_parts`).
    Llama-3-70B, TP = 8, PP = 4, b = 1, s = 8192, M = 32: 4 · 70.6e9 · 16 / 32 / 1e9 = 35.3 GB
    of states and 20 layers · 4 · 8192 · 8192 · 34 / 8 = 22.8 GB of activations.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> m = memory_per_gpu(Workload(model_preset("Llama-3-70B")), Layout(8, 8, 4, 32))
    >>> round((m["weights"] + m["gradients"] + m["optimizer"]) / 1e9, 1), round(m["activations"] / 1e9, 1)
    (35.3, 22.8)

    CP 2 beside the same DP (twice the GPUs) halves the activations, 22.8 / 2 = 11.4 GB; in
    place of half the DP ranks it doubles b and they stay at 22.8 GB.

    >>> w = Workload(model_preset("Llama-3-70B"))
    >>> [round(memory_per_gpu(w, Layout(d, 8, 4, 32, cp=2))["activations"] / 1e9, 1) for d in (8, 4)]
    [11.4, 22.8]
    """
    mdl, tp, pp, m, dp = work.model, layout.tp, layout.pp, layout.num_microbatches, layout.dp
    b = work.global_batch_size / (dp * m)
    parts = [(count / shards, r) for count, shards, r in
             ep_cp.state_parts(mdl, tp=tp, pp=pp, ep=layout.ep, replicas=dp * layout.cp)]
    sbh = work.seq_len * b * mdl.hidden_size
    if work.recompute == "full":
        per_layer = 2.0 * sbh
    else:
        per_layer = 34.0 * sbh
        if work.recompute == "none" and not work.flash_attention:
            per_layer += 5.0 * mdl.num_heads * work.seq_len ** 2 * b
    if layout.schedule == "gpipe":
        in_flight = float(m)
    else:
        in_flight = float(min(m, pp))
        if layout.schedule == "interleaved":
            in_flight *= 1 + (pp - 1) / (pp * layout.virtual_stages)
    z = work.zero_stage
    out = {
        "weights": sum(shard * BYTES[work.precision] / (r if z >= 3 else 1) for shard, r in parts),
        "gradients": sum(shard * BYTES[work.precision] / (r if z >= 2 else 1) for shard, r in parts),
        "optimizer": sum(shard * work.optimizer_bytes_per_param / (r if z >= 1 else 1)
                         for shard, r in parts),
        "activations": mdl.num_layers / pp * in_flight * per_layer / (tp * layout.cp),
    }
    out["total"] = sum(out.values())
    return out


# --- one step -------------------------------------------------------------------------------------

def division_problem(work: Workload, layout: Layout) -> str | None:
    """Why ``layout`` cannot cut ``work`` into whole microbatches (DP × M of the batch) and
    model chunks (PP × V of the layers), M into groups of PP when interleaved; None if it can.
    Like every check of a layout, it names fields: ``labkit model`` puts its flags in their place.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> w = Workload(model_preset("Llama-3-70B"))
    >>> division_problem(w, Layout(8, 8, 4, 2, "interleaved", 2))
    'num_microbatches 2 must be a multiple of pp 4 with schedule interleaved'
    """
    dp, pp, m, v = layout.dp, layout.pp, layout.num_microbatches, layout.virtual_stages
    batch, layers = work.global_batch_size, work.model.num_layers
    if batch % (dp * m):
        return (f"global_batch_size {batch} is not divisible by DP {dp} x num_microbatches {m} "
                f"= {dp * m}: each replica's {batch / dp:g} sequences must split into {m} whole "
                "microbatches")
    if layers % (pp * v):
        return (f"pp {pp} x virtual_stages {v}: the {layers} layers of {work.model.key} do not "
                f"split evenly into {pp * v} model chunks")
    if layout.schedule == "interleaved" and not interleavable(num_stages=pp, num_microbatches=m):
        return f"num_microbatches {m} must be a multiple of pp {pp} with schedule interleaved"
    if work.seq_len % layout.cp:
        return f"seq_len {work.seq_len} is not divisible by cp {layout.cp}"
    if layout.ep > 1 and (not work.model.is_moe or work.model.num_experts % layout.ep):
        return (f"ep {layout.ep} must divide the {work.model.num_experts} expert(s) of "
                f"{work.model.key}")
    return None


def predict(work: Workload, cluster: Cluster, layout: Layout, *, algorithm: str = "auto") -> Prediction:
    """Predict one training step of ``work`` on ``cluster`` with ``layout`` (formulas above);
    ``algorithm`` prices the DP and TP collectives (:func:`labkit.perfmodel.topology.collective`:
    auto picks the fastest, as NCCL's tuner does).

    Llama-3-70B, 256 sequences of 8192 tokens, 32 DGX H100 (256 GPUs, IB NDR), DP 8 × TP 8 ×
    PP 4, M = 32, 40 % of the bf16 peak: compute 6·70.6e9·256·8192 / (256·989.4e12·0.4) = 8.77 s,
    bubble 3/32 of it = 0.82 s; the DP group has one GPU per node (a flat ring over NDR).

    >>> from labkit.perfmodel.catalog import model_preset
    >>> p = predict(Workload(model_preset("Llama-3-70B")), Cluster.from_catalog("DGX_H100", 32),
    ...             Layout(8, 8, 4, 32))
    >>> round(p.compute_s, 2), round(p.bubble_s, 2), round(p.bubble_fraction, 4), p.fits
    (8.77, 0.82, 0.0857, True)
    >>> p.dp_algorithm, p.dp_ranks_per_node, p.dp_link
    ('ring', 1, 'IB_NDR')
    """
    layout.check(cluster)
    if problem := division_problem(work, layout):
        raise UsageError(problem)
    mdl, g = work.model, cluster.gpus_per_node
    dp, tp, pp, m, v = layout.dp, layout.tp, layout.pp, layout.num_microbatches, layout.virtual_stages
    n = cluster.world_size
    peak = cluster.accelerator.peak(work.precision)
    nbytes = BYTES[work.precision]
    cp, ep = layout.cp, layout.ep
    b = work.global_batch_size // (dp * m)
    act_bytes = b * work.seq_len * mdl.hidden_size * nbytes / cp  # the rank's s/CP tokens
    flops, hw_flops = work.flops, work.hardware_flops

    compute = hw_flops / (n * peak * work.efficiency)
    bubble = bubble_time(num_stages=pp, num_microbatches=v * m, stage_compute_s=compute)  # (P−1)/(v·M) · T_c

    def priced(op, size, shape):
        return topology.collective(op=op, size_bytes=size, shape=shape, intra=cluster.intra,
                                   inter=cluster.inter, algorithm=algorithm)

    dp_shape = layout.shape("dp", g)  # the DP·CP ranks that hold the same weights
    # ZeRO-1/2: reduce-scatter of the gradients + all-gather of the updated weights, the bytes
    # and the cost of one all-reduce; ZeRO-3 gathers the weights again for the forward and the
    # backward of every microbatch. With EP the expert shard has its own, smaller group.
    parts = ep_cp.state_parts(mdl, tp=tp, pp=pp, ep=ep, replicas=dp * cp)
    shapes = [dp_shape] + ([layout.shape("edp", g)] if ep > 1 else [])
    dp_total, dp_coll = 0.0, None
    for (count, shards, _), shape in zip(parts, shapes):
        grad_bytes = count * nbytes / shards
        coll = priced("all_reduce", grad_bytes, shape)
        dp_coll = dp_coll or coll
        part = coll.time_s
        if work.zero_stage == 3 and shape.ranks > 1:
            gather = priced("all_gather", grad_bytes, shape).time_s
            part = priced("reduce_scatter", grad_bytes, shape).time_s + 2 * m * gather
        dp_total += part
    # the all-reduce can hide behind the backward of the last microbatch only (DDP's no_sync
    # holds it back during accumulation); ZeRO-3's gathers prefetch during the whole step
    forward = flops / 3
    window = compute if work.zero_stage == 3 else compute * (hw_flops - forward) / hw_flops / m
    dp_comm = dp_total - min(work.dp_overlap * dp_total, window)

    tp_shape = layout.shape("tp", g)
    per_layer = 6 if work.recompute == "full" else 4
    tp_coll = priced("all_reduce", act_bytes, tp_shape)
    tp_comm = m * per_layer * (mdl.num_layers / pp) * tp_coll.time_s if tp > 1 else 0.0

    pp_shape = layout.shape("pp", g)
    pp_link = cluster.intra if pp_shape.inside_one_node else cluster.inter
    pp_comm = 2 * v * m * p2p_time(act_bytes, pp_link) if pp > 1 else 0.0
    beyond = ep_cp.step_terms(work, layout, cluster, microbatch_size=b, nbytes=nbytes,
                              priced=priced, send_time=p2p_time)  # EP and CP: 0 at 1
    step = compute + bubble + dp_comm + tp_comm + pp_comm + beyond["ep_comm_s"] + beyond["cp_comm_s"]
    return Prediction(
        dp=dp, tp=tp, pp=pp, num_microbatches=m, schedule=layout.schedule, virtual_stages=v,
        microbatch_size=b, compute_s=compute, bubble_s=bubble, dp_comm_s=dp_comm,
        tp_comm_s=tp_comm, pp_comm_s=pp_comm, step_time_s=step,
        bubble_fraction=_bubble(pp, m, v), scaling_efficiency=compute / step,
        samples_per_s=work.global_batch_size / step,
        tokens_per_s=work.global_batch_size * work.seq_len / step,
        mfu=flops / (step * n * peak), memory=memory_per_gpu(work, layout),
        memory_capacity_bytes=cluster.accelerator.memory_gb * 1e9,
        dp_link=dp_coll.link, world_size=n, hfu=hw_flops / (step * n * peak),
        dp_comm_total_s=dp_total, dp_overlap=work.dp_overlap, dp_algorithm=dp_coll.algorithm,
        dp_ranks_per_node=dp_shape.ranks_per_node, dp_nodes=dp_shape.nodes,
        tp_algorithm=tp_coll.algorithm if tp > 1 else "none", tp_link=tp_coll.link,
        pp_link=pp_link.key if pp > 1 else "", placement=layout.placement,
        zero_stage=work.zero_stage, recompute=work.recompute, model_flops=flops,
        hardware_flops=hw_flops, cp=cp, ep=ep, **beyond)


def assumptions(work: Workload, cluster: Cluster, *, placement: str = topology.MEGATRON,
                schedule: str = "1f1b", algorithm: str = "auto",
                ep: tuple[int, ...] = (1,)) -> list[str]:
    """Every assumption a prediction rests on, one line each (the CLI's header); ``ep``, the
    expert-parallel sizes (one, or a search's), say how a mixture's experts are sharded.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> lines = assumptions(Workload(model_preset("Llama-3-70B")), Cluster.from_catalog("DGX_H100", 32))
    >>> lines[1]
    'workload: global batch 256 sequences x seq_len 8192 tokens, precision bf16, efficiency 0.4 of peak'
    """
    mdl, acc = work.model, cluster.accelerator
    shard = (f"EP {', '.join(map(str, ep))}: experts sharded over TP·PP·EP, all-to-alls over "
             "the EP group" if max(ep) > 1
             else "at ep 1 expert parallelism not modelled: experts sharded by TP·PP like dense "
             "weights")
    moe = (f", mixture of {mdl.num_experts} experts ({mdl.experts_per_token} per token: "
           f"{mdl.flop_params / 1e9:.1f} B active; {shard})" if mdl.is_moe else "")
    zero = {0: "off", 1: "1 (optimizer states over DP)", 2: "2 (+ gradients)",
            3: "3 (+ weights, re-gathered per microbatch)"}[work.zero_stage]
    return [
        f"model: {mdl.key} ({mdl.params / 1e9:.1f} B parameters, {mdl.num_layers} layers, hidden "
        f"{mdl.hidden_size}){moe}",
        f"workload: global batch {work.global_batch_size} sequences x seq_len {work.seq_len} tokens, "
        f"precision {work.precision}, efficiency {work.efficiency:g} of peak",
        f"step: DP overlap with backward {work.dp_overlap:g}, ZeRO {zero}, recomputation "
        f"{work.recompute}, flash attention {'on' if work.flash_attention else 'off'}, schedule "
        f"{schedule}",
        f"cluster: {cluster.name} = {cluster.world_size} x {acc.key} ({acc.peak(work.precision) / 1e12:.1f} "
        f"TFLOP/s {work.precision}, {acc.memory_gb:g} GB), {cluster.intra.key} inside a node "
        f"({cluster.intra.bandwidth_gb_per_s:g} GB/s, {cluster.intra.latency_us:g} us), "
        f"{cluster.inter.key} between nodes ({cluster.inter.bandwidth_gb_per_s:g} GB/s per GPU, "
        f"{cluster.inter.latency_us:g} us)",
        f"placement: {placement} (innermost first); collectives: {algorithm}",
    ]


def run_cost(pred: Prediction, cluster: Cluster, steps: int = 1) -> dict:
    """Wall time, GPU-hours and service units of ``steps`` steps on whole nodes.

    gpu_hours = N · T · steps / 3600; SU = (cores + 2 · GPUs) · hours, Rivanna's rate
    (:func:`labkit.metrics.service_units`).
    """
    steps = positive_count("steps", steps)
    wall = pred.step_time_s * steps
    return {"steps": steps, "wall_time_s": wall, "gpu_hours": pred.world_size * wall / 3600,
            "su": service_units(wall, cores=cluster.nodes * cluster.cpu_cores_per_node,
                                gpus=pred.world_size)}
