"""The context-parallel lab's laws and sentences, computed from a run's rows and this machine's
profile (pure: no torch).

The step model (:func:`context`): the busiest rank's compute measured alone in the launch
(``compute_alone_s``) times the profile's co-run slowdown at P ranks, plus 2(P-1) exchanges of
a K/V block, each at the profile's **transfer** of a point-to-point message of that size (one
that waited for nothing; the cores busy: the blocks travel while the ranks compute), plus a
**scheduler wait** (the profile's, about a tick here) for each exchange that waited in the
row's own median pass, counted from its timeline (:mod:`labkit.cp.exchanges`), and one more
where a rank arrived at that pass late by more than the wait rule (the ranks arriving at
different times): how often the scheduler makes a rank wait changes from second to second, how
long a wait lasts is the machine's. A step law that misses prints its measured split: the
compute with a loopback (ranks together), the messages alone, what the counted waits and the
late start took of the pass, and what is left (negative where messages hid behind the
compute).

The compute of each rank (:func:`compute_model`) is fixed work plus its score blocks, each at
the time one block of its kind takes alone (:func:`labkit.cp.formulas.rank_compute`): a
causal block (a chunk against itself, the mask written over the whole block) costs more than
a full one, and the fixed work of a pass does not shrink with the blocks. The ranks' shares
are compared as timed on one core (:func:`shares`): each rank's compute on its own core also
carries how fast that core ran, and on a shared VM one core can run slower for seconds.
"""

from __future__ import annotations

from labkit.book.laws import check
from labkit.cp import exchanges
from labkit.cp.formulas import predict_step, rank_compute, ring_sends_per_rank

#: the relative tolerance of every time and ratio law of the lab
TOLERANCE_PCT = 25.0


class FakeProfile:
    """A stand-in machine profile for examples and tests: co-run slowdown ``slowdown`` at two
    ranks or more, every message's transfer ``message_s``, a scheduler wait ``wait_s``."""

    def __init__(self, slowdown: float = 1.25, message_s: float = 2e-4, wait_s: float = 3.6e-3):
        self.slowdown, self.msg, self.scheduler_wait_s = slowdown, message_s, wait_s

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.slowdown

    def transfer_s(self, size_bytes, *, measurement="allreduce", busy=False):
        return self.msg


def _ms(x) -> float:
    return float(x) * 1e3


def _listed(xs, digits: int = 1) -> str:
    return ", ".join(f"{_ms(t):.{digits}f}" for t in xs)


def _timeline(row):
    """The row's timeline (a list), or None (none, or NaN in a DataFrame)."""
    tl = row.get("timeline_s") if hasattr(row, "get") else None
    return tl if isinstance(tl, list) else None


def context(row, prof) -> dict:
    """The step model of one row: ``slowdown``, ``exchange_s`` (one K/V block's transfer, the
    profile's message of that size with the cores busy), ``scheduler_wait_s`` (the profile's),
    ``waits`` (:func:`labkit.cp.exchanges.count` of the row's median pass: None without a
    timeline, and the model then prices transfers only), ``waits_s`` (what the counted waits
    add) and :func:`~labkit.cp.formulas.predict_step`'s terms, ``comm_s`` with the waits.

    >>> ctx = context({"world_size": 2, "kv_block_bytes": 131072, "compute_alone_s": 0.008},
    ...               FakeProfile())
    >>> ctx["slowdown"], round(ctx["step_s"] * 1e3, 2)
    (1.25, 10.4)

    The same with a timeline whose backward exchange took 4 ms: one wait, 3.6 ms more.

    >>> tl = [{"rank": r, "name": "wait grad K/V 0", "direction": "backward", "ring_step": 0,
    ...        "start_s": 0.0, "end_s": 4e-3} for r in (0, 1)]
    >>> ctx = context({"world_size": 2, "kv_block_bytes": 131072, "compute_alone_s": 0.008,
    ...                "timeline_s": tl}, FakeProfile())
    >>> ctx["waits"]["count"], round(ctx["step_s"] * 1e3, 2)
    (1, 14.0)
    """
    p = int(row["world_size"])
    slow = prof.compute_slowdown(p) if p > 1 else 1.0
    ex = wait = 0.0
    got = late = None
    if p > 1:  # the blocks travel while the ranks compute
        ex = prof.transfer_s(float(row["kv_block_bytes"]), measurement="message", busy=True)
        wait = float(prof.scheduler_wait_s)
        got = exchanges.count(_timeline(row), world_size=p, transfer_s=ex)
        late = exchanges.late_start(_timeline(row))
    waits_s = ((got["count"] if got else 0) + late_counted(late)) * wait
    model = predict_step(compute_alone_s=float(row["compute_alone_s"]), slowdown=slow,
                         exchanges=ring_sends_per_rank(p), exchange_s=ex)
    return {"slowdown": slow, "exchange_s": ex, "scheduler_wait_s": wait, "waits": got,
            "late": late, "waits_s": waits_s, **model, "comm_s": model["comm_s"] + waits_s,
            "step_s": model["step_s"] + waits_s}


