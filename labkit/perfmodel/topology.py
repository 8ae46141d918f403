"""Collectives with topology: where a group's ranks sit decides what its collectives cost (pure).

A group (the DP ranks that hold one shard, the TP ranks of one layer, the stages of one
pipeline) is ``N`` ranks, ``k`` of them on each node they touch (``N = n · k`` over ``n``
nodes). Inside a node the ranks talk over the ``intra`` link (NVLink), between nodes over
the ``inter`` link, one NIC per GPU. Every formula is the α–β model of
:mod:`labkit.collectives.formulas` (α = latency, β = bandwidth per direction per GPU)::

    ring (flat)            2(N−1)/N · S/β + 2(N−1)·α           over the slowest link
    double binary tree     1.05 · 2(N−1)/N · S/β + 1.2 · 2·log2(N)·α
    hierarchical           reduce-scatter inside the node   (k−1)/k · S/β_intra + (k−1)·α_intra
    all-reduce             + ring across the n nodes on S/k  2(n−1)/n · S/(k·β_inter) + 2(n−1)·α_inter
                           + all-gather inside the node      (k−1)/k · S/β_intra + (k−1)·α_intra

The hierarchical all-reduce is what NCCL (and mlsysim) do when a group holds several GPUs of
each node: only 1/k of the bytes cross the NICs, k NICs at a time. A flat ring over the NICs
moves all S through one NIC per GPU: for 70 B bf16 gradients over 256 GPUs on 32 DGX H100
that is 5.63 s against 1.23 s hierarchical.

**Rank placement.** Ranks are numbered with one dimension innermost: Megatron-LM's order, the
default, is TP innermost, then DP, then PP (``"tp,dp,pp"``), so TP groups are consecutive
GPUs of a node and a DP group's neighbours are TP ranks apart. A group of ``size`` ranks whose
neighbours are ``stride`` ranks apart has ``k = min(size, g // stride)`` ranks on each node of
``g`` GPUs when ``stride < g`` (and ``g`` is a multiple of ``stride``), else ``k = 1``
(:func:`group_shape`). mlsysim places the whole TP·PP replica innermost (``"tp,pp,dp"``).

**Which algorithm.** NCCL chooses among its algorithms (ring, tree) by its own cost model;
:func:`collective` with ``algorithm="auto"`` computes each candidate this module has and
picks the fastest, and says which: hierarchical when the group spans nodes with k > 1, a flat
ring otherwise, or the double binary tree across nodes when latency dominates (small messages,
many ranks).
NCCL's ring pipelines the three hierarchical phases (the scaling book, "How to Scale Your
Model", writes the cost as max(node, network) rather than their sum); the sum here is the
upper bound mlsysim 0.3.0 also uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.collectives import formulas as collectives
from labkit.errors import UsageError
from labkit.metrics import positive_count

#: Megatron-LM's rank order, innermost first
MEGATRON = "tp,dp,pp"
DIMS = ("tp", "dp", "pp")
ALGORITHMS = ("auto", "ring", "tree", "double_binary_tree", "hierarchical")
#: the double binary tree's factors: mlsysim 0.3.0's constants ("slightly worse than ideal log
#: latency, slightly above ring-optimal bandwidth"), not measurements; NCCL 2.4's trees give
#: full bandwidth and logarithmic latency (NVIDIA developer blog, "Massively Scale Your Deep
#: Learning Training with NCCL 2.4", 2019)
DBT_LATENCY_FACTOR = 1.2
DBT_BANDWIDTH_FACTOR = 1.05


# --- where the ranks of a group sit -----------------------------------------------------------

def parse_placement(text: str) -> tuple[str, str, str]:
    """The rank order, innermost first: a permutation of tp, dp, pp.

    >>> parse_placement("tp,dp,pp"), parse_placement("tp pp dp")
    (('tp', 'dp', 'pp'), ('tp', 'pp', 'dp'))
    """
    order = tuple(p for p in str(text).replace(",", " ").split() if p)
    if sorted(order) != sorted(DIMS):
        raise UsageError(f"placement must order tp, dp and pp, innermost first (Megatron: "
                         f"{MEGATRON}), got {text!r}")
    return order  # type: ignore[return-value]


def strides(*, dp: int, tp: int, pp: int, placement: str = MEGATRON) -> dict[str, int]:
    """Distance in ranks between neighbours of each group: the product of the sizes of the
    dimensions inside it. Megatron's order, DP 8 × TP 8 × PP 4: TP neighbours are adjacent, DP
    neighbours 8 ranks apart, PP neighbours 64 apart.

    >>> strides(dp=8, tp=8, pp=4)
    {'tp': 1, 'dp': 8, 'pp': 64}
    >>> strides(dp=8, tp=8, pp=4, placement="tp,pp,dp")
    {'tp': 1, 'pp': 8, 'dp': 32}
    """
    sizes = {"dp": positive_count("dp", dp), "tp": positive_count("tp", tp), "pp": positive_count("pp", pp)}
    out, inner = {}, 1
    for dim in parse_placement(placement):
        out[dim] = inner
        inner *= sizes[dim]
    return out


@dataclass(frozen=True)
class GroupShape:
    """A group of ``ranks``: ``ranks_per_node`` of them on each of ``nodes`` nodes."""

    ranks: int
    ranks_per_node: int
    nodes: int

    @property
    def inside_one_node(self) -> bool:
        return self.nodes == 1


def group_shape(*, size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """How a group of ``size`` ranks, neighbours ``stride`` ranks apart, sits on nodes of
    ``gpus_per_node`` = g GPUs. When the stride is below a node and divides it, a node holds
    c = g // stride of the group's positions: the whole group if c is a multiple of ``size``,
    else k = gcd(size, c) ranks on each of size / k nodes (a group that does not tile the
    nodes evenly counts its smallest share, the slowest case). A stride of a node or more: one
    rank per node.

    Pure DP of 256 ranks on 8-GPU nodes: 8 per node on 32 nodes; DP 32 over TP 8: one per
    node; TP 16 on 8-GPU nodes: 8 on each of 2 nodes; TP 3: it straddles nodes.

    >>> group_shape(size=256, stride=1, gpus_per_node=8)
    GroupShape(ranks=256, ranks_per_node=8, nodes=32)
    >>> group_shape(size=32, stride=8, gpus_per_node=8)
    GroupShape(ranks=32, ranks_per_node=1, nodes=32)
    >>> group_shape(size=32, stride=4, gpus_per_node=8)
    GroupShape(ranks=32, ranks_per_node=2, nodes=16)
    >>> group_shape(size=16, stride=1, gpus_per_node=8), group_shape(size=3, stride=1, gpus_per_node=8)
    (GroupShape(ranks=16, ranks_per_node=8, nodes=2), GroupShape(ranks=3, ranks_per_node=1, nodes=3))
    """
    size, stride, g = (positive_count("group size", size), positive_count("stride", stride),
                       positive_count("gpus_per_node", gpus_per_node))
    if stride >= g or g % stride:
        return GroupShape(size, 1, size)
    c = g // stride
    k = size if c % size == 0 else math.gcd(size, c)
    return GroupShape(size, k, size // k)


# --- the formulas ---------------------------------------------------------------------------

def link_time(*, op: str, size_bytes: float, ranks: int, link, algorithm: str = "ring") -> float:
    """One collective over ``ranks`` GPUs joined by a catalogued ``link``: the collectives
    lab's α–β model (:func:`labkit.collectives.formulas.collective_time`) with the link's
    α = latency and β = bandwidth (``algorithm`` ring or tree, the naive binary tree).

    Ring all-reduce of 140 GB (70B gradients in bf16) over 32 nodes at 50 GB/s, α = 0:
    2 · 31/32 · 140e9 / 50e9 = 5.425 s; all-gather of 8 GB over 8 GPUs: 7/8 · 8e9 / 50e9.

    >>> from labkit.perfmodel.catalog import Fabric
    >>> link = Fabric("x", "x", bandwidth_gb_per_s=50, latency_us=0)
    >>> link_time(op="all_reduce", size_bytes=140e9, ranks=32, link=link)
    5.425
    >>> link_time(op="all_reduce", size_bytes=140e9, ranks=32, link=link, algorithm="tree")
    28.0
    >>> link_time(op="all_gather", size_bytes=8e9, ranks=8, link=link)
    0.14
    """
    return collectives.collective_time(op=op, ranks=ranks, size_bytes=size_bytes,
                                       alpha_s=link.alpha_s,
                                       beta_bytes_per_s=link.beta_bytes_per_s,
                                       algorithm=algorithm)


def double_binary_tree_time(*, size_bytes: float, ranks: int, link) -> float:
    """All-reduce over NCCL's double binary tree: near ring bandwidth, logarithmic latency,
    t = 1.05 · 2(N−1)/N · S/β + 1.2 · 2·log2(N) · α (mlsysim 0.3.0's approximation and factors).

    1 MB over 256 ranks at 50 GB/s, α = 5 µs: 1.05 · 2 · 255/256 · 1e6/50e9 + 1.2 · 16 · 5e-6
    = 41.8 µs + 96 µs = 137.8 µs, where a ring pays 2 · 255 · 5 µs = 2.55 ms of latency alone.

    >>> from labkit.perfmodel.catalog import Fabric
    >>> ndr = Fabric("ndr", "ndr", bandwidth_gb_per_s=50, latency_us=5)
    >>> round(double_binary_tree_time(size_bytes=1e6, ranks=256, link=ndr) * 1e6, 1)
    137.8
    >>> round(link_time(op="all_reduce", size_bytes=1e6, ranks=256, link=ndr) * 1e6, 1)
    2589.8
    """
    n = positive_count("ranks", ranks)
    if n == 1:
        return 0.0
    return (DBT_BANDWIDTH_FACTOR * 2 * (n - 1) / n * size_bytes / link.beta_bytes_per_s
            + DBT_LATENCY_FACTOR * 2 * math.log2(n) * link.alpha_s)


def hierarchical_time(*, op: str, size_bytes: float, ranks_per_node: int, nodes: int,
                      intra, inter) -> float:
    """A collective of a group with ``ranks_per_node`` = k ranks on each of ``nodes`` = n nodes,
    in phases inside and across the nodes (S = the whole buffer, nccl-tests' convention):

    * all_reduce: reduce-scatter inside (k−1)/k·S/β_intra, ring all-reduce across the nodes
      on S/k, all-gather inside (k−1)/k·S/β_intra (plus each phase's α terms);
    * all_gather: across the nodes (n−1)/n·(S/k)/β_inter, then inside (k−1)/k·S/β_intra;
    * reduce_scatter: the mirror image (inside first, then across);
    * all_to_all: not hierarchical (every rank sends to every rank): (k−1)/N·S over the
      intra link, (N−k)/N·S over the NIC, (k−1)·α_intra + (N−k)·α_inter, N = n·k.

    70.6 B parameters' bf16 gradients (141.2 GB), pure DP on 32 DGX H100 (k = 8, n = 32,
    NVLink 450 GB/s and α = 1 µs, NDR 50 GB/s and α = 5 µs): 2 × (7/8 · 141.2e9/450e9 + 7 µs)
    + 2 · 31/32 · 17.65e9/50e9 + 62 · 5 µs = 0.5491 + 0.6843 = 1.2334 s.

    >>> from labkit.perfmodel.catalog import Fabric
    >>> nvl, ndr = Fabric("nvl", "nvl", 450, 1), Fabric("ndr", "ndr", 50, 5)
    >>> round(hierarchical_time(op="all_reduce", size_bytes=141.2e9, ranks_per_node=8,
    ...                         nodes=32, intra=nvl, inter=ndr), 4)
    1.2334
    >>> round(hierarchical_time(op="all_gather", size_bytes=8e9, ranks_per_node=8, nodes=2,
    ...                         intra=nvl, inter=ndr), 4)
    0.0256
    """
    k, n = positive_count("ranks_per_node", ranks_per_node), positive_count("nodes", nodes)
    s = float(size_bytes)
    if op == "all_to_all":
        total = n * k
        return ((k - 1) / total * s / intra.beta_bytes_per_s + (k - 1) * intra.alpha_s
                + (total - k) / total * s / inter.beta_bytes_per_s + (total - k) * inter.alpha_s)
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise UsageError(f"no hierarchical form of {op!r} (all_reduce, all_gather, "
                         "reduce_scatter, all_to_all)")
    inside_one = link_time(op="all_gather", size_bytes=s, ranks=k, link=intra)  # = reduce-scatter
    if op == "all_reduce":
        return 2 * inside_one + link_time(op="all_reduce", size_bytes=s / k, ranks=n, link=inter)
    return inside_one + link_time(op=op, size_bytes=s / k, ranks=n, link=inter)


@dataclass(frozen=True)
class Collective:
    """A priced collective: its time, the algorithm used and the links it crossed."""

    time_s: float
    algorithm: str
    link: str


def collective(*, op: str, size_bytes: float, shape: GroupShape, intra, inter,
               algorithm: str = "auto") -> Collective:
    """One collective of a group placed as ``shape``, priced with ``algorithm``:

    * ``ring``: a flat ring over the slowest link the group uses (inter when it spans nodes);
    * ``tree``: the naive binary tree (all-reduce only), same link;
    * ``double_binary_tree``: :func:`double_binary_tree_time` (all-reduce only), same link;
    * ``hierarchical``: :func:`hierarchical_time` (a group spanning nodes);
    * ``auto``: the fastest of ring/hierarchical and, for a group that spans nodes, the double
      binary tree (NCCL builds its trees across nodes; inside one node it runs a chain, so
      there the ring is used), as NCCL's tuner picks the fastest of its algorithms; the answer
      names the one picked.

    Pure DP over 32 DGX H100 (141.2 GB of gradients): hierarchical, 1.23 s; a 1 MB all-reduce
    over 256 ranks with one per node: the double binary tree (latency-bound).

    >>> from labkit.perfmodel.catalog import Fabric
    >>> nvl, ndr = Fabric("NVLink4", "", 450, 1), Fabric("IB_NDR", "", 50, 5)
    >>> c = collective(op="all_reduce", size_bytes=141.2e9, intra=nvl, inter=ndr,
    ...                shape=group_shape(size=256, stride=1, gpus_per_node=8))
    >>> c.algorithm, c.link, round(c.time_s, 4)
    ('hierarchical', 'NVLink4+IB_NDR', 1.2334)
    >>> collective(op="all_reduce", size_bytes=1e6, intra=nvl, inter=ndr,
    ...            shape=group_shape(size=256, stride=8, gpus_per_node=8)).algorithm
    'double_binary_tree'
    """
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    if shape.ranks == 1:
        return Collective(0.0, "none", "")
    spans = not shape.inside_one_node
    flat_link = inter if spans else intra
    layered = spans and shape.ranks_per_node > 1
    flat = ("ring", lambda: link_time(op=op, size_bytes=size_bytes, ranks=shape.ranks,
                                      link=flat_link), flat_link.key)
    hier = ("hierarchical", lambda: hierarchical_time(
        op=op, size_bytes=size_bytes, ranks_per_node=shape.ranks_per_node, nodes=shape.nodes,
        intra=intra, inter=inter), f"{intra.key}+{inter.key}")
    dbt = ("double_binary_tree", lambda: double_binary_tree_time(
        size_bytes=size_bytes, ranks=shape.ranks, link=flat_link), flat_link.key)
    tree = ("tree", lambda: link_time(op=op, size_bytes=size_bytes, ranks=shape.ranks,
                                      link=flat_link, algorithm="tree"), flat_link.key)
    if algorithm == "auto":
        candidates = [hier if layered or (op == "all_to_all" and spans) else flat]
        if op == "all_reduce" and spans:
            candidates.append(dbt)
    else:
        chosen = {"ring": flat, "tree": tree, "double_binary_tree": dbt, "hierarchical": hier}
        if algorithm in ("tree", "double_binary_tree") and op != "all_reduce":
            raise UsageError(f"the {algorithm} model is for all_reduce, not {op}")
        if algorithm == "hierarchical" and not spans:
            chosen["hierarchical"] = flat
        candidates = [chosen[algorithm]]
    priced = [(fn(), name, link) for name, fn, link in candidates]
    t, name, link = min(priced, key=lambda x: x[0])
    return Collective(float(t), name, link)
