"""Tensor-parallel lab, rank side: one launch of P ranks runs every variant of the config.

Run by hand (``labkit tp`` / :func:`labkit.tp.run.run` build the same command, one launch
per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.tp.worker \\
        --config '{"hidden": 256, "num_heads": 8, "variants": ["naive", "library"]}' --out tp.json

What one launch does, every rank on the same seeded batch (TP splits weights, not data):

1. **the single-process reference**: every rank builds the whole model from the seed and runs
   one forward and backward on the whole batch: output, input gradient, every weight gradient;
2. **the link and the device**, measured now, under the same load as the steps: α and β from a
   short all-reduce sweep (:func:`labkit.tp.measure.fit_link`), and the FLOP/s of one rank
   alone on its share of one layer (:func:`labkit.tp.measure.compute_rate`, the ranks taking
   turns);
3. per variant (``naive``, ``library``, ``sp``): **correctness first** -- one forward and
   backward compared with the reference (the output, the input gradient, every local slice of
   every weight gradient; sequence parallelism's output and input gradient are the rank's
   tokens; ``matches_single_process``); one step with every collective counted (by
   :class:`labkit.tp.comm.Comm` in the hand-written versions, by
   :class:`labkit.tp.measure.CommCounter` for the library's); then ``steps`` SGD steps, the
   first ``warmup`` untimed, each timed on every rank, the slowest rank's time taken
   (:func:`labkit.timing.summarize`); the prediction of :mod:`labkit.tp.formulas` beside it;
   for the hand-written versions, every rank's entry and exit of every collective, gathered,
   split the time inside them into the messages and the wait for the later rank
   (:mod:`labkit.tp.timeline`), and the timed step of median length becomes the row's
   ``timeline_s`` (every rank's compute, waits and messages on one clock: the lab's Chrome
   trace, :mod:`labkit.tp.trace`; two clock reads a step and two a collective); their counted
   step also counts the bytes autograd saves for backward on the rank
   (:class:`labkit.memory.SavedActivations`);
4. **the library's own work** on the P ranks (``own_work_hidden``): the library and the
   teaching version at a small hidden size, one step of each in turn; the median difference
   is what DTensor adds to a step here (``library_own_work_s``, on the library's row);
5. **compute only**, last: the teaching version with f and g switched off (each rank's
   slices, no all-reduce: the arithmetic of a TP step without its communication), timed, with
   every rank's own median (``compute_time_rank_p50_s``: the rate of each rank's share).

The ``sp`` variant (:mod:`labkit.tp.sp`) has no 1-rank row: on one rank it is the teaching
version.

Everything lives on the rank's device; each variant's row carries its device memory peak
(None on a CPU).
"""

from __future__ import annotations

import math

from labkit import runtime, timing
from labkit.harness import worker_main
from labkit.machine.formulas import median_index
from labkit.memory import SavedActivations
from labkit.tp import formulas, timeline, waits
from labkit.tp.config import OWN_WORK_STEPS, TPConfig
from labkit.tp.measure import (
    CommCounter,
    compute_rate,
    fit_link,
    layer_seconds,
    max_rel_error,
    timed_steps,
)
from labkit.tp.models import (
    NAIVE_TAIL,
    Comm,
    build_model,
    library_tp_model,
    local_slice,
    local_tensor,
    loss_fn,
    make_optimizer,
    make_step,
    naive_tp_model,
    shard_dim,
    synthetic_batch,
)
from labkit.tp.report import add_compute_time, prediction_fields
from labkit.tp.sp import SP_TAIL, SPLayer, check_sp, make_sp_step, seq_shard


def _reference(full, x, y) -> dict:
    """One process, the whole model and batch: what every split must reproduce."""
    xr = x.detach().clone().requires_grad_(True)
    out = full(xr)
    loss_fn(out, y).backward()
    ref = {"out": out.detach(), "x_grad": xr.grad.detach(),
           "grads": {n: p.grad.detach().clone() for n, p in full.named_parameters()}}
    full.zero_grad(set_to_none=True)
    return ref


def split_dim(p, plain: int | None = None) -> int | None:
    """The dimension parameter ``p`` is split along: a DTensor says so (None: replicated),
    ``plain`` for a plain tensor. The FSDP lab's worker reads its shards so too."""
    placements = getattr(p, "placements", None)
    if placements is None:
        return plain
    pl = placements[0]
    return pl.dim if pl.is_shard() else None


