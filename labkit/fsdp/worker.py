"""Sharded-data-parallel lab, rank side: one launch of N ranks runs every variant of the config.

Run by hand (``labkit fsdp`` / :func:`labkit.fsdp.run.run` build the same command, one
launch per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.fsdp.worker \\
        --config '{"hidden": 256, "variants": ["ddp", "zero1", "fsdp"]}' --out fsdp.json

What one launch does (data parallelism: rank r trains on its own seeded batch r):

1. **the single-process reference**: every rank builds the whole model from the seed and runs
   one forward and backward on all ranks' batches at once, then one Adam step: the outputs,
   the gradients and the parameters after the step;
2. **the link and the device**, measured now: α and β from an all-reduce sweep up to 4 MiB
   (``labkit fsdp``'s estimate; notebook 09 prices the collectives with the machine profile),
   the FLOP/s of one rank alone on one layer of the model, the ranks taking turns
   (:mod:`labkit.tp.measure`);
3. per variant (``ddp``, ``zero1``, ``zero2``, ``fsdp``): **correctness first** -- one step compared
   with the reference (this rank's outputs, its gradients or gradient shard, its parameters
   after Adam; ``matches_single_process``); one step with every collective counted
   (:class:`labkit.tp.measure.CommCounter`); the weights, gradients and Adam states it holds
   (:func:`labkit.fsdp.shard.held_bytes`, local shards); what it holds over that counted
   step, sampled (:class:`labkit.fsdp.peak.StepMemory`: the peak and where, beside
   :func:`labkit.fsdp.formulas.peak_bytes`; FSDP once more with the other resharding
   setting); then ``steps`` steps, the first
   ``warmup`` untimed, the slowest rank's time per step, the prediction of
   :mod:`labkit.fsdp.formulas` beside it; then the step's collectives alone, on buffers of
   their sizes, timed (:func:`labkit.fsdp.shard.collectives_alone`: the step's split). DDP's
   bytes, held and moved, are put on every row. The timed steps of ZeRO-1, ZeRO-2 and FSDP
   (more than one rank, no checkpointing) are recorded (:class:`labkit.fsdp.record.StepRecorder`:
   each layer's forward and backward and each collective, stamped): the one of median length,
   every rank's on one clock, is the row's ``timeline_s`` (the lab's Chrome trace,
   :mod:`labkit.fsdp.trace`);
4. **compute only**, last: the plain model on this rank's batch, no wrapper, no
   communication, timed; each stage's Adam arithmetic alone, the ranks taking turns
   (:func:`_adam_alone`: what F/R leaves out); then with activation checkpointing (timed, and
   the bytes saved for backward both ways counted) and its forward alone.

Everything lives on the rank's device; each variant's row carries its device memory peak
(None on a CPU): beside the bytes the rank holds by count, what the device really held.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch

from labkit import runtime, timing
from labkit.fsdp import formulas
from labkit.fsdp.config import STAGE, FSDPConfig
from labkit.fsdp.peak import StepMemory
from labkit.fsdp.record import StepRecorder
from labkit.fsdp.shard import (
    ADAM_BETAS,
    ADAM_EPS,
    ZeRO1,
    ZeRO2,
    adam_update,
    collectives_alone,
    held_bytes,
    wrap_ddp,
    wrap_fsdp,
)
from labkit.harness import worker_main
from labkit.memory import device_peak_bytes, reset_device_peak
from labkit.tp import formulas as tp_formulas
from labkit.tp.measure import (
    CommCounter,
    compute_rate,
    fit_link,
    max_rel_error,
)
from labkit.tp.models import (
    build_model,
    local_slice,
    local_tensor,
    loss_fn,
    make_step,
    synthetic_batch,
)
from labkit.tp.report import add_compute_time, prediction_fields
from labkit.tp.worker import split_dim, timed_after_warmup

#: the variants whose timed steps are recorded for the trace (:mod:`labkit.fsdp.record`: DDP's
#: all-reduces run in its C++ reducer, beyond a stamp)
TRACED = ("zero1", "zero2", "fsdp")


def _reference(cfg: FSDPConfig, full, batches, device) -> dict:
    """One process, every rank's batch at once, one Adam step."""
    model = copy.deepcopy(full)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    out = model(x.requires_grad_(True))
    loss_fn(out, y).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.Adam(model.parameters(), lr=cfg.lr).step()
    return {"out": out.detach(), "grads": grads,
            "flat_grad": torch.cat([g.reshape(-1) for g in grads.values()]),
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _slice(ref: torch.Tensor, p, rank: int, world_size: int) -> torch.Tensor:
    """The part of ``ref`` this rank holds of parameter ``p`` (FSDP2: ``Shard(0)``; DDP and
    ZeRO-1: all of it)."""
    return local_slice(ref, split_dim(p), rank, world_size)


def _name(n: str) -> str:
    return n.removeprefix("module.")  # DDP's wrapper


def check(variant: str, model, opt, ref: dict, x, y, rank: int, world_size: int) -> float:
    """One training step compared with the reference: this rank's outputs, its gradients (DDP:
    all of them; FSDP: its shards; ZeRO-1: its slice of the averaged flat gradient) and its
    parameters after Adam. Gradients and parameters are measured against the largest value of
    their group (:func:`labkit.tp.measure.max_rel_error`)."""
    b = x.shape[0]
    opt.zero_grad(set_to_none=True)
    out = model(x.detach().requires_grad_(True))
    loss_fn(out, y).backward()
    errs = [max_rel_error([(out, ref["out"][rank * b:(rank + 1) * b])])]
    gscale = max(float(g.abs().max()) for g in ref["grads"].values())
    pscale = max(float(q.abs().max()) for q in ref["params"].values())
    named = [(_name(n), p) for n, p in model.named_parameters()]
    if variant == "zero2":  # its gradients are slices of each layer's flat gradient
        names = {id(p): n for n, p in named}
        want = opt.shard_of([ref["grads"][names[id(p)]] for p in opt.params])
        errs.append(max_rel_error([(opt.grad_shard(), want)], scale=gscale))
        opt.step()
    elif variant == "zero1":
        opt.keep_grad_shard = True
        opt.step()
        opt.keep_grad_shard = False
        lo = rank * opt.shard_size
        want = ref["flat_grad"][lo:lo + opt.shard_size]
        errs.append(max_rel_error([(opt.last_grad_shard[:want.numel()], want)], scale=gscale))
        opt.last_grad_shard = None
    else:
        errs.append(max_rel_error([(local_tensor(p.grad),
                                    _slice(ref["grads"][n], p, rank, world_size))
                                   for n, p in named], scale=gscale))
        opt.step()
    errs.append(max_rel_error([(local_tensor(p), _slice(ref["params"][n], p, rank, world_size))
                               for n, p in named], scale=pscale))
    opt.zero_grad(set_to_none=True)
    return max(errs)


def _build(variant: str, full, cfg: FSDPConfig, rt, mesh):
    model = copy.deepcopy(full)
    model.checkpoint = cfg.checkpoint
    if variant == "ddp":
        model = wrap_ddp(model, rt.device)
        return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)
    if variant == "zero1":
        return model, ZeRO1(model, lr=cfg.lr, rank=rt.rank, world_size=rt.world_size)
    if variant == "zero2":
        return model, ZeRO2(model.layers, lr=cfg.lr, rank=rt.rank, world_size=rt.world_size)
    model = wrap_fsdp(model, mesh, reshard_after_forward=cfg.reshard_after_forward)
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def on_rank(rt: runtime.Runtime, cfg: FSDPConfig) -> dict:
    n, dev = rt.world_size, rt.device
    b, s, h = cfg.batch_size, cfg.seq_len, cfg.hidden
    full = build_model(hidden=h, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                       seed=cfg.seed, device=dev)
    batches = [synthetic_batch(batch_size=b, seq_len=s, hidden=h, seed=cfg.seed, rank=r,
                               device=dev) for r in range(n)]
    x, y = batches[rt.rank]
    ref = _reference(cfg, full, batches, dev)
    del batches

    psi = sum(p.numel() for p in full.parameters())
    units = [4 * sum(p.numel() for p in layer.parameters()) for layer in full.layers]
    link = fit_link(rt, max_bytes=4 << 20)  # the CLI's α–β; the notebook uses the profile
    rate = compute_rate(rt, hidden=h, num_heads=cfg.num_heads, batch_size=b, seq_len=s)
    flops = tp_formulas.flops_per_rank(batch_size=b, seq_len=s, hidden=h,
                                       num_layers=cfg.num_layers)

    mesh = None
    if "fsdp" in cfg.variants:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(dev.type, (n,))
    rows = []
    for variant in cfg.variants:
        stage = STAGE[variant]
        # the point's peak: the whole model, the batch and the reference (held throughout)
        # count too
        runtime.reset_device_peak(dev)
        model, opt = _build(variant, full, cfg, rt, mesh)
        err = timing.worst_over_ranks(rt, check(variant, model, opt, ref, x, y, rt.rank, n))
        step = make_step(model, opt, x, y)
        counter = CommCounter()
        reset_device_peak(dev)
        with counter, StepMemory(model, opt, checkpoint=cfg.checkpoint) as mem:
            _sampled_step(step, mem)
        step_peak = device_peak_bytes(dev)
        held = held_bytes(model, opt)  # after a whole step: gradients and states all present
        peaks = _peaks(cfg, variant, stage, model, opt, step, mem, psi=psi, n=n)
        law = formulas.state_bytes(params=psi, stage=stage, dp=n, **formulas.LAB_BYTES)
        coll = formulas.collectives_per_step(stage=stage, unit_bytes=units,
                                             reshard_after_forward=cfg.reshard_after_forward)
        pred = formulas.predict_step(flops=flops, compute_flop_per_s=rate, collectives=coll,
                                     ranks=n, alpha_s=link["alpha_s"],
                                     beta_bytes_per_s=link["beta_bytes_per_s"])
        traced = {}
        if variant in TRACED and n > 1 and not cfg.checkpoint:
            recorder = StepRecorder(model, opt, variant, dev)
            stats, slowest = timed_after_warmup(recorder.timed(step), cfg, rt)
            recorder.close()
            traced = _timeline(rt, recorder, slowest)
        else:
            stats, slowest = timed_after_warmup(step, cfg, rt)
        peak = runtime.max_device_peak_bytes(dev)
        alone = math.nan
        if n > 1:  # the same collectives, nothing around them: the step's split
            alone = timing.summarize(timing.repeat_timed(
                collectives_alone(coll, dev), warmup=1, repeat=3, device=dev),
                prefix="t")["t_p50_s"]
        # FSDP2's own work: its step with nothing on the wire, beside the plain model's
        local = (_local_step_s(model, step, cfg, rt) if stage == "zero3" and n > 1
                 and not cfg.checkpoint else math.nan)
        t = stats["step_time_p50_s"]
        rows.append({
            **cfg.describe(),
            "variant": variant,
            "stage": stage,
            "world_size": n,
            "num_params": psi,
            "matches_single_process": bool(err <= cfg.tolerance),
            "max_rel_error": err,
            "tolerance": cfg.tolerance,
            "param_bytes_per_rank": held["params"],
            "grad_bytes_per_rank": held["gradients"],
            "optimizer_bytes_per_rank": held["optimizer"],
            "state_bytes_per_rank": held["total"],
            "param_bytes_formula": law["params"],
            "grad_bytes_formula": law["gradients"],
            "optimizer_bytes_formula": law["optimizer"],
            "state_bytes_formula": law["total"],
            "device_memory_peak_bytes": peak,
            **peaks,
            "peak_device_bytes": step_peak,
            "allreduce_bytes_measured": counter.bytes["all_reduce"],
            "allgather_bytes_measured": counter.bytes["all_gather"],
            "reduce_scatter_bytes_measured": counter.bytes["reduce_scatter"],
            "collective_calls_measured": sum(counter.calls.values()),
            # DDP all-reduces bucket by bucket, a count no formula of ours fixes
            "collective_calls_formula": (len(coll) if n > 1 else 0) if stage != "ddp" else math.nan,
            "comm_bytes_measured": counter.volume_bytes(),
            # DDP all-reduces even in a world of one; ZeRO-1 and FSDP2 skip their collectives
            "comm_bytes_formula": (formulas.volume_bytes(coll) if n > 1 or stage == "ddp"
                                   else 0.0),
            **stats,
            "step_times_s": slowest,
            **traced,
            "collectives_time_alone_s": alone,
            "local_step_time_p50_s": local,
            **prediction_fields(link=link, compute_flop_per_s=rate, flops_per_rank=flops,
                                predicted=pred),
            "prediction_error_pct": tp_formulas.prediction_error_pct(
                predicted_s=pred["step_s"], measured_s=t),
        })
        del model, opt, step
    # compute only, last (as warm as the variants): the plain model on this rank's batch
    bare = copy.deepcopy(full)
    bare_opt = torch.optim.Adam(bare.parameters(), lr=cfg.lr)
    compute, _ = timed_after_warmup(make_step(bare, bare_opt, x, y), cfg, rt,
                                    prefix="compute_time")
    add_compute_time(rows, compute)
    adam = _adam_alone(rt, cfg, bare_opt, psi)
    for row in rows:
        # FSDP2's own work, where measured, is against the plain model's step and its Adam over
        # all Ψ; without it FSDP2's own Adam steps Ψ/N, as the hand-written ZeRO's does
        whole = row["stage"] == "ddp" or (row["stage"] == "zero3"
                                         and math.isfinite(row["local_step_time_p50_s"]))
        row["optimizer_time_s"] = adam["whole"] if whole else adam["slice"]
    add_checkpoint_fields(rows, cfg, rt, full, x, y)
    return {"rows": against_ddp(rows)} if rt.rank == 0 else {}


