"""Sharded data parallelism by the numbers: the bytes each rank holds under DDP and ZeRO
stages 1-3, the bytes each moves per step, and the step time predicted from a measured compute
rate and α–β (pure: no torch).

Ψ parameters, N data-parallel ranks (TP degree t divides everything too). Per parameter the
lab holds **fp32** weights (4 bytes), fp32 gradients (4) and Adam's two fp32 moments (8): 16
bytes, no master copy (:data:`LAB_BYTES`). The ZeRO paper's mixed precision holds 2 + 2 + 12
(bf16 weights and gradients; fp32 master weights, m and v: :data:`MIXED_BYTES`). Per rank::

    DDP     (w + g + k) Ψ                 ZeRO-2   w Ψ + (g + k) Ψ / N
    ZeRO-1  (w + g) Ψ + k Ψ / N           ZeRO-3   (w + g + k) Ψ / N     (FSDP)

Communication volume per rank and step, the ZeRO paper's convention (an all-reduce of S bytes
counts 2S: a reduce-scatter then an all-gather; ring algorithms move (N−1)/N of it over each
rank's link)::

    DDP, ZeRO-1, ZeRO-2   all-reduce of the gradients (or reduce-scatter + all-gather)  2 Ψ·4
    ZeRO-3 / FSDP         all-gather forward + all-gather backward + reduce-scatter     3 Ψ·4

so FSDP moves 1.5x DDP's bytes to hold 1/N of the state. The step prediction adds the α–β time
of each collective (:func:`labkit.collectives.formulas.collective_time`, nothing overlapped)
to F / R.
"""

from __future__ import annotations

import math

from labkit.collectives.formulas import collective_time
from labkit.config import one_of, positive_int, positive_number

STAGES = ("ddp", "zero1", "zero2", "zero3")

#: bytes per parameter of this lab: fp32 weights, fp32 gradients, Adam's m and v in fp32
LAB_BYTES = {"param_bytes": 4, "grad_bytes": 4, "optim_bytes": 8}
#: the ZeRO paper's mixed precision: bf16/fp16 weights and gradients, fp32 master, m and v
MIXED_BYTES = {"param_bytes": 2, "grad_bytes": 2, "optim_bytes": 12}


def state_bytes(*, params: float, stage: str, dp: int = 1, tp: int = 1, param_bytes: float = 4,
                grad_bytes: float = 4, optim_bytes: float = 8) -> dict:
    """Bytes of weights, gradients and optimizer states one rank holds (``params``,
    ``gradients``, ``optimizer``, ``total``); defaults: the lab's fp32 Adam (16 bytes/param).

    The ZeRO paper's example, Ψ = 7.5 B on 64 ranks, mixed precision (2 + 2 + 12): 120 GB under
    DDP, 31.4 GB with ZeRO-1, 16.6 GB with ZeRO-2, 1.9 GB with ZeRO-3.

    >>> [round(state_bytes(params=7.5e9, stage=s, dp=64, **MIXED_BYTES)["total"] / 1e9, 1)
    ...  for s in STAGES]
    [120.0, 31.4, 16.6, 1.9]

    The lab's model (1.58 M parameters) on 2 ranks: DDP holds 25.3 MB, FSDP half of it.

    >>> state_bytes(params=1_579_520, stage="ddp")["total"]
    25272320.0
    >>> state_bytes(params=1_579_520, stage="zero3", dp=2)
    {'params': 3159040.0, 'gradients': 3159040.0, 'optimizer': 6318080.0, 'total': 12636160.0}
    """
    one_of("stage", stage, STAGES)
    n, t = positive_int("dp", dp), positive_int("tp", tp)
    shard = params / t if t > 1 else params
    w = shard * param_bytes / (n if stage == "zero3" else 1)
    g = shard * grad_bytes / (n if stage in ("zero2", "zero3") else 1)
    o = shard * optim_bytes / (n if stage != "ddp" else 1)
    return {"params": w, "gradients": g, "optimizer": o, "total": w + g + o}


def collectives_per_step(*, stage: str, unit_bytes,
                         reshard_after_forward: bool = True) -> list[tuple[str, float]]:
    """The collectives of one training step as this lab implements each stage, ``(op, S)``
    with S the whole buffer (nccl-tests: all-reduce buffer, all-gather output, reduce-scatter
    input). ``unit_bytes``: the parameter bytes of each FSDP unit (one per layer here).

    * ``ddp``: one all-reduce of every gradient (DDP cuts it into buckets; the bytes are the same);
    * ``zero1`` (the teaching version): a reduce-scatter of the flat gradients, then an
      all-gather of the updated parameters;
    * ``zero2`` (the teaching version): per unit, a reduce-scatter of its gradients in
      backward, then after the step an all-gather of each unit's updated parameters;
    * ``zero3`` (FSDP2): per unit, an all-gather before its forward, another before its
      backward, a reduce-scatter of its gradients after it (``reshard_after_forward=False``
      keeps the gathered weights from forward to backward: one all-gather less, 2Ψ in all).

    >>> collectives_per_step(stage="zero3", unit_bytes=[100, 100])
    [('all_gather', 100), ('all_gather', 100), ('reduce_scatter', 100), ('all_gather', 100), ('all_gather', 100), ('reduce_scatter', 100)]
    >>> collectives_per_step(stage="ddp", unit_bytes=[100, 100])
    [('all_reduce', 200)]
    """
    one_of("stage", stage, STAGES)
    units = list(unit_bytes)
    total = sum(units)
    if stage == "ddp":
        return [("all_reduce", total)]
    if stage == "zero1":
        return [("reduce_scatter", total), ("all_gather", total)]
    if stage == "zero2":
        return [("reduce_scatter", u) for u in units[::-1]] + [("all_gather", u) for u in units]
    gathers = 2 if reshard_after_forward else 1
    return [c for u in units for c in [("all_gather", u)] * gathers + [("reduce_scatter", u)]]


