"""How long a context-parallel launch runs, estimated before it (pure): :func:`launch_seconds`.

The estimate counts what a launch of :mod:`labkit.cp.worker` does, variant by variant: the
float64 check (the one-process attention over the whole sequence, and the ring), the counted
pass, the timed passes with the ring and with a loopback (the ranks at once), each rank's
passes alone (forward and backward, then forward only, the ranks taking turns), every rank's
share timed on each rank in turn, the exchanges alone, each rank's blocks of each kind alone,
and rank 0's forward over the whole sequence. A pass of the busiest rank costs its ring
steps (:data:`RING_STEP_S`) and its score blocks (:func:`score_seconds`: the softmax's
elementwise work and the two products of depth d, at the machine's matrix-product rate, more
where a block spills out of the caches). With more ranks than cores every rank runs that much
slower. Notebook 10 adds it to the MoE launch's (:func:`labkit.moe.budget.notebook_seconds`).

The constants were fitted on the 2-core machine the lab's budget is set for (torch 2.x, one
thread a rank, gloo, a best matrix-product rate of 48 GFLOP/s): one-thread timings of the ring
pass with a loopback and of the float64 reference (the fastest of 5; S = 64 to 2048, h = 32 to
256, P = 1, 2 and 4, every variant), and whole launches of every variant on 2 ranks (S = 64:
3.6 to 3.9 s; 256: 1.7 to 6.1 s; 512: 4.9 to 7.6 s; 1024: 9.2 to 17 s; 2048: 81 s, the longer
ones with other programs on the cores) and on 4 (S = 256: 5.3 to 11 s).
"""

from __future__ import annotations

from labkit.cp.config import CPConfig
from labkit.cp.formulas import (
    blocks_per_rank,
    chunk_count,
    kinds_computed,
    kv_block_bytes,
    predict_step,
    ring_sends_per_rank,
)
from labkit.machine.formulas import compute_slowdown

#: seconds a launch costs besides its passes: torchrun, importing torch, gloo's rendezvous,
#: the placement table and the row (whole launches on 2 ranks: 3.6 to 3.9 s at S = 64,
#: h = 32; 1.7 to 6.1 s at S = 256, the longer ones with other programs on the cores)
LAUNCH_S = 4.0
#: seconds per ring step of a pass, forward + backward: the loop, the chunks, autograd's nodes
#: (S = 64, h = 32 on 2 ranks: 0.78 ms a pass of 2 ring steps, nearly all of it this)
RING_STEP_S = 3.5e-4
#: FLOPs-equivalent per score of a block besides its two products of depth d (12 d FLOPs
#: forward + backward): the mask, the exponentials, the log-sum-exp, the merge's rescaling.
#: Measured: 9 to 12 ns a score at d = 16 (S = 512 to 2048, blocks up to 8 MB) against a best
#: matrix-product rate of 48 GFLOP/s, so (330 + 12 x 16) / 48e9 = 10.9 ns
SCORE_FLOP = 330.0
#: a block's scores (b H c^2 x 4 bytes) past the caches cost more per score, about
#: 1 + (bytes / SPILL_BYTES)^2 times: 25 ns a score in blocks of 32 MB (S = 2048, full), 9 to
#: 12 ns up to 8 MB; held at SPILL_CAP times beyond (memory's bandwidth; not measured there)
SPILL_BYTES, SPILL_CAP = 28e6, 4.0
#: the float64 check (the ring and the one-process attention) against a float32 pass, per
#: score (the reference: 13 ns a score at S = 256 to 2048)
FLOAT64_FACTOR = 1.5
#: ranks computing at once on their own cores run this much slower than alone
CO_RUN_SLOWDOWN = 1.25
#: seconds per exchange of a K/V block, and bytes per second beside it (gloo on one host:
#: 0.25 to 0.7 ms alone for blocks of 64 to 512 kB between 2 ranks; in a pass an exchange
#: also waits for the other rank, 1 to 4 ms here, which the 1 ms covers in part)
EXCHANGE_S, EXCHANGE_BYTES_PER_S = 1e-3, 1e9


def score_seconds(config: CPConfig, c: int, *, flop_per_s: float) -> float:
    """Seconds per score of a block of c x c scores a head and sequence, forward + backward:
    :data:`SCORE_FLOP` and its two products (12 d FLOPs) at ``flop_per_s``, slower where the
    block's scores spill out of the caches (:data:`SPILL_BYTES`).

    >>> round(score_seconds(CPConfig(), 64, flop_per_s=48e9) * 1e9, 1)   # 128 kB blocks
    10.9
    >>> round(score_seconds(CPConfig(seq_len=2048), 1024, flop_per_s=48e9) * 1e9, 1)
    26.5
    """
    block_bytes = 4 * config.batch_size * config.num_heads * c * c
    spill = min(SPILL_CAP, 1 + (block_bytes / SPILL_BYTES) ** 2)
    return (SCORE_FLOP + 12 * config.head_dim) / flop_per_s * spill


