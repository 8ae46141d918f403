"""Pipeline parallelism on P ranks: measured bubbles of GPipe, 1F1B and interleaved 1F1B.

Run by hand (``labkit pipeline`` builds the same command, one launch per P)::

    torchrun --standalone --nproc-per-node=2 -m labkit.workers.pipeline \\
        --config '{"schedules": ["naive_gpipe", "gpipe", "1f1b"], "microbatches": [2, 4]}'

A stack of ``layers`` Linear+tanh blocks is split into P stages, one per rank (P·V chunks,
looped over the ranks, for ``interleaved``). ``naive_gpipe`` is the teaching version: all
forwards with blocking send/recv, then all backwards. ``gpipe``, ``1f1b`` and ``interleaved`` are
``torch.distributed.pipelining``'s ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B.

Every stage module is wrapped so that each forward and backward of a microbatch records its
start and end on this rank's clock (relative to the step's start, after a barrier). Per step:
busy = Σ (forward + backward) on a rank, step time = the slowest rank's, and
bubble = 1 − Σ_ranks busy / (P × step time). Known: pipelining on gloo can hang; the launcher's
timeout ends such a run.
"""

from __future__ import annotations

import copy
import functools
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit import runtime
from labkit.bubbles import PipelineConfig, measured_bubble, schedule_bubble, stage_layers
from labkit.workers._harness import worker_main


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
    """A stage's layers, recording (kind, microbatch, start_s, end_s) of each F and B."""

    def __init__(self, layers: nn.Module, stage: int):
        super().__init__()
        self.layers, self.stage = layers, stage
        # requires grad so the input mark's backward runs even on stage 0 (input is data)
        self._anchor = torch.zeros((), requires_grad=True)
        self.reset(time.perf_counter())

    def reset(self, origin: float) -> None:
        self.origin, self.records, self._fwd, self._bwd_start = origin, [], 0, {}

    def _start_backward(self, mb: int) -> None:
        self._bwd_start[mb] = time.perf_counter()

    def _end_backward(self, mb: int) -> None:
        self._record("B", mb, self._bwd_start.pop(mb), time.perf_counter())

    def _record(self, kind, mb, t0, t1) -> None:
        self.records.append({"stage": self.stage, "kind": kind, "microbatch": mb,
                             "start_s": t0 - self.origin, "end_s": t1 - self.origin})

    def forward(self, x):
        mb, t0 = self._fwd, time.perf_counter()
        self._fwd += 1
        x = _Mark.apply(x, self._anchor, functools.partial(self._end_backward, mb))
        y = _Mark.apply(self.layers(x), self._anchor, functools.partial(self._start_backward, mb))
        self._record("F", mb, t0, time.perf_counter())
        return y


def build_model(cfg: PipelineConfig) -> nn.Sequential:
    torch.manual_seed(cfg.seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh())
                           for _ in range(cfg.layers)])


def naive_gpipe_step(stage: Timed, rank: int, p: int, m: int, x, target):
    """GPipe by hand: all M forwards (recv, compute, send), then all M backwards."""
    mb = x.shape[0] // m
    ins, outs = [], []
    for i in range(m):
        if rank == 0:
            a = x[i * mb:(i + 1) * mb]
        else:
            a = torch.empty(mb, x.shape[1])
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


def make_runner(schedule: str, m: int, mods: list[Timed], rt, cfg: PipelineConfig, chunks: int):
    """A function step(x, target) -> output on the last rank (None elsewhere)."""
    p, rank = rt.world_size, rt.rank
    if schedule == "naive_gpipe":
        return functools.partial(naive_gpipe_step, mods[0], rank, p, m)
    from torch.distributed import pipelining as pp

    def example(stage: int):
        # shapes given up front skip the shape-inference exchange (one less place to hang);
        # a stage's input must require grad, or no gradient is sent back to the stage before
        return torch.empty(cfg.batch // m, cfg.hidden, requires_grad=stage > 0)

    stages = [pp.PipelineStage(mod, mod.stage, chunks, rt.device, input_args=example(mod.stage),
                               output_args=example(chunks)) for mod in mods]
    if schedule == "interleaved":
        sched = pp.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=F.mse_loss)
    else:
        cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
        sched = cls(stages[0], n_microbatches=m, loss_fn=F.mse_loss)

    def step(x, target):
        args = (x,) if rank == 0 else ()
        kw = {"target": target, "losses": []} if rank == p - 1 else {}
        out = sched.step(*args, **kw)
        return out.detach() if rank == p - 1 else None
    return step


def one_step(runner, mods: list[Timed], x, target):
    """Zero grads, barrier, one step; (this rank's step seconds, output, records)."""
    for mod in mods:
        mod.layers.zero_grad(set_to_none=True)
    dist.barrier()
    t0 = time.perf_counter()
    for mod in mods:
        mod.reset(t0)
    out = runner(x, target)
    return time.perf_counter() - t0, out, [r for mod in mods for r in mod.records]


