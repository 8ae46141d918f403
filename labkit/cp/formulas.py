"""The context-parallel lab's laws (pure: no torch): which tokens a rank holds, which score
blocks it computes at each ring step, the bytes the ring moves, what autograd saves, and the
step time.

The sequence of S tokens is cut into chunks. ``full`` and ``causal`` give rank r the r-th of
P contiguous chunks; ``causal_balanced`` cuts it into 2P chunks and gives rank r chunks r and
2P-1-r, so that under a causal mask every rank computes the same number of score blocks (a
contiguous split leaves rank 0 one block and rank P-1 P of them). At ring step t a rank
holds the K/V block of rank (r - t) mod P and computes every (query chunk, key chunk) pair
the mask does not wholly hide: ``full`` pairs whole, ``causal`` pairs (a chunk against
itself) under the triangular mask, at the cost of a whole block.
"""

from __future__ import annotations

from labkit.machine.formulas import median

VARIANTS = ("full", "causal", "causal_balanced")
#: fp32 in the timed steps
BYTES_PER_VALUE = 4


def chunk_count(world_size: int, variant: str) -> int:
    """Chunks the sequence is cut into: 2P for the balanced split, else P.

    >>> chunk_count(4, "causal_balanced"), chunk_count(4, "causal")
    (8, 4)
    """
    return 2 * world_size if variant == "causal_balanced" else world_size


def chunks_of(rank: int, world_size: int, variant: str) -> tuple:
    """The global chunks rank ``rank`` holds, in sequence order.

    Worked example, P = 4, S = 16 tokens, balanced: 8 chunks of 2 tokens; rank 0 holds chunks
    0 and 7 (tokens 0-1 and 14-15), rank 3 holds chunks 3 and 4 (tokens 6-9):

    >>> [chunks_of(r, 4, "causal_balanced") for r in range(4)]
    [(0, 7), (1, 6), (2, 5), (3, 4)]
    >>> chunks_of(2, 4, "causal")
    (2,)
    """
    if variant == "causal_balanced":
        return (rank, 2 * world_size - 1 - rank)
    return (rank,)


def token_ranges(rank: int, world_size: int, seq_len: int, variant: str) -> list[tuple]:
    """The [start, stop) token ranges rank ``rank`` holds.

    >>> token_ranges(0, 4, 16, "causal_balanced"), token_ranges(3, 4, 16, "causal_balanced")
    ([(0, 2), (14, 16)], [(6, 8), (8, 10)])
    """
    c = seq_len // chunk_count(world_size, variant)
    return [(k * c, (k + 1) * c) for k in chunks_of(rank, world_size, variant)]


def kv_source(rank: int, step: int, world_size: int) -> int:
    """Whose K/V block rank ``rank`` holds at ring step ``step`` (each step passes every block
    one rank on: r sends to r+1, receives from r-1).

    >>> [kv_source(0, t, 4) for t in range(4)]
    [0, 3, 2, 1]
    """
    return (rank - step) % world_size


def work_items(rank: int, step: int, world_size: int, variant: str) -> list[tuple]:
    """The score blocks rank ``rank`` computes at ring step ``step``: (query chunk, key chunk,
    kind), chunks as indices into the rank's own and the visiting block's chunks, kind
    ``full`` or ``causal`` (a chunk against itself); pairs the causal mask hides wholly are
    left out.

    >>> work_items(0, 0, 2, "causal_balanced")   # own block: chunks 0, 3 against 0, 3
    [(0, 0, 'causal'), (1, 0, 'full'), (1, 1, 'causal')]
    >>> work_items(0, 1, 2, "causal_balanced")   # rank 1's chunks 1, 2: chunk 3 sees both
    [(1, 0, 'full'), (1, 1, 'full')]
    >>> work_items(1, 1, 2, "causal_balanced")   # rank 0's chunks 0, 3: both see chunk 0
    [(0, 0, 'full'), (1, 0, 'full')]
    >>> work_items(0, 1, 2, "causal")            # rank 1's keys all come later: nothing
    []
    """
    mine = chunks_of(rank, world_size, variant)
    theirs = chunks_of(kv_source(rank, step, world_size), world_size, variant)
    out = []
    for i, a in enumerate(mine):
        for j, b in enumerate(theirs):
            if variant == "full" or b < a:
                out.append((i, j, "full"))
            elif b == a:
                out.append((i, j, "causal"))
    return out


def blocks_per_rank(rank: int, world_size: int, variant: str) -> int:
    """Score blocks (chunk x chunk) rank ``rank`` computes over the whole ring: 2P + 1 on every
    rank with the balanced split, r + 1 with the contiguous causal one, P without a mask.

    >>> [blocks_per_rank(r, 4, "causal_balanced") for r in range(4)]
    [9, 9, 9, 9]
    >>> [blocks_per_rank(r, 4, "causal") for r in range(4)]
    [1, 2, 3, 4]
    """
    return sum(len(work_items(rank, t, world_size, variant)) for t in range(world_size))


