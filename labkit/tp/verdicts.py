"""The tensor-parallel lab's laws and sentences, computed from a run's rows and this machine's
profile (pure: no torch).

The step model carries what the machine profile measured (:mod:`labkit.machine`): a rank's
compute measured alone in the launch (``predicted_compute_s``) times the profile's co-run
slowdown at P ranks, and each of the step's collectives priced as its **transfer** (the
profile's all-reduce of that size that waited for nothing, peers idle: in a TP step nothing
computes while a message moves) plus, for each message of the row's own median step that
**waited for the scheduler** (counted from its timeline, :mod:`labkit.tp.waits`), the
profile's scheduler wait (:func:`labkit.tp.formulas.step_in_context`). A row without a
timeline prices each collective at the profile's average in context instead, transfer + its
share of waits (:meth:`labkit.machine.Profile.allreduce_s`), or, given the waits a step counted
elsewhere (the library's row: :mod:`labkit.tp.library`), at its transfer with those waits.
``prof`` below is a :class:`labkit.machine.Profile` or anything with its
``compute_slowdown(ranks)``, ``transfer_s(size_bytes, ranks=..., busy=...)``,
``allreduce_s(size_bytes, ranks=..., busy=...)``, ``wait_share(busy=...)`` and
``scheduler_wait_s`` (:class:`labkit.tp.fakeprofile.FakeProfile`). A step-time law that misses
prints its measured split: the time outside the all-reduces, the messages, what the counted
scheduler waits took of them, and the wait for the later rank (:mod:`labkit.tp.timeline`);
those add up to the step.
"""

from __future__ import annotations

import math

from labkit.book.laws import check, symmetric_error_pct
from labkit.metrics import ratio_split, slowdown_split
from labkit.tp import waits
from labkit.tp.fakeprofile import FakeProfile  # noqa: F401 - the examples' stand-in
from labkit.tp.formulas import step_in_context

#: the relative tolerance of every time and ratio law of the lab
TOLERANCE_PCT = 25.0
#: an all-gather or a reduce-scatter of S against an all-reduce of S where the machine profile
#: timed none (an older profile): a ring all-reduce is one of each. The profile times both on
#: the lab's backend (gloo's are not half an all-reduce: its reduce-scatter into one tensor took
#: 1.4-1.7x an all-reduce's transfer of the same buffer here, its all-gather 0.8-1.0x).
GATHER_SCATTER = {"all_gather": 0.5, "reduce_scatter": 0.5}
#: the measured split's term for what the counted scheduler waits took
WAITS_TERM = "scheduler waits (counted)"


def _number(row, key: str, default: float = 0.0) -> float:
    """``row[key]`` as a number; ``default`` where the row lacks it (an older row) or holds NaN."""
    v = row.get(key) if hasattr(row, "get") else None
    return default if v is None or v != v else float(v)


def op_factor(prof, op: str, size_bytes: float, *, ranks: int, busy: bool) -> float:
    """An ``op`` (``all_gather``, ``reduce_scatter``; 1 for an all-reduce) of ``size_bytes``
    over an all-reduce of the same buffer: the machine profile's transfers of both at that size
    where it timed the op at this world size, else :data:`GATHER_SCATTER` (a ring's).

    >>> op_factor(FakeProfile(ops={}), "reduce_scatter", 4e6, ranks=2, busy=False)
    0.5
    >>> op_factor(FakeProfile(ops={"reduce_scatter": 1.6}), "reduce_scatter", 4e6, ranks=2,
    ...           busy=False)
    1.6
    """
    if op == "all_reduce":
        return 1.0
    measured = getattr(prof, "measured", lambda name: False)(op)
    if not measured or int(ranks) != int(getattr(prof, "world_size", ranks)):
        return GATHER_SCATTER[op]
    return (prof.transfer_s(size_bytes, measurement=op, ranks=ranks, busy=busy)
            / prof.transfer_s(size_bytes, ranks=ranks, busy=busy))


