"""The expert-parallel lab's laws and sentences, computed from a run's rows and this machine's
profile (pure: no torch).

The step model (:func:`context`) prices each phase from the machine profile
(:mod:`labkit.machine`) and, where the launch timed them, the phases' local work alone (a
separate pass after the timed steps), never from the timed steps themselves:

* **expert compute**: where the launch timed each phase's local work on each rank alone
  (``{phase}_local_alone_s``: the all-to-alls the identity, the ranks in turn), the experts'
  time alone, scaled from the rows each rank routed itself to the rows the busiest rank
  computes in the step, times the profile's co-run slowdown of its miniature training step
  (every lab's step model takes it so); else the FLOPs of the busiest rank's experts (12 rows
  h f) at the rate of that miniature step measured alone (a two-layer MLP forward and
  backward: matrix products with the elementwise work and autograd's traffic around them),
  times the same slowdown (on the 2-vCPU VM the experts alone took 15-20 % longer than their
  FLOPs at that rate: the step law's note prints both);
* **routing**: where timed alone, the routing's time alone times the same slowdown: a router
  of a few MFLOP is a dozen small torch calls (softmax, top-k, the capacity mask, the
  gathers) whose cost its FLOPs do not show; else the router's FLOPs (6 T h E) at the
  profile's n x n product rate at its size, times the slowdown;
* **the permutations**: the dispatch's and the combine's local work alone (the split sizes'
  bookkeeping; the gate-weighted sum and its backward), times the slowdown, where timed;
* **all-to-all**: from the profile's **message** sweep (one-way point-to-point, peers idle: in
  an MoE step nothing computes while the rows travel): the exchanges with the P − 1 peers one
  after another, each one message of the larger direction's bytes
  (:func:`labkit.moe.formulas.alltoall_s`), for the rank that waits the longest, at its
  **transfer** (a message that waited for nothing); dispatch and combine each run twice a step
  (forward, and their gradients backward), the dispatch also exchanges the split sizes (one
  small message per peer);
* **scheduler waits**: a message also waits, now and then, for the scheduler to give one of
  gloo's threads a core (about a tick here); how often changes from second to second, so the
  waits are **counted** in the row's own median step (its all-to-alls' timeline,
  :mod:`labkit.moe.waits`) and each is priced at the profile's ``scheduler_wait_s``, in the
  phase whose all-to-all waited.

``prof`` below is a :class:`labkit.machine.Profile` or anything with its ``step_flop_per_s()``,
``matmul_flop_per_s(n)``, ``compute_slowdown(ranks)``, ``transfer_s(size_bytes,
measurement=...)`` and ``scheduler_wait_s``. The step law's split is the measured phases of the
slowest rank, what the counted waits took apart; they add up to its step.
"""

from __future__ import annotations

from labkit.book.laws import check, given, symmetric_error_pct
from labkit.moe import formulas, waits
from labkit.moe.formulas import PHASES

#: the relative tolerance of every time law of the lab
TOLERANCE_PCT = 25.0


def _ms(x: float) -> float:
    return float(x) * 1e3


class FakeProfile:
    """A stand-in machine profile for examples and tests: every product at ``flop_per_s``
    alone, ``slowdown`` with two ranks or more, a message's transfer ``alpha_s`` + bytes /
    ``bytes_per_s``, a scheduler wait ``wait_s``.
    """

    def __init__(self, flop_per_s: float = 3e10, slowdown: float = 1.25, alpha_s: float = 1e-4,
                 bytes_per_s: float = 1e9, wait_s: float = 3.6e-3):
        self.rate, self.slowdown = flop_per_s, slowdown
        self.alpha_s, self.bytes_per_s = alpha_s, bytes_per_s
        self.scheduler_wait_s = wait_s

    def matmul_flop_per_s(self, n, *, together=False):
        return self.rate / (self.slowdown if together else 1.0)

    def step_flop_per_s(self, *, together=False, batch=None):
        return self.matmul_flop_per_s(0, together=together)

    def compute_slowdown(self, ranks, *, n=None):
        return 1.0 if ranks == 1 else self.slowdown

    def transfer_s(self, size_bytes, *, measurement="allreduce", busy=False):
        return self.alpha_s + size_bytes / self.bytes_per_s


