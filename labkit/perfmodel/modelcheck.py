"""The 3-D model against this machine: its formulas, carrying this run's machine profile, beside
collectives and pipeline rows measured now (pure: no torch). ``labkit model-check`` and
notebook 08 section 11.

A prediction on this machine uses this machine's profile of this run (:mod:`labkit.machine`),
never ``data/local.yaml`` (a reference VM, another machine). Any object with the profile's
attributes and methods will do (``alpha_s``, ``beta_bytes_per_s``, ``transfer_s``,
``scheduler_wait_s``, ``wait_share``, ``compute_slowdown``, ``step_flop_per_s``): the formulas
below take plain numbers.

* a collective of ``S`` bytes on ``N`` ranks: a call moves at its transfer's pace or also
  waits for the scheduler (:func:`labkit.machine.formulas.waits`), and how often changes from
  second to second, so the transfers are compared: the profile's all-reduce transfer at that
  size (its sweep's transfers, the peer idle) against the calls' transfer, with
  the calls' median, mean and share that waited beside them; the α–β ring law with the
  profile's α, β fitted to its transfers (:func:`labkit.collectives.formulas.collective_time`)::

      t = 2(N−1)·α + 2(N−1)/N·S/β

* pipeline steps whose rows all hold their timelines (rows of this lab's pipeline worker):
  notebook 07's step model, a replay of each row's blocks (:mod:`labkit.perfmodel.replay`),
  its bubble share read off the replayed step; the closed form below stays in each step
  law's note (its terms in the step row's ``model_*`` columns) and prices every row of a
  table where any row lacks those timelines;
* the closed form: a pipeline step of ``layers`` × Linear(h, h) over P stages, batch B, M
  microbatches, v chunks (:func:`pipeline_terms`)::

      T = T_stage + (P−1)/(v·M)·T_stage + T_fixed + 2·v·M·(t_transfer(h) − t_transfer(w)),
      T_stage = 6·(L/P)·h²·B / rate

  with ``rate`` the profile's training-step rate measured alone at the microbatch's B/M rows
  (small products run slower) divided by the co-run slowdown of P ranks computing at once; or,
  where the launch timed a microbatch's blocks on each rank alone (the row's
  ``block_alone_s``, less ``fixed_block_alone_s`` at width w), T_stage = M·t_block × the
  co-run slowdown; ``T_fixed`` the same step timed in the same launch at a width w where the
  arithmetic is almost nothing (the row's ``fixed_step_s``: each block's overhead, each hop,
  the scheduler's turns, what the arithmetic and the bytes leave out), and ``t_transfer`` the
  one-way transfer of one microbatch's activations ((B/M)·h·4 bytes) with the cores busy (a
  message that waited for nothing), less that of width w's, which T_fixed holds. A row timed
  without a fixed step: ``T_fixed`` 0, every message's whole transfer, and a scheduler wait
  ``t_wait`` (the profile's, about a tick) for each of the ``n_waited`` messages of the row's
  median step that waited (counted from its timeline:
  :func:`labkit.pipeline.messages.row_waits`);
* the bubble fraction (P−1)/(v·M+P−1) beside the fill and drain idle read off the timeline.

Errors are symmetric (:func:`labkit.book.laws.symmetric_error_pct`). The laws' notes and the
sentence on the messages and calls that waited: :mod:`labkit.perfmodel.checknotes`.
"""

from __future__ import annotations

import math
import statistics

from labkit.book import laws
from labkit.collectives import formulas as collectives
from labkit.errors import UsageError
from labkit.machine import formulas as machine_formulas
from labkit.perfmodel import replay as replay_model
from labkit.perfmodel.checknotes import check_laws  # noqa: F401 (the module's law rows)
from labkit.pipeline.config import fixed_steps_seconds
from labkit.pipeline.formulas import bubble_fraction
from labkit.pipeline.imbalance import bubble_split

#: bytes per activation element the pipeline lab sends (fp32)
ACTIVATION_BYTES = 4


def _rows(rows) -> list[dict]:
    if rows is None:
        return []
    if hasattr(rows, "to_dict"):  # a DataFrame
        return rows.to_dict("records")
    return [dict(r) for r in rows]


