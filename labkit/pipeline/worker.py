"""Pipeline parallelism on P ranks: measured bubbles of GPipe, 1F1B and interleaved 1F1B.

Run by hand (``labkit pipeline`` builds the same command, one launch per P)::

    torchrun --standalone --nproc-per-node=2 -m labkit.pipeline.worker \\
        --config '{"schedules": ["naive_gpipe", "gpipe", "1f1b"], "microbatches": [2, 4]}'

A stack of ``layers`` Linear+tanh blocks is split into P stages, one per rank (P·V chunks,
looped over the ranks, for ``interleaved``). ``naive_gpipe`` is the teaching version: all
forwards with blocking send/recv, then all backwards. ``gpipe``, ``1f1b``, ``interleaved`` and
``zero_bubble`` are ``torch.distributed.pipelining``'s ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble with one stage per rank (ZB-H1:
the backward split into an input-gradient pass B and a weight-gradient pass W). ``gpipe`` and
``1f1b`` post every receive of a step at its start unless ``recv_ahead`` is off
(:mod:`labkit.pipeline.ahead`: on gloo a message moves only once its receive is posted).

Every stage module is wrapped so that each forward and backward of a microbatch (and each W)
records its start and end on this rank's clock, relative to the step's start (after a
barrier); ranks on one host are put on one clock (``time.perf_counter`` is the machine's
monotonic clock). On CUDA the blocks are CUDA events read after the step, and the step's
clock reads follow a synchronisation. Model, batch and reference live on the rank's device;
rows carry the point's device memory peak (None on a CPU) and stage 0's peak of saved
activations over the timed steps (:class:`labkit.memory.SavedActivations`, open during each
timed step: a few microseconds per saved tensor). Per step: busy = Σ (forward +
backward) on a rank, step time = the step's span on one clock (the first rank's start to the
last rank's end; across hosts, the slowest rank's own step), bubble = 1 − Σ_ranks busy / (P ×
step time), and the timeline's split into compute, fill/drain bubble and the rest
(:func:`labkit.pipeline.formulas.timeline_split`). The median step's blocks are kept with
the delay of each message between them (:func:`labkit.pipeline.messages.step_messages`: read
off the blocks' stamps, no clock read more), from which the step model counts the messages
that waited for the scheduler. With ``fixed_width``, each (schedule, M) is timed again right
after, at that width, where the arithmetic is almost nothing (``fixed_step_s``: what its step
costs besides arithmetic and bytes), and one microbatch's blocks on each rank alone at both
widths (``block_alone_s``, ``fixed_block_alone_s``). Known: pipelining on gloo can hang; the
launcher's timeout ends such a run.
"""

from __future__ import annotations

import copy
import functools
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.machine.formulas import median_index
from labkit.memory import SavedActivations
from labkit.pipeline.ahead import post_receives_ahead
from labkit.pipeline.alone import block_alone_s
from labkit.pipeline.config import SCHEDULES_AHEAD, PipelineConfig, placements
from labkit.pipeline.formulas import (
    block_times,
    bubble_fraction,
    bubble_over_ideal,
    measured_bubble,
    predicted_step_time,
    timeline_split,
)
from labkit.pipeline.messages import step_messages
from labkit.pipeline.schedules import stage_layers


class _Mark(torch.autograd.Function):
    """Identity whose backward calls ``cb``: marks where a stage's backward starts or ends."""

    @staticmethod
    def forward(ctx, x, anchor, cb):
        ctx.cb = cb
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.cb()
        return grad, None, None


