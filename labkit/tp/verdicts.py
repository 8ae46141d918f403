"""The tensor-parallel lab's laws and sentences, computed from a run's rows and this machine's
profile (pure: no torch).

The step model carries what the machine profile measured (:mod:`labkit.machine`): a rank's
compute measured alone in the launch (``predicted_compute_s``) times the profile's co-run
slowdown at P ranks, and each of f's and g's all-reduces priced by the profile's all-reduce
of that size in context (:func:`labkit.tp.formulas.step_in_context`). ``prof`` below is a
:class:`labkit.machine.Profile` or anything with its ``compute_slowdown(ranks, n=...)`` and
``allreduce_s(size_bytes, ranks=..., busy=...)``. A step-time law that misses prints its
measured split: the time outside the all-reduces, the messages, and the wait for the later rank
(:mod:`labkit.tp.timeline`); those three add up to the step.
"""

from __future__ import annotations

import math

from labkit.book.laws import check, symmetric_error_pct
from labkit.tp.formulas import step_in_context

#: the relative tolerance of every time and ratio law of the lab
TOLERANCE_PCT = 25.0
#: an all-gather or a reduce-scatter of S against an all-reduce of S, per backend: NCCL's ring
#: all-reduce is one of each; gloo reduce-scatters by all-reducing the whole buffer, and its
#: all-gather into one tensor costs about as much (the FSDP rows' collectives_time_alone_s);
#: the FSDP lab prices its collectives so too
GATHER_SCATTER = {"nccl": 0.5, "gloo": 1.0}


def _number(row, key: str, default: float = 0.0) -> float:
    """``row[key]`` as a number; ``default`` where the row lacks it (an older row) or holds NaN."""
    v = row.get(key) if hasattr(row, "get") else None
    return default if v is None or v != v else float(v)


def context(row, prof, *, extra_s: float = 0.0) -> dict:
    """The in-context prediction for one row: ``slowdown`` (the profile's co-run slowdown at the
    row's world size, at its hidden size as the matrix size), ``allreduce_s`` (one all-reduce
    of the row's activation, peers idle: in a TP step nothing computes while it runs),
    ``gather_s`` (one all-gather or reduce-scatter of it: :data:`GATHER_SCATTER` of an
    all-reduce, for sequence parallelism's) and :func:`~labkit.tp.formulas.step_in_context`'s
    ``compute_s``, ``comm_s``, ``step_s`` (``extra_s``: work measured apart, added as it is).

    >>> ctx = context({"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...                "allreduce_calls_formula": 8, "predicted_compute_s": 0.054}, FakeProfile())
    >>> ctx["slowdown"], round(ctx["step_s"] * 1e3, 1)
    (1.25, 73.9)
    """
    p = int(row["world_size"])
    slow = prof.compute_slowdown(p, n=int(row["hidden"])) if p > 1 else 1.0
    n_ar = int(row["allreduce_calls_formula"])
    each = float(row["bytes_per_allreduce"])
    ar_each = _number(row, "allreduce_bytes_formula", n_ar * each) / n_ar if n_ar else each
    gathers = int(_number(row, "allgather_calls_formula") + _number(row, "reduce_scatter_calls_formula"))
    part = GATHER_SCATTER.get(row.get("backend") or "gloo", 1.0) if hasattr(row, "get") else 1.0
    ar = prof.allreduce_s(ar_each, ranks=p, busy=False) if p > 1 else 0.0
    gs = part * prof.allreduce_s(each, ranks=p, busy=False) if p > 1 and gathers else 0.0
    return {"slowdown": slow, "allreduce_s": ar, "gather_s": gs,
            **step_in_context(compute_alone_s=row["predicted_compute_s"], slowdown=slow,
                              allreduces=n_ar, allreduce_s=ar, gathers=gathers, gather_s=gs,
                              extra_s=extra_s)}