def fit_local(collective_rows, op: str = "all_reduce", world_size: int | None = None,
              min_fit_bytes: int = 0) -> tuple[float, float]:
    """α (s) and β (B/s) fitted to the ``op`` rows of one world size (default: the largest > 1)."""
    rows = [r for r in _rows(collective_rows) if r.get("op") == op and r.get("world_size", 1) > 1]
    if not rows:
        raise UsageError(f"no {op} rows with world_size > 1 to fit alpha and beta from")
    n = world_size or max(r["world_size"] for r in rows)
    used = [r for r in rows if r["world_size"] == n and r["size_bytes"] >= min_fit_bytes]
    if not used:
        raise UsageError(f"no {op} rows at world_size {n} (and size >= {min_fit_bytes} B)")
    return collectives.fit_alpha_beta(op, n, sizes=[r["size_bytes"] for r in used],
                                      times=[r["time_p50_s"] for r in used])


def overlap_from_ddp_rows(ddp_rows) -> tuple[float, int]:
    """The DP overlap measured by the DDP lab: the median ``overlap_fraction`` (1 − exposed
    all-reduce / standalone all-reduce) of its DDP rows with more than one rank, and how many.

    >>> overlap_from_ddp_rows([{"ddp": True, "world_size": 2, "overlap_fraction": f}
    ...                        for f in (0.1, 0.3, 0.2)])
    (0.2, 3)
    """
    vals = [float(r["overlap_fraction"]) for r in _rows(ddp_rows)
            if r.get("world_size", 1) > 1 and r.get("ddp", True)
            and isinstance(r.get("overlap_fraction"), (int, float))
            and math.isfinite(r["overlap_fraction"])]
    if not vals:
        raise UsageError("no DDP rows with world_size > 1 and an overlap_fraction (run "
                         "`labkit ddp --nproc 2 --json FILE`)")
    return statistics.median(vals), len(vals)


def microbatch_rows(row: dict) -> int:
    """Rows of one microbatch of a pipeline-lab row: B/M (the lab takes B a multiple of M).

    >>> microbatch_rows(dict(batch=128, num_microbatches=4))
    32
    """
    return int(row["batch"]) // int(row["num_microbatches"])


def message_bytes(row: dict) -> int:
    """Bytes of one microbatch's activations, what a stage sends: (B/M)·h·4.

    >>> message_bytes(dict(batch=128, num_microbatches=4, hidden=512))
    65536
    """
    return microbatch_rows(row) * int(row["hidden"]) * ACTIVATION_BYTES