class Timed(nn.Module):
    """A stage's layers on ``device``, recording (kind, microbatch, start, end) of each F and B
    (and W, through :meth:`timed_weight`); :meth:`blocks` gives them in seconds since the
    step's start once the step is over.

    On a CPU a stamp is the host's monotonic clock. On CUDA it is an event queued on the
    current stream (where the GPU reaches that point), read after the step: a synchronisation
    inside the schedule would also wait for the pipeline's own sends and receives in flight
    and change the schedule it measures."""

    def __init__(self, layers: nn.Module, stage: int, *, device: torch.device):
        super().__init__()
        self.layers, self.stage, self.device = layers, stage, device
        # requires grad so the input mark's backward runs even on stage 0 (input is data)
        self._anchor = torch.zeros((), requires_grad=True, device=device)
        self.reset(time.perf_counter())

    def stamp(self):
        """Now, on this stage's device (:func:`labkit.timing.stamp`)."""
        return timing.stamp(self.device)

    def reset(self, origin: float) -> None:
        """A new step that starts at ``origin`` (host clock, the device idle)."""
        self.origin, self.records, self._fwd, self._bwd_start = origin, [], 0, {}
        self._origin_event = self.stamp() if self.device.type == "cuda" else None

    def _seconds(self, stamp) -> float:
        return timing.seconds_between(
            self.origin if self._origin_event is None else self._origin_event, stamp)

    def blocks(self) -> list[dict]:
        """This step's blocks (stage, kind, microbatch, start_s, end_s), seconds since the
        step's start. On CUDA only once the device is idle (the events are done)."""
        return [{"stage": self.stage, "kind": r["kind"], "microbatch": r["microbatch"],
                 "start_s": max(self._seconds(t) for t in r["start"]),
                 "end_s": self._seconds(r["end"])} for r in self.records]

    def _start_backward(self, mb: int) -> None:
        self._bwd_start[mb] = self.stamp()

    def _end_backward(self, mb: int) -> None:
        self._record("B", mb, self._bwd_start.pop(mb), self.stamp())

    def _record(self, kind, mb, t0, t1) -> None:
        self.records.append({"kind": kind, "microbatch": mb, "start": (t0,), "end": t1})

    def forward(self, x):
        mb, t0 = self._fwd, self.stamp()
        self._fwd += 1
        x = _Mark.apply(x, self._anchor, functools.partial(self._end_backward, mb))
        y = self.layers(x)
        # a hook, not a mark: the stage output must not be a view (the zero-bubble schedule
        # detaches it in place); the hook runs when the output's gradient arrives
        y.register_hook(functools.partial(self._backward_hook, mb))
        self._record("F", mb, t0, self.stamp())
        return y

    def _backward_hook(self, mb: int, grad) -> None:
        self._start_backward(mb)

    def timed_weight(self, weight_pass):
        """``PipelineStage.backward_weight_one_chunk`` that records a W block. On the first
        stage the schedule runs the whole backward there: W starts where that B ends."""
        def run(mb: int, *args, **kwargs):
            n, t0 = len(self.records), self.stamp()
            out = weight_pass(mb, *args, **kwargs)
            t1 = self.stamp()
            inner = [r["end"] for r in self.records[n:] if r["kind"] == "B"]
            self.records.append({"kind": "W", "microbatch": mb, "start": (t0, *inner),
                                 "end": t1})
            return out
        return run


def build_model(cfg: PipelineConfig, device: torch.device) -> nn.Sequential:
    """The whole stack from ``cfg.seed``, drawn on the host and moved to ``device``: the same
    weights on every rank and every kind of device."""
    torch.manual_seed(cfg.seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh())
                           for _ in range(cfg.layers)]).to(device)


def synthetic_batch(cfg: PipelineConfig, device: torch.device):
    """(inputs, targets) of the whole batch from ``cfg.seed + 1``, drawn on the host (the
    numbers of every kind of device) and moved to ``device``."""
    torch.manual_seed(cfg.seed + 1)
    x, target = torch.randn(cfg.batch, cfg.hidden), torch.randn(cfg.batch, cfg.hidden)
    return x.to(device), target.to(device)


