"""DDP training lab, rank side: time optimizer steps with and without DistributedDataParallel.

Run by hand (``labkit ddp`` / :func:`labkit.ddp.run.ddp_scaling` build the same command, one
launch per world size)::

    torchrun --standalone --nproc-per-node=2 -m labkit.workers.ddp \\
        --config '{"model": "mlp", "batch_size": 64, "steps": 25, "warmup": 5}' --out ddp.json

What one launch of N ranks does, all on synthetic seeded data drawn on the device:

For each batch size of the config, inside this one launch:

1. **no-DDP baseline** (only in the 1-rank launch, only if ``baseline``): the plain model, no
   wrapper, no all-reduce, same per-rank batch. Row ``variant: no_ddp``. It runs in the 1-rank
   launch, not in a launch of its own, so it uses the same threads a 1-rank DDP run uses (all
   cores) and costs no extra torchrun start.
2. **DDP**: the model wrapped with the config's bucket_cap_mb, broadcast_buffers, static_graph and
   gradient_as_bucket_view; ``steps`` optimizer steps, the first ``warmup`` untimed. Every rank
   times each step; the step's time is the slowest rank's (:func:`labkit.timing.summarize`).
   Row ``variant: ddp``, with the replicas' parameter drift (0 when DDP kept them in sync).
3. **where the time goes** (if ``breakdown``): the same DDP step under ``no_sync()`` (compute
   without the all-reduce), then a standalone all-reduce of all gradient bytes; the DDP row gets
   exposed communication, overlap with backward, algbw and busbw (:mod:`labkit.ddp.analysis`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit import runtime, timing
from labkit.ddp import analysis
from labkit.ddp.config import DDPConfig
from labkit.ddp.models import build_model, grad_bytes, num_params, synthetic_batches
from labkit.ddp.train import gather_params, make_optimizer, make_step, replica_drift, wrap_ddp
from labkit.workers._harness import worker_main


def _timed(step, cfg: DDPConfig, rt: runtime.Runtime, prefix: str = "step_time",
           warmup: int | None = None) -> dict:
    """Time ``step`` on every rank; the slowest rank's per-step times and their summary."""
    local = timing.repeat_timed(step, warmup=cfg.warmup if warmup is None else warmup,
                                repeat=cfg.measured_steps, device=rt.device)
    slowest, by_rank = timing.slowest_step_times(local)
    stats = timing.summarize(local, prefix=prefix)
    stats[f"{prefix.removesuffix('_time')}_times_s"] = [float(t) for t in slowest]
    if prefix == "step_time":  # kept so a reader can check "slowest rank" for themselves
        stats["rank_step_times_s"] = by_rank.tolist()
    return stats


def _row(cfg: DDPConfig, variant: str, world_size: int, model, stats: dict) -> dict:
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
    }


def run(rt: runtime.Runtime, cfg: DDPConfig) -> dict:
    rows = []
    for batch in cfg.batch_size:  # every batch size inside this one launch
        rows += run_batch(rt, cfg.at(batch))
    return {"rows": rows} if rt.rank == 0 else {}


def run_batch(rt: runtime.Runtime, cfg: DDPConfig) -> list[dict]:
    """Baseline (1-rank launch only), DDP, breakdown, at the config's one batch size."""
    batches = synthetic_batches(cfg, rt.rank, rt.device)
    rows = []
    if cfg.baseline and rt.world_size == 1:
        model = build_model(cfg, rt.device)
        stats = _timed(make_step(model, make_optimizer(model, cfg), batches), cfg, rt)
        rows.append(_row(cfg, "no_ddp", 1, model, stats))
        del model

    model = build_model(cfg, rt.device)
    ddp = wrap_ddp(model, cfg, rt.device)
    opt = make_optimizer(ddp, cfg)
    # gradients that are views into DDP's buckets must be zeroed in place, not dropped
    keep_views = not cfg.gradient_as_bucket_view
    stats = _timed(make_step(ddp, opt, batches, set_to_none=keep_views), cfg, rt)
    # after exactly cfg.steps synchronised steps: the state the tests compare
    drift = replica_drift(model)
    row = _row(cfg, "ddp", rt.world_size, model, stats)
    row.update(replica_drift=drift, replicas_in_sync=drift == 0.0)
    if cfg.return_params:  # small test models only: every rank's parameters, in rank order
        row["params_by_rank"] = gather_params(model)
    if cfg.breakdown:
        row.update(_breakdown(cfg, rt, ddp, opt, batches, row))
    return rows + [row]


def _breakdown(cfg, rt, ddp, opt, batches, row: dict) -> dict:
    """no_sync steps and a standalone all-reduce of the gradient bytes; derived columns."""
    keep_views = not cfg.gradient_as_bucket_view
    nosync = _timed(make_step(ddp, opt, batches, no_sync=True, set_to_none=keep_views), cfg, rt,
                    prefix="nosync_step_time", warmup=1)
    nbytes = row["grad_bytes"]
    flat = torch.zeros(nbytes // 4, dtype=torch.float32, device=rt.device)
    ar = _timed(lambda: dist.all_reduce(flat), cfg, rt, prefix="allreduce_time", warmup=2)
    t_ddp, t_ns, t_ar = row["step_time_p50_s"], nosync["nosync_step_time_p50_s"], \
        ar["allreduce_time_p50_s"]
    exposed = analysis.exposed_comm_s(t_ddp, t_ns)
    algbw = analysis.algbw_gb_per_s(nbytes, t_ar)
    return {
        **nosync, **ar,
        "allreduce_bytes": nbytes,
        "allreduce_algbw_gb_per_s": algbw,
        "allreduce_busbw_gb_per_s": analysis.busbw_gb_per_s(algbw, rt.world_size),
        "exposed_comm_s": exposed,
        "comm_fraction": exposed / t_ddp,
        "overlap_fraction": analysis.overlap_fraction(exposed, t_ar),
    }


if __name__ == "__main__":
    worker_main(run, DDPConfig)