def check(model, ref: dict, x, y, rank: int, world_size: int) -> float:
    """Largest relative difference between ``model`` and the reference over the output, the
    input gradient and this rank's slice of every weight gradient (one forward + backward;
    weight gradients relative to the largest of them, see
    :func:`labkit.tp.measure.max_rel_error`)."""
    xv = x.detach().clone().requires_grad_(True)
    out = model(xv)
    loss_fn(out, y).backward()
    grads = []
    for name, p in model.named_parameters():
        # a plain tensor: the teaching version's table (labkit.tp.models.SHARD_DIM)
        want = local_slice(ref["grads"][name], split_dim(p, shard_dim(name)), rank, world_size)
        grads.append((local_tensor(p.grad), want))
    model.zero_grad(set_to_none=True)
    scale = max(float(g.abs().max()) for g in ref["grads"].values())
    return max(max_rel_error([(out, ref["out"]), (xv.grad, ref["x_grad"])]),
               max_rel_error(grads, scale=scale))


def timed_after_warmup(step, cfg, rt, *, prefix: str = "step_time",
                       rank_p50: bool = False) -> tuple[dict, list]:
    """``cfg.warmup`` untimed calls of ``step``, then ``cfg.measured_steps`` timed ones
    (:func:`labkit.tp.measure.timed_steps`: the statistics and the slowest rank's times). The
    FSDP lab's worker times its steps so too."""
    for _ in range(cfg.warmup):
        step()
    return timed_steps(step, rt, repeat=cfg.measured_steps, prefix=prefix, rank_p50=rank_p50)


def _inside_and_timeline(rt, comm: Comm, slowest: list) -> tuple[dict, dict]:
    """Seconds per step inside the collectives on the rank that spent the longest there, split
    into the wait for the later rank and the messages (:func:`labkit.tp.timeline.split_waits`),
    and the timed step of median length on one clock (:func:`labkit.tp.timeline.step_slices`),
    and every timed step's collectives (:func:`labkit.tp.waits.call_messages_s`), all from
    every rank's stamps. Collective."""
    k = median_index(slowest)
    every, shared = timing.gather_stamps(rt.device, (comm.timeline(), comm.step_record(k)))
    worst = timeline.slowest(timeline.split_waits([tl for tl, _ in every], shared_clock=shared))
    slices = timeline.step_slices([rec for _, rec in every], shared_clock=shared)
    calls = waits.call_messages_s([tl for tl, _ in every], comm.ops(), shared_clock=shared)
    return ({k2: v / len(slowest) for k2, v in worst.items()},
            {"timeline_s": slices, "timeline_step": k + 1, "timeline_step_time_s": slowest[k],
             "collective_calls_s": calls})


def _variant(variant: str, full, rt, mesh, x, y, *, ref: dict, lr: float):
    """(model, its Comm or None, its checked error, its step closure) of one variant."""
    p, dev = rt.world_size, rt.device
    if variant == "library":
        model = library_tp_model(full, mesh)
        err = check(model, ref, x, y, rt.rank, p)
        return model, None, err, make_step(model, make_optimizer(model, lr), x, y)
    comm = Comm(p, dev)
    if variant == "naive":
        model = naive_tp_model(full, rt.rank, p, comm)
        err = check(model, ref, x, y, rt.rank, p)
        step = make_step(model, make_optimizer(model, lr), x, y)
    else:
        model = naive_tp_model(full, rt.rank, p, comm, layer=SPLayer)
        err = check_sp(model, ref, x, y, rt.rank, p, comm)
        step = make_sp_step(model, make_optimizer(model, lr), seq_shard(x, rt.rank, p),
                            seq_shard(y, rt.rank, p), comm)
    return model, comm, err, comm.timed(step, tail=SP_TAIL if variant == "sp" else NAIVE_TAIL)