def late_counted(late: dict | None) -> int:
    """1 where a rank arrived at the median pass late enough to count as a scheduler wait
    (:func:`labkit.cp.exchanges.late_start`), else 0."""
    return int(bool(late and late["waited"]))


#: the split's term for what the counted scheduler waits took of the measured pass
WAITS_TERM = "scheduler waits (counted)"
#: the split's term for a rank's late arrival at the median pass, where it counted as a wait
LATE_TERM = "a rank's late start (counted)"


def step_split(row, ctx: dict | None = None) -> dict:
    """The measured pass (ms) split into measured terms that add up to it; with the model's
    ``ctx`` (:func:`context`) that counted scheduler waits, what those took of the median pass
    beyond their transfers (:data:`WAITS_TERM`) and how late a rank arrived where that counted
    (:data:`LATE_TERM`), out of the rest.

    >>> row = {"step_time_p50_s": 0.012, "compute_time_p50_s": 0.006, "message_time_s": 0.001}
    >>> step_split(row, {"waits": {"count": 1, "excess_s": 0.0038}})
    {'compute (loopback, ranks together)': 6.0, 'messages alone': 1.0, 'scheduler waits (counted)': 3.8, 'the rest (negative: hidden by overlap)': 1.2}
    >>> step_split(row, {"waits": {"count": 0, "excess_s": 0.0},
    ...                  "late": {"late_s": 0.0031, "waited": True}})
    {'compute (loopback, ranks together)': 6.0, 'messages alone': 1.0, "a rank's late start (counted)": 3.1, 'the rest (negative: hidden by overlap)': 1.9}
    """
    step, comp, msg = (_ms(row[k]) for k in ("step_time_p50_s", "compute_time_p50_s",
                                             "message_time_s"))
    got, late = (ctx or {}).get("waits"), (ctx or {}).get("late")
    waits = {WAITS_TERM: _ms(got["excess_s"])} if got and got["count"] else {}
    if late_counted(late):
        waits[LATE_TERM] = _ms(late["late_s"])
    return {"compute (loopback, ranks together)": comp, "messages alone": msg, **waits,
            "the rest (negative: hidden by overlap)": round(step - comp - msg
                                                            - sum(waits.values()), 9)}


def waits_note(ctx: dict) -> str:
    """What the pass model counted and priced for the exchanges, in one sentence.

    >>> waits_note({"waits": {"exchanges": 2, "count": 1}, "scheduler_wait_s": 3.6e-3})
    "1 of 2 K/V exchanges waited for the scheduler in the median pass (counted from its timeline), priced at the profile's 3.6 ms each; transfers from the profile's message sweep (cores busy)"
    >>> print(waits_note({"waits": {"exchanges": 2, "count": 0}, "scheduler_wait_s": 3.6e-3,
    ...                   "late": {"late_s": 2.8e-3, "waited": True}}).split("; ")[1])
    a rank started the median pass 2.8 ms after the first (its barrier's exit waited for the scheduler), priced as one more wait
    """
    got = ctx["waits"]
    if not got:
        return ("no exchange's wait was counted (the row holds no timeline): transfers from "
                "the profile's message sweep (cores busy) only")
    late = ctx.get("late")
    arrival = (f"a rank started the median pass {_ms(late['late_s']):.1f} ms after the first "
               "(its barrier's exit waited for the scheduler), priced as one more wait; "
               if late_counted(late) else "")
    return (f"{got['count']} of {got['exchanges']} K/V exchanges waited for the scheduler in the "
            f"median pass (counted from its timeline), priced at the profile's "
            f"{_ms(ctx['scheduler_wait_s']):.1f} ms each; {arrival}transfers from the profile's "
            "message sweep (cores busy)")