class FakeProfile:
    """A stand-in machine profile for examples and tests: co-run slowdown ``slowdown`` at two
    ranks or more, every all-reduce ``allreduce_s`` (busy: ``busy_factor`` times that)."""

    def __init__(self, slowdown: float = 1.25, allreduce_s: float = 8e-4,
                 busy_factor: float = 1.5):
        self.slowdown, self.ar, self.busy_factor = slowdown, allreduce_s, busy_factor

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.slowdown

    def allreduce_s(self, size_bytes, *, ranks=None, busy=False):
        return self.ar * (self.busy_factor if busy else 1.0)

    def matmul_flop_per_s(self, n, *, together=False):
        """n x n products at 40 GFLOP/s x n / (n + 64), ``slowdown`` slower together."""
        return 40e9 * n / (n + 64) / (self.slowdown if together else 1.0)


def _ms(x: float) -> float:
    return float(x) * 1e3


def inside_split(row) -> dict:
    """The measured time inside f's and g's all-reduces (ms per step), as the law's split."""
    return {"messages": _ms(row["allreduce_message_in_step_s"]),
            "waiting for the later rank": _ms(row["allreduce_wait_in_step_s"])}


def step_split(row) -> dict:
    """The measured step (ms, p50) split into the time outside the all-reduces and the two parts
    of the time inside them (:func:`inside_split`); the terms add up to the step."""
    inside = _ms(row["allreduce_time_in_step_s"])
    return {"outside the all-reduces": _ms(row["step_time_p50_s"]) - inside, **inside_split(row)}


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
                 unit="ms", tolerance_pct=TOLERANCE_PCT,
                 note=f"F/R alone {_ms(row['predicted_compute_s']):.3g} ms x {ctx['slowdown']:.2f}")]
    split = None
    if p > 1:
        out += [check(f"{pre}: all-reduces per step = 4 L", predicted=row["allreduce_calls_formula"],
                      measured=row["allreduce_calls_measured"], tolerance_pct=0),
                check(f"{pre}: bytes all-reduced per step = 4 L b s h x 4 B",
                      predicted=row["comm_bytes_formula"], measured=row["comm_bytes_measured"],
                      unit="B", tolerance_pct=0),
                check(f"{pre}: time inside f's and g's all-reduces = 4 L t_ar (in context)",
                      predicted=_ms(ctx["comm_s"]), measured=_ms(row["allreduce_time_in_step_s"]),
                      unit="ms", tolerance_pct=TOLERANCE_PCT, split=inside_split(row))]
        split = step_split(row)
    out.append(check(f"{pre}: step = F/R x slowdown + 4 L t_ar", predicted=_ms(ctx["step_s"]),
                     measured=_ms(row["step_time_p50_s"]), unit="ms",
                     tolerance_pct=TOLERANCE_PCT, split=split))
    return out


def library_laws(row, prof, *, bookkeeping: float = math.nan, naive=None) -> list[dict]:
    """Section 2's laws for the library's row: the same counts, and the step with DTensor's
    bookkeeping (``bookkeeping``, :func:`bookkeeping_s`, seconds: the same operators' on one
    rank; left out when NaN) added to the teaching version's model. ``naive``: the teaching
    version's row at the same P, whose step splits the library's when given."""
    p = int(row["world_size"])
    pre = f"TP library, P = {p}"
    known = math.isfinite(bookkeeping)
    ctx = context(row, prof, extra_s=bookkeeping if known else 0.0)
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
    law = "step = F/R x slowdown + 4 L t_ar" + (" + DTensor's bookkeeping (1 rank)" if known
                                                else "")
    out.append(check(f"{pre}: {law}", predicted=_ms(ctx["step_s"]),
                     measured=_ms(row["step_time_p50_s"]), unit="ms",
                     tolerance_pct=TOLERANCE_PCT, split=split,
                     note="" if known else "DTensor's bookkeeping not measured (no 1-rank run)"))
    return out


def predicted_speedup(one, row, prof) -> float:
    """T(1) / T(P) of the teaching version, both from the in-context model."""
    return context(one, prof)["step_s"] / context(row, prof)["step_s"]


def speedup_law(one, row, prof) -> dict:
    """Section 3's law: the measured speedup of the teaching version against the model's."""
    p = int(row["world_size"])
    return check(f"TP speedup T(1)/T({p}) at h = {int(row['hidden'])}",
                 predicted=predicted_speedup(one, row, prof), measured=row["speedup_vs_1_rank"],
                 tolerance_pct=TOLERANCE_PCT)