def _counted(step, model, comm) -> dict:
    """One step with its collectives counted, and, for the hand-written versions, the bytes
    autograd saved on this rank (the library's DTensors: not counted)."""
    if comm is None:
        counter = CommCounter()
        with counter:
            step()
        return {"activation_bytes_measured": math.nan,
                "allreduce_calls_measured": counter.calls["all_reduce"],
                "allgather_calls_measured": counter.calls["all_gather"],
                "reduce_scatter_calls_measured": counter.calls["reduce_scatter"],
                "comm_bytes_measured": counter.bytes["all_reduce"],
                "allgather_bytes_measured": counter.bytes["all_gather"],
                "reduce_scatter_bytes_measured": counter.bytes["reduce_scatter"],
                "other_collective_calls": sum(n for op, n in counter.calls.items()
                                              if op != "all_reduce")}
    comm.reset()
    with SavedActivations(exclude=[local_tensor(q) for q in model.parameters()]) as meter:
        step()
    return {"activation_bytes_measured": float(meter.peak_bytes),
            "allreduce_calls_measured": comm.calls_by_op["all_reduce"],
            "allgather_calls_measured": comm.calls_by_op["all_gather"],
            "reduce_scatter_calls_measured": comm.calls_by_op["reduce_scatter"],
            "comm_bytes_measured": comm.bytes,
            "allgather_bytes_measured": comm.bytes_by_op["all_gather"],
            "reduce_scatter_bytes_measured": comm.bytes_by_op["reduce_scatter"],
            "other_collective_calls": 0}


def on_rank(rt: runtime.Runtime, cfg: TPConfig) -> dict:
    p, dev = rt.world_size, rt.device
    b, s, h = cfg.batch_size, cfg.seq_len, cfg.hidden
    full = build_model(hidden=h, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                       seed=cfg.seed, device=dev)
    x, y = synthetic_batch(batch_size=b, seq_len=s, hidden=h, seed=cfg.seed, device=dev)
    ref = _reference(full, x, y)

    each = b * s * h * formulas.BYTES_PER_VALUE  # one all-reduced activation
    link = fit_link(rt, max_bytes=4 * each)
    rate = compute_rate(rt, hidden=h, num_heads=cfg.num_heads, batch_size=b, seq_len=s, split=p)
    mesh = None
    if "library" in cfg.variants:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(dev.type, (p,))
    rows = []
    for variant in cfg.variants:
        common = _common(cfg, full, p, link, rate, variant)
        # the point's peak: the whole model, batch and reference (held throughout) count too
        runtime.reset_device_peak(dev)
        model, comm, err, step = _variant(variant, full, rt, mesh, x, y, ref=ref, lr=cfg.lr)
        err = timing.worst_over_ranks(rt, err)  # before any timing
        counted = _counted(step, model, comm)
        # the counted step ran under a counter (a dispatch mode, saved-tensor hooks), not as
        # the timed steps run: as the first warm-up, it left the library's first timed step on
        # 2 ranks 1.2-1.4x the next ones here
        for _ in range(cfg.warmup):
            step()
        if comm is not None:
            comm.reset()
        stats, slowest = timed_steps(step, rt, repeat=cfg.measured_steps)
        inside = dict.fromkeys(("inside", "wait", "message"), math.nan)
        traced = {}
        if comm is not None and p > 1:
            inside, traced = _inside_and_timeline(rt, comm, slowest)
        peak = runtime.max_device_peak_bytes(dev)
        rows.append({
            **common,
            "variant": variant,
            "world_size": p,
            "params_per_rank": sum(local_tensor(q).numel() for q in model.parameters()),
            "matches_single_process": bool(err <= cfg.tolerance),
            "max_rel_error": err,
            **counted,
            **stats,
            "step_times_s": slowest,
            "allreduce_time_in_step_s": inside["inside"],
            "allreduce_wait_in_step_s": inside["wait"],
            "allreduce_message_in_step_s": inside["message"],
            **traced,
            "device_memory_peak_bytes": peak,
            "prediction_error_pct": formulas.prediction_error_pct(
                predicted_s=common["predicted_step_s"], measured_s=stats["step_time_p50_s"]),
        })
        del model, step
    if p > 1 and cfg.own_work_width:
        own = _own_work(rt, cfg, mesh)
        for r in rows:
            if r["variant"] == "library":
                r.update(own)
    # compute only: the same slices and arithmetic, f and g as identities (timed last, when
    # allocator and caches are as warm as for the variants); every rank's own median too
    bare = naive_tp_model(full, rt.rank, p, Comm(1))
    compute, _ = timed_after_warmup(make_step(bare, make_optimizer(bare, cfg.lr), x, y), cfg, rt,
                                    prefix="compute_time", rank_p50=True)
    add_compute_time(rows, compute)
    if cfg.baseline and p > 1:
        rows += _baseline_rows(rt, cfg, full, ref, x, y)
    return {"rows": rows} if rt.rank == 0 else {}