def pipeline_terms(row: dict, *, compute_flop_per_s: float | None = None,
                   block_s: float | None = None, compute_slowdown: float = 1.0,
                   transfer_s: float = 0.0, waited: float = 0.0,
                   scheduler_wait_s: float = 0.0, fixed_s: float | None = None,
                   fixed_transfer_s: float = 0.0) -> dict:
    """The model's step of a pipeline-lab row (``layers`` × Linear(h, h), ``batch``, P, M, v),
    term by term, in seconds: ``compute`` (one stage's work, T_stage), ``bubble``
    ((P−1)/(v·M)·T_stage), ``transfers`` (2·v·M·t_transfer), ``scheduler waits``
    (``waited`` × ``scheduler_wait_s``) and their sum ``step``. ``compute_flop_per_s`` is the
    rate of one rank computing alone; the ``compute_slowdown`` of P ranks computing at once
    divides it (every stage computes while the others do); or ``block_s``, one microbatch's
    forward and backward on a rank timed alone, so T_stage = M·block_s × slowdown. With
    ``fixed_s`` (the same step timed where the arithmetic is almost nothing) the step has a
    ``fixed costs`` term and each message's ``transfers`` beyond ``fixed_transfer_s`` (its own
    messages' transfer), and still the counted waits: the fixed step's hops find the peer idle,
    the real step's messages arrive while it computes (in 16 runs of notebook 08 the model
    without them read 13-65 % low in 11 of the 12 steps whose messages waited).

    8 layers of 256, batch 64, P = 2, M = 4 at 40 GFLOP/s, slowdown 1.25, 100 µs transfers, 2
    of the messages waited 3.6 ms: T_stage = 6·4·256²·64/40e9 · 1.25 = 3.146 ms, bubble 1/4 of
    it, 8 transfers 0.8 ms, waits 7.2 ms. The same step timed at 9 ms where the arithmetic is
    nothing, its messages' transfer 40 µs: 8 × 60 µs beyond it.

    >>> row = dict(layers=8, hidden=256, batch=64, num_stages=2, num_microbatches=4)
    >>> t = pipeline_terms(row, compute_flop_per_s=40e9, compute_slowdown=1.25, transfer_s=1e-4,
    ...                    waited=2, scheduler_wait_s=3.6e-3)
    >>> {k: round(v * 1e3, 3) for k, v in t.items()}
    {'compute': 3.146, 'bubble': 0.786, 'transfers': 0.8, 'scheduler waits': 7.2, 'step': 11.932}
    >>> t = pipeline_terms(row, compute_flop_per_s=40e9, compute_slowdown=1.25, transfer_s=1e-4,
    ...                    waited=2, scheduler_wait_s=3.6e-3, fixed_s=9e-3, fixed_transfer_s=4e-5)
    >>> {k: round(v * 1e3, 3) for k, v in t.items()}
    {'compute': 3.146, 'bubble': 0.786, 'fixed costs': 9.0, 'transfers': 0.48, 'scheduler waits': 7.2, 'step': 20.612}
    >>> round(pipeline_terms(row, block_s=0.5e-3, compute_slowdown=1.25)["compute"] * 1e3, 3)
    2.5
    """
    if (compute_flop_per_s is None) == (block_s is None):
        raise UsageError("give the compute as a rate (compute_flop_per_s) or as one "
                         "microbatch's blocks timed alone (block_s), one of them")
    given = compute_flop_per_s if block_s is None else block_s
    if not given > 0 or not compute_slowdown > 0 or min(
            transfer_s, waited, scheduler_wait_s, fixed_transfer_s,
            0.0 if fixed_s is None else fixed_s) < 0:
        raise UsageError("compute_flop_per_s or block_s and compute_slowdown must be > 0; "
                         "transfer_s, waited, scheduler_wait_s, fixed_s and fixed_transfer_s "
                         ">= 0")
    p, m = int(row["num_stages"]), int(row["num_microbatches"])
    v = int(row.get("virtual_stages", 1) or 1)
    h, batch, layers = int(row["hidden"]), int(row["batch"]), int(row["layers"])
    stage = (m * block_s if block_s is not None else
             6.0 * layers / p * h * h * batch / compute_flop_per_s) * compute_slowdown
    terms = {"compute": stage, "bubble": stage * (p - 1) / (v * m)}
    if fixed_s is not None:  # the fixed step holds its messages' transfers and its own hops
        terms["fixed costs"] = fixed_s
        terms["transfers"] = 2 * v * m * max(0.0, transfer_s - fixed_transfer_s) if p > 1 else 0.0
    else:
        terms["transfers"] = 2 * v * m * transfer_s if p > 1 else 0.0
    terms["scheduler waits"] = waited * scheduler_wait_s if p > 1 else 0.0
    return {**terms, "step": sum(terms.values())}


def message_waits(prof, row: dict) -> dict:
    """The messages of a pipeline row as the model prices them: ``transfer_s`` (the profile's
    one-way transfer of one microbatch's activations, cores busy), ``scheduler_wait_s`` (the
    profile's), and ``waited``: the messages of the row's median step that waited for the
    scheduler, ``counted`` from its timeline (:func:`labkit.pipeline.messages.row_waits`, with
    ``messages`` and ``measured_s``, what they took of the step); a row that holds no
    per-message timeline gets the profile's share of waits times its 2·v·M messages instead
    (``counted`` False)."""
    from labkit.pipeline.messages import row_waits

    transfer = float(prof.transfer_s(message_bytes(row), measurement="message", busy=True))
    out = {"transfer_s": transfer, "scheduler_wait_s": float(prof.scheduler_wait_s)}
    got = row_waits(row, transfer_s=transfer)
    if got is not None:
        return {**out, "counted": True, "messages": got["messages"], "waited": got["count"],
                "measured_s": got["measured_s"]}
    n = 2 * int(row.get("virtual_stages", 1) or 1) * int(row["num_microbatches"])
    return {**out, "counted": False, "messages": n,
            "waited": float(prof.wait_share(busy=True)) * n, "measured_s": None}