def context(row, prof) -> dict:
    """The model's phases and step (seconds) for one row:
    :func:`labkit.moe.formulas.step_model`'s ``routing``, ``dispatch``, ``experts``,
    ``combine``, ``step`` (the dispatch and the combine each with the scheduler waits counted
    in their all-to-alls, and their local work alone where the row has it), and what it used:
    ``slowdown``, ``local`` (the phases' local work alone, s; {} where not timed),
    ``alltoall_s`` (one all-to-all of
    rows, its transfer), ``counts_s`` (the split sizes' transfer), ``scheduler_wait_s`` (the
    profile's, one wait), ``waits`` (:func:`labkit.moe.waits.count` of the row's timeline:
    None where it has none, and the model then prices transfers only) and ``waits_s`` (what
    the counted waits add).

    >>> row = {"world_size": 2, "num_experts": 4, "hidden": 128, "ffn": 512,
    ...        "tokens_per_rank": 256, "kept_by_rank": [[160, 100, 90, 120], [110, 130, 90, 120]]}
    >>> ctx = context(row, FakeProfile())
    >>> round(ctx["experts"] * 1e3, 2), round(ctx["alltoall_s"] * 1e3, 3), round(ctx["step"] * 1e3, 2)
    (16.38, 0.223, 17.41)

    The same row with its all-to-alls' timeline, the combine's backward 4 ms long: one wait,
    3.6 ms more in the combine.

    >>> tl = [{"rank": r, "call": i, "tag": tag, "start_s": 0.01 * i, "end_s": 0.01 * i + d}
    ...       for r in (0, 1) for i, (tag, d) in enumerate(
    ...           [("counts", 1e-4), ("dispatch", 2e-4), ("combine", 2e-4),
    ...            ("combine_grad", 4e-3), ("dispatch_grad", 2e-4)])]
    >>> ctx = context({**row, "a2a_timeline_s": tl}, FakeProfile())
    >>> ctx["waits"]["count"], round(ctx["waits_s"] * 1e3, 1), round(ctx["step"] * 1e3, 2)
    (1, 3.6, 21.01)

    With the experts timed alone (20 ms for the 470 rows the busier rank routed itself), the
    busiest rank's 500 rows in the step take 20 x 500 / 470 x 1.25 = 26.60 ms; their FLOPs at
    the profile's rate would say 16.38.

    >>> ctx = context({**row, "experts_local_alone_s": 0.02}, FakeProfile())
    >>> round(ctx["experts"] * 1e3, 2), round(ctx["expert_flops_s"] * 1e3, 2)
    (26.6, 16.38)
    """
    p, e = int(row["world_size"]), int(row["num_experts"])
    h, f, t = int(row["hidden"]), int(row["ffn"]), int(row["tokens_per_rank"])
    kept = [list(map(int, r)) for r in row["kept_by_rank"]]
    between = formulas.rows_between(kept, world_size=p)
    rows = max(sum(between[s][d] for s in range(p)) for d in range(p))
    per_expert = max(1, rows // (e // p))
    slow = prof.compute_slowdown(p) if p > 1 else 1.0
    flops_s = (formulas.expert_flops(rows=rows, hidden=h, ffn=f)
               / prof.step_flop_per_s(batch=per_expert) * slow)
    n_router = formulas.matmul_size(rows=t, hidden=h, ffn=e)
    local = {ph: float(row[f"{ph}_local_alone_s"]) for ph in PHASES
             if given(row.get(f"{ph}_local_alone_s"))}
    # alone, each rank's experts computed the rows it routed itself; in the step, the busiest
    # rank computes the rows every rank sent it: the time alone scales by their ratio
    own = max(sum(r) for r in kept)
    expert_s = (local["experts"] * rows / own * slow if "experts" in local and own > 0
                else flops_s)
    routing_s = (local["routing"] * slow if "routing" in local else
                 formulas.router_flops(tokens=t, hidden=h, num_experts=e)
                 / prof.matmul_flop_per_s(n_router) * slow)
    a2a = counts = wait = 0.0
    got = None
    if p > 1:
        row_bytes = h * formulas.BYTES_PER_VALUE

        def transfer(size):  # one way, the peers idle: nothing computes while rows travel
            return prof.transfer_s(size, measurement="message")

        a2a = max(formulas.alltoall_s([max(between[r][d], between[d][r]) * row_bytes
                                       for d in range(p) if d != r], transfer)
                  for r in range(p))
        counts = formulas.alltoall_s([8 * (e // p)] * (p - 1), transfer)
        wait = float(prof.scheduler_wait_s)
        got = waits.count(_timeline(row), transfers={"counts": counts, "rows": a2a})
    n = got["waited"] if got else {"dispatch": 0, "combine": 0}
    model = formulas.step_model(
        routing_s=routing_s, expert_s=expert_s,
        dispatch_s=2 * a2a + counts + n["dispatch"] * wait + local.get("dispatch", 0.0) * slow,
        combine_s=2 * a2a + n["combine"] * wait + local.get("combine", 0.0) * slow)
    return {**model, "slowdown": slow, "local": local, "expert_flops_s": flops_s,
            "alltoall_s": a2a, "counts_s": counts,
            "scheduler_wait_s": wait, "waits": got,
            "waits_s": (n["dispatch"] + n["combine"]) * wait}


def _timeline(row):
    """The row's all-to-alls' timeline (a list), or None (none, or NaN in a DataFrame)."""
    tl = row.get("a2a_timeline_s") if hasattr(row, "get") else None
    return tl if isinstance(tl, list) else None


#: the split's term for what the counted scheduler waits took of the measured step
WAITS_TERM = "scheduler waits (counted)"


def measured_split(row, ctx: dict | None = None) -> dict:
    """The measured step's four phases (ms, p50, the slowest rank's), for the step law; with
    the model's ``ctx`` (:func:`context`) that counted scheduler waits, what those took of the
    median step (measured, beyond their transfers) apart from the dispatch and the combine
    (:data:`WAITS_TERM`): the terms still add up to the phases.

    >>> row = {"routing_time_s": 0.001, "dispatch_time_s": 0.002, "experts_time_s": 0.01,
    ...        "combine_time_s": 0.005}
    >>> measured_split(row, {"waits": {"count": 1, "excess_s": {"dispatch": 0.0,
    ...                                                          "combine": 0.0038}}})
    {'routing': 1.0, 'dispatch': 2.0, 'experts': 10.0, 'combine': 1.2, 'scheduler waits (counted)': 3.8}
    """
    out = {ph: _ms(row[f"{ph}_time_s"]) for ph in PHASES}
    got = (ctx or {}).get("waits")
    if not got or not got["count"]:
        return out
    total = 0.0
    for ph, excess in got["excess_s"].items():
        part = min(_ms(excess), out[ph])  # the median step's waits, within the p50 phase
        out[ph] = round(out[ph] - part, 12)
        total += part
    return {**out, WAITS_TERM: total}


def waits_note(ctx: dict) -> str:
    """What the step model counted and priced for the all-to-alls, in one sentence.

    >>> waits_note({"waits": {"calls": 5, "count": 2}, "scheduler_wait_s": 3.6e-3})
    "2 of 5 all-to-alls waited for the scheduler in the median step (counted from its timeline), priced at the profile's 3.6 ms each; transfers from the profile's message sweep"
    >>> waits_note({"waits": None, "scheduler_wait_s": 3.6e-3})
    "no all-to-all's wait was counted (the row holds no timeline of them): transfers from the profile's message sweep only"
    """
    from labkit.tp.waits import note

    return note(ctx["waits"], wait_s=ctx["scheduler_wait_s"], what="all-to-alls",
                transfers="from the profile's message sweep",
                fallback="no all-to-all's wait was counted (the row holds no timeline of them): "
                         "transfers from the profile's message sweep only")


def local_note(ctx: dict) -> str:
    """What the model took for the phases' local work, timed alone (empty where not timed).

    >>> local_note({"local": {"routing": 1.0e-3, "dispatch": 0.2e-3, "experts": 9e-3,
    ...                       "combine": 1.1e-3}, "slowdown": 1.1, "expert_flops_s": 8e-3})
    "local work alone (the all-to-alls the identity): routing 1.00, dispatch 0.20, experts 9.00, combine 1.10 ms, each x the slowdown 1.10 (the experts' FLOPs at the profile's training-step rate, x the slowdown: 8.00 ms)"
    """
    local = ctx.get("local") or {}
    if not local:
        return ""
    parts = ", ".join(f"{ph} {local[ph] * 1e3:.2f}" for ph in PHASES if ph in local)
    flops = ctx.get("expert_flops_s")
    return (f"local work alone (the all-to-alls the identity): {parts} ms, each x the slowdown "
            f"{ctx['slowdown']:.2f}"
            + (f" (the experts' FLOPs at the profile's training-step rate, x the slowdown: "
               f"{flops * 1e3:.2f} ms)" if "experts" in local and flops else ""))


def laws(row, prof) -> list[dict]:
    """The laws of one row: at P > 1 the all-to-alls counted and the bytes each one sent
    (every rank's, exact) against the routing drawn; then the step against the model, with
    the measured phases as its split."""
    p = int(row["world_size"])
    pre = f"MoE, P = {p}"
    out = []
    if p > 1:
        measured = [b for r in row["a2a_bytes_by_call_measured"] for b in r]
        formula = [b for r in row["a2a_bytes_by_call_formula"] for b in r]
        exact = len(measured) == len(formula) and all(a == b for a, b in zip(measured, formula))
        out += [check(f"{pre}: all-to-alls of rows per step = 4",
                      predicted=row["a2a_calls_formula"], measured=row["a2a_calls_measured"],
                      tolerance_pct=0),
                check(f"{pre}: bytes sent per step = kept pairs elsewhere x h x 4 B, both ways, "
                      "forward and backward", predicted=row["a2a_bytes_formula"],
                      measured=row["a2a_bytes_measured"], unit="B", tolerance_pct=0,
                      mechanism_observed=exact,
                      mechanism="every all-to-all of every rank equal to its formula")]
    ctx = context(row, prof)
    out.append(check(f"{pre}: step = routing + 2 dispatches + busiest rank's experts x slowdown "
                     "+ 2 combines", predicted=_ms(ctx["step"]),
                     measured=_ms(row["step_time_p50_s"]), unit="ms",
                     tolerance_pct=TOLERANCE_PCT, split=measured_split(row, ctx),
                     note="; ".join(x for x in (waits_note(ctx) if p > 1 else "",
                                               local_note(ctx)) if x)))
    return out


def load_sentence(row) -> str:
    """The load the routing drew: per expert and per rank, and what the capacity dropped.

    >>> row = {"world_size": 2, "expert_load_routed": [140, 118, 130, 124], "top_k": 2,
    ...        "tokens_per_rank": 128, "expert_imbalance": 1.09, "rank_load_rows": [250, 254],
    ...        "rank_imbalance": 1.008, "tokens_dropped": 8, "dropped_fraction": 8 / 512,
    ...        "capacity": 80, "capacity_factor": 1.25}
    >>> print(load_sentence(row))
    the router sent 512 (token, expert) pairs: 118 to 140 per expert (max/mean 1.09), 250 and 254 rows per rank (max/mean 1.01); the capacity (80 pairs per expert from each rank, factor 1.25) dropped 8 of them (1.6%).
    """
    load = row["expert_load_routed"]
    ranks = [int(x) for x in row["rank_load_rows"]]
    per_rank = (" and ".join(map(str, ranks)) if len(ranks) <= 2
                else f"{min(ranks)} to {max(ranks)}")
    return (f"the router sent {sum(load)} (token, expert) pairs: {min(load)} to {max(load)} per "
            f"expert (max/mean {row['expert_imbalance']:.2f}), {per_rank} rows per rank "
            f"(max/mean {row['rank_imbalance']:.2f}); the capacity ({int(row['capacity'])} pairs "
            f"per expert from each rank, factor {row['capacity_factor']:g}) dropped "
            f"{int(row['tokens_dropped'])} of them ({row['dropped_fraction']:.1%}).")


def bytes_sentence(row) -> str:
    """The bytes the all-to-alls sent, counted, against the routing's formula and an even
    routing's.

    >>> print(bytes_sentence({"world_size": 2, "a2a_bytes_measured": 520192,
    ...                       "a2a_bytes_formula": 520192, "a2a_bytes_uniform": 524288}))
    the 2 ranks' all-to-alls sent 520.2 kB per step, counted on the collective: the routing's formula gives 520.2 kB (equal); an even routing without drops would send 524.3 kB.
    """
    got, want = row["a2a_bytes_measured"], row["a2a_bytes_formula"]
    same = "equal" if got == want else f"{got - want:+,.0f} bytes off"
    return (f"the {int(row['world_size'])} ranks' all-to-alls sent {got / 1e3:.1f} kB per step, "
            f"counted on the collective: the routing's formula gives {want / 1e3:.1f} kB "
            f"({same}); an even routing without drops would send "
            f"{row['a2a_bytes_uniform'] / 1e3:.1f} kB.")


def step_sentence(row, prof) -> str:
    """Where the step went, measured, beside the model's phases.

    >>> row = {"world_size": 2, "num_experts": 4, "hidden": 128, "ffn": 512,
    ...        "tokens_per_rank": 256, "kept_by_rank": [[160, 100, 90, 120], [110, 130, 90, 120]],
    ...        "step_time_p50_s": 0.0205, "routing_time_s": 0.001, "dispatch_time_s": 0.001,
    ...        "experts_time_s": 0.017, "combine_time_s": 0.0015}
    >>> print(step_sentence(row, FakeProfile()))
    step on 2 ranks: 20.5 ms measured (routing 1.0, dispatch 1.0, experts 17.0, combine 1.5 ms on the slowest rank); the model 17.4 ms (routing 0.0, dispatch 0.5, experts 16.4, combine 0.4 ms): -18%, within 25%.
    """
    ctx = context(row, prof)
    got = ", ".join(f"{ph} {_ms(row[f'{ph}_time_s']):.1f}" for ph in PHASES)
    model = ", ".join(f"{ph} {_ms(ctx[ph]):.1f}" for ph in PHASES)
    err = symmetric_error_pct(ctx["step"], row["step_time_p50_s"])
    word = "within" if abs(err) <= TOLERANCE_PCT else "more than"
    return (f"step on {int(row['world_size'])} ranks: {_ms(row['step_time_p50_s']):.1f} ms "
            f"measured ({got} ms on the slowest rank); the model {_ms(ctx['step']):.1f} ms "
            f"({model} ms): {err:+.0f}%, {word} {TOLERANCE_PCT:g}%.")


def waits_sentence(row, prof) -> str:
    """How many all-to-alls of the median step waited for the scheduler, why, and what that
    adds to the model and took of the measured step; or that none waited.

    >>> tl = [{"rank": r, "call": i, "tag": tag, "start_s": 0.01 * i, "end_s": 0.01 * i + d}
    ...       for r in (0, 1) for i, (tag, d) in enumerate(
    ...           [("counts", 1e-4), ("dispatch", 2e-4), ("combine", 2e-4),
    ...            ("combine_grad", 4e-3), ("dispatch_grad", 2e-4)])]
    >>> row = {"world_size": 2, "num_experts": 4, "hidden": 128, "ffn": 512,
    ...        "tokens_per_rank": 256, "kept_by_rank": [[160, 100, 90, 120], [110, 130, 90, 120]],
    ...        "a2a_timeline_s": tl}
    >>> print(waits_sentence(row, FakeProfile()))
    on 2 ranks, 1 of the median step's 5 all-to-alls waited for the scheduler (counted from its timeline: longer than its transfer + max(1.5 ms, transfer / 4)): a message whose receiver's core is busy waits for the scheduler's next turn (the profile's 3.6 ms a wait). The model adds 3.6 ms for it; it took 3.8 ms of the measured step beyond its transfer.
    >>> print(waits_sentence({**row, "a2a_timeline_s": tl[:3] + tl[4:8] + tl[9:]}, FakeProfile()))
    on 2 ranks, none of the median step's 4 all-to-alls waited for the scheduler (each ended within its transfer + max(1.5 ms, transfer / 4), counted from its timeline): the model prices their transfers only.
    """
    from labkit.machine.formulas import WAIT_RULE

    p = int(row["world_size"])
    head = f"on {p} rank{'s' if p != 1 else ''}, "
    if p < 2:
        return head + "no all-to-all moves anything: nothing waited for the scheduler."
    ctx = context(row, prof)
    got = ctx["waits"]
    rule = f"its {WAIT_RULE}"
    if not got:
        return head + ("the row holds no timeline of its all-to-alls, so no wait for the "
                       "scheduler was counted: the model prices their transfers only.")
    if not got["count"]:
        return head + (f"none of the median step's {got['calls']} all-to-alls waited for the "
                       f"scheduler (each ended within {rule}, counted from its timeline): the "
                       "model prices their transfers only.")
    k = got["count"]
    them, it = ("it", "it") if k == 1 else ("them", "they")
    took = _ms(sum(got["excess_s"].values()))
    return head + (f"{k} of the median step's {got['calls']} all-to-alls waited for the "
                   f"scheduler (counted from its timeline: longer than {rule}): a message "
                   "whose receiver's core is busy waits for the scheduler's next turn (the "
                   f"profile's {_ms(ctx['scheduler_wait_s']):.1f} ms a wait). The model adds {_ms(ctx['waits_s']):.1f} ms for {them}; {it} took "
                   f"{took:.1f} ms of the measured step beyond {'its' if k == 1 else 'their'} "
                   "transfer" + ("." if k == 1 else "s."))
