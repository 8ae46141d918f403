"""Expert parallelism by the numbers: capacity, load, the bytes each all-to-all moves, FLOPs,
and the step time from a machine profile (pure: no torch).

Notation: ``E`` experts, ``P`` ranks (``E/P`` experts each, rank r holding experts
``r·E/P .. (r+1)·E/P − 1``), ``T`` tokens per rank, each sent to its top ``k`` experts, hidden size
``h``, expert width ``f``, ``B`` bytes per value.

A step of the layer (forward and backward) moves token rows in four all-to-alls: **dispatch**
(each rank sends every kept (token, expert) pair whose expert lives elsewhere: a row of h
values), **combine** (the experts' outputs go back the same way reversed), and in backward the
two again, gradients in the opposite directions. So with ``kept[r][e]`` the pairs rank r routed
to expert e and kept (within capacity), rank r sends per step::

    dispatch_r = h B Σ_{e not on r} kept[r][e]         (forward dispatch, backward combine)
    combine_r  = h B Σ_{s ≠ r} Σ_{e on r} kept[s][e]   (forward combine, backward dispatch)

With routing spread evenly and nothing dropped, ``dispatch_r = T k h B (P−1)/P``
(:func:`uniform_bytes`): the share of a rank's T·k rows whose expert lives elsewhere.

Before each dispatch the ranks exchange how many rows they will send each other (one small
all-to-all of P integers), so that every rank can size its receive buffer.
"""

from __future__ import annotations

import math

from labkit.config import positive_int, positive_number

#: bytes per value of the timed steps (fp32); the one-process check runs in float64
BYTES_PER_VALUE = 4
#: the four phases of a step, in order (each forward and backward)
PHASES = ("routing", "dispatch", "experts", "combine")
#: all-to-alls of token rows per step on more than one rank: dispatch and combine, forward and
#: backward
PAYLOAD_ALLTOALLS = 4


