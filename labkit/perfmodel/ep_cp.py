"""Expert and context parallelism: the two dimensions beyond DP x TP x PP (pure: no torch).

A layout is DP × TP × PP × CP = N GPUs, with EP dividing DP: an expert group is made of
data-parallel ranks (Megatron-Core's rank order, innermost first tp, cp, ep, dp, pp, so the CP
ranks of one sequence sit next to the TP ranks and an expert group is consecutive DP ranks).
The DP·CP ranks that hold the same weights all-reduce the gradients; CP = EP = 1 is the 3-D
model unchanged. Per GPU and per step (b sequences of s tokens per microbatch, h hidden, k
experts per token, M microbatches, L/PP layers per stage)::

    EP  T_ep = M · 4 · (L/PP) · all-to-all of t·k·h·bytes over the EP group, t = b·s/CP
             (dispatch and combine, forward and backward; 6 per layer with full
             recomputation); priced by :func:`labkit.perfmodel.topology.collective`
    CP  T_cp = M · 3 · (L/PP) · (CP − 1) · (α + 2·b·(s/CP)·h·bytes / (TP·β))
             (the K/V ring: each rank passes its K and V chunk CP − 1 times forward, K/V and
             their gradients backward; 4 per layer with full recomputation)
    memory   experts / (TP·PP·EP) + dense / (TP·PP) parameters per GPU (:func:`params_per_gpu`),
             activations / CP
    DP       with EP > 1 the dense gradients are all-reduced over the DP·CP ranks and the
             expert shard over the DP·CP/EP ranks that hold the same experts

Stated limits: every layer counts as a mixture-of-experts layer (DeepSeek-V3's 3 dense layers
of 61 too); routing is balanced (every expert gets t·k/E tokens); K and V are h wide (grouped
query attention's fewer K/V heads would shrink the ring's bytes: an upper bound); the ring is
not hidden behind the attention it feeds (an upper bound: ring attention overlaps each send
with the previous chunk's attention); the all-to-all is on the critical path (the experts wait
for their tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from labkit.collectives.formulas import moe_all_to_all_bytes
from labkit.perfmodel.topology import GroupShape


def expert_params(spec) -> float:
    """Parameters in the experts of a mixture (0 for a dense model), from the catalog's total P
    and active A: P = D + E·e and A = D + k·e, so the experts hold E·e = E·(P − A)/(E − k).
    Mixtral 8x7B: 8 · (46.7 − 12.9) / 6 = 45.07 B of 46.7 B; DeepSeek-V3: 256 · 634 / 248.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> round(expert_params(model_preset("Mixtral-8x7B")) / 1e9, 2)
    45.07
    >>> round(expert_params(model_preset("DeepSeek-V3")) / 1e9, 1), expert_params(model_preset("Llama-3-8B"))
    (654.5, 0.0)
    """
    e, k = spec.num_experts, spec.experts_per_token
    if not spec.is_moe or spec.active_params is None or e <= k:
        return 0.0
    return e * (spec.params - spec.active_params) / (e - k)


def params_per_gpu(spec, *, tp: int, pp: int, ep: int = 1) -> float:
    """Parameters one GPU stores: dense / (TP·PP) + experts / (TP·PP·EP); params / (TP·PP) at
    EP = 1. Mixtral 8x7B on EP 8: 1.63 B dense + 45.07 / 8 = 7.27 B, against 46.7 B without.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> mixtral = model_preset("Mixtral-8x7B")
    >>> round(params_per_gpu(mixtral, tp=1, pp=1, ep=8) / 1e9, 2), params_per_gpu(mixtral, tp=1, pp=1) / 1e9
    (7.27, 46.7)
    """
    if ep == 1:
        return spec.params / (tp * pp)
    experts = expert_params(spec)
    return (spec.params - experts) / (tp * pp) + experts / (tp * pp * ep)


def state_parts(spec, *, tp: int, pp: int, ep: int, replicas: int) -> list[tuple]:
    """(parameters, the shards they are cut into, ranks that hold the same shard) per part:
    one part at EP = 1 (all of them over TP·PP, held by the DP·CP ``replicas``), else the dense
    part (over TP·PP, DP·CP) and the experts (over TP·PP·EP, DP·CP/EP). The gradients of each
    part are all-reduced over its ranks, and ZeRO shards its states over them. Mixtral, TP 1,
    PP 1, DP 16, EP 8: 1.63 B dense on 16 ranks, 5.63 B of experts per GPU on 2.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> [(round(p / k / 1e9, 2), r) for p, k, r in state_parts(model_preset("Mixtral-8x7B"),
    ...                                                        tp=1, pp=1, ep=8, replicas=16)]
    [(1.63, 16), (5.63, 2)]
    """
    if ep == 1:
        return [(spec.params, tp * pp, replicas)]
    experts = expert_params(spec)
    return [(spec.params - experts, tp * pp, replicas), (experts, tp * pp * ep, replicas // ep)]


def all_to_all_bytes(*, tokens: float, experts_per_token: int, hidden_size: int,
                     bytes_per_value: float) -> float:
    """One all-to-all's send buffer (nccl-tests' S): every token goes to its k experts as h
    values. Mixtral, one 2048-token sequence in bf16: 2048 · 2 · 4096 · 2 = 33.6 MB.

    >>> all_to_all_bytes(tokens=2048, experts_per_token=2, hidden_size=4096, bytes_per_value=2)
    33554432
    """
    return moe_all_to_all_bytes(tokens=tokens, experts_per_token=experts_per_token,
                                hidden_size=hidden_size, bytes_per_value=bytes_per_value)


def all_to_alls(*, num_microbatches: int, layers_per_stage: float, recompute: str = "none") -> float:
    """All-to-alls per step on one GPU: 2 forward (dispatch, combine) and 2 backward per
    layer, 2 more with full recomputation, for each microbatch. M = 4, 32 layers:

    >>> all_to_alls(num_microbatches=4, layers_per_stage=32), all_to_alls(num_microbatches=1, layers_per_stage=8, recompute="full")
    (512, 48)
    """
    return num_microbatches * (6 if recompute == "full" else 4) * layers_per_stage


def kv_chunk_bytes(*, microbatch_size: float, seq_len: int, hidden_size: int,
                   bytes_per_value: float, cp: int, tp: int) -> float:
    """One send of the K/V ring: the rank's K and V for its s/CP tokens, its TP share of the
    heads. Llama-3-70B, b = 1, s = 8192, CP 4, TP 8, bf16: 2 · 2048 · 8192 · 2 / 8 = 8.4 MB.

    >>> kv_chunk_bytes(microbatch_size=1, seq_len=8192, hidden_size=8192, bytes_per_value=2, cp=4, tp=8)
    8388608.0
    """
    return 2 * microbatch_size * seq_len / cp * hidden_size * bytes_per_value / tp


def ring_sends(*, cp: int, num_microbatches: int, layers_per_stage: float,
               recompute: str = "none") -> float:
    """K/V ring sends per step on one GPU: CP − 1 per layer forward, 2 (CP − 1) backward (K/V
    and their gradients), CP − 1 more with full recomputation, for each microbatch. CP 4,
    M = 8, 20 layers per stage: 8 · 3 · 20 · 3 = 1440.

    >>> ring_sends(cp=4, num_microbatches=8, layers_per_stage=20), ring_sends(cp=1, num_microbatches=8, layers_per_stage=20)
    (1440, 0)
    """
    return num_microbatches * (4 if recompute == "full" else 3) * layers_per_stage * (cp - 1)


def block_shape(*, dim: str, cp: int, ep: int, dp: int, stride: int,
                gpus_per_node: int) -> GroupShape:
    """Where the ``dim`` group sits on nodes of ``gpus_per_node`` GPUs: ``cp`` (the CP ranks of
    one sequence), ``ep`` (an expert group) or ``edp`` (the DP·CP/EP ranks that hold the same
    experts). The DP·CP block's positions are numbered cp innermost, then ep, then DP/EP, its
    neighbours ``stride`` ranks apart (TP below it in Megatron's order); a node holds g //
    stride consecutive positions when the stride divides g, else one. TP 8 on 8-GPU nodes: one
    rank of each group per node; TP 2, CP 2, EP 2, DP 4:

    >>> block_shape(dim="cp", cp=4, ep=1, dp=8, stride=8, gpus_per_node=8)
    GroupShape(ranks=4, ranks_per_node=1, nodes=4)
    >>> [block_shape(dim=d, cp=2, ep=2, dp=4, stride=2, gpus_per_node=8).ranks_per_node
    ...  for d in ("cp", "ep", "edp")]
    [2, 2, 2]
    """
    sizes = {"cp": cp, "ep": ep, "edp": dp * cp // ep}
    member: dict[str, Callable[[int], bool]] = {
        "cp": lambda i: i < cp, "ep": lambda i: i % cp == 0 and i < cp * ep,
        "edp": lambda i: (i // cp) % ep == 0}
    ranks = sizes[dim]
    if ranks == 1:
        return GroupShape(1, 1, 1)
    if stride >= gpus_per_node or gpus_per_node % stride:
        return GroupShape(ranks, 1, ranks)
    on_node = sum(1 for i in range(min(gpus_per_node // stride, dp * cp)) if member[dim](i))
    k = math.gcd(ranks, max(1, on_node))
    return GroupShape(ranks, k, ranks // k)


def step_terms(work, layout, cluster, *, microbatch_size: float, nbytes: float, priced,
               send_time) -> dict:
    """The EP and CP terms of one step (seconds per GPU), with where each ran: the EP and CP
    fields of :class:`~labkit.perfmodel.prediction.Prediction`. ``priced(op, size, shape)``
    prices a collective of a placed group (:func:`labkit.perfmodel.topology.collective`),
    ``send_time(size, link)`` one point-to-point message
    (:func:`labkit.perfmodel.model.p2p_time`).

    Mixtral 8x7B, 256 sequences of 2048 tokens on 4 DGX H100, DP 32 with EP 8 inside a node
    (b = 8): 4 · 32 all-to-alls of b·s·k·h·bytes = 8 · 2048 · 2 · 4096 · 2 = 268 MB over NVLink,
    each 7/8 · 268e6 / 450e9 + 7 µs = 528.9 µs: 128 · 528.9 µs = 67.7 ms.

    >>> from labkit.perfmodel.catalog import model_preset
    >>> from labkit.perfmodel.model import Cluster, Layout, Workload, predict
    >>> p = predict(Workload(model_preset("Mixtral-8x7B"), seq_len=2048),
    ...             Cluster.from_catalog("DGX_H100", 4), Layout(32, 1, 1, 1, ep=8))
    >>> p.ep_link, round(p.ep_all_to_all_bytes / 1e6), round(p.ep_comm_s * 1e3, 1)
    ('NVLink4', 268, 67.7)

    Llama-3-70B at s = 8192, DP 2 × TP 8 × PP 4 × CP 4 (one CP rank per node), M = 8, so
    b = 256 / (2 · 8) = 16 and 20 layers per stage: 1440 sends (:func:`ring_sends`) of
    16 · 8.4 MB (:func:`kv_chunk_bytes`) over NDR, each 5 µs + 134.2e6 / 50e9 = 2.69 ms.

    >>> p = predict(Workload(model_preset("Llama-3-70B")), Cluster.from_catalog("DGX_H100", 32),
    ...             Layout(2, 8, 4, 8, cp=4))
    >>> p.cp_link, round(p.cp_comm_s, 3), round(1440 * (5e-6 + 16 * 8388608 / 50e9), 3)
    ('IB_NDR', 3.873, 3.873)
    """
    mdl, g, cp, ep = work.model, cluster.gpus_per_node, layout.cp, layout.ep
    layers = mdl.num_layers / layout.pp
    out = {"cp_comm_s": 0.0, "ep_comm_s": 0.0, "cp_link": "", "ep_algorithm": "none",
           "ep_link": "", "ep_all_to_all_bytes": 0.0}
    if ep > 1:
        size = all_to_all_bytes(tokens=microbatch_size * work.seq_len / cp,
                                experts_per_token=mdl.experts_per_token,
                                hidden_size=mdl.hidden_size, bytes_per_value=nbytes)
        coll = priced("all_to_all", size, layout.shape("ep", g))
        calls = all_to_alls(num_microbatches=layout.num_microbatches, layers_per_stage=layers,
                            recompute=work.recompute)
        out.update(ep_comm_s=calls * coll.time_s, ep_algorithm=coll.algorithm, ep_link=coll.link,
                   ep_all_to_all_bytes=size)
    if cp > 1:
        link = cluster.intra if layout.shape("cp", g).inside_one_node else cluster.inter
        kv = kv_chunk_bytes(microbatch_size=microbatch_size, seq_len=work.seq_len,
                            hidden_size=mdl.hidden_size, bytes_per_value=nbytes, cp=cp,
                            tp=layout.tp)
        sends = ring_sends(cp=cp, num_microbatches=layout.num_microbatches,
                           layers_per_stage=layers, recompute=work.recompute)
        out.update(cp_comm_s=sends * send_time(kv, link), cp_link=link.key)
    return out

