"""How long notebook 05's experiments will take, estimated before anything launches (pure).

A student changes the parameters cell: another model, wider layers, larger batches. Each
launch then runs for as long as its steps take, and a setting that needs ten minutes should be
refused in one line before it starts, with its estimate and what to change (:func:`check`).

The estimate counts the floating-point work of every step the notebook's launches run
(:func:`flop_per_sample`, forward and backward), at the machine's matrix-product rate (the
machine profile's ``matmul_flop_per_s``) times what a model's layers reach of it
(:data:`EFFICIENCY`: small convolutions and attention run well below a large product's rate),
plus a fixed time per step, per launch (starting torchrun, importing torch, the rendezvous) and
per notebook (its imports, tables and figures).
"""

from __future__ import annotations

from labkit.ddp.config import ALLREDUCE_CALLS, DDPConfig
from labkit.ddp.formulas import param_count
from labkit.errors import UsageError

#: the share of the matrix-product rate each model's step reaches on one thread of a CPU
EFFICIENCY = {"mlp": 1.0, "cnn": 0.3, "transformer": 0.5}
#: fixed seconds: per optimizer step, per launch, per notebook run
STEP_S, LAUNCH_S, NOTEBOOK_S = 0.010, 5.5, 7.5
#: warm-up steps every launch runs before its first timed one (labkit.ddp.worker._warm_up)
LAUNCH_WARMUP_STEPS = 3


def flop_per_sample(config: DDPConfig) -> float:
    """Floating-point operations of one sample's forward and backward (3 x the forward's 2 per
    multiply-add) in ``config``'s model. The default MLP (4.2 M weights): 25 MFLOP.

    >>> round(flop_per_sample(DDPConfig(model="mlp")) / 1e6, 1)
    25.3
    >>> round(flop_per_sample(DDPConfig(model="cnn")) / 1e6, 1), \\
    ...     round(flop_per_sample(DDPConfig(model="transformer")) / 1e6, 1)
    (23.0, 80.2)
    """
    c = config
    if c.model == "mlp":
        macs = param_count(model="mlp", input_dim=c.input_dim, hidden_dim=c.hidden_dim,
                           output_dim=c.output_dim, num_layers=c.num_layers)
    elif c.model == "cnn":
        macs = sum(9 * (c.input_dim if k == 0 else c.hidden_dim) * c.hidden_dim
                   * (c.image_size // 2 ** k) ** 2 for k in range(c.num_layers))
        macs += c.hidden_dim * c.output_dim
    else:
        d, s = c.hidden_dim, c.seq_len
        macs = s * (c.input_dim * d + c.num_layers * (12 * d * d + 2 * s * d)) + d * c.output_dim
    return 6.0 * macs


def step_s(config: DDPConfig, batch: int, *, flop_per_s: float) -> float:
    """One optimizer step of ``batch`` samples on one thread alone (seconds).

    >>> round(step_s(DDPConfig(), 128, flop_per_s=45e9), 3)
    0.082
    """
    rate = float(flop_per_s) * EFFICIENCY[config.model]
    return STEP_S + flop_per_sample(config) * batch / rate


def notebook_s(config: DDPConfig, *, world_sizes, bucket_batch: int | None, flop_per_s: float,
               slowdown: float = 1.25, allreduce_bytes_per_s: float = 1e9) -> float:
    """Notebook 05's run, estimated (seconds): the 1-rank launch (no-DDP and DDP runs at every
    batch, the all-cores runs), each launch of more ranks (rounds of a DDP step, a ``no_sync``
    step, the plain step on rank 0 alone, the all-reduces and the copies; ``slowdown``: ranks
    computing at once) and the bucket A/B's launch at ``bucket_batch`` (None: none), which
    times run A's steps too. Its defaults: about 32 s.

    >>> cfg = DDPConfig(batch_size=(16, 32, 64, 128), steps=5, warmup=1,
    ...                 all_cores_batches=(32, 128))
    >>> round(notebook_s(cfg, world_sizes=[1, 2], bucket_batch=32, flop_per_s=45e9))
    32
    """
    rate_steps = config.steps
    rounds = config.measured_steps + 1
    ar = (ALLREDUCE_CALLS + 1) * param_count(model=config.model, input_dim=config.input_dim,
                           hidden_dim=config.hidden_dim, output_dim=config.output_dim,
                           num_layers=config.num_layers, seq_len=config.seq_len) * 4 \
        / allreduce_bytes_per_s  # the gradients' all-reduces, and the fit's, less than one more
    first = min(config.batch_size)
    total = NOTEBOOK_S

    def launch(n: int, batches) -> float:
        t = LAUNCH_S + LAUNCH_WARMUP_STEPS * step_s(config, first, flop_per_s=flop_per_s)
        for b in batches:
            one = step_s(config, b, flop_per_s=flop_per_s)
            if n == 1:
                t += 2 * rate_steps * one  # no DDP, then DDP
                if b in config.all_cores_batches:
                    # every core as a thread, in turn with one thread's steps
                    t += rate_steps * one * (1 + 1 / 1.8)
            else:
                # a DDP and a no_sync step on every rank, the plain step on rank 0 alone
                t += config.warmup * one * slowdown + rounds * ((2 * slowdown + 1) * one + ar)
        return t

    for n in world_sizes:
        total += launch(int(n), config.batch_size)
    if bucket_batch is not None and any(int(n) > 1 for n in world_sizes):
        total += launch(max(int(n) for n in world_sizes), [bucket_batch])
        # run A's DDP steps, timed in the same rounds (labkit.ddp.abtest)
        total += (config.warmup + rounds) * step_s(config, bucket_batch,
                                                   flop_per_s=flop_per_s) * slowdown
    return total


def check(config: DDPConfig, *, world_sizes, bucket_batch: int | None, flop_per_s: float,
          budget_s: float, slowdown: float = 1.25) -> float:
    """The estimate of :func:`notebook_s`, or a one-line :class:`UsageError` before anything
    launches when it exceeds ``budget_s``, saying what to change.

    >>> check(DDPConfig(batch_size=(16, 1024, 4096)), world_sizes=[1, 2], bucket_batch=16,
    ...       flop_per_s=45e9, budget_s=32)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: these settings would run about 410 s here, over this notebook's budget of 32 s: use smaller batches (the largest is 4096), a smaller model or fewer steps, or raise budget_s
    """
    est = notebook_s(config, world_sizes=world_sizes, bucket_batch=bucket_batch,
                     flop_per_s=flop_per_s, slowdown=slowdown)
    if est > budget_s:
        raise UsageError(f"these settings would run about {est:.0f} s here, over this "
                         f"notebook's budget of {budget_s:g} s: use smaller batches (the largest "
                         f"is {max(config.batch_size)}), a smaller model or fewer steps, or "
                         "raise budget_s")
    return est
