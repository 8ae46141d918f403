"""Context-parallel lab, rank side: one launch of P ranks runs every variant of the config.

Run by hand (``labkit cp`` / :func:`labkit.cp.run.run` build the same command, one launch
per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.cp.worker \\
        --config '{"seq_len": 256, "variants": ["causal_balanced"]}' --out cp.json

Per variant, every rank on the same seeded Q, K, V (b, H, S, d) and output gradient:

1. **correctness first**, in float64: the one-process attention
   (``scaled_dot_product_attention``), output and Q/K/V gradients, against this rank's share of
   the ring's (the gradients by autograd through the ring code); the worst rank's error;
2. one forward + backward in float32 with every send counted (:class:`labkit.cp.comm.Ring`)
   and what autograd saves measured (:class:`labkit.memory.SavedActivations`), with rank 0
   measuring the same code on one rank, the whole sequence, beside it;
3. ``steps`` timed passes (the first ``warmup`` untimed), the slowest rank's, each ring
   step's moments recorded (:class:`labkit.cp.timeline.RingClock`) and those of the median
   pass gathered to rank 0 on one clock (its trace, :mod:`labkit.cp.trace`); the same with
   the messages replaced by a loopback (the compute, ranks together); each rank's compute
   **alone** (the ranks taking turns: the work of each rank, forward + backward and forward
   only), and one score block of each kind the variant computes, forward + backward, alone
   (what a rank's compute is made of: :func:`labkit.cp.formulas.rank_compute`), and every
   rank's share timed on each rank in turn (the work's imbalance on one core); one K/V
   exchange alone, and the 2(P-1) exchanges of a pass alone (the messages).

Everything lives on the rank's device.
"""

from __future__ import annotations

import socket
import statistics

import torch
import torch.distributed as dist

from labkit import runtime, timing, trace
from labkit.cp import formulas
from labkit.cp.comm import Ring
from labkit.cp.config import CPConfig
from labkit.cp.ring import block_attention, local_chunks, loopback, reference, ring_attention
from labkit.cp.timeline import NO_CLOCK, RingClock
from labkit.harness import worker_main
from labkit.machine.formulas import median_index
from labkit.memory import SavedActivations


def _inputs(cfg: CPConfig, dtype, device):
    """Q, K, V and the output gradient of the whole sequence, the same on every rank."""
    g = torch.Generator().manual_seed(cfg.seed)
    shape = (cfg.batch_size, cfg.num_heads, cfg.seq_len, cfg.head_dim)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
            for _ in range(4)]


def _local(rt, cfg, variant, tensors, rank: int | None = None):
    """This rank's chunks of each tensor (or rank ``rank``'s), as leaves that take gradients."""
    r = rt.rank if rank is None else rank
    return [local_chunks(t, r, rt.world_size, variant).detach().requires_grad_()
            for t in tensors]


def _ring(rt):
    return Ring(rt.rank, rt.world_size) if rt.world_size > 1 else loopback


def check(rt, cfg: CPConfig, variant: str) -> float:
    """Largest relative difference, over output and Q/K/V gradients, between this rank's share
    of the ring and one process's attention (float64); the worst rank's. Collective."""
    q, k, v, go = _inputs(cfg, torch.float64, rt.device)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference(*full, variant=variant)
    want_grads = torch.autograd.grad(want, full, go)
    ql, kl, vl = _local(rt, cfg, variant, (q, k, v))
    got = ring_attention(ql, kl, vl, rank=rt.rank, world_size=rt.world_size, variant=variant,
                         exchange=_ring(rt))
    got.backward(local_chunks(go, rt.rank, rt.world_size, variant))
    worst = 0.0
    for mine, whole in zip((got, ql.grad, kl.grad, vl.grad), (want, *want_grads)):
        ref = local_chunks(whole, rt.rank, rt.world_size, variant)
        worst = max(worst, float((mine.detach() - ref).abs().max() / ref.abs().max()))
    return _max_over_ranks(rt, worst)