def shares(row) -> list:
    """Each rank's share of the pass alone, as the imbalance laws compare them: timed on one
    core (``share_alone_s``: every share on each rank in turn, the ranks' median), or, in a row
    without them, each rank's compute on its own core (``compute_alone_per_rank_s``).

    >>> shares({"compute_alone_per_rank_s": [7.7e-3, 12.1e-3], "share_alone_s": [9.8e-3, 9.9e-3]})
    [0.0098, 0.0099]
    >>> shares({"compute_alone_per_rank_s": [7.7e-3, 12.1e-3]})
    [0.0077, 0.0121]
    """
    got = row.get("share_alone_s")
    return list(got) if isinstance(got, list) else list(row["compute_alone_per_rank_s"])


def compute_model(row) -> dict | None:
    """Each rank's compute alone as fixed work + its blocks at their kinds' times alone
    (:func:`labkit.cp.formulas.rank_compute` of the row's :func:`shares`,
    ``block_kinds_per_rank`` and ``block_time_alone_s``); None for a row that timed no
    blocks."""
    block_s, kinds = row.get("block_time_alone_s"), row.get("block_kinds_per_rank")
    if not isinstance(block_s, dict) or not isinstance(kinds, list):
        return None
    return rank_compute(alone_per_rank_s=shares(row), kinds_per_rank=kinds, block_s=block_s)


def compute_note(row, model: dict) -> str:
    """What the compute ratio's model is made of, in one sentence.

    >>> row = {"block_kinds_per_rank": [{"full": 0, "causal": 1}, {"full": 1, "causal": 1}],
    ...        "block_time_alone_s": {"full": 8e-4, "causal": 1.4e-3},
    ...        "compute_alone_per_rank_s": [1.55e-3, 2.38e-3]}
    >>> print(compute_note(row, compute_model(row)))
    per rank: 0.17 ms of fixed work a pass (the ranks' median of their share alone less its blocks) + its blocks at their time alone, full 0.80 ms, causal 1.40 ms (the mask over a whole block): rank 0 0.17 + 1.40, rank 1 0.17 + 2.20 ms; blocks alone would give 1.57x

    With the shares timed on one core, the ranks' own cores beside them:

    >>> row["share_alone_s"] = [1.6e-3, 2.4e-3]
    >>> print("; ".join(compute_note(row, compute_model(row)).split("; ")[-2:]))
    each share timed on one core (every rank's in turn): 1.60, 2.40 ms; each rank on its own core: 1.55, 2.38 ms
    """
    ranks = ", ".join(f"rank {r} {_ms(model['fixed_s']):.2f} + {_ms(b):.2f}"
                      for r, b in enumerate(model["blocks_s"]))
    kinds = ", ".join(f"{k} {_ms(t):.2f} ms" + (" (the mask over a whole block)"
                                                 if k == "causal" else "")
                      for k, t in sorted(row["block_time_alone_s"].items(),
                                         key=lambda kv: kv[0] != "full"))
    bare = (max(model["blocks_s"]) / min(model["blocks_s"]) if min(model["blocks_s"]) > 0
            else float("nan"))
    text = (f"per rank: {_ms(model['fixed_s']):.2f} ms of fixed work a pass (the ranks' median "
            f"of their share alone less its blocks) + its blocks at their time alone, {kinds}: "
            f"{ranks} ms; blocks alone would give {bare:.2f}x")
    if isinstance(row.get("share_alone_s"), list):
        text += (f"; each share timed on one core (every rank's in turn): "
                 f"{_listed(row['share_alone_s'], 2)} ms; each rank on its own core: "
                 f"{_listed(row['compute_alone_per_rank_s'], 2)} ms")
    return text


