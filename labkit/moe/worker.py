"""Expert-parallel lab, rank side: one launch of P ranks, E/P experts on each.

Run by hand (``labkit moe`` / :func:`labkit.moe.run.run` build the same command, one launch per
world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.moe.worker \\
        --config '{"num_experts": 4, "top_k": 2, "hidden": 128, "tokens": 256}' --out moe.json

What one launch does, every rank on its own seeded tokens:

1. **the one-process reference**: every rank builds the whole layer and every rank's tokens
   from the seed and runs each expert on every token (:func:`labkit.moe.layer.reference`), in
   float64, forward and backward;
2. **correctness first**: the expert-parallel layer in float64, one forward and backward,
   compared with it: this rank's output and input gradient, the router's gradient (summed over
   the ranks: each holds the router whole and sees its own tokens) and the gradients of this
   rank's experts (``matches_single_process``, ``max_rel_error``: the worst rank's);
3. in float32: one step with every all-to-all **counted** (bytes leaving this rank, per call),
   beside the counts of the routing it drew (routed and kept per expert, on every rank); then
   ``steps`` steps, the first ``warmup`` untimed, each timed on every rank with its four phases
   (routing, dispatch, expert compute, combine: each forward and backward), the slowest rank's
   step taken (:func:`labkit.timing.summarize`); each phase's start and end in every timed
   step too (:class:`SpanWatch`), and each all-to-all's (the split sizes' and the four of
   rows: one clock reading before and after each), those of the median step gathered to rank
   0 on one clock (its trace, :mod:`labkit.moe.trace`; the all-to-alls that waited for the
   scheduler, :mod:`labkit.moe.waits`);
4. at P > 1, each phase's local work timed on each rank alone (:func:`local_phases`: the
   all-to-alls the identity), what the step model takes for the routing and the permutations.

Every tensor handed to torch.distributed lives on the rank's device; the row carries its
device memory peak (None on a CPU).
"""

from __future__ import annotations

import math
import socket
import statistics
import time

import torch
import torch.distributed as dist

from labkit import runtime, timing, trace
from labkit.harness import worker_main
from labkit.machine.formulas import median_index
from labkit.moe import formulas
from labkit.moe.budget import LOCAL_STEPS
from labkit.moe.config import MoEConfig
from labkit.moe.formulas import PHASES
from labkit.moe.layer import STEP_ORDER, ExpertLayer, init_weights, reference


class SpanWatch(timing.Stopwatch):
    """A :class:`labkit.timing.Stopwatch` (the same totals, the same synchronisations around
    each clock read) that also keeps every span it timed: ``spans``, (name, start_s, end_s) in
    seconds since it was made, and ``origin_s``, that moment on this machine's monotonic clock.
    ``calls``: the all-to-alls a :class:`CountedAllToAll` stamped meanwhile (tag, start, end),
    as :func:`labkit.timing.stamp` readings (events on CUDA: no synchronisation inside a
    phase); :meth:`call_spans` gives them in seconds, once the step is over.
    """

    def __init__(self, device):
        super().__init__(device)
        runtime.sync(self._device())
        self.origin = timing.stamp(self._device())
        # on a CPU a stamp is the host clock: one reading is the origin of the spans and the
        # calls alike, so a call stamped as its phase begins never reads as before the phase
        self.origin_s = self.origin if isinstance(self.origin, float) else time.perf_counter()
        self.spans: list[tuple[str, float, float]] = []
        self.calls: list[tuple] = []

    def call_spans(self) -> list[tuple[str, float, float]]:
        """The stamped all-to-alls as (tag, start_s, end_s) since the watch was made (after the
        step: every phase ends with a synchronisation, so every event has been reached)."""
        since = timing.seconds_between
        return [(tag, since(self.origin, a), since(self.origin, b)) for tag, a, b in self.calls]

    def __exit__(self, *exc) -> None:
        runtime.sync(self._device())
        now = time.perf_counter()
        name = self._name or "total"
        self.totals[name] = self.totals.get(name, 0.0) + now - self._t0
        self.spans.append((name, self._t0 - self.origin_s, now - self.origin_s))