def naive_gpipe_step(stage: Timed, rank: int, p: int, m: int, x, target):
    """GPipe by hand: all M forwards (recv, compute, send), then all M backwards."""
    mb = x.shape[0] // m
    ins, outs = [], []
    for i in range(m):
        if rank == 0:
            a = x[i * mb:(i + 1) * mb]
        else:
            a = x.new_empty(mb, x.shape[1])  # on x's device: a receive buffer NCCL can fill
            dist.recv(a, src=rank - 1)
            a.requires_grad_()
        y = stage(a)
        if rank < p - 1:
            dist.send(y.detach(), dst=rank + 1)
        ins.append(a)
        outs.append(y)
    for i in range(m):
        if rank == p - 1:
            # loss per microbatch / M: the gradient of the full-batch mean loss
            (F.mse_loss(outs[i], target[i * mb:(i + 1) * mb]) / m).backward()
        else:
            g = torch.empty_like(outs[i])
            dist.recv(g, src=rank + 1)
            outs[i].backward(g)
        if rank > 0:
            dist.send(ins[i].grad, dst=rank - 1)
    return torch.cat([o.detach() for o in outs]) if rank == p - 1 else None


def make_runner(schedule: str, m: int, mods: list[Timed], rt, cfg: PipelineConfig, chunks: int,
                *, recv_ahead: bool):
    """(a function step(x, target) -> output on the last rank (None elsewhere), whether the
    receives are posted ahead: None for the schedules that cannot, see
    :data:`~labkit.pipeline.config.SCHEDULES_AHEAD`)."""
    p, rank = rt.world_size, rt.rank
    if schedule == "naive_gpipe":
        return functools.partial(naive_gpipe_step, mods[0], rank, p, m), None
    from torch.distributed import pipelining as pp

    def example(stage: int):
        # shapes given up front skip the shape-inference exchange (one less place to hang);
        # a stage's input must require grad, or no gradient is sent back to the stage before
        return torch.empty(cfg.batch // m, cfg.hidden, device=rt.device,
                           requires_grad=stage > 0)

    stages = [pp.PipelineStage(mod, mod.stage, chunks, rt.device, input_args=example(mod.stage),
                               output_args=example(chunks)) for mod in mods]
    if schedule == "interleaved":
        sched = pp.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=F.mse_loss)
    elif schedule == "zero_bubble":
        for stage, mod in zip(stages, mods):
            stage.backward_weight_one_chunk = mod.timed_weight(stage.backward_weight_one_chunk)
        # one stage per rank: ZB-H1. ScheduleZBVZeroBubble and ScheduleDualPipeV need two
        # stages per rank in a V; the looped ZB schedule is the one that fits this lab's stages
        sched = pp.ScheduleInterleavedZeroBubble(stages, n_microbatches=m, loss_fn=F.mse_loss)
    else:
        cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
        sched = cls(stages[0], n_microbatches=m, loss_fn=F.mse_loss)
    ahead = None
    if schedule in SCHEDULES_AHEAD:  # one stage per rank
        # gloo only: NCCL runs a pair's messages in order on one stream, where M receives
        # posted ahead would sit in front of the sends the other rank waits for
        ahead = recv_ahead and rt.backend == "gloo" and post_receives_ahead(stages[0], m)
        if recv_ahead and not ahead and rt.backend == "gloo":
            runtime.print0("note: this torch's PipelineStage lacks a method that posting "
                           "receives ahead uses: torch's own placement runs (recv_ahead False)")

    def step(x, target):
        args = (x,) if rank == 0 else ()
        kw = {"target": target, "losses": []} if rank == p - 1 else {}
        out = sched.step(*args, **kw)
        return out.detach() if rank == p - 1 else None
    return step, ahead


def one_step(runner, mods: list[Timed], x, target):
    """Zero grads, barrier, one step; (this rank's step seconds, output, blocks, the step's
    start on this machine's monotonic clock). Both clock reads follow a synchronisation of
    the device (nothing on a CPU)."""
    for mod in mods:
        mod.layers.zero_grad(set_to_none=True)
    device = mods[0].device
    dist.barrier()
    runtime.sync(device)
    t0 = time.perf_counter()
    for mod in mods:
        mod.reset(t0)
    out = runner(x, target)
    runtime.sync(device)
    seconds = time.perf_counter() - t0
    return seconds, out, [b for mod in mods for b in mod.blocks()], t0


