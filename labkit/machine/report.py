"""The profile's columns, and the sentences that say what it measured (pure).

Every sentence is computed from the profile's numbers: a student who reruns on another machine
reads that machine's story.
"""

from __future__ import annotations

from labkit.results import Column
from labkit.tables import size_text

KEY = ("measurement", "context", "n", "batch", "size_bytes")
COLUMNS = (
    Column("measurement", "", "matmul, step (an MLP's forward and backward), copy, allreduce, "
                              "message (point-to-point, one way), reduce_scatter or "
                              "all_gather (of size_bytes in nccl-tests' sense, from 256 KiB), "
                              "allreduce_repeated (up to 32 KiB, one size at a time on one "
                              "buffer, as notebook 01 times its own), allreduce_steady "
                              "(calls back to back, as the collectives lab times its own)"),
    Column("context", "", "alone (rank 0 only), together (every rank at once), idle or busy "
                          "(every rank's core also computing while the messages move)"),
    Column("n", "", "n of the n x n matrix product; step: the MLP's width"),
    Column("batch", "", "step: the rows of its batch"),
    Column("size_bytes", "bytes", "bytes copied, all-reduced or sent"),
    Column("time_p50_s", "s", "median time of one operation (slowest rank, or rank 0 alone)"),
    Column("transfer_s", "s", "messages: the transfer, the median of the calls that waited for "
                              "nothing (labkit.machine.formulas.transfer_of)"),
    Column("time_p10_s", "s", "messages: 10th percentile"),
    Column("time_p90_s", "s", "messages: 90th percentile"),
    Column("wait_share", "", "messages: the share of calls that also waited for the scheduler "
                             "(longer than the transfer + 1.5 ms, or + a quarter of it)"),
    Column("wait_excess_s", "s", "messages: what each call that waited took beyond the "
                                 "transfer (a list)"),
    Column("flop_per_s", "flop/s", "2 n^3 / time of the matrix product"),
    Column("paired_slowdowns", "", "step, together: each round's time together over that "
           "round's alone (the co-run slowdown's samples)"),
    Column("bytes_per_s", "B/s", "bytes moved per second (a copy counts read + write)"),
)


def _ratio_words(r: float, *, more: str, less: str, same_within: float = 0.05) -> str:
    """'1.25x more', '0.80x (less)', or 'about the same'.

    >>> _ratio_words(1.25, more="slower", less="faster")
    '1.25x slower'
    >>> _ratio_words(0.8, more="slower", less="faster")
    '1.25x faster'
    >>> _ratio_words(1.02, more="slower", less="faster")
    'about as fast (1.02x)'
    """
    if abs(r - 1) <= same_within:
        return f"about as fast ({r:.2f}x)"
    return f"{r:.2f}x {more}" if r > 1 else f"{1 / r:.2f}x {less}"


def copy_sentence(copy_slowdowns: dict, *, ranks: int) -> str:
    """What copying at once did at each size the profile timed, largest first.

    >>> print(copy_sentence({1 << 20: 1.02, 4 << 20: 1.2, 32 << 20: 1.8}, ranks=2))
    ... # doctest: +NORMALIZE_WHITESPACE
    memory: a copy of 32 MiB per rank runs 1.80x slower with 2 ranks copying at once than
    alone; of 4 MiB, 1.20x slower; of 1 MiB, about as fast (1.02x).
    >>> copy_sentence({32 << 20: 0.9}, ranks=2)
    'memory: a copy of 32 MiB per rank runs 1.11x faster with 2 ranks copying at once than alone.'
    """
    sizes = sorted(copy_slowdowns, reverse=True)

    def words(size):
        return _ratio_words(copy_slowdowns[size], more="slower", less="faster")

    text = (f"memory: a copy of {size_text(sizes[0])} per rank runs {words(sizes[0])} with "
            f"{ranks} ranks copying at once than alone")
    return "; ".join([text] + [f"of {size_text(s)}, {words(s)}" for s in sizes[1:]]) + "."


