"""DDP training lab, rank side: time optimizer steps with and without DistributedDataParallel.

Run by hand (``labkit ddp`` / :func:`labkit.ddp.run.run` build the same command, one launch
per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.ddp.worker \\
        --config '{"model": "mlp", "batch_size": 64, "steps": 25, "warmup": 5}' --out ddp.json

What one launch of N ranks does, all on synthetic seeded data drawn on the device:

For each batch size of the config, inside this one launch:

1. **no-DDP baseline** (only in the 1-rank launch, only if ``baseline``): the plain model, no
   wrapper, no all-reduce, same per-rank batch. Row ``variant: no_ddp``. It runs in the 1-rank
   launch, not in a launch of its own (no extra torchrun start), so it uses that launch's
   threads: all cores by default, one with ``threads_per_rank=1`` (like with like: one core per
   process, as each rank brings its own). At ``all_cores_batches`` the same run is timed
   again with every allocated core as a thread (``torch.set_num_threads``): row
   ``variant: no_ddp_all_cores``, one process using the whole machine.
2. **DDP**: the model wrapped with the config's bucket_cap_mb, broadcast_buffers, static_graph and
   gradient_as_bucket_view; ``steps`` optimizer steps, the first ``warmup`` untimed. Every rank
   times each step; the step's time is the slowest rank's (:func:`labkit.timing.summarize`).
   Row ``variant: ddp``, with the replicas' parameter drift (0 when DDP kept them in sync).
3. **where the time goes** (if ``breakdown``, on more than one rank): the same DDP step under
   ``no_sync()`` (compute without the all-reduce), the plain model's step on rank 0 alone (the
   step the model starts from, timed as the DDP step is), a standalone all-reduce of all
   gradient bytes; the DDP row gets exposed communication, overlap with backward, algbw and
   busbw (:mod:`labkit.ddp.formulas`).
   Also: the sizes of DDP's gradient buckets, the time of DDP's copies of the gradients into
   its buckets (scaled by 1/N) and back, and, on more than one rank, all-reduces of a few
   smaller sizes (:data:`FIT_BYTES`) with the α–β fit of them and the gradient bytes
   (:func:`labkit.collectives.formulas.fit_alpha_beta`): the measured split of a DDP step
   that the host puts beside its model (:func:`labkit.ddp.predict.measured_split`). These are
   timed in rounds with the DDP steps themselves (:func:`_rounds`: one DDP step, one
   ``no_sync`` step, one plain step on rank 0 alone, the gradients' all-reduce
   :data:`~labkit.ddp.config.ALLREDUCE_CALLS` times, each smaller all-reduce, the copies,
   again and again), so that a neighbour's
   load, which comes and goes within seconds, weighs on the step and on its parts alike. The
   ``no_sync`` step's update is undone after it (untimed), so the replicas still take exactly
   ``steps`` DDP steps.
4. **the overlap, measured** (on more than one rank): a :class:`~labkit.ddp.train.CommTimeline`
   on the DDP model records, in every timed step, when backward ran and when each bucket's
   all-reduce was launched and completed (rank 0's clock); the row gets the intervals and
   their split into hidden and exposed communication (:func:`labkit.ddp.overlap.summarize`).
5. **the bucket A/B** (an :class:`~labkit.ddp.abtest.ABConfig` with
   ``compare_bucket_cap_mb``): run A's DDP model is timed in the same rounds, right after
   this config's step, and its times come back beside them.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.collectives.formulas import algbw_gb_per_s, busbw_gb_per_s, fit_alpha_beta
from labkit.ddp import formulas, overlap
from labkit.ddp.abtest import ABConfig
from labkit.ddp.config import ALLREDUCE_CALLS, DDPConfig
from labkit.ddp.models import build_model, grad_bytes, num_params, synthetic_batches
from labkit.ddp.train import (
    CommTimeline,
    gather_params,
    make_optimizer,
    make_step,
    replica_drift,
    wrap_ddp,
)
from labkit.errors import UsageError
from labkit.harness import worker_main
from labkit.machine.formulas import transfer_of
from labkit.procs import allocated_cores

#: the standalone all-reduce sizes (bytes) timed besides the gradient bytes for the α–β fit:
#: small ones pin α, large ones β
FIT_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)


def _timed(step, cfg: DDPConfig, rt: runtime.Runtime, prefix: str = "step_time",
           warmup: int | None = None) -> dict:
    """Time ``step`` on every rank; the slowest rank's per-step times and their summary."""
    local = timing.repeat_timed(step, warmup=cfg.warmup if warmup is None else warmup,
                                repeat=cfg.measured_steps, device=rt.device)
    return _summary(local, prefix)