def _common(cfg: TPConfig, full, p: int, link: dict, rate: float, variant: str = "naive") -> dict:
    """The fields a row of ``variant`` at world size ``p`` carries besides its measurements:
    the workload, the formulas' counts and the prediction from ``rate`` (a rank's share of a
    layer, alone) and the α–β ``link``."""
    b, s, h = cfg.batch_size, cfg.seq_len, cfg.hidden
    flops = formulas.flops_per_rank(batch_size=b, seq_len=s, hidden=h,
                                    num_layers=cfg.num_layers, world_size=p)
    each = b * s * h * formulas.BYTES_PER_VALUE
    if variant == "sp":
        from labkit.fsdp.formulas import predict_step as predict_collectives

        coll = formulas.sp_collectives(batch_size=b, seq_len=s, hidden=h,
                                       num_layers=cfg.num_layers, world_size=p)
        calls = {op: n for op, (n, _) in coll.items()}
        nbytes = {op: v for op, (_, v) in coll.items()}
        pred = predict_collectives(
            flops=flops, compute_flop_per_s=rate, ranks=p, alpha_s=link["alpha_s"],
            beta_bytes_per_s=link["beta_bytes_per_s"],
            collectives=[(op, v / n) for op, (n, v) in coll.items() for _ in range(n)])
    else:
        n_ar = formulas.allreduce_count(num_layers=cfg.num_layers, world_size=p)
        calls = {"all_reduce": n_ar, "all_gather": 0, "reduce_scatter": 0}
        nbytes = {"all_reduce": n_ar * each, "all_gather": 0, "reduce_scatter": 0}
        pred = formulas.predict_step(flops=flops, compute_flop_per_s=rate, allreduces=n_ar,
                                     allreduce_bytes_each=each, ranks=p, alpha_s=link["alpha_s"],
                                     beta_bytes_per_s=link["beta_bytes_per_s"])
    return {
        **cfg.describe(),
        "num_params": sum(t.numel() for t in full.parameters()),
        "num_params_formula": formulas.param_count(hidden=h, num_layers=cfg.num_layers),
        "params_per_rank_formula": formulas.params_per_rank(hidden=h, num_layers=cfg.num_layers,
                                                            world_size=p),
        "tolerance": cfg.tolerance,
        "allreduce_calls_formula": calls["all_reduce"],
        "allgather_calls_formula": calls["all_gather"],
        "reduce_scatter_calls_formula": calls["reduce_scatter"],
        "allreduce_bytes_formula": nbytes["all_reduce"],
        "allgather_bytes_formula": nbytes["all_gather"],
        "reduce_scatter_bytes_formula": nbytes["reduce_scatter"],
        "comm_bytes_formula": sum(nbytes.values()),
        "bytes_per_allreduce": each,
        **activation_fields(cfg, p, sequence_parallel=variant == "sp"),
        **prediction_fields(link=link, compute_flop_per_s=rate, flops_per_rank=flops,
                            predicted=pred),
    }


def activation_fields(cfg: TPConfig, p: int, *, sequence_parallel: bool = False) -> dict:
    """The saved activations of one rank at TP degree ``p`` by the lab's exact count (with or
    without ``sequence_parallel``) and by Korthikanti et al.'s terms without and with sequence
    parallelism, as published and in the lab's terms (:mod:`labkit.tp.formulas`)."""
    kw = dict(batch_size=cfg.batch_size, seq_len=cfg.seq_len, hidden=cfg.hidden,
              num_heads=cfg.num_heads, num_layers=cfg.num_layers)
    lab = dict(bytes_per_value=formulas.BYTES_PER_VALUE, mask_bytes=0, flash=True)
    out = {"activation_bytes_formula": formulas.saved_activation_bytes(
        **kw, world_size=p, sequence_parallel=sequence_parallel)}
    for tag, sp in (("", False), ("_sp", True)):
        out[f"activation_korthikanti{tag}_bytes"] = formulas.korthikanti_activation_bytes(
            **kw, tp=p, sequence_parallel=sp)
        out[f"activation_korthikanti{tag}_fp32_bytes"] = formulas.korthikanti_activation_bytes(
            **kw, tp=p, sequence_parallel=sp, **lab)
    return out