def profile_terms(prof, row: dict, waits: dict | None = None,
                  parts: dict | None = None) -> dict:
    """:func:`pipeline_terms` of a pipeline row with a machine profile's numbers: the rate of
    its miniature training step alone at the microbatch's rows (Linear + tanh layers forward
    and backward, the pipeline lab's own kind of layer), the co-run slowdown of P ranks
    training at once, the one-way transfer of one microbatch's activations with the cores
    busy, and a scheduler wait for each message that waited (``waits``: :func:`message_waits`
    of the row, counted here where not given); where the launch timed the row's parts apart
    (``parts``: :func:`fixed_step` of the row, read here where not given), its blocks alone
    for the rate and its fixed step for the waits."""
    w = message_waits(prof, row) if waits is None else waits
    fixed = dict(fixed_step(prof, row) if parts is None else parts)
    # beside a fixed step only the waits counted in the row's own timeline are priced (the
    # profile's share of busy waits stands for a whole step's hops, which the fixed step holds)
    waited = w["waited"] if w.get("counted", True) or "fixed_s" not in fixed else 0.0
    compute = ({"block_s": fixed.pop("block_s")} if "block_s" in fixed else
               {"compute_flop_per_s": prof.step_flop_per_s(batch=microbatch_rows(row))})
    return pipeline_terms(row, **compute,
                          compute_slowdown=prof.compute_slowdown(int(row["num_stages"])),
                          transfer_s=w["transfer_s"], waited=waited,
                          scheduler_wait_s=w["scheduler_wait_s"], **fixed)


def fixed_step(prof, row: dict) -> dict:
    """The parts of a pipeline row timed apart, as :func:`pipeline_terms` takes them:
    ``fixed_s``, its step timed at ``fixed_width`` (where the arithmetic is almost nothing),
    ``fixed_transfer_s``, the profile's one-way transfer of that width's message, cores busy,
    and ``block_s``, the arithmetic of one microbatch's blocks on a rank alone (its blocks
    alone at the row's width less at the fixed width, whose overhead the fixed step holds);
    {} for a row timed without them.

    >>> class Prof:
    ...     def transfer_s(self, size_bytes, **kw): return 1e-4 + size_bytes / 1e9
    >>> got = fixed_step(Prof(), dict(batch=128, num_microbatches=2, fixed_width=16,
    ...     fixed_step_s=9e-3, block_alone_s=8e-3, fixed_block_alone_s=0.7e-3))
    >>> {k: round(v * 1e3, 4) for k, v in got.items()}
    {'fixed_s': 9.0, 'fixed_transfer_s': 0.1041, 'block_s': 7.3}
    >>> fixed_step(Prof(), dict(batch=128, num_microbatches=2, fixed_step_s=None))
    {}
    """
    fixed, width = row.get("fixed_step_s"), row.get("fixed_width")
    if not laws.given(fixed) or not width:
        return {}
    size = microbatch_rows(row) * int(width) * ACTIVATION_BYTES
    out = {"fixed_s": float(fixed),
           "fixed_transfer_s": float(prof.transfer_s(size, measurement="message", busy=True))}
    alone, small = row.get("block_alone_s"), row.get("fixed_block_alone_s")
    if laws.given(alone) and laws.given(small):
        out["block_s"] = max(float(alone) - float(small), 0.0)
    return out


