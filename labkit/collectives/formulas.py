"""Collectives math: nccl-tests bandwidths, the α–β (latency–bandwidth) model and its fit.

Pure (no torch): the host validates sizes with :func:`parse_size` before it launches
(:class:`labkit.collectives.config.CollectivesConfig`), :mod:`labkit.collectives.regimes` fits
the model where it applies, and the performance model (``labkit.perfmodel.model``) prices its
collectives with :func:`collective_time`.

Conventions of nccl-tests, kept so numbers compare with theirs:

* ``S`` (``size_bytes``) is the whole buffer: the all-reduce/broadcast buffer, the all-gather
  *output*, the reduce-scatter *input*, the all-to-all send buffer.
* algbw = S / t (GB/s, 1 GB = 1e9 B); busbw = algbw × factor, with the factor that makes busbw
  comparable to the link bandwidth whatever the rank count: all-reduce 2(N−1)/N;
  reduce-scatter, all-gather, all-to-all (N−1)/N; broadcast 1.
* sizes on the command line take K, M, G suffixes as powers of 1024 (``64M`` = 67108864).

The model (ring algorithms, α = per-message latency in s, β = link bandwidth in B/s)::

    t(op, N, S) = steps(op, N)·α + factor(op, N)·S/β
    all-reduce (ring): 2(N−1)·α + 2(N−1)/N · S/β

so in the bandwidth-dominated limit busbw → β, and the size where both terms are equal (the
crossover) is S* = steps·α·β / factor, for the ring all-reduce S* = N·α·β.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from labkit.errors import UsageError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
DTYPE_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)


def _op(op: str) -> str:
    if op not in OPS:
        raise UsageError(f"unknown op {op!r} (known: {', '.join(OPS)})")
    return op


def _world(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise UsageError(f"ranks must be an integer >= 1, got {n!r}")
    return int(n)


def parse_size(text: str | int) -> int:
    """Bytes from ``8``, ``64K``, ``64M``, ``1G`` (powers of 1024, as nccl-tests ``-b/-e``).

    >>> parse_size("64M"), parse_size("8"), parse_size("1K")
    (67108864, 8, 1024)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise UsageError(f"size {text!r} is not a byte count like 8, 64K, 64M or 1G")
        value = float(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " ")
    if value < 1 or value != int(value):
        raise UsageError(f"size must be a whole number of bytes >= 1, got {text!r}")
    return int(value)


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw × factor.

    all-reduce 2(N−1)/N (each byte crosses a link twice: reduce-scatter then all-gather);
    all-gather, reduce-scatter, all-to-all (N−1)/N; broadcast 1.

    >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 4), busbw_factor("broadcast", 4)
    (1.5, 0.75, 1.0)
    """
    n = _world(ranks)
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(_op(op), (n - 1) / n)


def latency_steps(op: str, ranks: int) -> int:
    """Messages on the critical path: ring all-reduce 2(N−1), all-gather / reduce-scatter /
    all-to-all N−1, broadcast ⌈log2 N⌉ (binomial tree).

    >>> latency_steps("all_reduce", 4), latency_steps("all_gather", 4), latency_steps("broadcast", 4)
    (6, 3, 2)
    """
    n = _world(ranks)
    if _op(op) == "all_reduce":
        return 2 * (n - 1)
    if op == "broadcast":
        return math.ceil(math.log2(n)) if n > 1 else 0
    return n - 1


def algbw_gb_per_s(*, size_bytes: float, time_s: float) -> float:
    """algbw = S / t in GB/s (1e9 B/s). 1 MiB in 1 ms:

    >>> round(algbw_gb_per_s(size_bytes=1 << 20, time_s=1e-3), 3)
    1.049
    """
    if time_s <= 0 or size_bytes < 0:
        raise UsageError(f"need size >= 0 and time > 0, got {size_bytes}, {time_s}")
    return size_bytes / time_s / 1e9


def busbw_gb_per_s(*, op: str, ranks: int, size_bytes: float, time_s: float) -> float:
    """busbw = algbw × :func:`busbw_factor`. All-reduce of 1 MiB in 1 ms on 2 ranks:

    >>> round(busbw_gb_per_s(op="all_reduce", ranks=2, size_bytes=1 << 20, time_s=1e-3), 3)
    1.049
    """
    return algbw_gb_per_s(size_bytes=size_bytes, time_s=time_s) * busbw_factor(op, ranks)


ALGORITHMS = ("ring", "tree")


def collective_time(*, op: str, ranks: int, size_bytes, alpha_s: float,
                    beta_bytes_per_s: float, algorithm: str = "ring"):
    """α–β model of one collective (seconds; ``size_bytes`` may be an array).

    ring: t = steps(op, N)·α + factor(op, N)·S/β (:func:`latency_steps`, :func:`busbw_factor`);
    tree all-reduce (reduce up a binary tree, broadcast down): t = 2⌈log2 N⌉·(S/β + α).

    Ring all-reduce of 140 GB over 32 ranks at β = 50 GB/s, α = 5 µs:
    2·31/32·140e9/50e9 + 62·5e-6 = 5.425 + 0.00031 s.

    >>> round(collective_time(op="all_reduce", ranks=32, size_bytes=140e9, alpha_s=5e-6,
    ...                       beta_bytes_per_s=50e9), 5)
    5.42531
    >>> collective_time(op="all_reduce", ranks=4, size_bytes=1e6, alpha_s=0.0,
    ...                 beta_bytes_per_s=1e9, algorithm="tree")
    0.004
    """
    if alpha_s < 0 or beta_bytes_per_s <= 0:
        raise UsageError(f"need alpha >= 0 and beta > 0, got {alpha_s}, {beta_bytes_per_s}")
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    s = np.asarray(size_bytes, dtype=float)
    if algorithm == "tree":
        if _op(op) != "all_reduce":
            raise UsageError(f"the tree model is for all_reduce, not {op}")
        n = _world(ranks)
        steps = 2 * math.ceil(math.log2(n)) if n > 1 else 0
        t = steps * (s / beta_bytes_per_s + alpha_s)
    else:
        t = latency_steps(op, ranks) * alpha_s + busbw_factor(op, ranks) * s / beta_bytes_per_s
    return float(t) if np.ndim(t) == 0 else t


def allreduce_time(*, size_bytes, ranks: int, alpha_s: float, beta_bytes_per_s: float,
                   algorithm: str = "ring"):
    """All-reduce: ring t = 2(N−1)/N · S/β + 2(N−1)·α (see :func:`collective_time`).

    >>> allreduce_time(size_bytes=1e6, ranks=2, alpha_s=0.0, beta_bytes_per_s=1e9)
    0.001
    """
    return collective_time(op="all_reduce", ranks=ranks, size_bytes=size_bytes, alpha_s=alpha_s,
                           beta_bytes_per_s=beta_bytes_per_s, algorithm=algorithm)


def fit_alpha_beta(op: str, ranks: int, *, sizes: Sequence[float],
                   times: Sequence[float]) -> tuple[float, float]:
    """Least-squares α (s) and β (B/s) of ``t = steps·α + factor·S/β`` over a size sweep.

    The fit minimises *relative* error (each equation divided by its measured t), otherwise the
    largest sizes, whose times are 10⁶× the smallest, would decide α alone. A negative α (noise
    at tiny sizes) is clamped to 0 and β refitted. Recovers the model's own numbers:

    >>> s = [8 * 4**k for k in range(10)]
    >>> t = allreduce_time(size_bytes=np.array(s), ranks=2, alpha_s=50e-6, beta_bytes_per_s=2e9)
    >>> a, b = fit_alpha_beta("all_reduce", 2, sizes=s, times=t)
    >>> round(a * 1e6, 6), round(b / 1e9, 6)
    (50.0, 2.0)
    """
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if x.shape != t.shape or x.size < 2 or len(np.unique(x)) < 2:
        raise UsageError("the α–β fit needs at least two distinct sizes with one time each")
    if np.any(t <= 0) or np.any(x <= 0):
        raise UsageError("the α–β fit needs positive sizes and times")
    k, f = latency_steps(op, ranks), busbw_factor(op, ranks)
    if k == 0 or f == 0:
        raise UsageError(f"{op} on {ranks} rank(s) moves nothing: no α–β to fit")
    # unknowns u = (α, 1/β): t = k·α + f·S·(1/β), rows scaled by 1/t
    a = np.column_stack([np.full_like(x, k), f * x]) / t[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha = 0.0
        inv_beta = float(np.sum(f * x / t) / np.sum((f * x / t) ** 2))
    if inv_beta <= 0:
        raise UsageError("the α–β fit found no bandwidth term: sweep to larger sizes")
    return float(alpha), float(1.0 / inv_beta)


def moe_all_to_all_bytes(*, tokens: float, experts_per_token: int, hidden_size: int,
                         bytes_per_value: float) -> float:
    """One all-to-all of a mixture-of-experts layer, its whole send buffer (S): each of the
    rank's tokens goes to its k experts as h values. 512 tokens, k = 2, h = 4096, bf16: 8 MiB.

    >>> moe_all_to_all_bytes(tokens=512, experts_per_token=2, hidden_size=4096, bytes_per_value=2)
    8388608
    """
    return tokens * experts_per_token * hidden_size * bytes_per_value


def crossover_bytes(op: str, ranks: int, *, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Size where the bandwidth term equals the latency term: S* = steps·α·β / factor.
    Above it bandwidth dominates. Ring all-reduce: S* = N·α·β; 2 ranks, 50 µs, 2 GB/s:

    >>> crossover_bytes("all_reduce", 2, alpha_s=50e-6, beta_bytes_per_s=2e9)
    200000.0
    """
    f = busbw_factor(op, ranks)
    if f == 0:
        return math.inf
    return latency_steps(op, ranks) * alpha_s * beta_bytes_per_s / f


