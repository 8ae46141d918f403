"""The data-parallel training lab's verdicts: the sentences notebook 05 and ``labkit ddp``
print, each computed from the numbers it is given (pure: no torch).

:func:`pays_sentence` whether DDP pays against one process over a batch sweep;
:func:`model_sentence` how well the model of a DDP step held; :func:`threads_sentence` ranks
against one process with every core as a thread; :func:`crossover_sentence` the measured and
predicted crossover of :func:`labkit.ddp.report.crossover`.
"""

from __future__ import annotations

import math


def pays_sentence(batches, speedups, *, ranks: int = 2) -> str:
    """The verdict of a batch sweep against the no-DDP process, from its numbers.

    >>> pays_sentence([16, 32, 64, 128], [0.8, 0.9, 1.1, 1.3])
    'DDP on 2 ranks pays from batch 45 per rank on: 0.90x at batch 32, 1.10x at batch 64.'
    >>> pays_sentence([16, 32, 64, 128], [0.8, 0.9, 0.95, 0.97])
    'DDP on 2 ranks does not pay at any batch swept: at best 0.97x, at batch 128 per rank.'
    >>> pays_sentence([16, 32], [1.2, 1.5])
    'DDP on 2 ranks pays at every batch swept, from batch 16 per rank on (1.20x there).'
    """
    from labkit.ddp.formulas import crossover_batch

    pairs = sorted(zip((int(b) for b in batches), (float(x) for x in speedups)))
    who = f"DDP on {ranks} ranks"
    if all(x >= 1 for _, x in pairs):
        return (f"{who} pays at every batch swept, from batch {pairs[0][0]} per rank on "
                f"({pairs[0][1]:.2f}x there).")
    if all(x < 1 for _, x in pairs):
        bb, best = max(pairs, key=lambda p: p[1])
        return (f"{who} does not pay at any batch swept: at best {best:.2f}x, at batch {bb} "
                "per rank.")
    if pairs[-1][1] < 1:
        won = ", ".join(f"{b}" for b, x in pairs if x >= 1)
        return (f"{who} does not pay at the largest batch swept ({pairs[-1][1]:.2f}x at "
                f"{pairs[-1][0]} per rank), though it did at batch {won}: noise, or a sweep "
                "to run again.")
    last = max(i for i, (_, x) in enumerate(pairs) if x < 1)
    (b0, s0), (b1, s1) = pairs[last], pairs[last + 1]
    star = crossover_batch([b for b, _ in pairs], [x for _, x in pairs])
    return (f"{who} pays from batch {star:.0f} per rank on: {s0:.2f}x at batch {b0}, "
            f"{s1:.2f}x at batch {b1}.")


def model_sentence(batches, errors_pct, *, tolerance_pct: float = 25.0) -> str:
    """How well the model of the DDP step held over a sweep, from its errors (%).

    >>> model_sentence([16, 64, 1024], [5.0, -12.0, 3.0])
    'The model is within 25% of the measured speedup at every batch (largest error -12%, at batch 64).'
    >>> model_sentence([16, 64, 1024], [31.0, -12.0, 3.0])
    'The model is within 25% of the measured speedup at 2 of 3 batches; it misses at batch 16 (+31%).'
    """
    pairs = [(int(b), float(e)) for b, e in zip(batches, errors_pct)]
    miss = [(b, e) for b, e in pairs if not abs(e) <= tolerance_pct]
    if not miss:
        b, e = max(pairs, key=lambda p: abs(p[1]))
        return (f"The model is within {tolerance_pct:g}% of the measured speedup at every batch "
                f"(largest error {e:+.0f}%, at batch {b}).")
    return (f"The model is within {tolerance_pct:g}% of the measured speedup at "
            f"{len(pairs) - len(miss)} of {len(pairs)} batches; it misses at "
            + ", ".join(f"batch {b} ({e:+.0f}%)" for b, e in miss) + ".")


def threads_sentence(*, batch: int, ranks: int, threads: int, ratio: float) -> str:
    """The verdict of ranks against one process with every core as a thread.

    >>> threads_sentence(batch=1024, ranks=2, threads=2, ratio=0.93)
    'At batch 1024 per rank, 2 one-thread DDP ranks train 0.93x the samples per second of one no-DDP process with 2 threads: the one process wins.'
    >>> threads_sentence(batch=64, ranks=2, threads=2, ratio=1.1).endswith("the ranks win.")
    True
    """
    who = "the ranks win" if ratio > 1 else "the one process wins"
    return (f"At batch {batch} per rank, {ranks} one-thread DDP ranks train {ratio:.2f}x the "
            f"samples per second of one no-DDP process with {threads} threads: {who}.")


def crossover_sentence(c: dict) -> str:
    """Measured and predicted crossover (:func:`crossover`) in one sentence, whatever their
    values (inside the sweep, outside it, never).

    >>> crossover_sentence({"world_size": 2, "measured": 45.3, "predicted": 42.0,
    ...                     "batches": [16, 1024]})
    'Crossover at 2 ranks: measured batch 45 per rank, predicted 42 (from t_no_DDP, t_c and what DDP adds).'
    >>> crossover_sentence({"world_size": 2, "measured": float("nan"),
    ...                     "predicted": float("inf"), "batches": [16, 1024]})
    'Crossover at 2 ranks: measured not inside the sweep (16 to 1024 per rank), predicted never (from t_no_DDP, t_c and what DDP adds).'
    """
    def say(x):
        if x != x:
            return f"not inside the sweep ({min(c['batches'])} to {max(c['batches'])} per rank)"
        if x == math.inf:
            return "never"
        if x == 0:
            return "at any batch"
        return f"{x:.0f}"

    return (f"Crossover at {c['world_size']} ranks: measured "
            f"{'batch ' if c['measured'] == c['measured'] else ''}{say(c['measured'])}"
            f"{' per rank' if c['measured'] == c['measured'] else ''}, predicted "
            f"{say(c['predicted'])} (from t_no_DDP, t_c and what DDP adds).")
