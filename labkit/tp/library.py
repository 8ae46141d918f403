"""The library's row of notebook 09 (DTensor's tensor parallelism): DTensor's own work, the
step model its laws and figures price it with, and what they say (pure: no torch).

DTensor runs the same 4 L all-reduces as the teaching version, at the same points of the step,
but inside the library, unstamped: the library's row holds no timeline of its collectives. Its
model prices them as the teaching version's are, each at its transfer, and adds the waits
the teaching version's steps counted, their mean over its timed steps, each at the profile's
pooled scheduler wait (:func:`borrowed_waits`; the teaching version's own step law counts its
median step's, the step it is judged on). Why: priced at the profile's average in context
(transfer + the idle sweep's share of waits) the library's step law missed in 5 of 12 lab
runs on the 2-vCPU VM, always short; with the teaching version's waits, in 1.
"""

from __future__ import annotations

import math

from labkit.book.laws import check
from labkit.tp import verdicts
from labkit.tp.fakeprofile import FakeProfile  # noqa: F401 - the examples' stand-in
from labkit.tp.verdicts import TOLERANCE_PCT, _ms, _number, context

#: what a teaching row shares with the library's row whose waits it lends (beside P)
SAME_SHAPE = ("hidden", "seq_len", "batch_size", "num_layers", "num_heads")


def borrowed_waits(naive, prof) -> float | None:
    """The waits a step of the teaching version counted (:func:`labkit.tp.verdicts.context`'s
    ``every``: its every timed step's collectives, their mean count a step; a row stored before
    it kept them: its median step's count), which the library's step model takes for its own;
    None without the teaching version's row at the same P or without its timeline.

    >>> naive = {"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...          "allreduce_calls_formula": 2, "predicted_compute_s": 0.054,
    ...          "step_times_s": [0.07, 0.07], "timeline_s": [
    ...              {"rank": 0, "name": "g 0", "cat": "all-reduce", "start_s": 0.0,
    ...               "end_s": 8e-4}],
    ...          "collective_calls_s": [{"cat": "all-reduce", "message_s": t}
    ...                                 for t in (8e-4, 4.4e-3, 8e-4, 8e-4)]}
    >>> borrowed_waits(naive, FakeProfile())  # one of the two steps' four calls waited
    0.5
    >>> borrowed_waits(None, FakeProfile()) is None
    True
    """
    if naive is None or int(naive["world_size"]) < 2:
        return None
    ctx = context(naive, prof)
    if ctx["every"]:
        return float(ctx["every"]["per_step"])
    return float(ctx["waits"]["count"]) if ctx["waits"] else None


def model_context(row, rows, prof, *, bookkeeping: float = math.nan) -> dict:
    """:func:`labkit.tp.verdicts.context` of any row of a run (``rows``: its DataFrame), as its
    laws price it: a library row with DTensor's own work (``bookkeeping``, its 1-rank
    fallback: :func:`bookkeeping_s`) and the teaching version's waits at the same P; the
    others as they are."""
    if row["variant"] != "library":
        return context(row, prof)
    same = rows[rows["variant"] == "naive"]
    for key in ("world_size", *SAME_SHAPE):
        if key in rows and key in row:
            same = same[same[key] == row[key]]
    return library_context(row, prof, naive=same.iloc[-1] if len(same) else None,
                           bookkeeping=bookkeeping)


def library_context(row, prof, *, naive=None, bookkeeping: float = math.nan) -> dict:
    """:func:`labkit.tp.verdicts.context` of the library's row: with DTensor's own work
    (:func:`own_work`; left out where neither it nor ``bookkeeping`` is measured) and the
    teaching version's waits a step (``naive``, its row at the same P: :func:`borrowed_waits`)."""
    extra = own_work(row, bookkeeping=bookkeeping)[0]
    return context(row, prof, extra_s=extra if math.isfinite(extra) else 0.0,
                   waits_per_step=borrowed_waits(naive, prof))