def _collective_row(r: dict, *, op: str, n: int, ab: float, a: float, b: float,
                    profile) -> dict:
    """One collective row of :func:`model_check`: with a profile, the transfers (the
    profile's against the calls', :func:`labkit.machine.formulas.transfer_of`; their p50 where
    the row keeps none) and the calls' wait share; fitted, the α–β line against the p50."""
    out = {"lab": "collectives", "what": op, "world_size": n, "size_bytes": r["size_bytes"],
           "quantity": "time_s", "alpha_beta_s": ab, "alpha_s": a, "beta_gb_per_s": b / 1e9,
           "measured_p10_s": r.get("time_p10_s"), "measured_p50_s": r["time_p50_s"],
           "measured_p90_s": r.get("time_p90_s"), "measured_mean_s": r.get("time_mean_s")}
    if profile is None:
        return {**out, "measured": r["time_p50_s"], "model": ab, "statistic": "p50",
                "error_pct": laws.symmetric_error_pct(ab, r["time_p50_s"])}
    # the profile's calls back to back, as the collectives lab timed these
    model = profile.transfer_s(r["size_bytes"], ranks=n, steady=True) if op == "all_reduce" \
        else ab
    # the calls' transfer (a row stored before it was kept: its p10), else their p50
    measured, stat = next(((r[k], s) for k, s in (("transfer_s", "transfer"), ("time_p10_s", "p10"))
                           if r.get(k) is not None and r[k] == r[k]), (r["time_p50_s"], "p50"))
    from labkit.collectives.waits import call_times

    calls = call_times([r])
    w = machine_formulas.waits(calls) if calls else None
    share = w["wait_share"] if w else None
    return {**out, "measured": measured, "model": model, "statistic": stat,
            "error_pct": laws.symmetric_error_pct(model, measured), "calls": len(calls),
            "calls_waited": len(w["wait_excess_s"]) if w else None, "wait_share": share,
            "fastest_s": min(calls) if calls and stat == "transfer" else None,
            "scheduler_wait_s": profile.scheduler_wait_s,
            "in_context_s": None if w is None else model + share * profile.scheduler_wait_s}


def model_check(collective_rows=None, pipeline_rows=None, *, profile=None, fit: bool = False,
                min_fit_bytes: int = 0):
    """The model beside each measurement, with its symmetric error (a DataFrame with ``lab,
    what, world_size, size_bytes, num_microbatches, quantity, measured, model, error_pct``).

    Collective rows, with a profile: the profile's all-reduce transfer at that size
    (``model``) against the calls' transfer (``measured``; ``statistic`` says which),
    the calls' median and mean, how many of the calls in the row's timeline waited for the
    scheduler (``calls_waited``, ``wait_share``: :func:`labkit.machine.formulas.waits`) and
    the profile's transfer + that share × its scheduler wait (``in_context_s``); the α–β law
    with the profile's α, β beside them (``alpha_beta_s``). With ``fit`` (no profile needed)
    α, β are fitted to the rows' medians (per op and world size): the errors then show how well
    the *shape* of the α–β law holds. Pipeline rows get the bubble fraction beside
    ``bubble_fill_drain`` (``bubble_measured``, all idle time, where absent) and, with a
    profile, the step time beside ``step_time_s``, with the measured split of the step
    (compute, fill/drain bubble, the counted scheduler waits, other waits): notebook 07's
    replay where every row is :func:`labkit.perfmodel.replay.replayable` (``step_model``
    "replay"), else :func:`profile_terms`; the closed form's step (``closed_form_s``) and its
    terms (``model_compute_s``, ``model_bubble_s``, ...) are kept either way.
    """
    import pandas as pd

    if profile is None and not fit:
        raise UsageError("give a machine profile, or fit alpha and beta to the rows")
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in _rows(collective_rows):
        groups.setdefault((r["op"], int(r["world_size"])), []).append(r)
    for (op, n), part in sorted(groups.items()):
        if n < 2:
            continue
        if fit or profile is None:
            used = [r for r in part if r["size_bytes"] >= min_fit_bytes] or part
            a, b = collectives.fit_alpha_beta(op, n, sizes=[r["size_bytes"] for r in used],
                                              times=[r["time_p50_s"] for r in used])
        else:
            a, b = profile.alpha_s, profile.beta_bytes_per_s
        for r in sorted(part, key=lambda r: r["size_bytes"]):
            ab = collectives.collective_time(op=op, ranks=n, size_bytes=r["size_bytes"],
                                             alpha_s=a, beta_bytes_per_s=b)
            out.append(_collective_row(r, op=op, n=n, ab=ab, a=a, b=b,
                                       profile=None if fit else profile))
    pipes = _rows(pipeline_rows)
    for r, replay in zip(pipes, replay_model.replays(pipes, profile)):
        out += _pipeline_rows(r, profile, replay)
    if not out:
        raise UsageError("no measured rows to check (collective rows need world_size > 1)")
    return pd.DataFrame(out)