def call_s(prof, size_bytes: float, *, ranks: int, busy: bool, counted: bool,
           factor: float = 1.0) -> float:
    """One collective of ``size_bytes`` priced by the profile: ``factor`` (:func:`op_factor`)
    times the transfer of an all-reduce of that size where the step's scheduler waits are
    ``counted`` apart; otherwise its average in context, that transfer and the profile's share
    of waits (:meth:`~labkit.machine.Profile.wait_share`) times one wait; nothing on one rank.
    The FSDP lab prices its collectives so too.

    >>> prof = FakeProfile(allreduce_s=1e-3, wait_s=3.6e-3, wait_share=0.25)
    >>> [round(call_s(prof, 1e6, ranks=2, busy=False, counted=c, factor=2.0) * 1e3, 1)
    ...  for c in (True, False)]
    [2.0, 2.9]
    """
    if int(ranks) < 2:
        return 0.0
    moved = float(factor) * prof.transfer_s(size_bytes, ranks=ranks, busy=busy)
    if counted:
        return moved
    return moved + prof.wait_share(busy=busy) * float(prof.scheduler_wait_s)


def context(row, prof, *, extra_s: float = 0.0, waits_per_step: float | None = None) -> dict:
    """The in-context prediction for one row: ``slowdown`` (the profile's co-run slowdown at the
    row's world size: its miniature training step's), ``allreduce_s`` (one all-reduce
    of the row's activation, peers idle: its transfer where the row's timeline counts the
    waits, else its average in context), ``gather_s`` (one all-gather and one reduce-scatter
    of it, the pair's mean: sequence parallelism's), ``waits`` (:func:`labkit.tp.waits.count`
    of the row's timeline, None without one), ``scheduler_wait_s`` (the profile's, one wait)
    and :func:`~labkit.tp.formulas.step_in_context`'s ``compute_s``, ``transfers_s``,
    ``waits_s``, ``comm_s``, ``step_s`` (``extra_s``: work measured apart, added as it is).
    ``waits_per_step``: for a row without a timeline, the waits a step counted elsewhere (the
    teaching version's, :func:`labkit.tp.library.borrowed_waits`): its collectives are then
    priced as transfers and that many waits added, ``borrowed`` in the result.

    >>> row = {"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...        "allreduce_calls_formula": 8, "predicted_compute_s": 0.054}
    >>> ctx = context(row, FakeProfile())
    >>> ctx["slowdown"], round(ctx["step_s"] * 1e3, 1), ctx["waits"]
    (1.25, 73.9, None)

    The same row with its median step's timeline, one all-reduce 4.4 ms long: it waited, one
    scheduler wait (3.6 ms) more.

    >>> tl = [{"rank": r, "name": f"g {i}", "cat": "all-reduce", "start_s": 0.01 * i,
    ...        "end_s": 0.01 * i + (4.4e-3 if i == 3 else 8e-4)} for r in (0, 1) for i in range(8)]
    >>> ctx = context({**row, "timeline_s": tl}, FakeProfile())
    >>> ctx["waits"]["count"], round(ctx["waits_s"] * 1e3, 1), round(ctx["step_s"] * 1e3, 1)
    (1, 3.6, 77.5)
    """
    p = int(row["world_size"])
    slow = prof.compute_slowdown(p) if p > 1 else 1.0
    n_ar = int(row["allreduce_calls_formula"])
    each = float(row["bytes_per_allreduce"])
    ar_each = _number(row, "allreduce_bytes_formula", n_ar * each) / n_ar if n_ar else each
    n_ag = int(_number(row, "allgather_calls_formula"))
    n_rs = int(_number(row, "reduce_scatter_calls_formula"))
    got = every = borrowed = None
    wait = ar = ag = rs = 0.0
    if p > 1:
        tl = waits.timeline(row)
        borrowed = None if tl or waits_per_step is None else float(waits_per_step)
        kw = dict(ranks=p, busy=False, counted=bool(tl) or borrowed is not None)
        ar = call_s(prof, ar_each, **kw)
        ag = call_s(prof, each, factor=op_factor(prof, "all_gather", each, ranks=p, busy=False),
                    **kw) if n_ag else 0.0
        rs = call_s(prof, each, factor=op_factor(prof, "reduce_scatter", each, ranks=p,
                                                 busy=False), **kw) if n_rs else 0.0
        if tl or borrowed is not None:
            wait = float(prof.scheduler_wait_s)
        if tl:
            kinds = {"all-reduce": ar, "all-gather": ag, "reduce-scatter": rs}
            got = waits.count(tl, transfers=kinds)
            timed = row.get("step_times_s")
            every = waits.count_steps(row.get("collective_calls_s"), transfers=kinds,
                                      steps=len(timed) if isinstance(timed, list) else 0)
    gathers = n_ag + n_rs
    gs = (n_ag * ag + n_rs * rs) / gathers if gathers else 0.0
    counted = got["count"] if got else (borrowed or 0)
    model = step_in_context(compute_alone_s=row["predicted_compute_s"], slowdown=slow,
                            allreduces=n_ar, allreduce_s=ar, gathers=gathers, gather_s=gs,
                            waits=counted, wait_s=wait, extra_s=extra_s)
    # the time inside is a mean over the timed steps: their waits counted in every step, each
    # at what a wait costs a call every rank has entered, no compute beside it (idle calls')
    inside_wait = float(prof.scheduler_wait_in_s(busy=False)) if every else wait
    inside = model["transfers_s"] + every["per_step"] * inside_wait if every else model["comm_s"]
    return {"slowdown": slow, "allreduce_s": ar, "gather_s": gs, "waits": got,
            "borrowed": borrowed, "scheduler_wait_s": wait, "every": every, "inside_s": inside,
            "inside_wait_s": inside_wait, **model}