def _against(measured: float, predicted: float, tolerance_pct: float = TOLERANCE_PCT) -> str:
    """'(+12%): within 25% of it' or '(+190%): more than 25% from it' (symmetric error)."""
    e = symmetric_error_pct(predicted, measured)
    e = -e  # the measurement against the prediction
    word = (f"within {tolerance_pct:g}% of it" if math.isfinite(e) and abs(e) <= tolerance_pct
            else f"more than {tolerance_pct:g}% from it")
    return f"({e:+.0f}%): {word}"


def inside_sentence(row, prof) -> str:
    """Where the time inside f's and g's all-reduces went, against the profile's all-reduce.

    >>> row = {"world_size": 2, "hidden": 256, "bytes_per_allreduce": 262144,
    ...        "allreduce_calls_formula": 8, "predicted_compute_s": 0.054,
    ...        "step_time_p50_s": 0.0795, "allreduce_time_in_step_s": 0.026,
    ...        "allreduce_message_in_step_s": 0.0177, "allreduce_wait_in_step_s": 0.0083}
    >>> print(inside_sentence(row, FakeProfile()))
    time inside f's and g's all-reduces: 26.0 ms of a 79.5 ms step: the messages 17.7 ms, against 6.4 ms for 8 all-reduces in context on the machine profile (+177%): more than 25% from it; the wait for the later rank to enter 8.3 ms; mostly the messages.
    """
    msg, wait = _ms(row["allreduce_message_in_step_s"]), _ms(row["allreduce_wait_in_step_s"])
    pred = _ms(context(row, prof)["comm_s"])
    n = int(row["allreduce_calls_formula"])
    most = "mostly the messages" if msg >= wait else "mostly the wait for the later rank"
    return (f"time inside f's and g's all-reduces: {_ms(row['allreduce_time_in_step_s']):.1f} ms "
            f"of a {_ms(row['step_time_p50_s']):.1f} ms step: the messages {msg:.1f} ms, against "
            f"{pred:.1f} ms for {n} all-reduces in context on the machine profile "
            f"{_against(msg, pred)}; the wait for the later rank to enter {wait:.1f} ms; {most}.")