def one_clock(gathered) -> list[tuple[float, list[dict]]]:
    """Per step: (step end, every rank's blocks) on one clock from the first rank's step start
    (:func:`labkit.trace.on_one_clock`). ``gathered[r]`` = rank r's (step seconds, records,
    starts, host) of every step."""
    from labkit import trace

    hosts = [g[3] for g in gathered]
    out = []
    for k in range(len(gathered[0][0])):
        starts = [g[2][k] for g in gathered]
        shift = trace.start_offsets(starts, hosts)
        blocks = trace.on_one_clock([g[1][k] for g in gathered], starts=starts, hosts=hosts)
        out.append((max(shift[r] + g[0][k] for r, g in enumerate(gathered)), blocks))
    return out


def check(runner, mods, rt, x, target, reference) -> dict:
    """Output and gradients of one pipelined step against one process running every layer.
    The ranks' tensors travel as host copies (a pickled CUDA tensor would come back on the
    sending rank's GPU number) and are compared on rank 0's device, beside the reference."""
    _, out, _, _ = one_step(runner, mods, x, target)
    grads = {f"{mod.stage}.{name}": prm.grad.cpu()
             for mod in mods for name, prm in mod.layers.named_parameters()}
    parts = [None] * rt.world_size
    dist.all_gather_object(parts, (None if out is None else out.cpu(), grads))
    if rt.rank != 0:
        return {}
    ref_out, ref_grads = reference
    got_out = parts[-1][0].to(rt.device)
    got = {k: v.to(rt.device) for _, g in parts for k, v in g.items()}
    out_diff = float((got_out - ref_out).abs().max())
    grad_diff = max(float((got[k] - ref_grads[k]).abs().max()) for k in ref_grads)
    ok = (set(got) == set(ref_grads) and torch.allclose(got_out, ref_out, rtol=1e-4, atol=1e-6)
          and all(torch.allclose(got[k], ref_grads[k], rtol=1e-4, atol=1e-6) for k in ref_grads))
    return {"matches_single_process": bool(ok), "max_output_diff": out_diff,
            "max_grad_diff": grad_diff}