def compute_split(row, model: dict) -> dict:
    """The measured ratio slowest / fastest rank's compute alone (:func:`shares`) taken apart
    into terms that sum to it: 1 (the fastest rank's compute), the slowest rank's extra blocks
    at their time alone, and the rest of the difference (the other work, or blocks that ran at
    another pace inside the pass than alone), each over the fastest rank's compute.

    >>> row = {"compute_alone_per_rank_s": [1.5e-3, 2.4e-3]}
    >>> {k: round(v, 3) for k, v in compute_split(row, {"blocks_s": [1.4e-3, 2.2e-3]}).items()}
    {"1 (the fastest rank's compute)": 1.0, 'its extra blocks at their time alone': 0.533, 'the rest of the difference': 0.067}
    """
    alone, blocks = shares(row), list(model["blocks_s"])
    slow, fast = alone.index(max(alone)), alone.index(min(alone))
    extra = blocks[slow] - blocks[fast]
    return {"1 (the fastest rank's compute)": 1.0,
            "its extra blocks at their time alone": extra / alone[fast],
            "the rest of the difference": (alone[slow] - alone[fast] - extra) / alone[fast]}


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
        alone = shares(row)
        model = compute_model(row)
        if model is None:  # a row that timed no blocks: the blocks' count alone
            blocks = list(row["blocks_per_rank"])
            out.append(check(f"{pre}: slowest / fastest rank's compute = most / fewest blocks",
                             predicted=max(blocks) / min(blocks),
                             measured=max(alone) / min(alone), tolerance_pct=TOLERANCE_PCT))
        else:
            out.append(check(f"{pre}: slowest / fastest rank's compute = fixed work + its "
                             "blocks at their time alone", predicted=model["ratio"],
                             measured=max(alone) / min(alone), tolerance_pct=TOLERANCE_PCT,
                             split=compute_split(row, model), note=compute_note(row, model)))
        out.append(check(f"{pre}: saved bytes / one rank's = 1/P", kind="naive",
                         predicted=1 / p, measured=row["saved_bytes_measured"]
                         / row["saved_bytes_one_rank_measured"], tolerance_pct=TOLERANCE_PCT,
                         note="every rank keeps the K/V blocks it received"))
    ctx = context(row, prof)
    out.append(check(f"{pre}: pass = compute alone x slowdown + 2(P-1) exchanges",
                     predicted=_ms(ctx["step_s"]), measured=_ms(row["step_time_p50_s"]),
                     unit="ms", tolerance_pct=TOLERANCE_PCT,
                     split=step_split(row, ctx) if p > 1 else None,
                     note=waits_note(ctx) if p > 1 else ""))
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
    """Each rank's compute alone against its score blocks, and against the model of fixed work
    + blocks at their time alone (:func:`compute_model`) where the row timed its blocks.

    >>> print(balance_sentence({"variant": "causal", "world_size": 2, "blocks_per_rank": [1, 2],
    ...                         "compute_alone_per_rank_s": [0.002, 0.0041]}))
    causal on 2 ranks: score blocks per rank 1, 2; compute alone 2.0, 4.1 ms: the slowest rank 2.05x the fastest (blocks: 2.00x).
    >>> print(balance_sentence({"variant": "causal", "world_size": 2, "blocks_per_rank": [1, 2],
    ...     "compute_alone_per_rank_s": [1.55e-3, 2.38e-3],
    ...     "block_kinds_per_rank": [{"full": 0, "causal": 1}, {"full": 1, "causal": 1}],
    ...     "block_time_alone_s": {"full": 8e-4, "causal": 1.4e-3}}))
    causal on 2 ranks: score blocks per rank 1, 2; compute alone 1.6, 2.4 ms: the slowest rank 1.54x the fastest (blocks: 2.00x; fixed work + blocks at their time alone: 1.51x, a causal block costing 1.75x a full one).

    With each share timed on one core (:func:`shares`), the ranks' own cores named beside:

    >>> print(balance_sentence({"variant": "full", "world_size": 2, "blocks_per_rank": [2, 2],
    ...     "compute_alone_per_rank_s": [7.7e-3, 12.1e-3], "share_alone_s": [9.8e-3, 9.9e-3]}))
    full on 2 ranks: score blocks per rank 2, 2; each share alone on one core 9.8, 9.9 ms (on their own cores 7.7, 12.1 ms: the cores ran at different speeds): the slowest share 1.01x the fastest (blocks: 1.00x).
    """
    blocks, alone = list(row["blocks_per_rank"]), shares(row)
    model = compute_model(row)
    why = ""
    if model is not None:
        kinds = row["block_time_alone_s"]
        why = f"; fixed work + blocks at their time alone: {model['ratio']:.2f}x"
        if kinds.get("full") and kinds.get("causal"):
            why += f", a causal block costing {kinds['causal'] / kinds['full']:.2f}x a full one"
    if isinstance(row.get("share_alone_s"), list):
        own = list(row["compute_alone_per_rank_s"])
        # each core's pace: its rank's compute on it over the same share timed on one core
        pace = [o / a for o, a in zip(own, alone)]
        cores = ("the cores ran at different speeds" if max(pace) / min(pace) > 1.1
                 else "the same ratio within 10%")
        what = (f"each share alone on one core {_listed(alone)} ms (on their own cores "
                f"{_listed(own)} ms: {cores}): the slowest share")
    else:
        what = f"compute alone {_listed(alone)} ms: the slowest rank"
    return (f"{row['variant']} on {int(row['world_size'])} ranks: score blocks per rank "
            f"{', '.join(str(int(b)) for b in blocks)}; {what} "
            f"{max(alone) / min(alone):.2f}x the fastest (blocks: "
            f"{max(blocks) / min(blocks):.2f}x{why}).")


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


