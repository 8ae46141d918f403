"""Tensor parallelism by the numbers: parameters, FLOPs, all-reduced bytes, and the step time
predicted from a measured compute rate and a measured α–β fit (pure: no torch).

Notation: ``b`` sequences of ``s`` tokens, hidden size ``h``, ``a`` heads, ``L`` layers, ``P``
tensor-parallel ranks, 4 bytes per value (the lab computes in fp32).

A layer is Megatron's: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``. In each of the two blocks
the first linear layers are split by columns (q, k, v by heads; the MLP's first layer by its
4h outputs) and the last by rows (the attention output projection; the MLP's second layer),
so a block needs exactly two collectives:

* **f** before the block: identity forward, all-reduce of the input gradient (b·s·h values)
  backward;
* **g** after the block: all-reduce of the partial outputs (b·s·h values) forward, identity
  backward.

Per layer and training step that is **4 all-reduces of b·s·h values**: 2 forward (g after
attention, g after the MLP) and 2 backward (f before attention, f before the MLP). The lab
counts every one (:mod:`labkit.tp.models` in f and g, :class:`labkit.tp.measure.CommCounter`
for the library version) against :func:`allreduce_count` and :func:`allreduce_bytes`.

The step-time prediction (nothing overlapped: TP's all-reduces sit on the critical path)::

    T = F / R + 4 L · t_ar(b·s·h·4 bytes, P)        F = 3 · L · (24 b s h² + 4 b s² h) / P

with R the measured FLOP/s of one rank and t_ar the ring all-reduce of
:func:`labkit.collectives.formulas.allreduce_time` with the α and β fitted in the same launch.
"""

from __future__ import annotations

import math

from labkit.collectives.formulas import allreduce_time
from labkit.config import positive_int, positive_number
from labkit.metrics import model_error_pct

#: bytes per value: the lab's weights, activations and gradients are fp32
BYTES_PER_VALUE = 4


def param_count(*, hidden: int, num_layers: int) -> int:
    """Parameters of the lab's model: per layer q, k, v, o (4h² + 4h), the MLP h→4h→h
    (8h² + 5h) and two LayerNorms (4h): ``L·(12h² + 13h)``.

    >>> param_count(hidden=256, num_layers=2)
    1579520
    """
    h = positive_int("hidden", hidden)
    return positive_int("num_layers", num_layers) * (12 * h * h + 13 * h)


def params_per_rank(*, hidden: int, num_layers: int, world_size: int) -> float:
    """Parameters one TP rank holds: the split weights and biases (12h² + 7h per layer) over P,
    plus what every rank keeps whole (the two row-parallel biases and the LayerNorms, 6h).

    >>> params_per_rank(hidden=256, num_layers=2, world_size=2)
    791296.0
    """
    h, n = positive_int("hidden", hidden), positive_int("world_size", world_size)
    return num_layers * ((12 * h * h + 7 * h) / n + 6 * h)


def allreduce_count(*, num_layers: int, world_size: int) -> int:
    """All-reduces per training step: 4 per layer (2 forward, 2 backward), none on one rank.

    >>> allreduce_count(num_layers=2, world_size=2), allreduce_count(num_layers=2, world_size=1)
    (8, 0)
    """
    positive_int("world_size", world_size)
    return 4 * positive_int("num_layers", num_layers) if world_size > 1 else 0