def _ms(x: float) -> float:
    return float(x) * 1e3


def inside_split(row, ctx: dict | None = None) -> dict:
    """The measured time inside the collectives (ms per step), as the law's split: the
    messages and the wait for the later rank; with the model's ``ctx`` (:func:`context`) that
    counted scheduler waits, what those took of the median step (beyond their transfers,
    measured) apart from the messages (:data:`WAITS_TERM`). The terms add up to the time
    inside.

    >>> row = {"allreduce_message_in_step_s": 0.012, "allreduce_wait_in_step_s": 0.002}
    >>> inside_split(row, {"waits": {"count": 2, "excess_s": [0.0021, 0.0026]}})
    {'messages': 7.3, 'scheduler waits (counted)': 4.7, 'waiting for the later rank': 2.0}

    Counted waits of 14 ms where the time inside was 12 ms and the transfers 3 ms: the waits
    take what lies beyond the transfers.

    >>> inside_split(row, {"waits": {"count": 4, "excess_s": [0.0035] * 4}, "transfers_s": 0.003})
    {'messages': 3.0, 'scheduler waits (counted)': 9.0, 'waiting for the later rank': 2.0}
    """
    msg = _ms(row["allreduce_message_in_step_s"])
    got, every = (ctx or {}).get("waits"), (ctx or {}).get("every")
    if every:  # counted in every timed step, as the time inside is their mean
        got = {"count": every["count"], "excess_s": [every["excess_per_step_s"]]}
    if not got or not got["count"]:
        return {"messages": msg, "waiting for the later rank": _ms(row["allreduce_wait_in_step_s"])}
    # the counted waits, within the messages and beyond their transfers (the calls counted
    # from their last exit can hold more wait than the slowest rank's own time inside)
    floor = _ms((ctx or {}).get("transfers_s") or 0.0)
    part = min(_ms(sum(got["excess_s"])), max(msg - floor, 0.0))
    return {"messages": round(msg - part, 9), WAITS_TERM: round(part, 9),
            "waiting for the later rank": _ms(row["allreduce_wait_in_step_s"])}


def messages_split(row, ctx: dict | None = None) -> dict:
    """The collectives' own time (ms per step: from the later rank's entry to the exit), as
    the law of 4 L t_ar's split: :func:`inside_split` without the wait for the later rank to
    enter, which the α–β law does not describe (the ranks' compute arriving apart).

    >>> row = {"allreduce_message_in_step_s": 0.012, "allreduce_wait_in_step_s": 0.002}
    >>> messages_split(row, {"waits": {"count": 2, "excess_s": [0.0021, 0.0026]}})
    {'messages': 7.3, 'scheduler waits (counted)': 4.7}
    """
    got = inside_split(row, ctx)
    got.pop("waiting for the later rank")
    return got


def step_split(row, ctx: dict | None = None) -> dict:
    """The measured step (ms, p50) split into the time outside the all-reduces and the parts
    of the time inside them (:func:`inside_split`), its counted waits the median step's (the
    step law's own count, as its note says, not every step's); the terms add up to the step."""
    inside = _ms(row["allreduce_time_in_step_s"])
    return {"outside the all-reduces": _ms(row["step_time_p50_s"]) - inside,
            **inside_split(row, {**ctx, "every": None} if ctx else None)}