def pass_seconds(config: CPConfig, world_size: int, variant: str, *, flop_per_s: float) -> float:
    """One forward + backward of the ring on the busiest rank of ``world_size`` in float32,
    alone: P ring steps of :data:`RING_STEP_S` and its score blocks of c x c scores a head and
    sequence (:func:`score_seconds` each).

    The notebook's default, balanced causal split on 2 ranks (5 blocks of 128 x 128 scores):

    >>> round(pass_seconds(CPConfig(), 2, "causal_balanced", flop_per_s=48e9) * 1e3, 2)
    7.83
    """
    blocks = max(blocks_per_rank(r, world_size, variant) for r in range(world_size))
    return (world_size * RING_STEP_S
            + blocks * block_seconds(config, world_size, variant, flop_per_s=flop_per_s))


def block_seconds(config: CPConfig, world_size: int, variant: str, *, flop_per_s: float) -> float:
    """One score block's forward + backward, alone: a chunk of c = S / (the variant's chunks)
    queries against c keys, for every sequence and head (:func:`score_seconds` a score).

    >>> round(block_seconds(CPConfig(), 2, "causal_balanced", flop_per_s=48e9) * 1e6, 1)
    1425.9
    """
    c = config.seq_len // chunk_count(world_size, variant)
    return (config.batch_size * config.num_heads * c * c
            * score_seconds(config, c, flop_per_s=flop_per_s))


def launch_seconds(config: CPConfig, world_size: int, *, flop_per_s: float, cores: int) -> float:
    """Wall seconds of one launch of ``world_size`` ranks running every variant of ``config``
    on a machine of ``cores`` cores whose rank multiplies matrices at ``flop_per_s`` alone.

    Per variant, with t the busiest rank's pass alone (:func:`pass_seconds`), s the ``steps``,
    σ the co-run slowdown of P ranks (:data:`CO_RUN_SLOWDOWN`, times P / cores beyond the
    cores), x one exchange of a K/V block (:data:`EXCHANGE_S` and its bytes) and r a pass of
    the ring (σ t + 2(P-1) x, :func:`labkit.cp.formulas.predict_step`): the float64 check,
    σ (t64 + f t) + 2(P-1) x, t64 the one-process attention over the whole sequence and f
    :data:`FLOAT64_FACTOR`; (1 + s) r for the counted and the timed passes; s σ t for the
    loopback's; P a (4/3) t for each rank's passes alone (forward + backward, then forward
    only, the others waiting; a the config's ``alone_warmup + alone_rounds(t)``); P² a t for
    every rank's share timed on each rank in turn (at P > 1); P a' k b
    for each rank's blocks alone (a' the same of b), b one block of c x c scores a head and
    sequence and k the kinds of block the variant computes (full, causal); s (1 + 2(P-1)) x
    for the exchanges alone; a third of the pass over the whole sequence on rank 0
    (P = 1) for its saved bytes. Plus :data:`LAUNCH_S`.

    The notebook's defaults (three variants, S = 512) on 2 cores, then S = 2048, whose
    blocks spill out of the caches:

    >>> round(launch_seconds(CPConfig(), 2, flop_per_s=48e9, cores=2), 1)
    8.1
    >>> round(launch_seconds(CPConfig(seq_len=2048), 2, flop_per_s=48e9, cores=2))
    97
    """
    p, s = world_size, config.steps
    slow = compute_slowdown(p, co_run=CO_RUN_SLOWDOWN, measured_ranks=p, cores=cores)
    whole = config.batch_size * config.num_heads * config.seq_len ** 2
    # the one-process attention works through the scores in blocks of its own: no spill
    reference = FLOAT64_FACTOR * whole * (SCORE_FLOP + 12 * config.head_dim) / flop_per_s
    sends = ring_sends_per_rank(p)
    x = (EXCHANGE_S + kv_block_bytes(batch_size=config.batch_size, seq_len=config.seq_len,
                                      hidden=config.hidden, world_size=p)
         / EXCHANGE_BYTES_PER_S) if p > 1 else 0.0
    total = LAUNCH_S
    for variant in config.variants:
        t = pass_seconds(config, p, variant, flop_per_s=flop_per_s)
        a = config.alone_warmup + config.alone_rounds(t)
        ring = predict_step(compute_alone_s=t, slowdown=slow, exchanges=sends,
                            exchange_s=x)["step_s"]
        total += slow * (reference + FLOAT64_FACTOR * t) + sends * x  # the check
        total += (1 + s) * ring + s * slow * t + p * a * (4 / 3) * t + s * (1 + sends) * x
        total += p * p * a * t if p > 1 else 0.0  # the shares, each on every rank
        total += pass_seconds(config, 1, variant, flop_per_s=flop_per_s) / 3
        b = block_seconds(config, p, variant, flop_per_s=flop_per_s)
        total += p * (config.alone_warmup + config.alone_rounds(b)) * len(
            kinds_computed(p, variant)) * b
    return total