def _summary(local: list[float], prefix: str) -> dict:
    """This rank's times of one thing, gathered: the slowest rank's and their summary."""
    slowest, by_rank = timing.slowest_step_times(local)
    stats = timing.summarize(local, prefix=prefix)
    stats[f"{prefix.removesuffix('_time')}_times_s"] = [float(t) for t in slowest]
    if prefix == "step_time":  # kept so a reader can check "slowest rank" for themselves
        stats["rank_step_times_s"] = by_rank.tolist()
    return stats


def _row(cfg: DDPConfig, variant: str, world_size: int, model, stats: dict, *,
         peak_bytes: int | None) -> dict:
    p50 = stats["step_time_p50_s"]
    nbytes = grad_bytes(model)
    (batch,) = cfg.batch_size
    return {
        **cfg.describe(),
        "variant": variant,
        "ddp": variant == "ddp",
        "world_size": world_size,
        "global_batch_size": batch * world_size,
        "num_params": num_params(model),
        "grad_bytes": nbytes,
        "allreduce_bytes_per_step": nbytes if variant == "ddp" else 0,
        **stats,
        "samples_per_s_per_replica": batch / p50,
        "samples_per_s": batch * world_size / p50,
        "device_memory_peak_bytes": peak_bytes,
    }


def on_rank(rt: runtime.Runtime, cfg: DDPConfig) -> dict:
    _warm_up(rt, cfg.at(cfg.batch_size[0]))
    rows = []
    for batch in cfg.batch_size:  # every batch size inside this one launch
        rows += run_batch(rt, cfg.at(batch))
    return {"rows": rows} if rt.rank == 0 else {}


def _warm_up(rt: runtime.Runtime, cfg: DDPConfig, steps: int = 3) -> None:
    """A few untimed DDP steps of a throwaway model at the first batch. A process's first
    steps pay once for what no later step pays (page faults of fresh memory, the allocator
    learning the gradients' sizes, the thread pool, gloo's first messages); without this the
    first run of the launch, the no-DDP baseline at the first batch, would carry it."""
    model = build_model(cfg, rt.device)
    ddp = wrap_ddp(model, cfg, rt.device)
    step = make_step(ddp, make_optimizer(ddp, cfg), synthetic_batches(cfg, rt.rank, rt.device))
    for _ in range(steps):
        step()