def _own_work(rt, cfg: TPConfig, mesh) -> dict:
    """The library's own work on these P ranks: the library's step less the teaching
    version's, both at the small hidden size ``cfg.own_work_width`` (where the arithmetic and
    the messages' bytes are almost nothing and what is left is each step's fixed work), timed
    in turns, one step of each a round, so a change of the machine's state falls on both;
    the median of the rounds' differences. Collective."""
    import numpy as np

    w = cfg.own_work_width
    small = build_model(hidden=w, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                        seed=cfg.seed, device=rt.device)
    x, y = synthetic_batch(batch_size=cfg.batch_size, seq_len=cfg.seq_len, hidden=w,
                           seed=cfg.seed, device=rt.device)
    naive = naive_tp_model(small, rt.rank, rt.world_size, Comm(rt.world_size, rt.device))
    library = library_tp_model(small, mesh)
    steps = [make_step(m, make_optimizer(m, cfg.lr), x, y) for m in (naive, library)]
    for step in steps:  # warm-up: the library's first step builds its sharding plans
        step()
        step()
    local = [[], []]
    for _ in range(OWN_WORK_STEPS):
        for got, step in zip(local, steps):
            got += timing.repeat_timed(step, warmup=0, repeat=1, device=rt.device)
    times = [timing.slowest_step_times(got)[0] for got in local]  # the slowest rank's, a round
    diff = [lib - nai for nai, lib in zip(*times)]
    return {"own_work_hidden_used": w,
            "own_work_naive_step_s": float(np.median(times[0])),
            "own_work_library_step_s": float(np.median(times[1])),
            "library_own_work_s": max(0.0, float(np.median(diff)))}


def _baseline_rows(rt, cfg: TPConfig, full, ref, x, y) -> list[dict]:
    """The 1-rank rows without a launch of their own: rank 0 runs every variant on the whole
    model alone (the library on a mesh of itself) while the other ranks wait in a barrier, as a
    1-rank launch would on one core. Collective (the group and the barrier); rows on rank 0."""
    import torch.distributed as dist

    from labkit.metrics import summarize_times

    group = dist.new_group([0])
    rows = []
    if rt.rank == 0:
        from torch.distributed.device_mesh import DeviceMesh

        layer_s = layer_seconds(hidden=cfg.hidden, num_heads=cfg.num_heads,
                                batch_size=cfg.batch_size, seq_len=cfg.seq_len, device=rt.device)
        rate = formulas.flops_per_rank(batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                                       hidden=cfg.hidden, num_layers=1) / layer_s
        common = _common(cfg, full, 1, {"alpha_s": math.nan, "beta_bytes_per_s": math.nan,
                                        "sweep": []}, rate)
        for variant in (v for v in cfg.variants if v != "sp"):  # one rank: sp is naive
            model = (naive_tp_model(full, 0, 1, Comm(1)) if variant == "naive" else
                     library_tp_model(full, DeviceMesh.from_group(group, rt.device.type)))
            err = check(model, ref, x, y, 0, 1)
            step = make_step(model, make_optimizer(model, cfg.lr), x, y)
            times = timing.repeat_timed(step, warmup=cfg.warmup, repeat=cfg.measured_steps,
                                        device=rt.device, barrier=False)
            stats = {**summarize_times(times, "step_time"), "step_time_rank_spread": 0.0}
            rows.append({
                **common, "variant": variant, "world_size": 1, "baseline_in_launch": True,
                "params_per_rank": sum(local_tensor(q).numel() for q in model.parameters()),
                "matches_single_process": bool(err <= cfg.tolerance), "max_rel_error": err,
                **dict.fromkeys(("allreduce_calls_measured", "allgather_calls_measured",
                                 "reduce_scatter_calls_measured", "comm_bytes_measured",
                                 "allgather_bytes_measured", "reduce_scatter_bytes_measured",
                                 "other_collective_calls"), 0), **stats, "step_times_s": [float(t) for t in times],
                "allreduce_time_in_step_s": math.nan, "allreduce_wait_in_step_s": math.nan,
                "allreduce_message_in_step_s": math.nan, "device_memory_peak_bytes": None,
                "prediction_error_pct": formulas.prediction_error_pct(
                    predicted_s=common["predicted_step_s"], measured_s=stats["step_time_p50_s"]),
            })
        # one rank: f and g are identities, so the teaching version's step is the compute
        naive = next((r for r in rows if r["variant"] == "naive"), None)
        if naive is not None:
            add_compute_time(rows, {**{k.replace("step_time", "compute_time"): v
                                       for k, v in naive.items() if k.startswith("step_time_")},
                                    "compute_time_rank_p50_s": [naive["step_time_p50_s"]]})
    dist.barrier()
    return rows


if __name__ == "__main__":
    worker_main(on_rank, TPConfig)