def wait_note(ctx: dict) -> str:
    """What the library's step model counted and priced for its collectives
    (:func:`labkit.tp.verdicts.context` with ``borrowed`` waits; without them,
    :func:`labkit.tp.verdicts.wait_note`).

    >>> print(wait_note({"waits": None, "borrowed": 2.2, "scheduler_wait_s": 4e-3,
    ...                  "allreduce_s": 3e-4}))  # doctest: +NORMALIZE_WHITESPACE
    the row holds no timeline of its collectives (DTensor's run inside the library,
    unstamped): the teaching version's waits, 2.2 a step (counted over its timed steps: the
    same 4 L all-reduces at the same points of the step), priced at the profile's 4.0 ms each;
    transfers the profile's, peers idle
    """
    if ctx.get("borrowed") is None:
        return verdicts.wait_note(ctx)
    return ("the row holds no timeline of its collectives (DTensor's run inside the library, "
            f"unstamped): the teaching version's waits, {ctx['borrowed']:.1f} a step (counted "
            "over its timed steps: the same 4 L all-reduces at the same points of the step), "
            f"priced at the profile's {_ms(ctx['scheduler_wait_s']):.1f} ms each; transfers "
            "the profile's, peers idle")


def bookkeeping_s(df) -> float:
    """What DTensor's bookkeeping costs a step, measured where nothing communicates: the
    library's 1-rank step less the teaching version's (NaN without both 1-rank rows).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"variant": ["naive", "library"], "world_size": [1, 1],
    ...                    "step_time_p50_s": [0.090, 0.120]})
    >>> round(bookkeeping_s(df), 3)
    0.03
    """
    one = df[df["world_size"] == 1]
    t = {v: one[one["variant"] == v]["step_time_p50_s"] for v in ("naive", "library")}
    if any(len(x) != 1 for x in t.values()):
        return math.nan
    return max(0.0, float(t["library"].iloc[0]) - float(t["naive"].iloc[0]))


def own_work(row, *, bookkeeping: float = math.nan) -> tuple[float, str]:
    """What DTensor adds to the library's step, in seconds, and where it was measured: the
    row's ``library_own_work_s`` (the library's step less the teaching version's, both on the
    row's P ranks at a small hidden size, in turns in the launch) where it has it, else
    ``bookkeeping`` (:func:`bookkeeping_s`, on 1 rank; NaN: not measured), which leaves out
    DTensor's collectives and their waits, work one rank never does.

    >>> own_work({"world_size": 2, "library_own_work_s": 0.031, "own_work_hidden_used": 16},
    ...          bookkeeping=0.018)
    (0.031, '2 ranks, h = 16')
    >>> own_work({"world_size": 2}, bookkeeping=0.018)
    (0.018, '1 rank')
    """
    got = _number(row, "library_own_work_s", math.nan)
    if math.isfinite(got):
        return got, (f"{int(row['world_size'])} ranks, "
                     f"h = {int(_number(row, 'own_work_hidden_used'))}")
    return float(bookkeeping), "1 rank"