def _pipeline_rows(r: dict, profile, replay: dict | None = None) -> list[dict]:
    p, m = int(r["num_stages"]), int(r["num_microbatches"])
    v = int(r.get("virtual_stages", 1) or 1)
    f = bubble_fraction(num_stages=p, num_microbatches=m, virtual_stages=v,
                        schedule="interleaved" if v > 1 else "1f1b")
    # the schedule's bubble (fill and drain idle, read off the timeline) is what the formula
    # describes; all idle time (bubble_measured) also holds message and scheduling waits
    fill_drain = r.get("bubble_fill_drain")
    meas = float(fill_drain if fill_drain is not None and fill_drain == fill_drain
                 else r["bubble_measured"])
    head = {"lab": "pipeline", "what": r.get("schedule", ""), "world_size": p, "num_stages": p,
            "num_microbatches": m}
    split = (bubble_split(r.get("median_step_blocks"), step_s=r.get("step_time_s") or 0.0,
                          measured=meas, over="step")
             if fill_drain is not None and fill_drain == fill_drain else None)
    out = [{**head, "quantity": "bubble_fraction", "measured": meas, "model": f,
            "error_pct": laws.symmetric_error_pct(f, meas), "error_abs": f - meas,
            "split": split}]
    if profile is not None and "hidden" in r:
        w = message_waits(profile, r)
        apart = fixed_step(profile, r)
        t = profile_terms(profile, r, w, apart)
        step = float(r["step_time_s"])
        split = None
        if r.get("compute_share") is not None and r.get("idle_other") is not None:
            other = step * float(r["idle_other"])
            split = {"compute": step * float(r["compute_share"]), "fill/drain bubble": step * meas}
            if w["counted"]:  # what the counted waits took of the step, read off its timeline
                waits = min(w["measured_s"], other)
                split.update({"scheduler waits (counted)": waits,
                              "other waits (transfers, scheduling)": other - waits})
            else:
                split["other waits (messages, scheduling)"] = other
        # the step model's own bubble share: the schedule's idle (P-1)/M T_stage in a step the
        # transfers, waits and fixed costs lengthen (the formula leaves those out); where the
        # rows hold their timelines, notebook 07's replay, whose share is read off the replayed
        # step as the measured one is off the measured step
        model = replay["step_time_model_s"] if replay else t["step"]
        share = replay["bubble_model"] if replay else (t["bubble"] / t["step"] if t["step"] > 0
                                                       else f)
        out[0].update({"model": share, "formula": f,
                       "error_pct": laws.symmetric_error_pct(share, meas),
                       "error_abs": share - meas})
        out.append({**head, "quantity": "step_time_s", "measured": step, "model": model,
                    "error_pct": laws.symmetric_error_pct(model, step),
                    "step_model": "replay" if replay else "closed form",
                    "closed_form_s": t["step"],
                    **({k: replay[k] for k in replay_model.REPLAY_COLUMNS} if replay else {}),
                    "model_compute_s": t["compute"], "model_bubble_s": t["bubble"],
                    "model_transfers_s": t["transfers"],
                    "model_waits_s": t.get("scheduler waits", 0.0),
                    "model_fixed_s": t.get("fixed costs"), "fixed_width": r.get("fixed_width"),
                    "fixed_transfer_s": apart.get("fixed_transfer_s"),
                    "block_s": apart.get("block_s"), "profile_block_s": pipeline_terms(
                        r, compute_flop_per_s=profile.step_flop_per_s(
                            batch=microbatch_rows(r)))["compute"] / m,
                    "compute_slowdown": profile.compute_slowdown(p),
                    "transfer_s": w["transfer_s"], "scheduler_wait_s": w["scheduler_wait_s"],
                    "messages": w["messages"], "messages_waited": w["waited"],
                    "waits_counted": w["counted"], "split": split})
    return out


def summary(check) -> dict:
    """Median absolute error % per lab: ``{"collectives": 12.3, "pipeline": 4.5}``."""
    res = {}
    for lab, part in check.groupby("lab"):
        vals = [abs(e) for e in part.error_pct if e == e and math.isfinite(e)]
        res[lab] = statistics.median(vals) if vals else math.nan
    return res