def waits_sentence(row, prof) -> str:
    """How many K/V exchanges of the median pass waited for the scheduler, why, and what that
    adds to the model and took of the measured pass; or that none waited.

    >>> tl = [{"rank": r, "name": "wait grad K/V 0", "direction": "backward", "ring_step": 0,
    ...        "start_s": 0.0, "end_s": 4e-3} for r in (0, 1)]
    >>> row = {"variant": "causal", "world_size": 2, "kv_block_bytes": 131072,
    ...        "compute_alone_s": 0.008, "timeline_s": tl}
    >>> print(waits_sentence(row, FakeProfile()))
    causal on 2 ranks: 1 of the median pass's 1 K/V exchanges waited for the scheduler (counted from its timeline: it cost a rank more than its transfer + max(1.5 ms, transfer / 4)): a message whose receiver's core is busy waits for the scheduler's next turn (the profile's 3.6 ms a wait). The model adds 3.6 ms; the waits took 3.8 ms of the measured pass beyond their transfers.
    >>> print(waits_sentence({**row, "timeline_s": [dict(s, end_s=3e-4) for s in tl]},
    ...                      FakeProfile()))
    causal on 2 ranks: none of the median pass's 1 K/V exchanges waited for the scheduler (each cost a rank at most its transfer + max(1.5 ms, transfer / 4), counted from its timeline): the model prices their transfers only.

    Rank 1 leaving the barrier 2.8 ms after rank 0:

    >>> late = [dict(s, start_s=2.8e-3 * s["rank"], end_s=3e-3 + 2.8e-3 * s["rank"]) for s in tl]
    >>> print(waits_sentence({**row, "timeline_s": late}, FakeProfile()).split(". ")[-1])
    A rank also started the median pass 2.8 ms after the first (more than the rule allows a call with nothing to transfer): its barrier's exit waited for the scheduler, and the model prices it as one more wait.
    """
    from labkit.machine.formulas import WAIT_RULE

    p = int(row["world_size"])
    head = f"{row['variant']} on {p} rank{'s' if p != 1 else ''}: "
    if p < 2:
        return head + "no K/V block travels, so nothing waited for the scheduler."
    ctx = context(row, prof)
    got = ctx["waits"]
    rule = f"its {WAIT_RULE}"
    if not got:
        return head + ("the row holds no timeline, so no wait for the scheduler was counted: "
                       "the model prices the exchanges' transfers only.")
    late = ctx["late"]
    arrival = (f" A rank also started the median pass {_ms(late['late_s']):.1f} ms after the "
               "first (more than the rule allows a call with nothing to transfer): its "
               "barrier's exit waited for the scheduler, and the model prices it as one more "
               "wait." if late_counted(late) else "")
    if not got["count"]:
        return head + (f"none of the median pass's {got['exchanges']} K/V exchanges waited for "
                       f"the scheduler (each cost a rank at most {rule}, counted from its "
                       "timeline): the model prices their transfers only." + arrival)
    return head + (f"{got['count']} of the median pass's {got['exchanges']} K/V exchanges "
                   f"waited for the scheduler (counted from its timeline: it cost a rank more "
                   f"than {rule}): a message whose receiver's core is busy waits for the "
                   "scheduler's next turn (the profile's "
                   f"{_ms(ctx['scheduler_wait_s']):.1f} ms a wait). The model adds "
                   f"{_ms(got['count'] * ctx['scheduler_wait_s']):.1f} ms; the waits took "
                   f"{_ms(got['excess_s']):.1f} ms of the measured pass beyond their "
                   "transfers." + arrival)