def run_batch(rt: runtime.Runtime, cfg: DDPConfig) -> list[dict]:
    """Baseline (1-rank launch only), DDP, breakdown, at the config's one batch size. Each row
    carries the device memory peak of its own run (the batches, held throughout, count in
    each)."""
    batches = synthetic_batches(cfg, rt.rank, rt.device)
    rows = []
    if cfg.baseline and rt.world_size == 1:
        runtime.reset_device_peak(rt.device)
        model = build_model(cfg, rt.device)
        stats = _timed(make_step(model, make_optimizer(model, cfg), batches), cfg, rt)
        rows.append(_row(cfg, "no_ddp", 1, model, stats,
                         peak_bytes=runtime.max_device_peak_bytes(rt.device)))
        del model
    if cfg.all_cores_batches and rt.world_size == 1:
        rows.append(_all_cores_row(cfg, rt, batches))

    runtime.reset_device_peak(rt.device)
    model = build_model(cfg, rt.device)
    ddp = wrap_ddp(model, cfg, rt.device)
    opt = make_optimizer(ddp, cfg)
    # one rank all-reduces nothing: its timeline and breakdown would tell nothing
    timeline = CommTimeline(ddp, rt.device) if rt.world_size > 1 else None
    # gradients that are views into DDP's buckets must be zeroed in place, not dropped
    keep_views = not cfg.gradient_as_bucket_view
    step = make_step(ddp, opt, batches, set_to_none=keep_views, timeline=timeline)
    breakdown = cfg.breakdown and rt.world_size > 1
    if breakdown:
        for _ in range(cfg.warmup):
            step()
        # the DDP step's own peak, read before the breakdown allocates its measuring buffers
        # (a flat gradient, bucket copies, the fit's all-reduce sizes)
        peak = runtime.max_device_peak_bytes(rt.device) if cfg.warmup else None
        parts = _breakdown_parts(cfg, rt, ddp, opt, batches, timeline)
        compare = _compare_part(cfg, rt, batches)
        if compare is not None:  # timed right after B's step, round after round
            parts = {"compare": (compare, None, None), **parts}
        local = _rounds(cfg, rt, step, parts)
        stats = _summary(local.pop("step"), "step_time")
        if peak is None:  # no warm-up step to read it after: the whole run's
            peak = runtime.max_device_peak_bytes(rt.device)
    else:
        stats = _timed(step, cfg, rt)
        peak = runtime.max_device_peak_bytes(rt.device)
    # after exactly cfg.steps synchronised steps: the state the tests compare
    drift = replica_drift(model)
    row = _row(cfg, "ddp", rt.world_size, model, stats, peak_bytes=peak)
    row.update(replica_drift=drift, replicas_in_sync=drift == 0.0)
    if cfg.return_params:  # small test models only: every rank's parameters, in rank order
        row["params_by_rank"] = gather_params(model)
    if breakdown:
        row.update(_breakdown(cfg, rt, ddp, row, local))
    if timeline is not None:  # rank 0's timeline of the timed steps
        row.update(overlap.summarize(
            timeline.records(nosync=False, last=cfg.measured_steps),
            timeline.records(nosync=True, last=cfg.measured_steps if breakdown else 0)))
    if breakdown and "compare" in local:
        row.update(_compare_columns(cfg, local["compare"]))
    return rows + [row]


def _compare_part(cfg: DDPConfig, rt: runtime.Runtime, batches):
    """Run A of an A/B (:class:`~labkit.ddp.abtest.ABConfig`): the same model, seed and
    batches in DDP with A's bucket size, its warm-up steps run; its step, to be timed in the
    rounds beside this config's (run B). It carries a timeline too (unread), so that A and B
    pay the same hooks. None without an A/B."""
    cap = getattr(cfg, "compare_bucket_cap_mb", None)
    if cap is None:
        return None
    cfg_a = dataclasses.replace(cfg, bucket_cap_mb=cap)
    ddp_a = wrap_ddp(build_model(cfg_a, rt.device), cfg_a, rt.device)
    step_a = make_step(ddp_a, make_optimizer(ddp_a, cfg_a), batches,
                       set_to_none=not cfg.gradient_as_bucket_view,
                       timeline=CommTimeline(ddp_a, rt.device))
    for _ in range(cfg.warmup):
        step_a()
    return step_a


def _compare_columns(cfg: DDPConfig, local_a: list[float]) -> dict:
    """Run A's step times of the rounds (slowest rank), beside run B's own."""
    stats = _summary(local_a, "compare_step_time")
    return {"compare_bucket_cap_mb": cfg.compare_bucket_cap_mb,
            "compare_step_time_p50_s": stats["compare_step_time_p50_s"],
            "compare_step_times_s": stats["compare_step_times_s"]}


def _all_cores_row(cfg: DDPConfig, rt: runtime.Runtime, batches) -> dict:
    """The no-DDP run again, with every allocated core as a torch thread (one process using
    the whole machine), its steps timed in turn with one thread's on the same model (one,
    all, one, all, ...): a burst of the machine's noise falls on both alike, so their ratio
    is the threads' speedup of this moment. The launch's own thread count is restored after."""
    cores, saved = allocated_cores(), torch.get_num_threads()
    runtime.reset_device_peak(rt.device)
    model = build_model(cfg, rt.device)
    step = make_step(model, make_optimizer(model, cfg), batches)
    times: dict[int, list[float]] = {1: [], cores: []}
    try:
        for i in range(cfg.warmup + cfg.measured_steps):
            for k in times:  # one key on a one-core machine
                torch.set_num_threads(k)
                t = timing.repeat_timed(step, warmup=0, repeat=1, device=rt.device,
                                        barrier=False)[0]
                if i >= cfg.warmup:
                    times[k].append(t)
    finally:
        torch.set_num_threads(saved)
    row = _row(cfg, "no_ddp_all_cores", 1, model, _summary(times[cores], "step_time"),
               peak_bytes=runtime.max_device_peak_bytes(rt.device))
    row["threads_per_rank"] = cores  # this run's threads, not the launch's
    row["one_thread_paired_p50_s"] = float(np.median(times[1]))
    return row