def reference_run(model: nn.Sequential, x, target):
    """Single process, whole batch, every layer: the output and each layer's gradients. The
    weights never change (no optimizer step), so one reference serves every (schedule, M)."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)  # the copy carries the last measured step's gradients
    out = model(x)
    F.mse_loss(out, target).backward()
    return out.detach(), [{n: prm.grad.clone() for n, prm in layer.named_parameters()}
                          for layer in model]


def stage_keyed(reference, spans):
    """The reference's gradients keyed like the stages' parameters ("stage.layer.name")."""
    out, layers = reference
    return out, {f"{stage}.{j}.{n}": g for stage, span in enumerate(spans)
                 for j, i in enumerate(span) for n, g in layers[i].items()}


def measure(schedule: str, m: int, model, rt, cfg: PipelineConfig, x, target,
            reference=None) -> list[dict]:
    """One (schedule, M): a row per receive placement (:func:`placements`) on rank 0, [] on
    the others. Two placements take their timed steps in turns (which goes first alternates), so
    both see the same machine, and the same device memory peak (the point's, every rank's
    largest; None on a CPU)."""
    runtime.reset_device_peak(rt.device)
    p, rank = rt.world_size, rt.rank
    v = cfg.virtual_stages if schedule == "interleaved" else 1
    spans = stage_layers(cfg.layers, p * v)
    mine = list(range(rank, p * v, p))  # looped placement: rank r holds stages r, r+P, ...
    mods = [Timed(nn.Sequential(*[model[i] for i in spans[s]]), s, device=rt.device)
            for s in mine]
    runners = [make_runner(schedule, m, mods, rt, cfg, p * v, recv_ahead=a)
               for a in placements(schedule, m, cfg)]  # one or both receive placements
    checks = [{} for _ in runners]
    if cfg.check:
        ref = stage_keyed(reference, spans) if rank == 0 else None
        checks = [check(runner, mods, rt, x, target, ref) for runner, _ in runners]
    # the check's step is a full untimed step of each runner: it counts as the first warm-up
    for _ in range(max(cfg.warmup - (1 if cfg.check else 0), 0)):
        for runner, _ in runners:
            one_step(runner, mods, x, target)
    kinds = 3 if schedule == "zero_bubble" else 2  # F, B (and W)
    # per runner: step seconds, blocks, starts, peak saved activations
    recorded = [([], [], [], []) for _ in runners]
    # activations only: the weights and the batch are held whatever the schedule
    held = [*(prm for mod in mods for prm in mod.layers.parameters()), x, target]
    for k in range(cfg.steps):
        turns = list(zip(runners, recorded))[:: 1 if k % 2 == 0 else -1]
        for (runner, _), (steps, recs_per_step, starts, peaks) in turns:
            with SavedActivations(exclude=held) as saved:
                t, _, recs, t0 = one_step(runner, mods, x, target)
            peaks.append(saved.peak_bytes)
            if len(recs) != kinds * m * len(mods):
                raise RuntimeError(f"{schedule}: expected {kinds * m * len(mods)} block "
                                   f"records, got {len(recs)}")
            steps.append(t)
            recs_per_step.append(recs)
            starts.append(t0)
    peak = runtime.max_device_peak_bytes(rt.device)
    rows = [row_of(schedule, m, rt, cfg, v, ahead, *rec)
            for (_, ahead), rec in zip(runners, recorded)]
    return [{**chk, **row, "compared_placement": k > 0, "device_memory_peak_bytes": peak}
            for k, (chk, row) in enumerate(zip(checks, rows)) if row is not None]


def row_of(schedule: str, m: int, rt, cfg: PipelineConfig, v: int, recv_ahead, steps,
           recs_per_step, starts, peaks) -> dict | None:
    """The row of one (schedule, M, placement) from every rank's timed steps (rank 0; None on
    the others): step times, the timeline's split, t_slot, the predicted step and rank 0's
    largest peak of saved activations (``peaks``: one per timed step)."""
    p, rank = rt.world_size, rt.rank
    gathered = [None] * p
    dist.all_gather_object(gathered, (steps, recs_per_step, starts, socket.gethostname()))
    if rank != 0:
        return None
    timeline = one_clock(gathered)
    splits = [timeline_split(blocks, step_start_s=0.0, step_end_s=end) for end, blocks in timeline]
    busy_all = np.array([[sum(b["end_s"] - b["start_s"] for b in recs) for recs in g[1]]
                         for g in gathered])
    # each step's span on one clock: what its split sums to, so the row's step is the span of
    # one real step (the middle one; the lower middle for an even count), never an average
    # of two that no split adds up to
    spans = np.array([end for end, _ in timeline])
    bubbles = [measured_bubble(busy_all[:, k], spans[k]) for k in range(cfg.steps)]
    last = timeline[-1][1]

    def median_of(kind):
        times = [b["end_s"] - b["start_s"] for _, blocks in timeline for b in blocks
                 if b["kind"] == kind]
        return float(np.median(times)) if times else None

    middle = median_index(spans)
    mid = splits[middle]
    step_split = {"compute": mid["compute_s"] / p, "fill/drain bubble": mid["bubble_s"] / p,
                  "messages and other waits": mid["other_s"] / p}
    # t_slot(M): one stage's forward + backward (+ W) of one microbatch, averaged over the
    # step's P x M of them (V chunks of a rank count as one stage)
    slot = float(np.median([sp["compute_s"] for sp in splits])) / (p * m)
    kw = dict(num_stages=p, num_microbatches=m, schedule=schedule, virtual_stages=v)
    return {
        "schedule": schedule, "num_stages": p, "num_microbatches": m,
        "virtual_stages": v, "recv_ahead": recv_ahead, "layers": cfg.layers,
        "hidden": cfg.hidden, "batch": cfg.batch,
        "microbatch_size": cfg.batch // m, "steps": cfg.steps,
        "step_time_s": float(spans[middle]),
        "step_time_p10_s": float(np.percentile(spans, 10)),
        "step_time_p90_s": float(np.percentile(spans, 90)),
        "busy_time_s": float(np.median(busy_all.sum(axis=0))),
        "busy_per_microbatch_s": float(np.median(busy_all.sum(axis=0))) / (p * m),
        "forward_time_s": median_of("F"), "backward_time_s": median_of("B"),
        "weight_time_s": median_of("W"),
        "bubble_measured": float(np.median(bubbles)),
        "bubble_formula": bubble_fraction(**kw),
        "bubble_fill_drain": float(np.median([sp["bubble_share"] for sp in splits])),
        "idle_other": float(np.median([sp["other_share"] for sp in splits])),
        "compute_share": float(np.median([sp["compute_share"] for sp in splits])),
        "bubble_over_ideal_formula": bubble_over_ideal(**kw),
        "bubble_over_ideal_measured": float(np.median(
            [sp["bubble_s"] / sp["compute_s"] for sp in splits])),
        "slot_time_s": slot,
        "step_time_predicted_s": predicted_step_time(slot_s=slot, **kw),
        "block_times": block_times([blocks for _, blocks in timeline]),
        "step_split_s": step_split,
        "blocks": last,
        # the median step's blocks and the messages between them (what the step model counts)
        "median_step_blocks": timeline[middle][1],
        "step_messages": step_messages(timeline[middle][1]),
        "peak_activation_bytes": int(max(peaks)),
    }


def apart(schedule: str, m: int, rt, cfg: PipelineConfig, main, tiny) -> dict:
    """The parts of a (schedule, M) timed apart, right after it (``main``, ``tiny``: the model,
    inputs and targets at ``cfg.hidden`` and at ``cfg.fixed_width``): the same step at the fixed
    width, where the arithmetic is almost nothing (``fixed_step_s``: what a step costs besides
    its arithmetic and its bytes), and one microbatch's forward and backward of a rank's stages
    alone at both widths (``block_alone_s``, ``fixed_block_alone_s``). On rank 0; {} on the
    others."""
    small = cfg.fixed_config()
    got = measure(schedule, m, tiny[0], rt, small, tiny[1], tiny[2])
    alone = block_alone_s(main[0], rt, cfg, schedule, m, main[1])
    alone_fixed = block_alone_s(tiny[0], rt, small, schedule, m, tiny[1])
    if not got:
        return {}
    r = got[0]
    return {"fixed_width": cfg.fixed_width, "fixed_step_s": r["step_time_s"],
            "fixed_step_p10_s": r["step_time_p10_s"], "fixed_step_p90_s": r["step_time_p90_s"],
            "block_alone_s": alone, "fixed_block_alone_s": alone_fixed}


def on_rank(rt: runtime.Runtime, cfg: PipelineConfig) -> dict:
    cfg.check_world_size(rt.world_size)
    model = build_model(cfg, rt.device)
    x, target = synthetic_batch(cfg, rt.device)
    reference = reference_run(model, x, target) if cfg.check and rt.rank == 0 else None
    tiny = None
    if cfg.fixed_width:
        small = cfg.fixed_config()
        tiny = (build_model(small, rt.device), *synthetic_batch(small, rt.device))
    rows = []
    for schedule, m in cfg.runnable(rt.world_size):
        measured = measure(schedule, m, model, rt, cfg, x, target, reference)
        # right after the point itself: both see the same state of the machine
        fixed = apart(schedule, m, rt, cfg, (model, x, target), tiny) if tiny else {}
        for row in measured:
            row.update(fixed)
            rows.append(row)
            runtime.print0(f"{schedule} P={rt.world_size} M={m}: step "
                           f"{row['step_time_s'] * 1e3:.1f} ms, fill/drain bubble "
                           f"{row['bubble_fill_drain']:.3f} (formula {row['bubble_formula']:.3f}),"
                           f" predicted step {row['step_time_predicted_s'] * 1e3:.1f} ms")
    return {"rows": rows}


if __name__ == "__main__":
    worker_main(on_rank, PipelineConfig)