def capacity(*, tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """The most (token, expert) pairs an expert takes from one rank:
    ``ceil(factor · T · k / E)`` (an even share of the rank's T·k pairs, times the factor).

    >>> capacity(tokens=256, top_k=2, num_experts=4, capacity_factor=1.25)
    160
    >>> capacity(tokens=4, top_k=2, num_experts=4, capacity_factor=1.0)
    2
    """
    positive_number("capacity_factor", capacity_factor)
    share = positive_int("tokens", tokens) * positive_int("top_k", top_k) / positive_int(
        "num_experts", num_experts)
    return max(1, math.ceil(round(capacity_factor * share, 9)))


def owner(expert: int, *, num_experts: int, world_size: int) -> int:
    """The rank that holds ``expert`` (experts in contiguous blocks of E/P).

    >>> [owner(e, num_experts=4, world_size=2) for e in range(4)]
    [0, 0, 1, 1]
    """
    return expert // (num_experts // world_size)


def rows_between(kept: list[list[int]], *, world_size: int) -> list[list[int]]:
    """Token rows rank s sends rank d in a dispatch: ``out[s][d]`` from ``kept[s][e]`` (the
    pairs rank s routed to expert e and kept).

    >>> rows_between([[2, 2, 2, 1], [0, 3, 1, 1]], world_size=2)
    [[4, 3], [3, 2]]
    """
    num_experts = len(kept[0])
    out = [[0] * world_size for _ in kept]
    for s, row in enumerate(kept):
        for e, n in enumerate(row):
            out[s][owner(e, num_experts=num_experts, world_size=world_size)] += int(n)
    return out


def alltoall_bytes(kept: list[list[int]], *, rank: int, hidden: int,
                   bytes_per_value: int = BYTES_PER_VALUE) -> dict:
    """Bytes ``rank`` sends to other ranks in one dispatch and in one combine, from the routing
    drawn (``kept[s][e]``, one row per rank): ``{"dispatch": ..., "combine": ...}``.

    A rank of 4 tokens (h = 2, float64) that sends 3 of its 7 kept pairs to the other rank,
    and gets 3 back from it:

    >>> alltoall_bytes([[2, 2, 2, 1], [0, 3, 1, 1]], rank=0, hidden=2, bytes_per_value=8)
    {'dispatch': 48, 'combine': 48}
    """
    rows = rows_between(kept, world_size=len(kept))
    row_bytes = hidden * bytes_per_value
    sent = sum(n for d, n in enumerate(rows[rank]) if d != rank)
    back = sum(rows[s][rank] for s in range(len(kept)) if s != rank)
    return {"dispatch": sent * row_bytes, "combine": back * row_bytes}


def step_bytes(kept: list[list[int]], *, rank: int, hidden: int,
               bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes ``rank`` sends in the all-to-alls of one step (forward and backward): twice its
    dispatch and combine.

    >>> step_bytes([[2, 2, 2, 1], [0, 3, 1, 1]], rank=0, hidden=2, bytes_per_value=8)
    192
    """
    b = alltoall_bytes(kept, rank=rank, hidden=hidden, bytes_per_value=bytes_per_value)
    return 2 * (b["dispatch"] + b["combine"])


def uniform_bytes(*, tokens: int, top_k: int, hidden: int, world_size: int,
                  bytes_per_value: int = BYTES_PER_VALUE) -> float:
    """One dispatch of a rank when the routing is even and nothing is dropped:
    ``T k h B (P−1)/P``.

    >>> uniform_bytes(tokens=256, top_k=2, hidden=128, world_size=2)
    131072.0
    """
    return tokens * top_k * hidden * bytes_per_value * (world_size - 1) / world_size


def imbalance(loads) -> float:
    """max / mean of the loads (1.0: perfectly even; NaN when nothing is loaded).

    >>> imbalance([2, 3, 2, 1])
    1.5
    """
    loads = [float(x) for x in loads]
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else math.nan


def expert_flops(*, rows: int, hidden: int, ffn: int) -> float:
    """FLOPs of forward and backward of the experts over ``rows`` (token, expert) pairs: two
    products of 2·h·f per row forward, twice that backward: ``12 rows h f``.

    >>> expert_flops(rows=160, hidden=128, ffn=512)
    125829120.0
    """
    return 12.0 * rows * hidden * ffn


def router_flops(*, tokens: int, hidden: int, num_experts: int) -> float:
    """FLOPs of forward and backward of the router (one h x E product): ``6 T h E``.

    >>> router_flops(tokens=256, hidden=128, num_experts=4)
    786432.0
    """
    return 6.0 * tokens * hidden * num_experts


def matmul_size(*, rows: int, hidden: int, ffn: int) -> float:
    """The side n of the square product with one expert product's FLOPs (rows x h by h x f):
    where a machine profile's n x n rate is read.

    >>> matmul_size(rows=64, hidden=64, ffn=64)
    64.0
    """
    return round(max(1.0, float(rows) * hidden * ffn) ** (1 / 3), 9)


def alltoall_s(peer_bytes, message_s) -> float:
    """One all-to-all on a rank from a point-to-point message sweep: the exchanges with the
    P−1 peers one after another (gloo's pairwise all-to-all), each as long as one message of
    the larger of the two directions (``peer_bytes``: one number per peer); ``message_s(size)``
    is a one-way message's time (:meth:`labkit.machine.Profile.message_s`).

    >>> round(alltoall_s([4096, 1024], lambda size: 1e-5 + size / 1e9), 9)
    2.512e-05
    """
    return sum(message_s(float(b)) for b in peer_bytes)


def step_model(*, routing_s: float, dispatch_s: float, expert_s: float,
               combine_s: float) -> dict:
    """The step predicted as its four phases in a row, nothing overlapped (each waits for the
    one before): ``{"routing": ..., "dispatch": ..., "experts": ..., "combine": ...,
    "step": sum}`` in seconds.

    >>> round(step_model(routing_s=0.001, dispatch_s=0.002, expert_s=0.01,
    ...                  combine_s=0.002)["step"], 9)
    0.015
    """
    parts = {"routing": routing_s, "dispatch": dispatch_s, "experts": expert_s,
             "combine": combine_s}
    return {**parts, "step": sum(parts.values())}