def size_sweep(op: str, world_size: int, min_bytes: int, max_bytes: int, factor: float,
               dtype: str = "float32", *, dense_top: bool = False) -> list[tuple[int, int]]:
    """(size_bytes, count) per point, like nccl-tests ``-b -e -f``: S, S·f, S·f², … ≤ max;
    ``dense_top``: also the largest size over 2, 4, … down to the size below it, so the top
    factor step is swept at factor 2 (a bandwidth regime's α–β line needs three sizes, and
    with f = 4 the third largest can sit in the latency floor).

    count is rounded down to a multiple of N for the ops that split the buffer across ranks
    (at least one element per rank); duplicates after rounding are dropped.

    >>> size_sweep("all_gather", 2, 8, 64, 2)
    [(8, 2), (16, 4), (32, 8), (64, 16)]
    >>> [s for s, _ in size_sweep("all_reduce", 2, 8, 8192, 4, dense_top=True)][-4:]
    [512, 2048, 4096, 8192]
    """
    n, el = _world(world_size), DTYPE_BYTES[dtype]
    per = n if _op(op) in ("all_gather", "reduce_scatter", "all_to_all") else 1
    sizes, size = [], float(min_bytes)
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    if dense_top and len(sizes) > 1:
        half = sizes[-1] / 2
        while half > sizes[-2] * 1.0001:
            sizes.append(half)
            half /= 2
        sizes.sort()
    out, seen = [], set()
    for size in sizes:
        count = max(per, int(size) // el // per * per)
        if count not in seen:
            seen.add(count)
            out.append((count * el, count))
    return out