def _timeline(rt, seconds: float, watch: SpanWatch) -> tuple[list, list] | None:
    """One timed step's phases and all-to-alls of every rank (``watch``: this rank's,
    ``seconds`` its step) on one clock from the first rank's start, on rank 0 (None on the
    others): the phases, each a dict of ``rank, phase, direction``
    (:data:`labkit.moe.layer.STEP_ORDER`), ``start_s, end_s``; the all-to-alls, each a dict of
    ``rank, call`` (its place in the step), ``tag, start_s, end_s``. Collective."""
    names = [name for name, _, _ in watch.spans]
    if names != [phase for phase, _ in STEP_ORDER]:
        raise RuntimeError(f"the layer timed its phases in the order {names}, not STEP_ORDER's")
    spans = [{"phase": phase, "direction": direction, "start_s": a, "end_s": b}
             for (_, a, b), (phase, direction) in zip(watch.spans, STEP_ORDER)]
    calls = [{"call": i, "tag": tag, "start_s": a, "end_s": b}
             for i, (tag, a, b) in enumerate(watch.call_spans())]
    mine = (seconds, spans, calls, watch.origin_s, socket.gethostname())
    gathered = [mine]
    if rt.world_size > 1:
        gathered = [None] * rt.world_size
        dist.all_gather_object(gathered, mine)
    if rt.rank != 0:
        return None
    # the ranks of one host share its monotonic clock: the first rank's start is the origin
    starts, hosts = [g[3] for g in gathered], [g[4] for g in gathered]
    return (trace.on_one_clock([g[1] for g in gathered], starts=starts, hosts=hosts),
            trace.on_one_clock([g[2] for g in gathered], starts=starts, hosts=hosts))


class CountedAllToAll:
    """``dist.all_to_all_single`` of rows, wrapped: every call's tag and the bytes that leave
    this rank (the rows for other ranks; those for itself stay), and the split-size exchanges
    apart. :meth:`reset` clears them. With a ``watch`` (a :class:`SpanWatch`), every call of
    either kind is stamped into it as it starts and ends (tag ``counts`` for the split sizes)."""

    def __init__(self, rank: int, world_size: int, device=None):
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device or "cpu")
        self.watch: SpanWatch | None = None
        self.reset()

    def _stamped(self, tag: str, call) -> None:
        if self.watch is None:
            call()
            return
        start = timing.stamp(self.device)
        call()
        self.watch.calls.append((tag, start, timing.stamp(self.device)))

    def reset(self) -> None:
        self.calls: list[tuple[str, int]] = []  # (tag, bytes leaving this rank)
        self.count_calls = 0

    def __call__(self, x: torch.Tensor, send: list, recv: list, tag: str) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty((sum(recv), *x.shape[1:]))
        self._stamped(tag, lambda: dist.all_to_all_single(out, x, output_split_sizes=recv,
                                                          input_split_sizes=send))
        row = math.prod(x.shape[1:]) * x.element_size()  # a rank may send no rows at all
        self.calls.append((tag, (sum(send) - send[self.rank]) * row))
        return out

    def counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Rows for each expert of each rank out, what each rank sends this one's back."""
        out = torch.empty_like(counts)
        self._stamped("counts", lambda: dist.all_to_all_single(out, counts.contiguous()))
        self.count_calls += 1
        return out