def _bucket_bytes(ddp) -> list[int] | None:
    """The sizes of DDP's gradient buckets as its last step used them (rebuilt after the first
    step in the order gradients became ready); None where this torch does not tell."""
    try:
        return [int(b.buffer().numel() * b.buffer().element_size())
                for b in ddp.reducer._get_zeros_like_grad_buckets()]
    except (AttributeError, RuntimeError):
        return None


def _bucket_copies(model, world_size: int, as_view: bool):
    """What DDP's reducer does to the gradients besides the all-reduce, on tensors of their
    sizes: each gradient copied into its bucket scaled by 1/N (one pass) and, after the
    all-reduce, copied back (a second pass); with ``gradient_as_bucket_view`` the gradients
    already are the bucket, scaled in place (one pass)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [torch.zeros_like(p) for p in params]
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                       device=params[0].device)
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    scale = 1.0 / world_size

    def copies():
        if as_view:
            flat.mul_(scale)
            return
        for g, v in zip(grads, views):
            torch.mul(g, scale, out=v)
        for g, v in zip(grads, views):
            g.copy_(v)

    return copies


def _undo(model, opt):
    """(save, restore): the parameters and the optimizer's state before a ``no_sync`` step, put
    back after it bit for bit (state the step created is dropped), so that the step it timed
    leaves the replicas as they were."""
    saved: dict = {}

    def save():
        saved["params"] = [p.detach().clone() for p in model.parameters()]
        saved["state"] = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
                          for p, st in opt.state.items()}

    def restore():
        with torch.no_grad():
            for p, keep in zip(model.parameters(), saved["params"]):
                p.copy_(keep)
        opt.state.clear()
        opt.state.update(saved["state"])

    return save, restore


def _breakdown_parts(cfg, rt, ddp, opt, batches, timeline=None) -> dict:
    """What a round times besides the DDP step: name -> (function, before, after[, calls]);
    ``before`` and ``after`` run untimed around it, ``calls`` (default 1) timed one by one in
    a row. ``timeline`` also records the ``no_sync`` steps (backward without the all-reduce)."""
    keep_views = not cfg.gradient_as_bucket_view
    nosync = make_step(ddp, opt, batches, no_sync=True, set_to_none=keep_views,
                       timeline=timeline)
    nbytes = grad_bytes(ddp.module)
    flat = torch.zeros(nbytes // 4, dtype=torch.float32, device=rt.device)
    copies = _bucket_copies(ddp.module, rt.world_size, cfg.gradient_as_bucket_view)
    # the plain model's step on rank 0 alone (the others wait at the next barrier): the step
    # the model starts from, timed as the DDP step is, one a round after the other parts
    # (a step of a series runs faster: at hidden 256, 0.8 ms against 1.8 ms here)
    alone = _nothing
    if rt.rank == 0:  # the others hold no second model
        plain = build_model(cfg, rt.device)
        alone = make_step(plain, make_optimizer(plain, cfg), batches)
    parts = {"nosync": (nosync, *_undo(ddp.module, opt)),
             "alone": (alone, None, None),
             "allreduce": (lambda: dist.all_reduce(flat), None, None, ALLREDUCE_CALLS),
             "copies": (copies, None, None)}
    for size in (s for s in FIT_BYTES if s < nbytes):
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=rt.device)
        parts[size] = (lambda buf=buf: dist.all_reduce(buf), None, None)
    return parts


def _nothing() -> None:
    """What a rank other than 0 times of the plain step alone: nothing (it waits)."""


def _rounds(cfg: DDPConfig, rt: runtime.Runtime, step, parts: dict) -> dict:
    """The DDP ``step`` (its ``cfg.warmup`` untimed steps already run) and every part, timed
    in turn, round after round: one untimed run of each part, then ``cfg.measured_steps``
    timed rounds. Every timed thing starts with all ranks together (a barrier). An A/B's run A
    (part ``"compare"``, warmed up already) goes right after the step in odd rounds and right
    before it in even ones, so neither run always goes first. This rank's times, by name
    (``"step"`` and the parts')."""
    local: dict = {"step": [], **{name: [] for name in parts}}
    # a part of several calls a round (an all-reduce): each call its own timed item
    items = [("step", step, None, None),
             *((n, *v[:3]) for n, v in parts.items() for _ in range(v[3] if len(v) > 3 else 1))]
    for r in range(cfg.measured_steps + 1):  # round 0 warms every part up, untimed
        order = items
        if r % 2 == 0 and len(items) > 1 and items[1][0] == "compare":
            order = [items[1], items[0], *items[2:]]
        for name, fn, before, after in order:
            if r == 0 and name in ("step", "compare"):
                continue
            if before is not None:
                before()
            if dist.is_initialized():
                dist.barrier()
            runtime.sync(rt.device)
            t0 = time.perf_counter()
            fn()
            runtime.sync(rt.device)
            dt = time.perf_counter() - t0
            if after is not None:
                after()
            if r > 0:
                local[name].append(dt)
            runtime.mark_progress()
    return local


def _breakdown(cfg, rt, ddp, row: dict, local: dict) -> dict:
    """The DDP row's breakdown columns from the rounds' times: no_sync steps, the standalone
    all-reduce of the gradient bytes, DDP's bucket copies and the α–β fit; derived columns."""
    nosync = _summary(local["nosync"], "nosync_step_time")
    alone = _summary(local["alone"], "alone_step_time")
    ar = _summary(local["allreduce"], "allreduce_time")
    copies = _summary(local["copies"], "bucket_copy_time")
    nbytes = row["grad_bytes"]
    t_ddp, t_ns, t_ar = row["step_time_p50_s"], nosync["nosync_step_time_p50_s"], \
        ar["allreduce_time_p50_s"]
    exposed = formulas.exposed_comm_s(t_ddp, t_ns)
    algbw = algbw_gb_per_s(size_bytes=nbytes, time_s=t_ar)
    sizes = sorted(k for k in local if isinstance(k, int))
    slowest = [timing.slowest_step_times(local[k])[0] for k in sizes]
    times = [float(np.median(t)) for t in slowest]
    fit = _alpha_beta(rt.world_size, [*sizes, nbytes], [*times, t_ar])
    # each size's transfer: the median of its calls that waited for nothing
    transfers = [transfer_of(t) for t in [*slowest, ar["allreduce_times_s"]]]
    return {
        **nosync, **alone, **ar, **copies, **fit, "allreduce_fit_transfers_s": transfers,
        "bucket_bytes": _bucket_bytes(ddp),
        "allreduce_bytes": nbytes,
        "allreduce_algbw_gb_per_s": algbw,
        "allreduce_busbw_gb_per_s": busbw_gb_per_s(op="all_reduce", ranks=rt.world_size,
                                                   size_bytes=nbytes, time_s=t_ar),
        "exposed_comm_s": exposed,
        "comm_fraction": exposed / t_ddp,
        "overlap_fraction": formulas.overlap_fraction(exposed, t_ar),
    }


def _alpha_beta(world_size: int, sizes: list[int], times: list[float]) -> dict:
    """The standalone all-reduce times by size and their α–β fit."""
    out = {"allreduce_fit_bytes": sizes, "allreduce_fit_times_s": times}
    try:
        alpha, beta = fit_alpha_beta("all_reduce", world_size, sizes=sizes, times=times)
    except UsageError:  # noise left no bandwidth term: the rows say so by its absence
        return out
    return {**out, "allreduce_alpha_s": alpha, "allreduce_beta_bytes_per_s": beta}


if __name__ == "__main__":
    worker_main(on_rank, ABConfig)  # a DDPConfig, or one with an A/B (its subclass)