def block_kinds(rank: int, world_size: int, variant: str) -> dict:
    """Score blocks of each kind rank ``rank`` computes over the whole ring: ``full`` ones and
    ``causal`` ones (a chunk against itself: the mask written over a whole block, then the same
    arithmetic), which cost more each.

    >>> block_kinds(0, 2, "causal"), block_kinds(1, 2, "causal")
    ({'full': 0, 'causal': 1}, {'full': 1, 'causal': 1})
    >>> block_kinds(0, 2, "causal_balanced"), block_kinds(3, 4, "full")
    ({'full': 3, 'causal': 2}, {'full': 4, 'causal': 0})
    """
    out = {"full": 0, "causal": 0}
    for t in range(world_size):
        for _, _, kind in work_items(rank, t, world_size, variant):
            out[kind] += 1
    return out


def kinds_computed(world_size: int, variant: str) -> set:
    """The kinds of score block (:func:`block_kinds`) some rank of the ring computes.

    >>> sorted(kinds_computed(2, "causal")), sorted(kinds_computed(4, "full"))
    (['causal', 'full'], ['full'])
    """
    return {kind for r in range(world_size)
            for kind, n in block_kinds(r, world_size, variant).items() if n}


def rank_compute(*, alone_per_rank_s, kinds_per_rank, block_s: dict) -> dict:
    """Each rank's compute alone as **fixed work + its blocks**: ``block_s`` the time of one
    block of each kind (forward + backward, timed alone), ``kinds_per_rank`` each rank's
    :func:`block_kinds`; the fixed work of a pass (the ring steps' bookkeeping, the chunks, the
    output's concatenation, autograd's nodes: what does not scale with the blocks) is the same
    on every rank, the median over ranks of ``alone_per_rank_s`` less its blocks (at least 0).
    ``blocks_s`` and ``per_rank_s`` per rank, ``fixed_s`` and ``ratio`` (the most over the
    least of ``per_rank_s``: the slowest rank's compute over the fastest's).

    Contiguous causal split on 2 ranks: rank 0 one causal block (1.4 ms), rank 1 one causal
    and one full (0.8 ms); passes of 1.55 and 2.38 ms leave 0.15 ms of fixed work:

    >>> m = rank_compute(alone_per_rank_s=[1.55e-3, 2.38e-3],
    ...                  kinds_per_rank=[{"full": 0, "causal": 1}, {"full": 1, "causal": 1}],
    ...                  block_s={"full": 0.8e-3, "causal": 1.4e-3})
    >>> round(m["fixed_s"] * 1e3, 3), round(m["ratio"], 3)
    (0.165, 1.511)
    """
    blocks = [sum(int(n) * float(block_s.get(kind, 0.0)) for kind, n in kinds.items())
              for kinds in kinds_per_rank]
    fixed = max(0.0, median([float(a) - b for a, b in zip(alone_per_rank_s, blocks)]))
    per_rank = [fixed + b for b in blocks]
    return {"fixed_s": fixed, "blocks_s": blocks, "per_rank_s": per_rank,
            "ratio": max(per_rank) / min(per_rank) if min(per_rank) > 0 else float("nan")}


def imbalance(world_size: int, variant: str) -> float:
    """The most blocks any rank computes over the fewest: the slowest rank's compute over the
    fastest's (1 when balanced).

    >>> imbalance(4, "causal"), imbalance(4, "causal_balanced"), imbalance(4, "full")
    (4.0, 1.0, 1.0)
    """
    n = [blocks_per_rank(r, world_size, variant) for r in range(world_size)]
    return max(n) / min(n)


def flops_per_rank(*, batch_size: int, seq_len: int, hidden: int, world_size: int,
                   variant: str, rank: int | None = None) -> float:
    """Forward + backward FLOPs of the attention core on one rank (the busiest when ``rank`` is
    None): each block of c x c scores costs Q K^T and P V, 2 x 2 b c^2 h forward, twice that
    backward, so 12 b c^2 h (a causal block is computed whole, then masked).

    >>> flops_per_rank(batch_size=1, seq_len=8, hidden=2, world_size=1, variant="full")
    1536.0
    """
    c = seq_len // chunk_count(world_size, variant)
    ranks = range(world_size) if rank is None else (rank,)
    blocks = max(blocks_per_rank(r, world_size, variant) for r in ranks)
    return 12.0 * batch_size * c * c * hidden * blocks