# --- what the live check costs, estimated before anything is launched --------------------------

#: a launch of R ranks on C cores: torch imported by every rank, so beyond the cores it stretches
LAUNCH_BASE_S = 2.0
LAUNCH_PER_RANK_S = 1.2
#: a reference rate for the estimate (the profile is not needed to refuse)
ESTIMATE_ALPHA_S = 3e-4
ESTIMATE_BETA_BYTES_PER_S = 0.8e9
ESTIMATE_FLOP_PER_S = 20e9
#: what notebook 08 runs live (its size: fixed, so the estimate is a function of the parameters)
#: the same steps also timed at width 16, where the arithmetic is almost nothing (the step
#: model's fixed costs); 5 timed steps, not 3: the step law compares the median step, whose
#: counted scheduler waits took 1.8-7.4 ms of a 21-33 ms step at M = 4 in 16 of 21 runs
LIVE_PIPELINE = {"layers": 8, "hidden": 512, "batch": 128, "steps": 5, "warmup": 1,
                 "fixed_width": 16}
LIVE_COLLECTIVES = {"factor": 4.0, "iters": 10, "warmup": 3, "min_bytes": 8}


def live_estimate_s(*, world_size: int, max_bytes: int, microbatches, cores: int) -> float:
    """Seconds notebook 08's live check takes, estimated: two launches (collectives, pipeline)
    of ``world_size`` ranks on ``cores`` cores, the all-reduce sweep 8 B..``max_bytes`` (×4)
    and the pipeline's steps at each M (and those at its fixed width). Oversubscribed (ranks >
    cores), everything stretches by ranks/cores.

    >>> round(live_estimate_s(world_size=2, max_bytes=1 << 20, microbatches=[2, 4], cores=2), 1)
    9.7
    >>> round(live_estimate_s(world_size=4, max_bytes=1 << 20, microbatches=[2, 4], cores=2), 1)
    29.0
    """
    over = max(1.0, world_size / max(cores, 1))
    launch = (LAUNCH_BASE_S + LAUNCH_PER_RANK_S * world_size) * over
    c = LIVE_COLLECTIVES
    sweep, size = 0.0, c["min_bytes"]
    while size <= max_bytes:
        sweep += (c["iters"] + c["warmup"]) * collectives.allreduce_time(
            size_bytes=size, ranks=world_size, alpha_s=ESTIMATE_ALPHA_S,
            beta_bytes_per_s=ESTIMATE_BETA_BYTES_PER_S)
        size *= c["factor"]
    p = LIVE_PIPELINE
    flop = 6.0 * p["layers"] * p["hidden"] ** 2 * p["batch"]
    pipe = sum((p["steps"] + p["warmup"]) * flop / world_size / ESTIMATE_FLOP_PER_S
               * (1 + (world_size - 1) / m)
               + fixed_steps_seconds(m, warmup=p["warmup"]) for m in microbatches)
    return 2 * launch + (sweep + pipe) * over


def check_live(*, world_size: int, max_bytes: int, microbatches, cores: int,
               budget_s: float) -> float:
    """The estimate of :func:`live_estimate_s`, or a one-line refusal when it exceeds
    ``budget_s`` (before anything is launched).

    >>> check_live(world_size=4, max_bytes=1 << 20, microbatches=[2, 4], cores=2, budget_s=10)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: the live check (4 ranks, all-reduces up to 1048576 B, M = [2, 4]) takes about 29 s here, over its 10 s budget: use live_world_size <= 2 cores, a smaller live_max_bytes or fewer live_microbatches, or measure_live = False
    """
    est = live_estimate_s(world_size=world_size, max_bytes=max_bytes, microbatches=microbatches,
                          cores=cores)
    if est > budget_s:
        raise UsageError(f"the live check ({world_size} ranks, all-reduces up to {max_bytes} B, "
                         f"M = {list(microbatches)}) takes about {est:.0f} s here, over its "
                         f"{budget_s:g} s budget: use live_world_size <= {cores} cores, a smaller "
                         "live_max_bytes or fewer live_microbatches, or measure_live = False")
    return est