def check(runner, mods, rt, x, target, reference) -> dict:
    """Output and gradients of one pipelined step against one process running every layer."""
    _, out, _ = one_step(runner, mods, x, target)
    grads = {f"{mod.stage}.{name}": prm.grad.clone()
             for mod in mods for name, prm in mod.layers.named_parameters()}
    parts = [None] * rt.world_size
    dist.all_gather_object(parts, (out, grads))
    if rt.rank != 0:
        return {}
    ref_out, ref_grads = reference
    got_out = parts[-1][0]
    got = {k: v for _, g in parts for k, v in g.items()}
    out_diff = float((got_out - ref_out).abs().max())
    grad_diff = max(float((got[k] - ref_grads[k]).abs().max()) for k in ref_grads)
    ok = (set(got) == set(ref_grads) and torch.allclose(got_out, ref_out, rtol=1e-4, atol=1e-6)
          and all(torch.allclose(got[k], ref_grads[k], rtol=1e-4, atol=1e-6) for k in ref_grads))
    return {"matches_single_process": bool(ok), "max_output_diff": out_diff,
            "max_grad_diff": grad_diff}


def reference_run(model: nn.Sequential, spans, x, target):
    """Single process, whole batch, every layer: output and gradients keyed like the stages."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)  # the copy carries the last measured step's gradients
    out = model(x)
    F.mse_loss(out, target).backward()
    grads = {}
    for stage, span in enumerate(spans):
        part = nn.Sequential(*[model[i] for i in span])
        grads.update({f"{stage}.{n}": prm.grad.clone() for n, prm in part.named_parameters()})
    return out.detach(), grads


def measure(schedule: str, m: int, model, rt, cfg: PipelineConfig, x, target) -> dict | None:
    p, rank = rt.world_size, rt.rank
    v = cfg.virtual_stages if schedule == "interleaved" else 1
    spans = stage_layers(cfg.layers, p * v)
    mine = list(range(rank, p * v, p))  # looped placement: rank r holds stages r, r+P, ...
    mods = [Timed(nn.Sequential(*[model[i] for i in spans[s]]), s) for s in mine]
    runner = make_runner(schedule, m, mods, rt, cfg, p * v)
    row = {}
    if cfg.check:
        ref = reference_run(model, spans, x, target) if rank == 0 else None
        row.update(check(runner, mods, rt, x, target, ref))
    for _ in range(cfg.warmup):
        one_step(runner, mods, x, target)
    steps, busy, blocks = [], [], []
    for _ in range(cfg.steps):
        t, _, recs = one_step(runner, mods, x, target)
        if len(recs) != 2 * m * len(mods):
            raise RuntimeError(f"{schedule}: expected {2 * m * len(mods)} F/B records, got {len(recs)}")
        steps.append(t)
        busy.append(sum(r["end_s"] - r["start_s"] for r in recs))
        blocks = recs
    gathered = [None] * p
    dist.all_gather_object(gathered, (steps, busy, blocks))
    if rank != 0:
        return None
    step_all = np.array([g[0] for g in gathered])  # (P, steps)
    busy_all = np.array([g[1] for g in gathered])
    slowest = step_all.max(axis=0)
    bubbles = [measured_bubble(busy_all[:, k], slowest[k]) for k in range(cfg.steps)]
    fwd = [b["end_s"] - b["start_s"] for g in gathered for b in g[2] if b["kind"] == "F"]
    bwd = [b["end_s"] - b["start_s"] for g in gathered for b in g[2] if b["kind"] == "B"]
    return {
        **row, "schedule": schedule, "num_stages": p, "num_microbatches": m,
        "virtual_stages": v, "layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch,
        "microbatch_size": cfg.batch // m, "steps": cfg.steps,
        "step_time_s": float(np.median(slowest)),
        "step_time_p10_s": float(np.percentile(slowest, 10)),
        "step_time_p90_s": float(np.percentile(slowest, 90)),
        "busy_time_s": float(np.median(busy_all.sum(axis=0))),
        "busy_per_microbatch_s": float(np.median(busy_all.sum(axis=0))) / (p * m),
        "forward_time_s": float(np.median(fwd)), "backward_time_s": float(np.median(bwd)),
        "bubble_measured": float(np.median(bubbles)),
        "bubble_formula": schedule_bubble(schedule, p, m, v),
        "blocks": [{"rank": r, **b} for r, g in enumerate(gathered) for b in g[2]],
    }


def run(rt: runtime.Runtime, cfg: PipelineConfig) -> dict:
    cfg.validate_for(rt.world_size)
    model = build_model(cfg)
    torch.manual_seed(cfg.seed + 1)
    x, target = torch.randn(cfg.batch, cfg.hidden), torch.randn(cfg.batch, cfg.hidden)
    rows = []
    for schedule, m in cfg.runnable(rt.world_size):
        row = measure(schedule, m, model, rt, cfg, x, target)
        if row is not None:
            rows.append(row)
            runtime.print0(f"{schedule} P={rt.world_size} M={m}: step "
                           f"{row['step_time_s'] * 1e3:.1f} ms, bubble "
                           f"{row['bubble_measured']:.3f} (formula {row['bubble_formula']:.3f})")
    return {"rows": rows}


if __name__ == "__main__":
    worker_main(run, PipelineConfig)