def volume_bytes(collectives) -> float:
    """Communication volume of ``(op, S)`` pairs, the ZeRO paper's convention: an all-reduce
    counts 2S, an all-gather or a reduce-scatter S.

    FSDP's 3Ψ against DDP's 2Ψ, Ψ = 100 bytes in two units:

    >>> units = [50, 50]
    >>> (volume_bytes(collectives_per_step(stage="zero3", unit_bytes=units))
    ...  / volume_bytes(collectives_per_step(stage="ddp", unit_bytes=units)))
    1.5
    """
    return float(sum((2 if op == "all_reduce" else 1) * s for op, s in collectives))


def comm_volume_bytes(*, params: float, stage: str, bytes_per_param: float = 4) -> float:
    """Per rank and step: 2 Ψ·bytes for DDP and ZeRO-1/2, 3 Ψ·bytes for ZeRO-3 (FSDP).

    >>> comm_volume_bytes(params=1_579_520, stage="zero3") / comm_volume_bytes(
    ...     params=1_579_520, stage="ddp")
    1.5
    """
    one_of("stage", stage, STAGES)
    return (3.0 if stage == "zero3" else 2.0) * params * bytes_per_param


def comm_time(collectives, *, ranks: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """α–β ring time of ``(op, S)`` pairs, one after the other (0 on one rank).

    DDP's all-reduce of 6.3 MB against FSDP's six collectives of 3.2 MB on 2 ranks, α = 100 µs,
    β = 1 GB/s: 6.5 ms and 10.1 ms.

    >>> units = [3_159_040, 3_159_040]
    >>> [round(comm_time(collectives_per_step(stage=s, unit_bytes=units), ranks=2,
    ...                  alpha_s=100e-6, beta_bytes_per_s=1e9) * 1e3, 2) for s in ("ddp", "zero3")]
    [6.52, 10.08]
    """
    if positive_int("ranks", ranks) == 1:
        return 0.0
    positive_number("beta", beta_bytes_per_s)
    return float(sum(collective_time(op=op, ranks=ranks, size_bytes=s, alpha_s=alpha_s,
                                     beta_bytes_per_s=beta_bytes_per_s)
                     for op, s in collectives))


def predict_step(*, flops: float, compute_flop_per_s: float, collectives, ranks: int,
                 alpha_s: float, beta_bytes_per_s: float) -> dict:
    """``compute_s`` = F / R, ``comm_s`` = :func:`comm_time`, ``step_s`` their sum (nothing
    overlapped: an upper bound where DDP hides its all-reduce behind backward). A β not finite (a
    launch's sweep that no α–β line fitted) predicts no communication: NaN, and so the step.

    >>> p = predict_step(flops=1.2e9, compute_flop_per_s=40e9, collectives=[("all_reduce", 1e6)],
    ...                  ranks=2, alpha_s=0.0, beta_bytes_per_s=1e9)
    >>> round(p["compute_s"], 4), round(p["comm_s"], 4), round(p["step_s"], 4)
    (0.03, 0.001, 0.031)
    >>> predict_step(flops=1.2e9, compute_flop_per_s=40e9, collectives=[("all_reduce", 1e6)],
    ...              ranks=2, alpha_s=math.nan, beta_bytes_per_s=math.nan)["step_s"]
    nan
    """
    compute = float(flops) / positive_number("compute rate", compute_flop_per_s)
    if ranks > 1 and not math.isfinite(beta_bytes_per_s):
        comm = math.nan
    else:
        comm = comm_time(collectives, ranks=ranks, alpha_s=alpha_s,
                         beta_bytes_per_s=beta_bytes_per_s) if ranks > 1 else 0.0
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm}


# ---------------------------------------------------------------- memory over a step