def _alone_s(rt, fn, repeat: int = 5) -> float:
    """p50 of ``fn`` on each rank alone (:func:`labkit.timing.in_turns`), the slowest
    rank's. Collective."""
    return timing.in_turns(rt, lambda: statistics.median(timing.repeat_timed(
        fn, warmup=1, repeat=repeat, device=rt.device, barrier=False)))


def _adam_alone(rt, cfg: FSDPConfig, opt, psi: int) -> dict:
    """Seconds of Adam's arithmetic, one rank alone (:func:`_alone_s`), which F/R (forward
    and backward) leaves out: ``whole``, ``torch.optim.Adam`` over the plain model's Ψ
    (``opt``, after the plain model's last use: a step of :func:`labkit.tp.models.make_step`
    leaves its gradients in place, so each call does the whole update); ``slice``,
    :func:`labkit.fsdp.shard.adam_update` over a rank's flat slice of Ψ/N, with the
    hand-written ZeRO's defaults."""
    assert all(p.grad is not None for group in opt.param_groups for p in group["params"])
    whole = _alone_s(rt, opt.step)
    size = -(-psi // rt.world_size)
    param, grad, m, v = (torch.rand(size, device=rt.device) for _ in range(4))
    piece = _alone_s(rt, lambda: adam_update(param, grad, m, v, step=1, lr=cfg.lr,
                                             betas=ADAM_BETAS, eps=ADAM_EPS))
    return {"whole": whole, "slice": piece}


def _local_step_s(model, step, cfg: FSDPConfig, rt) -> float:
    """p50 (the slowest rank's, as the step's) of FSDP2's ``step`` with its collectives local
    (:class:`labkit.fsdp.local.LocalCollectives`), every rank at once; NaN where they could
    not be swapped. Last of the variant's timings: the weights it leaves are wrong."""
    from labkit.fsdp.local import LocalCollectives

    with LocalCollectives(model, rt.rank) as local:
        if not local.active:
            return math.nan
        stats, _ = timed_after_warmup(step, cfg, rt, prefix="t")
    return stats["t_p50_s"]


def _timeline(rt, recorder: StepRecorder, slowest: list) -> dict:
    """The timed step of median length, every rank's layers and collectives on one clock
    (:func:`labkit.fsdp.trace.step_slices`): the row's ``timeline_s``. Collective."""
    from labkit.fsdp.trace import step_slices
    from labkit.machine.formulas import median_index

    k = median_index(slowest)
    # the recorder also saw the warm-up steps: the timed ones are the last
    every, shared = timing.gather_stamps(rt.device, recorder.record(k - len(slowest)))
    return {"timeline_s": step_slices(every, shared_clock=shared),
            "timeline_step": k + 1, "timeline_step_time_s": slowest[k]}


def _sampled_step(step, mem: StepMemory) -> None:
    """``step`` (a :func:`labkit.tp.models.make_step` closure), sampled inside by ``mem``'s
    hooks and once more after the optimizer's step."""
    step()
    mem.sample("after step")


def _activation_formula(cfg: FSDPConfig, checkpoint: bool) -> tuple[float, float]:
    """(one layer's, the loss's) saved activation bytes (:mod:`labkit.tp.formulas`)."""
    kw = dict(batch_size=cfg.batch_size, seq_len=cfg.seq_len, hidden=cfg.hidden,
              num_heads=cfg.num_heads)
    loss = 2.0 * cfg.batch_size * cfg.seq_len * cfg.hidden * tp_formulas.BYTES_PER_VALUE
    one = tp_formulas.saved_activation_bytes(num_layers=1, checkpoint=checkpoint, **kw)
    return one - loss, loss


def _peak_fields(mem: StepMemory, prefix: str) -> dict:
    top = mem.peak
    return {f"{prefix}_bytes_per_rank": float(top["total"]), f"{prefix}_at": top["label"],
            **{f"{prefix}_{k}_bytes": float(top[k]) for k in (
                "params", "gradients", "optimizer", "buffers", "activations")}}


def _peaks(cfg, variant, stage, model, opt, step, mem, *, psi: int, n: int) -> dict:
    """The counted peak of the step just sampled, its formula, and for FSDP both ways of
    resharding (one more step, sampled, with the other setting; then the config's again)."""
    layer, loss = _activation_formula(cfg, cfg.checkpoint)

    def law(reshard: bool) -> float:
        return formulas.peak_bytes(stage=stage, params=psi, layers=cfg.num_layers, dp=n,
                                   layer_activation_bytes=layer, loss_activation_bytes=loss,
                                   reshard_after_forward=reshard)

    out = {**_peak_fields(mem, "peak"), "peak_bytes_formula": law(cfg.reshard_after_forward),
           "peak_resharded_bytes_per_rank": math.nan, "peak_resharded_bytes_formula": math.nan,
           "peak_kept_bytes_per_rank": math.nan, "peak_kept_bytes_formula": math.nan}
    if variant == "fsdp":
        mine = "resharded" if cfg.reshard_after_forward else "kept"
        other = "kept" if cfg.reshard_after_forward else "resharded"
        model.set_reshard_after_forward(not cfg.reshard_after_forward)
        with StepMemory(model, opt, checkpoint=cfg.checkpoint) as flipped:
            _sampled_step(step, flipped)
        model.set_reshard_after_forward(cfg.reshard_after_forward)
        out.update({f"peak_{mine}_bytes_per_rank": out["peak_bytes_per_rank"],
                    f"peak_{mine}_bytes_formula": out["peak_bytes_formula"],
                    f"peak_{other}_bytes_per_rank": float(flipped.peak["total"]),
                    f"peak_{other}_bytes_formula": law(not cfg.reshard_after_forward)})
    return out


def add_checkpoint_fields(rows: list[dict], cfg: FSDPConfig, rt, full, x, y) -> None:
    """The plain model on this rank's batch without and with activation checkpointing, on
    every row: the bytes saved for backward (counted) beside their formulas, the step timed
    both ways and the forward alone (the recomputation's price)."""
    from labkit.memory import SavedActivations

    out = {}
    for ckpt, name in ((False, "activation"), (True, "checkpoint_activation")):
        model = copy.deepcopy(full)
        model.checkpoint = ckpt
        with SavedActivations(exclude=list(model.parameters())) as meter:
            loss = loss_fn(model(x.detach().requires_grad_(True)), y)
        del loss  # the graph goes, and with it what was saved
        layer, lossb = _activation_formula(cfg, ckpt)
        out[f"{name}_bytes_measured"] = float(meter.peak_bytes)
        out[f"{name}_bytes_formula"] = cfg.num_layers * layer + lossb
        if ckpt:
            stats, _ = timed_after_warmup(
                make_step(model, torch.optim.Adam(model.parameters(), lr=cfg.lr), x, y), cfg, rt,
                prefix="checkpoint_compute_time")
            out.update(stats)
        else:
            def forward(model=model):
                model(x.detach().requires_grad_(True))

            out.update(timing.summarize(timing.repeat_timed(
                forward, warmup=cfg.warmup, repeat=cfg.measured_steps, device=rt.device),
                prefix="forward_time"))
    for row in rows:
        row.update(out)


def against_ddp(rows: list[dict]) -> list[dict]:
    """DDP's measured bytes (held and moved) on every row, and each row's ratio to them (NaN
    when the launch ran no DDP)."""
    ddp = next((r for r in rows if r["variant"] == "ddp"), None)
    out = []
    for r in rows:
        d = {k: (ddp[k] if ddp else math.nan) for k in (
            "param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank",
            "state_bytes_per_rank", "comm_bytes_measured", "step_time_p50_s")}
        out.append({**r,
                    "ddp_param_bytes_per_rank": d["param_bytes_per_rank"],
                    "ddp_grad_bytes_per_rank": d["grad_bytes_per_rank"],
                    "ddp_optimizer_bytes_per_rank": d["optimizer_bytes_per_rank"],
                    "ddp_state_bytes_per_rank": d["state_bytes_per_rank"],
                    "ddp_comm_bytes_measured": d["comm_bytes_measured"],
                    "state_ratio_vs_ddp": r["state_bytes_per_rank"] / d["state_bytes_per_rank"],
                    "comm_ratio_vs_ddp": (r["comm_bytes_measured"] / d["comm_bytes_measured"]
                                          if d["comm_bytes_measured"] else math.nan),
                    "step_ratio_vs_ddp": r["step_time_p50_s"] / d["step_time_p50_s"]})
    return out


if __name__ == "__main__":
    worker_main(on_rank, FSDPConfig)