def _gather(rt, t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` stacked (P, ...), on every rank (on the host afterwards)."""
    if rt.world_size == 1:
        return t[None].cpu()
    every = [torch.empty_like(t) for _ in range(rt.world_size)]
    dist.all_gather(every, t.contiguous())
    return torch.stack(every).cpu()


def _rel_error(pairs, scale: float | None = None) -> float:
    """Largest max|got - want| / scale (default: each want's max|want|)."""
    worst = 0.0
    for got, want in pairs:
        if not want.numel():
            continue
        norm = float(want.abs().max()) if scale is None else scale
        err = float((got.double() - want.double()).abs().max())
        worst = max(worst, err / norm if norm > 0 else err)
    return worst


def _check(rt, cfg: MoEConfig, weights: dict, x_all, grad_all, cap: int, comm) -> float:
    """The expert-parallel layer in float64 against :func:`reference`: the worst rank's
    largest relative difference. Collective."""
    ref = reference(weights, x_all, grad_all, top_k=cfg.top_k, capacity=cap,
                    renormalize=cfg.renormalize)
    layer = ExpertLayer(weights, rank=rt.rank, world_size=rt.world_size, top_k=cfg.top_k,
                        capacity=cap, renormalize=cfg.renormalize, device=rt.device,
                        dtype=torch.float64, **comm)
    x = x_all[rt.rank].clone().requires_grad_(True)
    out = layer.step(x, grad_all[rt.rank])
    router = layer.params["router"].grad
    if rt.world_size > 1:
        dist.all_reduce(router)
    part = slice(layer.first, layer.first + layer.local)
    grads = [(router, ref["grads"]["router"])] + [
        (layer.params[k].grad, ref["grads"][k][part]) for k in ("w1", "b1", "w2", "b2")]
    scale = max(float(g.abs().max()) for g in ref["grads"].values())
    err = max(_rel_error([(out, ref["out"][rt.rank]), (x.grad, ref["x_grad"][rt.rank])]),
              _rel_error(grads, scale=scale))
    worst = torch.tensor([err], dtype=torch.float64, device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst.item())


def local_phases(rt, cfg: MoEConfig, weights: dict, x, go, cap: int, *,
                 reps: int = LOCAL_STEPS - 1) -> dict:
    """Each phase's local work, timed on each rank **alone** (the ranks in turn, the others in a
    barrier): the same layer, tokens and routing with its all-to-alls the identity (the rows
    stay on the rank: its experts compute as many rows as it routed), the median of ``reps``
    steps after one untimed, the slowest rank's per phase (``{phase}_local_alone_s``). What
    the step model takes, beside the profile's transfers, for the routing and for the
    permutations around the all-to-alls, which its FLOPs leave out. Collective."""
    local = ExpertLayer(weights, rank=rt.rank, world_size=rt.world_size, top_k=cfg.top_k,
                        capacity=cap, renormalize=cfg.renormalize, device=rt.device,
                        dtype=torch.float32)
    mine = dict.fromkeys(PHASES, 0.0)
    for turn in range(rt.world_size):
        if rt.rank == turn:
            samples = []
            for _ in range(reps + 1):
                sw = timing.Stopwatch(rt.device)
                local.zero_grad()
                x.grad = None
                local.step(x, go, sw)
                samples.append(dict(sw.totals))
            mine = {ph: statistics.median(t.get(ph, 0.0) for t in samples[1:]) for ph in PHASES}
        dist.barrier()
    return {f"{ph}_local_alone_s": timing.worst_over_ranks(rt, mine[ph]) for ph in PHASES}


def on_rank(rt: runtime.Runtime, cfg: MoEConfig) -> dict:
    p, dev = rt.world_size, rt.device
    e, h, f, t = cfg.num_experts, cfg.hidden, cfg.expert_width, cfg.tokens
    cap = formulas.capacity(tokens=t, top_k=cfg.top_k, num_experts=e,
                            capacity_factor=cfg.capacity_factor)
    weights = {k: v.to(dev) for k, v in init_weights(num_experts=e, hidden=h, ffn=f,
                                                     seed=cfg.seed).items()}
    g = torch.Generator().manual_seed(cfg.seed + 1)
    x_all = torch.randn(p, t, h, generator=g, dtype=torch.float64).to(dev)
    grad_all = torch.randn(p, t, h, generator=g, dtype=torch.float64).to(dev)
    counter = CountedAllToAll(rt.rank, p, dev)
    comm = {"exchange": counter, "exchange_counts": counter.counts} if p > 1 else {}
    runtime.reset_device_peak(dev)
    err = _check(rt, cfg, weights, x_all, grad_all, cap, comm)  # before any timing

    layer = ExpertLayer(weights, rank=rt.rank, world_size=p, top_k=cfg.top_k, capacity=cap,
                        renormalize=cfg.renormalize, device=dev, dtype=torch.float32, **comm)
    x = x_all[rt.rank].float().requires_grad_(True)
    go = grad_all[rt.rank].float()
    phases: list[dict] = []
    watches: list[SpanWatch] = []

    def step(clock=None):
        layer.zero_grad()
        x.grad = None
        layer.step(x, go, clock)

    counter.reset()
    step()  # counted: the first warm-up step
    calls, count_calls = list(counter.calls), counter.count_calls
    routing = layer.last
    for _ in range(max(0, cfg.warmup - 1)):
        step()

    def timed():
        sw = SpanWatch(dev)
        counter.watch = sw  # each all-to-all of the step, stamped as it starts and ends
        step(sw)
        counter.watch = None
        phases.append(dict(sw.totals))
        watches.append(sw)

    local = timing.repeat_timed(timed, warmup=0, repeat=cfg.measured_steps, device=dev)
    stats = timing.summarize(local)
    slowest, _ = timing.slowest_step_times(local)
    middle = median_index(slowest)
    timeline, a2a_timeline = _timeline(rt, local[middle], watches[middle]) or (None, None)
    medians = torch.tensor([statistics.median(s.get(ph, 0.0) for s in phases) for ph in PHASES],
                           dtype=torch.float64, device=dev)
    by_rank = _gather(rt, medians).tolist()
    counts = _gather(rt, torch.stack([routing.routed, routing.kept])).tolist()
    sent = _gather(rt, torch.tensor([b for _, b in calls] or [0], dtype=torch.int64,
                                    device=dev)).tolist()
    alone = local_phases(rt, cfg, weights, x, go, cap) if p > 1 else {}
    peak = runtime.max_device_peak_bytes(dev)
    if rt.rank != 0:
        return {}
    kept = [c[1] for c in counts]
    formula = [formulas.alltoall_bytes(kept, rank=r, hidden=h) for r in range(p)]
    by_call = [[fm["dispatch"], fm["combine"], fm["dispatch"], fm["combine"]] if p > 1 else []
               for fm in formula]
    slow_rank = max(range(p), key=lambda r: sum(by_rank[r]))
    row = {
        **cfg.describe(),
        "world_size": p,
        "experts_per_rank": e // p,
        "capacity": cap,
        "num_params": sum(v.numel() for v in weights.values()),
        "params_per_rank": sum(v.numel() for v in layer.params.values()),
        "matches_single_process": bool(err <= cfg.tolerance),
        "max_rel_error": err,
        "routed_by_rank": [c[0] for c in counts],
        "kept_by_rank": kept,
        "a2a_calls_measured": len(calls),
        "a2a_calls_formula": formulas.PAYLOAD_ALLTOALLS if p > 1 else 0,
        "a2a_tags": [tag for tag, _ in calls],
        "count_exchange_calls": count_calls,
        "a2a_bytes_by_call_measured": [s[:len(calls)] for s in sent],
        "a2a_bytes_by_call_formula": by_call,
        **stats,
        "step_times_s": [float(v) for v in slowest],
        "phase_times_by_rank": [dict(zip(PHASES, r)) for r in by_rank],
        "phase_rank": slow_rank,
        "timeline_s": timeline,
        "timeline_step": middle + 1,
        "a2a_timeline_s": a2a_timeline if p > 1 else None,
        **{f"{ph}_time_s": by_rank[slow_rank][i] for i, ph in enumerate(PHASES)},
        **alone,
        "device_memory_peak_bytes": peak,
    }
    from labkit.moe.report import derived_fields

    return {"rows": [{**row, **derived_fields(row)}]}


if __name__ == "__main__":
    worker_main(on_rank, MoEConfig)