def wait_note(ctx: dict, *, what: str = "all-reduces") -> str:
    """What the model counted and priced for the row's collectives (:func:`context`): the
    waits counted in its timeline, or why none were and what it used instead.

    >>> print(wait_note({"waits": None, "allreduce_s": 1.3e-3, "scheduler_wait_s": 0.0}))
    the row holds no timeline of its collectives (DTensor's run inside the library, unstamped): each priced at the profile's average in context, transfer + its share of scheduler waits (1.30 ms)
    """
    return waits.note(ctx["waits"], wait_s=ctx["scheduler_wait_s"], what=what,
                      transfers="the profile's, peers idle",
                      fallback="the row holds no timeline of its collectives (DTensor's run "
                               "inside the library, unstamped): each priced at the profile's "
                               "average in context, transfer + its share of scheduler waits "
                               f"({_ms(ctx['allreduce_s']):.2f} ms)")


def inside_note(ctx: dict) -> str:
    """What the time-inside law counted (:func:`context`'s ``every``; empty without it).

    >>> print(inside_note({"every": {"calls": 40, "count": 6, "steps": 5, "per_step": 1.2},
    ...                    "inside_wait_s": 2.6e-3}))
    6 of the 40 all-reduces of the 5 timed steps waited for the scheduler (1.2 a step, counted from every step's calls), priced at 2.6 ms each (the profile's calls that waited with the peers idle); transfers the profile's, peers idle
    """
    every = ctx.get("every")
    if not every:
        return ""
    return (f"{every['count']} of the {every['calls']} all-reduces of the {every['steps']} "
            f"timed steps waited for the scheduler ({every['per_step']:.1f} a step, counted from "
            f"every step's calls), priced at {_ms(ctx['inside_wait_s']):.1f} ms each (the "
            "profile's calls that waited with the peers idle); transfers the profile's, peers idle")


def naive_laws(row, prof) -> list[dict]:
    """Section 1's laws for the teaching version's row: parameters per rank, compute, and at
    P > 1 the all-reduces counted, their bytes and the time inside them; then the step."""
    p = int(row["world_size"])
    pre = f"TP by hand, P = {p}"
    ctx = context(row, prof)
    out = [check(f"{pre}: parameters per rank = L ((12 h^2 + 7 h)/P + 6 h)",
                 predicted=row["params_per_rank_formula"], measured=row["params_per_rank"],
                 tolerance_pct=0),
           check(f"{pre}: compute (f and g off) = F/R alone x co-run slowdown",
                 predicted=_ms(ctx["compute_s"]), measured=_ms(row["compute_time_p50_s"]),
                 unit="ms", tolerance_pct=TOLERANCE_PCT, split_op="product",
                 split=slowdown_split(alone_s=row.get("predicted_compute_s"),
                                      together_s=row.get("compute_time_p50_s"),
                                      names=("F/R alone", f"the compute on {p} ranks")),
                 note=f"F/R alone {_ms(row['predicted_compute_s']):.3g} ms x {ctx['slowdown']:.2f}")]
    split, note = None, ""
    if p > 1:
        note = wait_note(ctx)
        out += [check(f"{pre}: all-reduces per step = 4 L", predicted=row["allreduce_calls_formula"],
                      measured=row["allreduce_calls_measured"], tolerance_pct=0),
                check(f"{pre}: bytes all-reduced per step = 4 L b s h x 4 B",
                      predicted=row["comm_bytes_formula"], measured=row["comm_bytes_measured"],
                      unit="B", tolerance_pct=0),
                check(f"{pre}: time inside f's and g's all-reduces from the later rank's "
                      "entry = 4 L t_ar (in context)", predicted=_ms(ctx["inside_s"]),
                      measured=_ms(row["allreduce_message_in_step_s"]), unit="ms",
                      tolerance_pct=TOLERANCE_PCT, split=messages_split(row, ctx),
                      note=f"{inside_note(ctx) or note}; before it, the wait for the later "
                           f"rank to enter ({_ms(row['allreduce_wait_in_step_s']):.1f} ms: the "
                           "ranks' compute arriving apart, in the step's split)")]
        split = step_split(row, ctx)
    out.append(check(f"{pre}: step = F/R x slowdown + 4 L t_ar", predicted=_ms(ctx["step_s"]),
                     measured=_ms(row["step_time_p50_s"]), unit="ms",
                     tolerance_pct=TOLERANCE_PCT, split=split, note=note))
    return out


