"""The context-parallel lab's laws and sentences, computed from a run's rows and this machine's
profile (pure: no torch).

The step model (:func:`context`): the busiest rank's compute measured alone in the launch
(``compute_alone_s``) times the profile's co-run slowdown at P ranks, plus 2(P-1) exchanges of
a K/V block priced by the profile's point-to-point message of that size. A step law that
misses prints its measured split: the compute with a loopback (ranks together), the messages
alone, and what is left (negative where messages hid behind the compute).
"""

from __future__ import annotations

from labkit.book.laws import check
from labkit.cp.formulas import predict_step, ring_sends_per_rank

#: the relative tolerance of every time and ratio law of the lab
TOLERANCE_PCT = 25.0


class FakeProfile:
    """A stand-in machine profile for examples and tests: co-run slowdown ``slowdown`` at two
    ranks or more, every message ``message_s``."""

    def __init__(self, slowdown: float = 1.25, message_s: float = 2e-4):
        self.slowdown, self.msg = slowdown, message_s

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.slowdown

    def message_s(self, size_bytes, *, busy=False):
        return self.msg


def _ms(x) -> float:
    return float(x) * 1e3


def context(row, prof) -> dict:
    """The step model of one row: ``slowdown``, ``exchange_s`` (one K/V block, the profile's
    message of that size) and :func:`~labkit.cp.formulas.predict_step`'s terms.

    >>> ctx = context({"world_size": 2, "kv_block_bytes": 131072, "compute_alone_s": 0.008},
    ...               FakeProfile())
    >>> ctx["slowdown"], round(ctx["step_s"] * 1e3, 2)
    (1.25, 10.4)
    """
    p = int(row["world_size"])
    slow = prof.compute_slowdown(p) if p > 1 else 1.0
    ex = prof.message_s(float(row["kv_block_bytes"])) if p > 1 else 0.0
    return {"slowdown": slow, "exchange_s": ex,
            **predict_step(compute_alone_s=float(row["compute_alone_s"]), slowdown=slow,
                           exchanges=ring_sends_per_rank(p), exchange_s=ex)}


def step_split(row) -> dict:
    """The measured pass (ms) split into measured terms that add up to it."""
    step, comp, msg = (_ms(row[k]) for k in ("step_time_p50_s", "compute_time_p50_s",
                                             "message_time_s"))
    return {"compute (loopback, ranks together)": comp, "messages alone": msg,
            "the rest (negative: hidden by overlap)": step - comp - msg}


def laws(row, prof) -> list[dict]:
    """The laws of one row: bytes and sends counted against the formula, saved bytes against
    theirs (exact counts), the compute imbalance, the 1/P memory law (naive), the step model."""
    p, v = int(row["world_size"]), row["variant"]
    pre = f"CP {v}, P = {p}"
    out = []
    if p > 1:
        for phase in ("forward", "backward"):
            out.append(check(f"{pre}: bytes sent per rank, {phase} = 2 (P-1)/P b S h x 4 B",
                             predicted=row["ring_bytes_formula"],
                             measured=row[f"ring_bytes_{phase}_measured"], unit="B",
                             tolerance_pct=0))
    out.append(check(f"{pre}: bytes autograd saves per rank = formula",
                     predicted=row["saved_bytes_formula"], measured=row["saved_bytes_measured"],
                     unit="B", tolerance_pct=0))
    if p > 1:
        blocks = list(row["blocks_per_rank"])
        alone = list(row["compute_alone_per_rank_s"])
        out.append(check(f"{pre}: slowest / fastest rank's compute = most / fewest blocks",
                         predicted=max(blocks) / min(blocks), measured=max(alone) / min(alone),
                         tolerance_pct=TOLERANCE_PCT))
        out.append(check(f"{pre}: saved bytes / one rank's = 1/P", kind="naive",
                         predicted=1 / p, measured=row["saved_bytes_measured"]
                         / row["saved_bytes_one_rank_measured"], tolerance_pct=TOLERANCE_PCT,
                         note="every rank keeps the K/V blocks it received"))
    ctx = context(row, prof)
    out.append(check(f"{pre}: pass = compute alone x slowdown + 2(P-1) exchanges",
                     predicted=_ms(ctx["step_s"]), measured=_ms(row["step_time_p50_s"]),
                     unit="ms", tolerance_pct=TOLERANCE_PCT,
                     split=step_split(row) if p > 1 else None))
    return out