def library_sentence(library, naive, *, bookkeeping: float = math.nan) -> str:
    """The library's step against the teaching version's, faster or slower.

    >>> lib = {"world_size": 2, "step_time_p50_s": 0.108, "allreduce_calls_measured": 8,
    ...        "bytes_per_allreduce": 262144}
    >>> library_sentence(lib, {"step_time_p50_s": 0.091}, bookkeeping=0.03)
    "the library's step on 2 ranks takes 108.0 ms against the teaching version's 91.0 ms: 1.19x slower, the same 8 all-reduces of 262 kB (DTensor's bookkeeping, measured on 1 rank: 30.0 ms a step)."
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
    tail = (f" (DTensor's bookkeeping, measured on 1 rank: {_ms(bookkeeping):.1f} ms a step)"
            if math.isfinite(bookkeeping) else "")
    return (f"the library's step on {int(library['world_size'])} ranks takes {a:.1f} ms against "
            f"the teaching version's {b:.1f} ms: {how}, the same "
            f"{int(library['allreduce_calls_measured'])} all-reduces of "
            f"{library['bytes_per_allreduce'] / 1e3:.0f} kB{tail}.")


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
    slow = prof.compute_slowdown(p, n=int(row["hidden"]))
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


# ---------------------------------------------------------------- compute rates

def rate_rows(one, row, prof) -> list[dict]:
    """Each TP rank's compute rate measured (one rank's FLOPs per step over its median step
    with f and g off) beside the profile's matrix-product rate at the sizes of its products
    (:func:`labkit.tp.formulas.products_rate`: alone for the 1-rank run and for the launch's
    share of a layer timed alone, with every rank at it at once for the ranks of a
    ``world_size`` launch). ``one``: the 1-rank row; ``row``: a row at P > 1."""
    from labkit.tp.formulas import flops_per_rank, layer_products, products_rate

    kw = {k: int(row[k]) for k in ("batch_size", "seq_len", "hidden", "num_heads")}
    p, L = int(row["world_size"]), int(row["num_layers"])
    flops = {n: flops_per_rank(**{k: v for k, v in kw.items() if k != "num_heads"},
                               num_layers=L, world_size=n) for n in (1, p)}

    def profile(n, together):
        return products_rate(layer_products(**kw, world_size=n),
                             lambda cube: prof.matmul_flop_per_s(cube, together=together))

    cases = [("1 rank: the whole model, f and g off, alone", 1, False,
              flops[1] / float(one["compute_time_p50_s"]))]
    cases += [(f"rank {r} of {p}: its share, f and g off, {p} ranks at once", p, True,
               flops[p] / float(t)) for r, t in enumerate(row["compute_time_rank_p50_s"])]
    cases.append((f"a rank of {p}: its share of one layer, alone (the launch's rate)", p, False,
                  float(row["compute_flop_per_s"])))
    out = []
    for what, n, together, rate in cases:
        prod = profile(n, together)
        out.append({"what": what, "ranks": n, "together": together, "matrix_n": prod["n"],
                    "measured_flop_per_s": rate, "profile_flop_per_s": prod["flop_per_s"],
                    "measured_over_profile": rate / prod["flop_per_s"]})
    return out



def rate_sentence(one, row, prof) -> str:
    """Whether a rank's share of the matrix products ran in less than its share of the time,
    measured (:func:`rate_rows`: each rank's FLOPs over its median step with f and g off),
    against what the profile's matrix products at those sizes say.

    >>> one = {"world_size": 1, "batch_size": 8, "seq_len": 32, "hidden": 256, "num_heads": 8,
    ...        "num_layers": 2, "compute_time_p50_s": 0.09, "compute_flop_per_s": 3e10}
    >>> two = {**one, "world_size": 2, "compute_time_rank_p50_s": [0.04, 0.042],
    ...        "compute_flop_per_s": 3.2e10}
    >>> print(rate_sentence(one, two, FakeProfile()))
    a rank's half of the products (n = 278 against 350 for the whole) ran at 30.8 and 29.4 GFLOP/s, the whole model on one rank at 27.4 GFLOP/s: the slower rank took 0.47 of the whole's time, below 1/2 (its rate 1.07x the whole's); the profile's products at these sizes, 2 ranks at once against one alone, predict 0.65 of the time (their rate 0.77x): the layer's other work runs the products at 0.84x and 1.17x of the profile's rate.
    """
    rows = rate_rows(one, row, prof)
    p = int(row["world_size"])
    whole, ranks = rows[0], rows[1:1 + p]
    slow = min(ranks, key=lambda r: r["measured_flop_per_s"])
    ratio = whole["measured_flop_per_s"] / slow["measured_flop_per_s"] / p
    model = whole["profile_flop_per_s"] / slow["profile_flop_per_s"] / p
    rates = " and ".join(f"{r['measured_flop_per_s'] / 1e9:.1f}" for r in ranks)
    where = "below" if ratio < 1 / p else "above" if ratio > 1 / p else "exactly"
    share = "half" if p == 2 else f"1/{p}"
    return (f"a rank's {share} of the products (n = {slow['matrix_n']:.0f} against "
            f"{whole['matrix_n']:.0f} for the whole) ran at {rates} GFLOP/s, the whole model on "
            f"one rank at {whole['measured_flop_per_s'] / 1e9:.1f} GFLOP/s: the slower rank took "
            f"{ratio:.2f} of the whole's time, {where} 1/{p} (its rate "
            f"{slow['measured_flop_per_s'] / whole['measured_flop_per_s']:.2f}x the whole's); "
            f"the profile's products at these sizes, {p} ranks at once against one alone, "
            f"predict {model:.2f} of the time (their rate "
            f"{slow['profile_flop_per_s'] / whole['profile_flop_per_s']:.2f}x): the layer's "
            f"other work runs the products at {whole['measured_over_profile']:.2f}x and "
            f"{slow['measured_over_profile']:.2f}x of the profile's rate.")