def predicted_speedup(one, row, prof) -> float:
    """T(1) / T(P) of the teaching version, both from the in-context model."""
    return context(one, prof)["step_s"] / context(row, prof)["step_s"]


def speedup_law(one, row, prof) -> dict:
    """Section 3's law: the measured speedup of the teaching version against the model's (its
    T(P) with the waits counted in the row's median step, :func:`wait_note`)."""
    p = int(row["world_size"])
    return check(f"TP speedup T(1)/T({p}) at h = {int(row['hidden'])}",
                 predicted=predicted_speedup(one, row, prof), measured=row["speedup_vs_1_rank"],
                 tolerance_pct=TOLERANCE_PCT, note=f"T({p}): " + wait_note(context(row, prof)),
                 split=ratio_split(base_s=one.get("step_time_p50_s"),
                                   compute_s=row.get("compute_time_p50_s"),
                                   step_s=row.get("step_time_p50_s"),
                                   names=("T(1)", f"compute({p}, f and g off)", f"T({p})")),
                 split_op="product")


def _against(measured: float, predicted: float, tolerance_pct: float = TOLERANCE_PCT) -> str:
    """'(+12%): within 25% of it' or '(+190%): more than 25% from it' (symmetric error)."""
    e = symmetric_error_pct(predicted, measured)
    e = -e  # the measurement against the prediction
    word = (f"within {tolerance_pct:g}% of it" if math.isfinite(e) and abs(e) <= tolerance_pct
            else f"more than {tolerance_pct:g}% from it")
    return f"({e:+.0f}%): {word}"


def inside_sentence(row, prof) -> str:
    """Where the time inside f's and g's all-reduces went, against the model's: the transfers
    and the scheduler waits counted in every timed step (or, for a row without their calls,
    in the median step: :func:`context`).

    >>> row = {"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...        "allreduce_calls_formula": 8, "predicted_compute_s": 0.054,
    ...        "step_time_p50_s": 0.0795, "allreduce_time_in_step_s": 0.026,
    ...        "allreduce_message_in_step_s": 0.0177, "allreduce_wait_in_step_s": 0.0083}
    >>> print(inside_sentence(row, FakeProfile()))
    time inside f's and g's all-reduces: 26.0 ms of a 79.5 ms step: the messages 17.7 ms, against 6.4 ms for 8 all-reduces at the profile's average in context (+177%): more than 25% from it; the wait for the later rank to enter 8.3 ms; mostly the messages.
    >>> tl = [{"rank": r, "name": f"g {i}", "cat": "all-reduce", "start_s": 0.01 * i,
    ...        "end_s": 0.01 * i + (4.4e-3 if i < 3 else 8e-4)} for r in (0, 1) for i in range(8)]
    >>> print(inside_sentence({**row, "timeline_s": tl}, FakeProfile()).split("; the wait")[0])
    time inside f's and g's all-reduces: 26.0 ms of a 79.5 ms step: the messages 17.7 ms, against 17.2 ms for 8 all-reduces: their transfers 6.4 ms and 3 scheduler waits counted in the median step, 10.8 ms (+3%): within 25% of it
    """
    msg, wait = _ms(row["allreduce_message_in_step_s"]), _ms(row["allreduce_wait_in_step_s"])
    ctx = context(row, prof)
    pred, every = _ms(ctx["inside_s"]), ctx["every"]
    n = int(row["allreduce_calls_formula"])
    most = "mostly the messages" if msg >= wait else "mostly the wait for the later rank"
    how = (f": their transfers {_ms(ctx['transfers_s']):.1f} ms and {every['per_step']:.1f} "
           f"scheduler waits a step (counted over the {every['steps']} timed steps), "
           f"{pred - _ms(ctx['transfers_s']):.1f} ms" if every else
           f": their transfers {_ms(ctx['transfers_s']):.1f} ms and {ctx['waits']['count']} "
           f"scheduler waits counted in the median step, {_ms(ctx['waits_s']):.1f} ms"
           if ctx["waits"] else " at the profile's average in context")
    return (f"time inside f's and g's all-reduces: {_ms(row['allreduce_time_in_step_s']):.1f} ms "
            f"of a {_ms(row['step_time_p50_s']):.1f} ms step: the messages {msg:.1f} ms, against "
            f"{pred:.1f} ms for {n} all-reduces{how} {_against(msg, pred)}; the wait for the "
            f"later rank to enter {wait:.1f} ms; {most}.")