def overlap_sentence(row) -> str:
    """One ring step's message against the block compute it could hide behind, and what the
    pass measured.

    >>> row = {"world_size": 2, "variant": "causal_balanced", "exchange_time_s": 0.0006,
    ...        "forward_alone_per_rank_s": [0.004, 0.0042], "step_time_p50_s": 0.014,
    ...        "compute_time_p50_s": 0.011, "message_time_s": 0.0015}
    >>> print(overlap_sentence(row))
    causal_balanced on 2 ranks: one K/V exchange takes 0.60 ms against 2.10 ms of forward block compute per ring step on the busiest rank: it could hide behind it. The pass took 14.0 ms against 11.0 ms of compute and 1.5 ms of messages: 1.5 ms not explained by either.
    """
    p = int(row["world_size"])
    per_step = max(row["forward_alone_per_rank_s"]) / p
    ex = row["exchange_time_s"]
    could = "it could hide behind it" if ex <= per_step else "too long to hide behind it"
    step, comp, msg = (_ms(row[k]) for k in ("step_time_p50_s", "compute_time_p50_s",
                                             "message_time_s"))
    rest = step - comp - msg
    tail = (f"{-rest:.1f} ms of the messages hidden" if rest < 0 else
            f"{rest:.1f} ms not explained by either")
    return (f"{row['variant']} on {p} ranks: one K/V exchange takes {_ms(ex):.2f} ms against "
            f"{_ms(per_step):.2f} ms of forward block compute per ring step on the busiest "
            f"rank: {could}. The pass took {step:.1f} ms against {comp:.1f} ms of compute and "
            f"{msg:.1f} ms of messages: {tail}.")


def balance_sentence(row) -> str:
    """Each rank's compute alone against its score blocks.

    >>> print(balance_sentence({"variant": "causal", "world_size": 2, "blocks_per_rank": [1, 2],
    ...                         "compute_alone_per_rank_s": [0.002, 0.0041]}))
    causal on 2 ranks: score blocks per rank 1, 2; compute alone 2.0, 4.1 ms: the slowest rank 2.05x the fastest (blocks: 2.00x).
    """
    blocks, alone = list(row["blocks_per_rank"]), list(row["compute_alone_per_rank_s"])
    return (f"{row['variant']} on {int(row['world_size'])} ranks: score blocks per rank "
            f"{', '.join(str(int(b)) for b in blocks)}; compute alone "
            f"{', '.join(f'{_ms(t):.1f}' for t in alone)} ms: the slowest rank "
            f"{max(alone) / min(alone):.2f}x the fastest (blocks: "
            f"{max(blocks) / min(blocks):.2f}x).")


def memory_sentence(row) -> str:
    """What autograd keeps per rank against one rank holding the whole sequence.

    >>> print(memory_sentence({"variant": "full", "world_size": 2, "saved_bytes_measured": 176128,
    ...                        "saved_bytes_one_rank_measured": 280576}))
    full on 2 ranks: autograd keeps 176 kB per rank against 281 kB on one rank: 0.63 of it, not 1/2 (the K/V blocks received are kept whole).
    """
    p = int(row["world_size"])
    ratio = row["saved_bytes_measured"] / row["saved_bytes_one_rank_measured"]
    return (f"{row['variant']} on {p} ranks: autograd keeps {row['saved_bytes_measured'] / 1e3:.0f}"
            f" kB per rank against {row['saved_bytes_one_rank_measured'] / 1e3:.0f} kB on one "
            f"rank: {ratio:.2f} of it, "
            + (f"not 1/{p} (the K/V blocks received are kept whole)." if ratio > 1.25 / p
               else f"about 1/{p}."))