def sentences(*, co_run: float, copy_slowdowns: dict, ranks: int, small_idle_s: float,
              small_busy_s: float, large_idle_s: float, large_busy_s: float, small_bytes: int,
              large_bytes: int, alpha_s: float | None, beta_bytes_per_s: float | None,
              ) -> list[str]:
    """What the profile says, one sentence per effect, each computed from its numbers.

    >>> for s in sentences(co_run=1.25, copy_slowdowns={1 << 25: 1.6}, ranks=2, small_idle_s=1e-4,
    ...                    small_busy_s=2e-3, large_idle_s=1e-2, large_busy_s=1.1e-2,
    ...                    small_bytes=8, large_bytes=8 << 20, alpha_s=1e-4,
    ...                    beta_bytes_per_s=1e9): print(s)
    compute: a training step runs 1.25x slower with 2 ranks computing at once than alone (the co-run slowdown every step model here carries).
    memory: a copy of 32 MiB per rank runs 1.60x slower with 2 ranks copying at once than alone.
    messages: an all-reduce of 8 B takes 0.100 ms with the peers idle and 2.000 ms with their cores busy (20.00x slower).
    messages: an all-reduce of 8.39e+06 B takes 10.000 ms idle and 11.000 ms busy (1.10x slower).
    alpha-beta fit to the idle sweep: alpha = 100 us, beta = 1.00 GB/s.
    """
    return [
        f"compute: a training step runs {_ratio_words(co_run, more='slower', less='faster')} "
        f"with {ranks} ranks computing at once than alone (the co-run slowdown every step "
        "model here carries).",
        copy_sentence(copy_slowdowns, ranks=ranks),
        f"messages: an all-reduce of {small_bytes} B takes {small_idle_s * 1e3:.3f} ms with the "
        f"peers idle and {small_busy_s * 1e3:.3f} ms with their cores busy "
        f"({_ratio_words(small_busy_s / small_idle_s, more='slower', less='faster')}).",
        f"messages: an all-reduce of {large_bytes:.3g} B takes {large_idle_s * 1e3:.3f} ms idle "
        f"and {large_busy_s * 1e3:.3f} ms busy "
        f"({_ratio_words(large_busy_s / large_idle_s, more='slower', less='faster')}).",
        (f"alpha-beta fit to the idle sweep: alpha = {alpha_s * 1e6:.0f} us, beta = "
         f"{beta_bytes_per_s / 1e9:.2f} GB/s." if alpha_s is not None else
         "alpha-beta: no line with a bandwidth term fits the idle sweep (it ends at "
         f"{large_bytes:.3g} B, where latency still rules: sweep to larger sizes)."),
    ]


def copy_slowdowns(prof) -> dict:
    """Each copy size of a :class:`~labkit.machine.profile.Profile` and its co-run slowdown
    (what :func:`copy_sentence` says)."""
    return {size: prof.copy_slowdown_at(size) for size in prof.copy_sizes}


def describe(prof) -> list[str]:
    """:func:`sentences` of a :class:`~labkit.machine.profile.Profile`."""
    sizes = sorted({r["size_bytes"] for r in prof.rows if r["measurement"] == "allreduce"})
    small, large = sizes[0], sizes[-1]
    from labkit.errors import UsageError

    try:  # a short or noisy sweep may hold no bandwidth term: say so, do not fail
        alpha, beta = prof.alpha_s, prof.beta_bytes_per_s
    except UsageError:
        alpha = beta = None
    return sentences(co_run=prof.co_run_slowdown, copy_slowdowns=copy_slowdowns(prof),
                     ranks=prof.world_size, small_idle_s=prof.allreduce_s(small),
                     small_busy_s=prof.allreduce_s(small, busy=True),
                     large_idle_s=prof.allreduce_s(large),
                     large_busy_s=prof.allreduce_s(large, busy=True), small_bytes=small,
                     large_bytes=large, alpha_s=alpha, beta_bytes_per_s=beta)