def library_laws(row, prof, *, bookkeeping: float = math.nan, naive=None) -> list[dict]:
    """Section 2's laws for the library's row: the same counts, and the step with DTensor's
    own work (:func:`own_work`, ``bookkeeping`` its 1-rank fallback; left out when neither is
    known) added to the teaching version's model. ``naive``: the teaching
    version's row at the same P, whose step splits the library's and whose waits a step stand
    for the library's when given (:func:`borrowed_waits`). The library's collectives run
    inside DTensor, unstamped: its row holds no timeline (:func:`wait_note`)."""
    p = int(row["world_size"])
    pre = f"TP library, P = {p}"
    extra, where = own_work(row, bookkeeping=bookkeeping)
    known = math.isfinite(extra)
    ctx = library_context(row, prof, naive=naive, bookkeeping=bookkeeping)
    out = [check(f"{pre}: parameters per rank = L ((12 h^2 + 7 h)/P + 6 h)",
                 predicted=row["params_per_rank_formula"], measured=row["params_per_rank"],
                 tolerance_pct=0)]
    if p > 1:
        out += [check(f"{pre}: all-reduces per step = 4 L", predicted=row["allreduce_calls_formula"],
                      measured=row["allreduce_calls_measured"], tolerance_pct=0),
                check(f"{pre}: bytes all-reduced per step = 4 L b s h x 4 B",
                      predicted=row["comm_bytes_formula"], measured=row["comm_bytes_measured"],
                      unit="B", tolerance_pct=0)]
    split = None
    if p > 1 and naive is not None:
        same = _ms(naive["step_time_p50_s"])
        split = {"the teaching version's step": same,
                 "the library's own work": _ms(row["step_time_p50_s"]) - same}
    law = "step = F/R x slowdown + 4 L t_ar" + (
        (" + DTensor's bookkeeping (1 rank)" if where == "1 rank"
         else " + DTensor's own work (P ranks, small h)") if known else "")
    notes = ([f"DTensor's own work {_ms(extra):.1f} ms a step, measured on {where}"] if known
             else ["DTensor's bookkeeping not measured (no 1-rank run)"])
    if known and where != "1 rank" and math.isfinite(bookkeeping):
        notes.append(f"on 1 rank it was {_ms(bookkeeping):.1f} ms")
    notes += [wait_note(ctx)] if p > 1 else []
    out.append(check(f"{pre}: {law}", predicted=_ms(ctx["step_s"]),
                     measured=_ms(row["step_time_p50_s"]), unit="ms",
                     tolerance_pct=TOLERANCE_PCT, split=split, note="; ".join(notes)))
    return out


def library_sentence(library, naive, *, bookkeeping: float = math.nan) -> str:
    """The library's step against the teaching version's, faster or slower.

    >>> lib = {"world_size": 2, "step_time_p50_s": 0.108, "allreduce_calls_measured": 8,
    ...        "bytes_per_allreduce": 262144}
    >>> library_sentence(lib, {"step_time_p50_s": 0.091}, bookkeeping=0.03)
    "the library's step on 2 ranks takes 108.0 ms against the teaching version's 91.0 ms: 1.19x slower, the same 8 all-reduces of 262 kB (DTensor's bookkeeping, measured on 1 rank: 30.0 ms a step)."
    >>> library_sentence({**lib, "library_own_work_s": 0.033, "own_work_hidden_used": 16},
    ...                  {"step_time_p50_s": 0.091}, bookkeeping=0.03)[-66:]
    "(DTensor's own work, measured on 2 ranks, h = 16: 33.0 ms a step)."
    >>> library_sentence({**lib, "step_time_p50_s": 0.08}, {"step_time_p50_s": 0.091})[-47:]
    '1.14x faster, the same 8 all-reduces of 262 kB.'
    """
    a, b = _ms(library["step_time_p50_s"]), _ms(naive["step_time_p50_s"])
    if a > b:
        how = f"{a / b:.2f}x slower"
    elif a < b:
        how = f"{b / a:.2f}x faster"
    else:
        how = "as fast"
    extra, where = own_work(library, bookkeeping=bookkeeping)
    what = "bookkeeping" if where == "1 rank" else "own work"
    tail = (f" (DTensor's {what}, measured on {where}: {_ms(extra):.1f} ms a step)"
            if math.isfinite(extra) else "")
    return (f"the library's step on {int(library['world_size'])} ranks takes {a:.1f} ms against "
            f"the teaching version's {b:.1f} ms: {how}, the same "
            f"{int(library['allreduce_calls_measured'])} all-reduces of "
            f"{library['bytes_per_allreduce'] / 1e3:.0f} kB{tail}.")