def waits_sentence(row, prof) -> str:
    """How many of the row's collectives waited for the scheduler in its median step, and why
    (:func:`labkit.tp.waits.sentence`)."""
    ctx = context(row, prof)
    return waits.sentence(ctx["waits"], wait_s=ctx["scheduler_wait_s"], what="collectives",
                          step=row.get("timeline_step"))


def compute_sentence(one, row, prof) -> str:
    """The compute-only step on 1 and P ranks against the ideal P and against the model: each
    rank's share computed alone (the launches' rates) times the profile's co-run slowdown.

    >>> one = {"compute_time_p50_s": 0.0906, "predicted_compute_s": 0.09}
    >>> two = {"world_size": 2, "hidden": 256, "compute_time_p50_s": 0.0545,
    ...        "predicted_compute_s": 0.054}
    >>> print(compute_sentence(one, two, FakeProfile()))
    compute only (f and g off): 90.6 ms on one rank, 54.5 ms on 2: 1.66x, against the ideal 2x; the model (each rank's share alone x the co-run slowdown 1.25) 1.33x (+25%): within 25% of it.
    >>> compute_sentence(one, {**two, "compute_time_p50_s": 0.1}, FakeProfile()).split("1.25) ")[1]
    '1.33x (-47%): more than 25% from it.'
    """
    p = int(row["world_size"])
    got = one["compute_time_p50_s"] / row["compute_time_p50_s"]
    slow = prof.compute_slowdown(p)
    model = one["predicted_compute_s"] / (row["predicted_compute_s"] * slow)
    return (f"compute only (f and g off): {_ms(one['compute_time_p50_s']):.1f} ms on one rank, "
            f"{_ms(row['compute_time_p50_s']):.1f} ms on {p}: {got:.2f}x, against the ideal {p}x; "
            f"the model (each rank's share alone x the co-run slowdown {slow:.2f}) {model:.2f}x "
            f"{_against(got, model)}.")


def speedup_sentence(one, row, prof) -> str:
    """Whether TP paid here: the measured speedup, the model's, and the share of the ideal.

    >>> one = {"world_size": 1, "hidden": 256, "bytes_per_allreduce": 262144,
    ...        "allreduce_calls_formula": 0, "predicted_compute_s": 0.09, "step_time_p50_s": 0.0914}
    >>> two = {"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...        "allreduce_calls_formula": 8, "predicted_compute_s": 0.054,
    ...        "step_time_p50_s": 0.0795, "speedup_vs_1_rank": 1.15}
    >>> print(speedup_sentence(one, two, FakeProfile()))
    one rank (one core): 91.4 ms per step; TP on 2 ranks: 79.5 ms -> measured speedup 1.15 (predicted 1.22): TP pays here at h = 256, 57% of the ideal 2.
    >>> "does not pay" in speedup_sentence(one, {**two, "speedup_vs_1_rank": 0.9}, FakeProfile())
    True
    """
    p, s = int(row["world_size"]), float(row["speedup_vs_1_rank"])
    verdict = "pays" if s > 1 else "does not pay"
    return (f"one rank (one core): {_ms(one['step_time_p50_s']):.1f} ms per step; TP on {p} ranks: "
            f"{_ms(row['step_time_p50_s']):.1f} ms -> measured speedup {s:.2f} (predicted "
            f"{predicted_speedup(one, row, prof):.2f}): TP {verdict} here at h = "
            f"{int(row['hidden'])}, {s / p:.0%} of the ideal {p}.")


def pays_sentence(label: str, *, ranks: int, breakeven: float, at: dict) -> str:
    """One line of the projections: where TP starts to pay, and the speedup at given widths.

    >>> pays_sentence("H100s", ranks=8, breakeven=42, at={256: 2.34, 4096: 0.9})
    'H100s, P = 8: pays above h = 42; predicted speedup at h = 256: 2.34 (pays), at h = 4096: 0.90 (does not pay)'
    """
    parts = [f"{s:.2f} ({'pays' if s > 1 else 'does not pay'})" for s in at.values()]
    first, *rest = [f"at h = {h}: {t}" for h, t in zip(at, parts)]
    return (f"{label}, P = {ranks}: pays above h = {breakeven:,.0f}; predicted speedup {first}"
            + "".join(f", {t}" for t in rest))