def kv_block_bytes(*, batch_size: int, seq_len: int, hidden: int, world_size: int,
                   bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """One rank's K and V blocks together: 2 b (S/P) h values, the payload of one ring step.

    >>> kv_block_bytes(batch_size=2, seq_len=256, hidden=64, world_size=2)
    131072
    """
    return 2 * batch_size * (seq_len // world_size) * hidden * bytes_per_value


def ring_bytes_per_rank(*, batch_size: int, seq_len: int, hidden: int, world_size: int,
                        bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes one rank sends in one pass of the ring (the forward; the backward sends the same
    again, the blocks' gradients going the other way): its K and V blocks P-1 times, that is
    (P-1) x 2 b (S/P) h w = 2 (P-1)/P x the bytes of K (b S h w). Nothing on one rank.

    >>> ring_bytes_per_rank(batch_size=2, seq_len=256, hidden=64, world_size=2)
    131072
    >>> ring_bytes_per_rank(batch_size=2, seq_len=256, hidden=64, world_size=4) / (2 * 256 * 64 * 4)
    1.5
    """
    return (world_size - 1) * kv_block_bytes(batch_size=batch_size, seq_len=seq_len,
                                             hidden=hidden, world_size=world_size,
                                             bytes_per_value=bytes_per_value)


def ring_sends_per_rank(world_size: int) -> int:
    """Point-to-point sends of one rank in one pass of the ring: K and V, P-1 times.

    >>> ring_sends_per_rank(4), ring_sends_per_rank(1)
    (6, 0)
    """
    return 2 * (world_size - 1)


def _items_per_chunk(world_size: int, variant: str) -> list[list]:
    """For every rank, the blocks each of its query chunks meets over the ring."""
    out = []
    for r in range(world_size):
        counts = [0] * len(chunks_of(r, world_size, variant))
        for t in range(world_size):
            for i, _, _ in work_items(r, t, world_size, variant):
                counts[i] += 1
        out.append(counts)
    return out


def saved_bytes_per_rank(*, batch_size: int, seq_len: int, hidden: int, num_heads: int,
                         world_size: int, variant: str, rank: int | None = None,
                         bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """What autograd saves for the backward in one rank's forward of the ring code (the most of
    any rank when ``rank`` is None), Q, K, V, the rank's own inputs, left out. Per score block
    (c x c per head): the scores (saved by logsumexp) and the probabilities (by exp and by
    P V), 2 b H c^2 w, and its log-sum-exp, b H c w; the causal mask, c^2 bool bytes (one,
    shared); every K/V block received that meets a query, 2 b (S/P) h w (autograd keeps it: a
    ring that re-sends K and V in the backward keeps none); the scaled Q, b (S/P) h w. A query
    chunk meeting k > 1 blocks merges k - 1 times, saving 2k - 2 outputs of b c h w and 3k - 4
    vectors of b H c w (two rescaling weights a merge, and the running log-sum-exp between
    merges). The score terms fall as 1/P (S^2/P per rank); the K/V copies do not.

    >>> kw = dict(batch_size=1, seq_len=8, hidden=4, num_heads=2, variant="full")
    >>> saved_bytes_per_rank(world_size=1, **kw)   # 1 block of 8 x 8 scores, 2 heads
    1216
    >>> saved_bytes_per_rank(world_size=2, **kw)   # 2 blocks of 4 x 4, 1 block received
    960
    """
    P, b, H, h, w = world_size, batch_size, num_heads, hidden, bytes_per_value
    c = seq_len // chunk_count(P, variant)
    n = seq_len // P
    out = []
    for r in range(P) if rank is None else (rank,):
        per_step = [work_items(r, t, P, variant) for t in range(P)]
        items = [it for step in per_step for it in step]
        total = len(items) * (2 * b * H * c * c * w + b * H * c * w)
        if any(kind == "causal" for _, _, kind in items):
            total += c * c
        received = sum(1 for step in per_step[1:] if step)
        total += received * 2 * b * n * h * w + b * n * h * w
        for k in _items_per_chunk(P, variant)[r]:
            if k > 1:
                total += (2 * k - 2) * b * c * h * w + (3 * k - 4) * b * H * c * w
        out.append(total)
    return max(out)


def predict_step(*, compute_alone_s: float, slowdown: float, exchanges: int,
                 exchange_s: float) -> dict:
    """The step model: the busiest rank's compute measured alone, times the co-run slowdown
    of P ranks at once, plus ``exchanges`` ring exchanges of one K/V block (``exchange_s``
    each) left exposed (the backward's cannot overlap: autograd waits for each gradient
    block before the next).

    >>> predict_step(compute_alone_s=0.010, slowdown=1.2, exchanges=2, exchange_s=0.001)
    {'compute_s': 0.012, 'comm_s': 0.002, 'step_s': 0.014}
    """
    compute = compute_alone_s * slowdown
    comm = exchanges * exchange_s
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm}