def allreduce_bytes(*, batch_size: int, seq_len: int, hidden: int, num_layers: int,
                    world_size: int, bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes all-reduced per training step (the sum of the all-reduce buffers, nccl-tests' S):
    ``4 L · b·s·h · bytes``. A ring moves 2(P−1)/P of each buffer over every rank's link.

    b = 8, s = 32, h = 256, L = 2 on 2 ranks: 8 all-reduces of 256 KiB.

    >>> allreduce_bytes(batch_size=8, seq_len=32, hidden=256, num_layers=2, world_size=2)
    2097152
    """
    each = (positive_int("batch_size", batch_size) * positive_int("seq_len", seq_len)
            * positive_int("hidden", hidden) * bytes_per_value)
    return allreduce_count(num_layers=num_layers, world_size=world_size) * each


def flops_per_rank(*, batch_size: int, seq_len: int, hidden: int, num_layers: int,
                   world_size: int = 1) -> float:
    """Training FLOPs of one rank per step: ``3 · L · (24 b s h² + 4 b s² h) / P``.

    Forward per layer: q, k, v, o 4·2bsh², the MLP 2·2bsh·4h, scores and their weighted sum
    2·2bs²h; backward twice the forward. Everything but LayerNorm, softmax and GELU.

    >>> flops_per_rank(batch_size=8, seq_len=32, hidden=256, num_layers=2, world_size=2)
    1233125376.0
    """
    b, s, h = batch_size, seq_len, hidden
    fwd = 24 * b * s * h * h + 4 * b * s * s * h
    return 3.0 * positive_int("num_layers", num_layers) * fwd / positive_int("world_size",
                                                                              world_size)


def activation_bytes(*, batch_size: int, seq_len: int, hidden: int, num_heads: int,
                     num_layers: int, bytes_per_value: int = BYTES_PER_VALUE) -> float:
    """Bytes the backward pass keeps, about ``L · (16 b s h + a b s²)`` values (layer inputs,
    norms, q, k, v, attention weights, the MLP's 4h-wide activations); a memory estimate.

    >>> activation_bytes(batch_size=8, seq_len=32, hidden=256, num_heads=8, num_layers=2)
    8912896.0
    """
    b, s, h = batch_size, seq_len, hidden
    return float(num_layers * (16 * b * s * h + num_heads * b * s * s) * bytes_per_value)


def predict_step(*, flops: float, compute_flop_per_s: float, allreduces: int,
                 allreduce_bytes_each: float, ranks: int, alpha_s: float,
                 beta_bytes_per_s: float) -> dict:
    """Predicted step: compute ``F / R`` plus ``allreduces`` ring all-reduces of
    ``allreduce_bytes_each`` (nothing overlapped). Returns ``compute_s``, ``comm_s``, ``step_s``.

    1.23 GFLOP at 40 GFLOP/s, 8 all-reduces of 256 KiB on 2 ranks, α = 100 µs, β = 1 GB/s:
    30.8 ms of compute, 8 · (2·100 µs + 262144 / 1e9 s) = 3.70 ms of communication.

    >>> p = predict_step(flops=1.233e9, compute_flop_per_s=40e9, allreduces=8,
    ...                  allreduce_bytes_each=262144, ranks=2, alpha_s=100e-6, beta_bytes_per_s=1e9)
    >>> round(p["compute_s"] * 1e3, 2), round(p["comm_s"] * 1e3, 2), round(p["step_s"] * 1e3, 2)
    (30.83, 3.7, 34.52)
    """
    compute = float(flops) / positive_number("compute rate", compute_flop_per_s)
    comm = 0.0
    if allreduces and ranks > 1:
        comm = allreduces * allreduce_time(size_bytes=allreduce_bytes_each, ranks=ranks,
                                           alpha_s=alpha_s, beta_bytes_per_s=beta_bytes_per_s)
    return {"compute_s": compute, "comm_s": float(comm), "step_s": compute + float(comm)}


def step_in_context(*, compute_alone_s: float, slowdown: float, allreduces: int,
                    allreduce_s: float, gathers: int = 0, gather_s: float = 0.0,
                    waits: float = 0, wait_s: float = 0.0, extra_s: float = 0.0) -> dict:
    """The step as this machine runs it: one rank's compute measured alone times the co-run
    ``slowdown`` (every rank computing at once, :meth:`labkit.machine.Profile.compute_slowdown`),
    plus ``allreduces`` all-reduces of ``allreduce_s`` each and ``gathers`` all-gathers and
    reduce-scatters of ``gather_s`` each (sequence parallelism's), each priced by the machine
    profile (a transfer, :meth:`~labkit.machine.Profile.transfer_s`, or a call's average in
    context, :meth:`~labkit.machine.Profile.allreduce_s`), plus ``waits`` scheduler waits of
    ``wait_s`` each (the messages of the measured step that waited,
    :func:`labkit.tp.waits.count`, or a mean count per step), plus ``extra_s`` of work
    measured apart (the library's bookkeeping). Returns ``compute_s``, ``transfers_s`` (the
    collectives), ``waits_s``, ``comm_s`` (the two), ``step_s``::

        T = σ F/R + n_ar t_ar + n_g t_g + n_waited t_wait (+ extra)

    54 ms of compute alone, 1.25x slower beside a second rank, 8 all-reduces of 0.3 ms, 2 of
    which waited 3.6 ms for the scheduler:

    >>> p = step_in_context(compute_alone_s=0.054, slowdown=1.25, allreduces=8, allreduce_s=3e-4,
    ...                     waits=2, wait_s=3.6e-3)
    >>> [round(p[k] * 1e3, 1) for k in ("compute_s", "transfers_s", "waits_s", "comm_s", "step_s")]
    [67.5, 2.4, 7.2, 9.6, 77.1]
    """
    compute = float(compute_alone_s) * positive_number("slowdown", slowdown)
    transfers = int(allreduces) * float(allreduce_s) + int(gathers) * float(gather_s)
    waited = float(waits) * float(wait_s)
    comm = transfers + waited
    return {"compute_s": compute, "transfers_s": transfers, "waits_s": waited, "comm_s": comm,
            "step_s": compute + comm + float(extra_s)}


def prediction_error_pct(*, predicted_s: float, measured_s: float) -> float:
    """100 · (predicted − measured) / measured (:func:`labkit.metrics.model_error_pct`).

    >>> round(prediction_error_pct(predicted_s=0.03, measured_s=0.025), 6)
    20.0
    """
    return model_error_pct(model_s=predicted_s, measured_s=measured_s)


def tp_speedup(*, batch_size: int, seq_len: int, hidden: int, num_layers: int, ranks: int,
               compute_flop_per_s: float, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Predicted speedup of P tensor-parallel ranks over one, when each rank brings a device
    of rate R of its own (a GPU each): ``T(1) / T(P)`` from :func:`predict_step`.

    h = 4096, b·s = 8192 tokens, 8 H100s at 400 TFLOP/s over NVLink (1 µs, 450 GB/s): one
    GPU computes a layer in 33.0 ms, eight in 4.1 ms plus 2.1 ms of all-reduces.

    >>> round(tp_speedup(batch_size=1, seq_len=8192, hidden=4096, num_layers=1, ranks=8,
    ...                  compute_flop_per_s=400e12, alpha_s=1e-6, beta_bytes_per_s=450e9), 2)
    5.26
    """
    kw = dict(batch_size=batch_size, seq_len=seq_len, hidden=hidden, num_layers=num_layers)
    one = flops_per_rank(**kw, world_size=1) / positive_number("compute rate", compute_flop_per_s)
    many = predict_step(flops=flops_per_rank(**kw, world_size=ranks),
                        compute_flop_per_s=compute_flop_per_s,
                        allreduces=allreduce_count(num_layers=num_layers, world_size=ranks),
                        allreduce_bytes_each=batch_size * seq_len * hidden * BYTES_PER_VALUE,
                        ranks=ranks, alpha_s=alpha_s, beta_bytes_per_s=beta_bytes_per_s)
    return one / many["step_s"]


def breakeven_hidden(*, batch_size: int, seq_len: int, ranks: int, compute_flop_per_s: float,
                     alpha_s: float, beta_bytes_per_s: float) -> float:
    """The hidden size above which P tensor-parallel ranks (a device each, rate R) beat one.

    Per layer TP saves ``(1 − 1/P) · 3(24 b s h² + 4 b s² h) / R`` of compute and pays
    ``4 · (2(P−1) α + 2(P−1)/P · 4 b s h / β)`` of all-reduces; both sides are a quadratic in h
    with one positive root. Compute grows as h², the all-reduced activations as h: a wide
    enough model always pays, a slow link or a fast device pushes the threshold up.

    b·s = 256 tokens on 2 ranks at 40 GFLOP/s, α = 100 µs, β = 1 GB/s (CPU cores over gloo):
    at h = 65 a layer saves 1.05 ms of compute and pays 1.07 ms of all-reduces.

    >>> round(breakeven_hidden(batch_size=8, seq_len=32, ranks=2, compute_flop_per_s=40e9,
    ...                        alpha_s=100e-6, beta_bytes_per_s=1e9))
    65
    """
    p = positive_int("ranks", ranks)
    if p == 1:
        return math.inf
    b, s = batch_size, seq_len
    r = positive_number("compute rate", compute_flop_per_s)
    beta = positive_number("beta", beta_bytes_per_s)
    keep = 1 - 1 / p
    qa = keep * 72 * b * s / r
    qb = keep * 12 * b * s * s / r - 4 * 2 * (p - 1) / p * 4 * b * s / beta
    qc = 4 * 2 * (p - 1) * alpha_s
    return (-qb + math.sqrt(qb * qb + 4 * qa * qc)) / (2 * qa)


# ---------------------------------------------------------------- activation memory

def saved_activation_bytes(*, batch_size: int, seq_len: int, hidden: int, num_heads: int,
                           num_layers: int, world_size: int = 1, checkpoint: bool = False,
                           sequence_parallel: bool = False,
                           bytes_per_value: int = BYTES_PER_VALUE) -> float:
    """Bytes autograd saves for backward in one training step of the lab's model on one rank
    (the teaching version at P = ``world_size``): every storage once, the parameters left out
    (what :class:`labkit.memory.SavedActivations` counts). Per layer::

        kept whole on every rank   LN1's input, LN1's output (q, k, v's input),
                                   LN2's input, LN2's output (the MLP's input)      4 s b h
                                   the two LayerNorms' mean and 1/std                4 b s
        split over P               q, k, v (the attention's inputs)               3 s b h / P
                                   the attention's output (o's input is a view)     s b h / P
                                   its log-sum-exp (flash attention: no s x s)      a b s / P
                                   the MLP's 4h pre-activation (GELU's input)     4 s b h / P
                                   GELU's output (the second linear's input)      4 s b h / P

    and once per step the loss's input and target, 2 s b h: ``L (s b h (4 + 12/P) + 4 b s +
    a b s / P) + 2 s b h`` values. The residual adds, f and g save nothing. With
    ``checkpoint`` each layer keeps only its input: ``L s b h + 2 s b h`` values (backward
    runs the layer's forward again and holds one layer's activations at a time). With
    ``sequence_parallel`` (:mod:`labkit.tp.sp`) what was kept whole is split by the sequence
    too (each LayerNorm's input and output, their statistics, the loss: a rank's s/P tokens;
    the column-parallel linears keep the sharded input and gather it again in backward):
    everything over P, ``(L (16 s b h + 4 b s + a b s) + 2 s b h) / P`` values.

    The lab's FSDP default (b = 4, s = 32, h = 256, 4 heads, 2 layers): 4.46 MB, 0.52 MB
    checkpointed; one layer split over 2 ranks keeps 10 s b h instead of 16.

    >>> kw = dict(batch_size=4, seq_len=32, hidden=256, num_heads=4, num_layers=2)
    >>> saved_activation_bytes(**kw), saved_activation_bytes(**kw, checkpoint=True)
    (4464640.0, 524288.0)
    >>> saved_activation_bytes(batch_size=2, seq_len=8, hidden=32, num_heads=4, num_layers=1,
    ...                        world_size=2)
    24960.0
    >>> saved_activation_bytes(batch_size=2, seq_len=8, hidden=32, num_heads=4, num_layers=1,
    ...                        world_size=2, sequence_parallel=True)
    18688.0
    """
    b, s, h = batch_size, seq_len, hidden
    p = positive_int("world_size", world_size)
    sbh = s * b * h
    if sequence_parallel and not checkpoint:
        values = (num_layers * (16 * sbh + 4 * b * s + num_heads * b * s) + 2 * sbh) / p
    elif checkpoint:
        values = num_layers * sbh + 2 * sbh
    else:
        values = num_layers * (sbh * (4 + 12 / p) + 4 * b * s + num_heads * b * s / p) + 2 * sbh
    return float(values * bytes_per_value)


def korthikanti_activation_bytes(*, batch_size: int, seq_len: int, hidden: int, num_heads: int,
                                 num_layers: int, tp: int = 1, sequence_parallel: bool = False,
                                 bytes_per_value: float = 2, mask_bytes: float = 1,
                                 flash: bool = False) -> float:
    """Activation bytes of a transformer layer after Korthikanti et al. 2022 ("Reducing
    Activation Recomputation in Large Transformer Models"), by its terms, per layer::

        values kept whole: both LayerNorms' inputs, q/k/v's input, the MLP's input   4 s b h
        dropout masks kept whole (after attention, after the MLP)                    2 s b h
        values split over t: q, k, v; o's input; the MLP's 4h twice                 12 s b h / t
        the s x s terms: softmax output, dropout output (values), dropout mask   a s² b / t each

    At 2 bytes a value and 1 a mask that is the paper's ``s b h (34 + 5 a s / h)`` with
    t = 1, ``s b h (10 + 24/t + 5 a s / (h t))`` for TP without sequence parallelism and
    everything over t with it. Flash attention keeps no s x s term (:mod:`labkit.perfmodel`
    uses ``34 s b h / t``: sequence parallelism, flash or selective recomputation).

    What this means for this lab (:func:`saved_activation_bytes`): fp32 (4 bytes a value), no
    dropout (no masks), flash attention (PyTorch's on the CPU): the paper's counts of s b h
    are the lab's exactly, 16 values whole at t = 1 (64 bytes, not 34), 4 + 12/t split; the
    lab adds what the paper leaves out: the attention's output kept by flash attention
    (o's input is a view of it, so it is the paper's o input), its log-sum-exp (a b s / t),
    the LayerNorms' statistics (4 b s) and the loss (2 s b h).

    >>> kw = dict(batch_size=1, seq_len=2048, hidden=4096, num_heads=32, num_layers=1)
    >>> sbh = 2048 * 4096
    >>> korthikanti_activation_bytes(**kw) / sbh, korthikanti_activation_bytes(**kw, tp=8) / sbh
    (114.0, 23.0)
    >>> korthikanti_activation_bytes(**kw, tp=8, sequence_parallel=True, flash=True) / sbh
    4.25
    >>> korthikanti_activation_bytes(**kw, bytes_per_value=4, mask_bytes=0, flash=True) / sbh
    64.0
    """
    b, s, h, a = batch_size, seq_len, hidden, num_heads
    t = positive_int("tp", tp)
    sbh = s * b * h
    whole = 4 * sbh * bytes_per_value + 2 * sbh * mask_bytes
    split = 12 * sbh * bytes_per_value
    if not flash:
        split += a * s * s * b * (2 * bytes_per_value + mask_bytes)
    per_layer = (whole / t if sequence_parallel else whole) + split / t
    return float(positive_int("num_layers", num_layers) * per_layer)


# ---------------------------------------------------------------- sequence parallelism

def sp_collectives(*, batch_size: int, seq_len: int, hidden: int, num_layers: int,
                   world_size: int, bytes_per_value: int = BYTES_PER_VALUE) -> dict:
    """Collectives of one training step of TP with sequence parallelism (:mod:`labkit.tp.sp`),
    ``{op: (calls, bytes)}`` with the buffers' bytes (nccl-tests' S), none on one rank. Per
    layer and block: forward an all-gather of the LayerNorm's output and a reduce-scatter of
    the partial outputs; backward an all-gather of the output's gradient, an all-gather of
    the LayerNorm's output again (it was kept sharded) and a reduce-scatter of the input's
    gradient; all of b·s·h values. Once a step, one all-reduce of the gradients every rank
    keeps whole: two LayerNorms (4h) and two row-parallel biases (2h) a layer::

        all-gather 6 L x b s h     reduce-scatter 4 L x b s h     all-reduce 1 x 6 h L

    A ring moves (P−1)/P of an all-gather's or a reduce-scatter's S over each link, twice that
    of an all-reduce's: 10 L (P−1)/P b s h against TP's 4 L · 2 (P−1)/P b s h, one more gather
    (the one again in backward) for each of TP's all-reduces.

    >>> sp_collectives(batch_size=8, seq_len=32, hidden=256, num_layers=2, world_size=2)
    {'all_gather': (12, 3145728), 'reduce_scatter': (8, 2097152), 'all_reduce': (1, 12288)}
    """
    p = positive_int("world_size", world_size)
    L = positive_int("num_layers", num_layers)
    if p == 1:
        return {"all_gather": (0, 0), "reduce_scatter": (0, 0), "all_reduce": (0, 0)}
    each = (positive_int("batch_size", batch_size) * positive_int("seq_len", seq_len)
            * positive_int("hidden", hidden) * bytes_per_value)
    return {"all_gather": (6 * L, 6 * L * each), "reduce_scatter": (4 * L, 4 * L * each),
            "all_reduce": (1, 6 * hidden * L * bytes_per_value)}


# ---------------------------------------------------------------- the matrix products

def layer_products(*, batch_size: int, seq_len: int, hidden: int, num_heads: int,
                   world_size: int = 1) -> list[tuple[int, int, int, int]]:
    """The matrix products of one layer's forward on one TP rank, ``(m, k, n, count)`` for
    ``count`` products of an m x k by a k x n matrix (2 m k n FLOPs each): q, k, v and the
    MLP's first layer column-parallel, o and its second row-parallel, over the b·s tokens;
    per head, the scores and their weighted sum over the s tokens. Backward runs two products
    of the same three sizes for each (the input's and the weight's gradients).

    >>> layer_products(batch_size=8, seq_len=32, hidden=256, num_heads=8, world_size=2)
    [(256, 256, 128, 3), (256, 128, 256, 1), (256, 256, 512, 1), (256, 512, 256, 1), (32, 32, 32, 64)]
    """
    b, s, h, a = batch_size, seq_len, hidden, num_heads
    p = positive_int("world_size", world_size)
    t, d = b * s, h // a
    return [(t, h, h // p, 3), (t, h // p, h, 1), (t, h, 4 * h // p, 1), (t, 4 * h // p, h, 1),
            (s, d, s, 2 * b * a // p)]


def products_rate(products, rate_at) -> dict:
    """The rate a layer's products would run at if each ran at ``rate_at(n)`` FLOP/s, n its
    equivalent cube (the n of an n x n by n x n product of as many FLOPs, (m k n)^(1/3)):
    ``flops`` (forward), ``seconds`` (their sum of flops / rate) and ``flop_per_s``
    (flops / seconds: the time-weighted rate); ``n`` is the FLOP-weighted mean cube.

    At a rate of 0.1 GFLOP/s per unit of n: a 256-cube (25.6 GFLOP/s) and two 128-cubes
    (12.8 GFLOP/s) take 1.97 ms, 21.3 GFLOP/s over the three.

    >>> r = products_rate([(256, 256, 256, 1), (128, 128, 128, 2)], lambda n: 1e8 * n)
    >>> round(r["flop_per_s"] / 1e9, 2), round(r["n"])
    (21.33, 230)
    """
    flops = secs = weighted = 0.0
    for m, k, n, count in products:
        f = 2.0 * m * k * n * count
        cube = (m * k * n) ** (1 / 3)
        flops += f
        secs += f / float(rate_at(cube))
        weighted += f * cube
    return {"flops": flops, "seconds": secs, "flop_per_s": flops / secs, "n": weighted / flops}