def step_memory(*, stage: str, params: float, layers: int, dp: int, layer_activation_bytes: float,
                loss_activation_bytes: float, reshard_after_forward: bool = True) -> dict:
    """The bytes one rank holds at each moment :class:`labkit.fsdp.peak.StepMemory` samples a
    training step (fp32 + Adam, gradients dropped before the step), as this lab's variants
    schedule them; the largest is the step's peak (:func:`peak_bytes`).

    W = 4Ψ weights, U = W/L one layer (an FSDP unit, a ZeRO-2 bucket), O = 8Ψ Adam's moments,
    a one layer's saved activations, N ranks. What is held besides the activations:

    * ``ddp``: W + O + W (DDP's gradient buckets), the gradients growing by U a layer in
      backward: at most 5W after backward (20Ψ);
    * ``zero1``: W + O/N, then the gradients (W), and in the step the flat copy of the
      gradients it reduce-scatters and its slice: 3W + W/N + O/N;
    * ``zero2``: W + O/N; after each layer's backward its U of gradients, their flat copy and
      slice (2U + U/N) beside the slices already kept;
    * ``zero3`` (FSDP2): W/N + O/N; in forward the unit computing, gathered (without
      resharding every unit gathered so far stays); in backward the unit, its U of unsharded
      gradients, the unit FSDP2 prefetches (U, resharding only) and the previous unit's
      reduce-scatter input it keeps (U) -- up to 4U beside the shards, where the textbook's
      transient is one unit (or all of them without resharding: :func:`naive_fsdp_peak_bytes`).

    FSDP2 on 2 ranks, the lab's model (Ψ = 1,579,520, 2 layers of 2.10 MB of activations, the
    loss's 0.26 MB): the peak is the last layer's backward, 21.1 MB either way (with 2 layers
    the unit kept from forward is the one resharding prefetches).

    >>> kw = dict(stage="zero3", params=1_579_520, layers=2, dp=2,
    ...           layer_activation_bytes=2_101_248, loss_activation_bytes=262_144)
    >>> m = step_memory(**kw)
    >>> max(m, key=m.get), round(peak_bytes(**kw) / 1e6, 3), round(m["loss"] / 1e6, 3)
    ('layer 1 backward exit', 21.055, 13.942)
    >>> round(peak_bytes(**kw, reshard_after_forward=False) / 1e6, 3)
    21.055
    >>> round(peak_bytes(**{**kw, "layers": 4}) / 1e6, 1), round(peak_bytes(
    ...     **{**kw, "layers": 4}, reshard_after_forward=False) / 1e6, 1)
    (21.3, 24.5)
    """
    one_of("stage", stage, STAGES)
    n, L = positive_int("dp", dp), positive_int("layers", layers)
    w, o = 4.0 * params, 8.0 * params
    u, a = w / L, float(layer_activation_bytes)
    part = u / n if n > 1 else 0.0  # a reduce-scatter's output (one rank: the input itself)
    base = {"ddp": w + o + w, "zero1": w + o / n, "zero2": w + o / n,
            "zero3": w / n + o / n}[stage]
    keep = stage == "zero3" and not reshard_after_forward
    out = {}
    for i in range(L):
        gathered = ((i + 1) * u if keep else u) if stage == "zero3" else 0.0
        out[f"layer {i} forward exit"] = base + gathered + (i + 1) * a
    out["loss"] = base + (L * u if keep else 0.0) + L * a + loss_activation_bytes
    for i in reversed(range(L)):
        if stage in ("ddp", "zero1"):
            out[f"layer {i} backward exit"] = base + (L - i) * u + i * a
        elif stage == "zero2":
            out[f"zero2 reduce-scatter {i}"] = base + (L - 1 - i) * u / n + 2 * u + part + i * a
        else:
            held = base + ((i + 1) * u if keep else u) + (L - 1 - i) * u / n
            held += (u if not keep and i > 0 else 0.0) + (u if i < L - 1 else 0.0)
            out[f"layer {i} backward entry"] = held + (i + 1) * a
            out[f"layer {i} backward exit"] = held + u + i * a
    if stage == "zero1":
        out["zero1 reduce-scatter"] = base + w + w + (w / n if n > 1 else 0.0)
    grads = {"ddp": w, "zero1": w}.get(stage, w / n)
    out["after step"] = base + grads
    return out


def peak_bytes(**kw) -> float:
    """The largest of :func:`step_memory` (same arguments): the step's peak on one rank."""
    return max(step_memory(**kw).values())


def naive_fsdp_peak_bytes(*, params: float, layers: int, dp: int, activation_bytes: float,
                          reshard_after_forward: bool = True) -> float:
    """The textbook's FSDP peak: the shards (16Ψ/N less the gradients, dropped before the
    step), the activations, and a transient of one unit's full weights (all of them without
    resharding after forward). FSDP2's own schedule holds more (:func:`step_memory`).

    >>> round(naive_fsdp_peak_bytes(params=1_579_520, layers=2, dp=2,
    ...                             activation_bytes=4_464_640) / 1e6, 3)
    17.101
    """
    w = 4.0 * params
    transient = w / positive_int("layers", layers) if reshard_after_forward else w
    return w / dp + 8.0 * params / dp + activation_bytes + transient


def checkpoint_step_ratio(*, forward_share: float = 1 / 3) -> float:
    """Activation checkpointing's step against the plain one: one more forward, a
    ``forward_share`` of forward + backward (1/3 when backward costs twice the forward).

    >>> round(checkpoint_step_ratio(), 4), checkpoint_step_ratio(forward_share=0.5)
    (1.3333, 1.5)
    """
    return 1.0 + forward_share