def _max_over_ranks(rt, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _every_rank(value: float) -> list[float]:
    """Every rank's ``value``, in rank order, on every rank. Collective."""
    return [float(x) for x in timing.gather_samples([value])[:, 0]]


def _pass(rt, cfg, variant, leaves, go, exchange, *, backward: bool = True, clock=None,
          share: int | None = None):
    """One forward (+ backward) of the ring on ``leaves``: this rank's chunks, or those of rank
    ``share`` (with a loopback: that rank's arithmetic on this core)."""
    ql, kl, vl = leaves
    if clock is not None:
        clock.start()
    out = ring_attention(ql, kl, vl, rank=rt.rank if share is None else share,
                         world_size=rt.world_size, variant=variant, exchange=exchange,
                         clock=clock or NO_CLOCK)
    if backward:
        out.backward(go)
        for t in leaves:
            t.grad = None


def _rounds(rt, k: int, fns) -> list[list[float]]:
    """``k`` rounds in which each rank in turn times every one of ``fns`` once (the others
    waiting), each round starting at the next function (the first call after the barrier ran
    about 10% slower here: no function takes that place every round): this rank's samples,
    per function."""
    got = [[] for _ in fns]
    for j in range(k):
        for turn in range(rt.world_size):
            if turn == rt.rank:
                for i in (*range(j % len(fns), len(fns)), *range(j % len(fns))):
                    got[i] += timing.repeat_timed(fns[i], warmup=0, repeat=1, device=rt.device,
                                                  barrier=False)
            if rt.world_size > 1:
                dist.barrier()
    return got


def _medians_alone(rt, cfg, fns) -> list[float]:
    """This rank's median of each of ``fns`` over :func:`_rounds`: ``cfg.alone_warmup`` rounds
    untimed, then :meth:`~labkit.cp.config.CPConfig.alone_rounds` of the slowest call of any
    rank's warm-up. Collective."""
    warm = timing.worst_over_ranks(rt, max(max(x) for x in _rounds(rt, cfg.alone_warmup, fns)))
    return [statistics.median(x) for x in _rounds(rt, cfg.alone_rounds(warm), fns)]


def _shares_alone(rt, cfg, variant, whole) -> list[float]:
    """Every rank's share of the pass (forward + backward, loopback) timed alone on *each* rank
    in turn, the shares interleaved within a turn: per share, the ranks' median, in rank
    order. A ratio of these is the work's: the same core times every share (on this shared VM
    one vCPU ran 1.3-1.8x slower than the other through a whole launch, which a ratio of
    each rank's compute on its own core takes for imbalance). Collective."""
    p = rt.world_size
    fns = []
    for r in range(p):
        leaves = _local(rt, cfg, variant, whole[:3], rank=r)
        gol = local_chunks(whole[3], r, p, variant)
        fns.append(lambda lv=leaves, g=gol, r=r: _pass(rt, cfg, variant, lv, g, loopback,
                                                      share=r))
    per_rank = timing.gather_samples(_medians_alone(rt, cfg, fns))  # (ranks, shares)
    return [float(statistics.median(per_rank[:, r])) for r in range(p)]


def _alone(rt, cfg, fn) -> list[float]:
    """Each rank's median time of ``fn`` with the others waiting, in rank order. The turns
    are interleaved, one call each a round (``cfg.alone_warmup`` rounds untimed, then
    :meth:`~labkit.cp.config.CPConfig.alone_rounds` of the slowest rank's warm-up call): the
    ranks' times are compared with each other, and a burst of the machine's noise then falls on
    every rank's samples alike, not on one rank's whole turn."""
    return _every_rank(_medians_alone(rt, cfg, [fn])[0])


def _block_times(rt, cfg: CPConfig, variant: str) -> dict:
    """One score block of each kind ``variant`` computes (c x c scores a head and sequence, c
    its chunks' length; ``causal``: a chunk against itself, under the mask), forward +
    backward of its output, each rank's median alone (:func:`_alone`): {kind: the median over
    ranks}. Collective."""
    c = cfg.seq_len // formulas.chunk_count(rt.world_size, variant)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    shape = (cfg.batch_size, cfg.num_heads, c, cfg.head_dim)
    q, k, v, go = [torch.randn(shape, generator=g).to(rt.device) for _ in range(4)]
    leaves = [t.requires_grad_() for t in (q, k, v)]
    kinds = formulas.kinds_computed(rt.world_size, variant)
    out = {}
    for kind in sorted(kinds):
        def one(causal=kind == "causal"):
            o, _ = block_attention(*leaves, causal=causal)
            o.backward(go)
            for t in leaves:
                t.grad = None

        out[kind] = statistics.median(_alone(rt, cfg, one))
    return out


def _timed(rt, cfg, fn, prefix: str) -> dict:
    local = timing.repeat_timed(fn, warmup=cfg.warmup, repeat=cfg.measured_steps,
                                device=rt.device)
    return timing.summarize(local, prefix=prefix)


def _traced(rt, cfg, fn, clock: RingClock) -> dict:
    """:func:`_timed` of the ring pass ``fn`` (which starts a pass of ``clock`` each call), and
    the timeline of its median timed pass (the slowest rank's median; the lower one of an even
    count): ``timeline_s``, every rank's slices on one clock from the first rank's start, on
    rank 0 (None on the others), and ``timeline_step``, which timed pass it is (1: the
    first). Collective."""
    local = timing.repeat_timed(fn, warmup=cfg.warmup, repeat=cfg.measured_steps,
                                device=rt.device)
    slowest, _ = timing.slowest_step_times(local)
    k = median_index(slowest)
    origin, spans = clock.spans(len(clock.passes) - cfg.measured_steps + k)
    mine = (local[k], spans, origin, socket.gethostname())
    gathered = [mine]
    if rt.world_size > 1:
        gathered = [None] * rt.world_size
        dist.all_gather_object(gathered, mine)
    timeline = None
    if rt.rank == 0:  # the ranks of one host share its monotonic clock
        timeline = trace.on_one_clock([sp for _, sp, _, _ in gathered],
                                       starts=[o for _, _, o, _ in gathered],
                                       hosts=[host for _, _, _, host in gathered])
    return {**timing.summarize(local, prefix="step_time"), "timeline_s": timeline,
            "timeline_step": k + 1}


def _saved_one_rank(cfg, variant, device) -> int:
    """What autograd saves in the same code on one rank holding the whole sequence."""
    q, k, v, _ = _inputs(cfg, torch.float32, device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    with SavedActivations(exclude=leaves) as meter:
        out = ring_attention(*leaves, rank=0, world_size=1, variant=variant, exchange=loopback)
    saved = meter.live_bytes
    del out
    return saved


def measure(rt, cfg: CPConfig, variant: str) -> dict:
    """The counted pass, the memory and the timings of one variant (float32). Collective."""
    p = rt.world_size
    q, k, v, go = _inputs(cfg, torch.float32, rt.device)
    leaves = _local(rt, cfg, variant, (q, k, v))
    gol = local_chunks(go, rt.rank, p, variant)
    ring = _ring(rt)
    with SavedActivations(exclude=[*leaves, gol]) as meter:
        out = ring_attention(*leaves, rank=rt.rank, world_size=p, variant=variant, exchange=ring)
    saved = _every_rank(meter.live_bytes)
    out.backward(gol)
    del out
    counts = ({"ring_bytes_forward_measured": ring.bytes["forward"],
               "ring_bytes_backward_measured": ring.bytes["backward"],
               "ring_sends_forward_measured": ring.sends["forward"],
               "ring_sends_backward_measured": ring.sends["backward"]} if p > 1 else
              dict.fromkeys(("ring_bytes_forward_measured", "ring_bytes_backward_measured",
                             "ring_sends_forward_measured", "ring_sends_backward_measured"), 0))
    for t in leaves:
        t.grad = None
    clock = RingClock(rt.device)
    if p > 1:
        ring.clock = clock  # the backward's exchanges
    steps = _traced(rt, cfg, lambda: _pass(rt, cfg, variant, leaves, gol, ring, clock=clock),
                    clock)
    compute = _timed(rt, cfg, lambda: _pass(rt, cfg, variant, leaves, gol, loopback),
                     "compute_time")
    alone = _alone(rt, cfg, lambda: _pass(rt, cfg, variant, leaves, gol, loopback))
    forward = _alone(rt, cfg, lambda: _pass(rt, cfg, variant, leaves, gol, loopback,
                                            backward=False))
    shares = _shares_alone(rt, cfg, variant, (q, k, v, go)) if p > 1 else alone
    block_s = _block_times(rt, cfg, variant)
    kb, vb = (local_chunks(t, rt.rank, p, variant) for t in (k, v))
    if p > 1:
        one = _timed(rt, cfg, lambda: ring.exchange_alone(kb, vb), "t")["t_p50_s"]
        n = formulas.ring_sends_per_rank(p)  # 2(P-1) exchanges a step: forward and backward

        def messages():
            for _ in range(n):
                ring.exchange_alone(kb, vb)

        msgs = _timed(rt, cfg, messages, "t")["t_p50_s"]
    else:
        one = msgs = 0.0
    one_rank = _saved_one_rank(cfg, variant, rt.device) if rt.rank == 0 else None
    return {**counts, "saved_bytes_per_rank_measured": saved,
            "saved_bytes_measured": max(saved), "saved_bytes_one_rank_measured": one_rank,
            **steps, **compute, "compute_alone_per_rank_s": alone,
            "compute_alone_s": max(alone), "forward_alone_per_rank_s": forward,
            "share_alone_s": shares,
            "block_time_alone_s": block_s,
            "exchange_time_s": one, "message_time_s": msgs}


def on_rank(rt: runtime.Runtime, cfg: CPConfig) -> dict:
    p = rt.world_size
    b, s, h = cfg.batch_size, cfg.seq_len, cfg.hidden
    rows = []
    for variant in cfg.variants:
        err = check(rt, cfg, variant)  # before any timing
        runtime.reset_device_peak(rt.device)
        got = measure(rt, cfg, variant)
        rows.append({
            **cfg.describe(), "variant": variant, "world_size": p,
            "matches_single_process": bool(err <= cfg.tolerance), "max_rel_error": err,
            "chunks": formulas.chunk_count(p, variant),
            "blocks_per_rank": [formulas.blocks_per_rank(r, p, variant) for r in range(p)],
            "block_kinds_per_rank": [formulas.block_kinds(r, p, variant) for r in range(p)],
            "kv_block_bytes": formulas.kv_block_bytes(batch_size=b, seq_len=s, hidden=h,
                                                      world_size=p),
            "ring_bytes_formula": formulas.ring_bytes_per_rank(batch_size=b, seq_len=s,
                                                               hidden=h, world_size=p),
            "ring_sends_formula": formulas.ring_sends_per_rank(p),
            "saved_bytes_formula": formulas.saved_bytes_per_rank(
                batch_size=b, seq_len=s, hidden=h, num_heads=cfg.num_heads, world_size=p,
                variant=variant),
            "saved_bytes_one_rank_formula": formulas.saved_bytes_per_rank(
                batch_size=b, seq_len=s, hidden=h, num_heads=cfg.num_heads, world_size=1,
                variant=variant),
            "flops_per_rank": formulas.flops_per_rank(batch_size=b, seq_len=s, hidden=h,
                                                      world_size=p, variant=variant),
            **got,
            "device_memory_peak_bytes": runtime.max_device_peak_bytes(rt.device),
        })
    return {"rows": rows} if rt.rank == 0 else {}


if __name__ == "__main__":
    worker_main(on_rank, CPConfig)
