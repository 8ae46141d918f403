"""What notebook 08's model check says (pure): its law rows (:func:`check_laws`), the notes of
those laws about messages and calls that waited for the scheduler (:func:`collective_note`,
:func:`step_note`) and the sentence under them (:func:`waits_sentence`), each computed from a
:func:`labkit.perfmodel.modelcheck.model_check` table's rows.

A gloo call moves at its transfer's pace, or it also waits for the scheduler to give one of
its threads a core (about a scheduler tick on a machine whose cores compute); how often
changes from second to second (:func:`labkit.machine.formulas.waits`). So the all-reduce law
compares transfers and says how many calls waited, and the pipeline's step model counts the
messages that waited in the row's own median step.
"""

from __future__ import annotations

import math

from labkit.book import laws
from labkit.book.laws import given
from labkit.machine import formulas as machine_formulas

#: every prediction here is a time or a ratio (relative) or a fraction of a step (absolute)
STEP_TOLERANCE_PCT = 25.0
BUBBLE_TOLERANCE_ABS = 0.05


def collective_note(r: dict) -> str:
    """What a collective's law compares, and the calls' medians and waits beside it (in ms, as
    the law).

    >>> print(collective_note({"statistic": "transfer", "model": 2.1e-3, "measured": 2.0e-3,
    ...     "measured_p50_s": 4.9e-3, "measured_mean_s": 4.2e-3, "measured_p90_s": 6e-3,
    ...     "calls": 10, "calls_waited": 4, "wait_share": 0.4, "scheduler_wait_s": 3.6e-3,
    ...     "in_context_s": 3.54e-3}))
    transfers compared: the profile's 2.1 ms against the calls' transfer 2 ms; the calls' p50 4.9 ms, mean 4.2 ms, p90 6 ms: 4 of 10 calls waited for the scheduler (share 0.40), so transfer + 0.40 x the profile's 3.6 ms wait = 3.54 ms
    """
    def ms(key: str) -> str:
        return f"{r[key] * 1e3:.3g} ms"

    if not given(r.get("scheduler_wait_s")):  # fitted: no profile
        return (f"the alpha-beta line fitted to the rows' medians, {ms('model')}, against "
                f"the calls' p50 {ms('measured')}")
    head = (f"transfers compared: the profile's {ms('model')} against the calls' "
            f"{r['statistic']} {ms('measured')}" if r.get("statistic") in ("transfer", "p10")
            else f"the profile's transfer {ms('model')} against the calls' p50 "
            f"{ms('measured')} (the row keeps no transfer)")
    calls = [f"{k} {ms(c)}" for k, c in (("p50", "measured_p50_s"), ("mean", "measured_mean_s"),
                                         ("p90", "measured_p90_s"))
             if r.get("statistic") in ("transfer", "p10") and given(r.get(c))]
    text = head + ("; the calls' " + ", ".join(calls) if calls else "")
    if not given(r.get("wait_share")):
        return text + " (no per-call times in the row: their waits not counted)"
    return text + (f": {int(r['calls_waited'])} of {int(r['calls'])} calls waited for the "
                   f"scheduler (share {r['wait_share']:.2f}), so transfer + "
                   f"{r['wait_share']:.2f} x the profile's {r['scheduler_wait_s'] * 1e3:.1f} ms "
                   f"wait = {ms('in_context_s')}")


def step_note(r: dict) -> str:
    """What a pipeline step's law priced its messages at.

    >>> print(step_note({"num_microbatches": 4, "transfer_s": 2.1e-4, "messages": 8,
    ...                  "messages_waited": 3, "waits_counted": True, "scheduler_wait_s": 3.6e-3}))
    transfers 8 x 0.21 ms (the profile's, cores busy); 3 of 8 messages waited for the scheduler in the median step (counted from its timeline), priced at the profile's 3.6 ms each

    A row the step model of notebook 07 predicted (``step_model`` "replay",
    :mod:`labkit.perfmodel.replay`): that model's note (:func:`labkit.pipeline.report.step_note`),
    and the closed form's step beside it.

    >>> print(step_note({"step_model": "replay", "closed_form_s": 0.0201, "fixed_width": 16,
    ...     "model_fixed_s": 3.4e-3, "corun_slowdown": 1.1, "message_transfer_s": 2e-4,
    ...     "schedule_gap_s": 6.5e-4, "step_edges_s": 2.1e-3, "messages": 8,
    ...     "messages_waited": 0, "scheduler_wait_s": 3.6e-3, "step_waits_model_s": 0.0,
    ...     "step_waits_measured_s": 0.0}))
    notebook 07's step model: each block at its time alone in the launch's timelines, replayed in the schedule; co-run slowdown 1.10, transfer 0.20 ms a message (the profile's, cores busy), 0.65 ms of the schedule's own work before each block and 2.1 ms at the step's edges (the launch's timelines); 0 of 8 messages waited for the scheduler in the median step (counted from its timeline), priced at the profile's 3.6 ms each where they waited: +0.0 ms on the predicted step (measured: 0.0 ms of the step); the closed form (T_stage, (P-1)/M of it, the step at width 16 for the fixed costs) would say 20.1 ms
    """
    if r.get("step_model") == "replay":
        import pandas as pd

        from labkit.pipeline.report import step_note as replay_note

        beside = (f"the step at width {int(r['fixed_width'])} for the fixed costs"
                  if given(r.get("model_fixed_s")) and given(r.get("fixed_width"))
                  else "the transfers and counted waits")
        return ("notebook 07's step model: each block at its time alone in the launch's "
                "timelines, replayed in the schedule; " + replay_note(pd.Series(r))
                + f"; the closed form (T_stage, (P-1)/M of it, {beside}) would say "
                f"{r['closed_form_s'] * 1e3:.1f} ms")
    if given(r.get("model_fixed_s")):
        return fixed_note(r)
    head = (f"transfers {int(r['messages'])} x {r['transfer_s'] * 1e3:.2f} ms (the profile's, "
            "cores busy)")
    if given(r.get("waits_counted")) and bool(r["waits_counted"]):
        return head + (f"; {int(r['messages_waited'])} of {int(r['messages'])} messages waited "
                       "for the scheduler in the median step (counted from its timeline), "
                       f"priced at the profile's {r['scheduler_wait_s'] * 1e3:.1f} ms each")
    return head + (f"; the row holds no per-message timeline: the profile's share of waits, "
                   f"{r['messages_waited']:.2g} of {int(r['messages'])} messages, at "
                   f"{r['scheduler_wait_s'] * 1e3:.1f} ms each")


def fixed_note(r: dict) -> str:
    """What a pipeline step's law took for its fixed costs and priced its messages at.

    >>> print(fixed_note({"fixed_width": 16, "model_fixed_s": 1.2e-2, "messages": 8,
    ...                   "transfer_s": 2.1e-4, "fixed_transfer_s": 1.1e-4, "messages_waited": 3,
    ...                   "waits_counted": True, "block_s": 6.1e-3, "profile_block_s": 4.0e-3,
    ...                   "compute_slowdown": 1.16, "scheduler_wait_s": 3.6e-3}))
    a microbatch's arithmetic on a rank 6.10 ms alone (its blocks timed apart, less their overhead at width 16; the profile's training step would give 4.00 ms) x the co-run slowdown 1.16; fixed costs 12.0 ms: the same step at width 16, where the arithmetic is almost nothing, timed right after it (each block's overhead, each hop, the scheduler's turns); transfers 8 x 0.10 ms beyond that width's (the profile's 0.21 against 0.11 ms, cores busy); 3 of 8 messages of the median step waited for the scheduler (counted from its timeline), each priced at the profile's 3.6 ms beyond the fixed costs
    """
    extra = max(0.0, r["transfer_s"] - r["fixed_transfer_s"])
    text = ""
    if given(r.get("block_s")):
        text = (f"a microbatch's arithmetic on a rank {r['block_s'] * 1e3:.2f} ms alone (its "
                f"blocks timed apart, less their overhead at width {int(r['fixed_width'])}; the "
                f"profile's training step would give {r['profile_block_s'] * 1e3:.2f} ms) x the "
                f"co-run slowdown {r['compute_slowdown']:.2f}; ")
    text += (f"fixed costs {r['model_fixed_s'] * 1e3:.1f} ms: the same step at width "
             f"{int(r['fixed_width'])}, where the arithmetic is almost nothing, timed right after "
             "it (each block's overhead, each hop, the scheduler's turns); transfers "
             f"{int(r['messages'])} x {extra * 1e3:.2f} ms beyond that width's (the profile's "
             f"{r['transfer_s'] * 1e3:.2f} against {r['fixed_transfer_s'] * 1e3:.2f} ms, cores "
             "busy)")
    if given(r.get("waits_counted")) and bool(r["waits_counted"]):
        text += (f"; {int(r['messages_waited'])} of {int(r['messages'])} messages of the "
                 "median step waited for the scheduler (counted from its timeline), each priced "
                 f"at the profile's {r['scheduler_wait_s'] * 1e3:.1f} ms beyond the fixed costs")
    return text


def waits_sentence(check) -> str:
    """How many of the live runs' messages and calls waited for the scheduler, from a
    :func:`model_check` table: the pipeline's per M (counted in each median step), the largest
    all-reduce's calls; why they wait, and how the laws price them.

    >>> import pandas as pd
    >>> print(waits_sentence(pd.DataFrame([
    ...     {"quantity": "step_time_s", "num_microbatches": 2, "messages": 4,
    ...      "messages_waited": 1, "waits_counted": True, "scheduler_wait_s": 3.6e-3},
    ...     {"quantity": "step_time_s", "num_microbatches": 4, "messages": 8,
    ...      "messages_waited": 3, "waits_counted": True, "scheduler_wait_s": 3.6e-3}])))
    Messages that waited for the scheduler in the pipeline's median steps: 1 of 4 at M = 2, 3 of 8 at M = 4 (counted from the timelines). A message whose receiver's core is computing waits for the scheduler's next turn, which the profile's waits put at 3.6 ms on this machine: the step model adds that for each one counted, beside every message's transfer.
    >>> print(waits_sentence(pd.DataFrame([{"quantity": "time_s", "size_bytes": 512,
    ...     "calls": 10, "calls_waited": 0, "wait_share": 0.0}])))
    The all-reduce of 512 B: none of its 10 timed calls waited for the scheduler; its law compares transfers, which do not depend on how many calls wait.
    """
    parts = []
    steps = check[check.quantity == "step_time_s"] if "quantity" in check else check.iloc[:0]
    counted = [r for r in steps.to_dict("records")
               if given(r.get("waits_counted")) and bool(r["waits_counted"])]
    if counted:
        each = ", ".join(f"{int(r['messages_waited'])} of {int(r['messages'])} at M = "
                         f"{int(r['num_microbatches'])}" for r in counted)
        wait = counted[0]["scheduler_wait_s"] * 1e3
        replayed = all(r.get("step_model") == "replay" for r in counted)
        fixed = not replayed and all(given(r.get("model_fixed_s")) for r in counted)
        if sum(r["messages_waited"] for r in counted):
            parts.append("Messages that waited for the scheduler in the pipeline's median steps: "
                         f"{each} (counted from the timelines). A message whose receiver's core "
                         "is computing waits for the scheduler's next turn, which the profile's "
                         f"waits put at {wait:.1f} ms on this machine: " + (
                             "the step model delays each one counted by that wait where it lies "
                             "in its replay (what it adds to the step depends on what waits "
                             "for that message)." if replayed else
                             "the step model holds such waits in its fixed costs, the same step "
                             "timed where the arithmetic is almost nothing." if fixed else
                             "the step model adds that for each one counted, beside every "
                             "message's transfer."))
        else:
            parts.append(f"No message of the pipeline's median steps waited for the scheduler "
                         f"({each}, counted from the timelines): " + (
                             "the step model's fixed costs (the same step timed where the "
                             "arithmetic is almost nothing) hold its hops." if fixed else
                             "the step model prices their transfers only."))
    coll = check[check.quantity == "time_s"] if "quantity" in check else check.iloc[:0]
    if len(coll) and given(coll.sort_values("size_bytes").iloc[-1].get("wait_share")):
        r = coll.sort_values("size_bytes").iloc[-1]
        k = int(r["calls_waited"])
        who = f"{k} of its {int(r['calls'])} timed calls" if k else \
            f"none of its {int(r['calls'])} timed calls"
        parts.append(f"The all-reduce of {r['size_bytes']:,.0f} B: {who} waited for the "
                     "scheduler; its law compares transfers, which do not depend on how many "
                     "calls wait.")
    return " ".join(parts) or "No live rows: no message's wait was counted."


def check_laws(check) -> list[dict]:
    """The law rows of a :func:`model_check` table (kind ``model``): the largest size of each
    collective (its transfer: relative, with the calls' median and waits in the note), each
    pipeline bubble (a fraction: absolute) and step time (relative, with its measured split
    and its counted waits in the note).

    >>> import pandas as pd
    >>> rows = check_laws(pd.DataFrame([
    ...     {"lab": "pipeline", "what": "gpipe", "num_stages": 2, "num_microbatches": 4,
    ...      "quantity": "bubble_fraction", "measured": 0.22, "model": 0.2}]))
    >>> rows[0]["law"], rows[0]["holds"], rows[0]["tolerance_abs"]
    ('pipeline bubble fraction, P = 2, M = 4', True, 0.05)
    """
    rows = []
    coll = check[check.quantity == "time_s"]
    if len(coll):
        largest = coll.sort_values("size_bytes").groupby(["what", "world_size"]).tail(1)
        for r in largest.to_dict("records"):
            rows.append(laws.check(
                f"{r['what']} of {r['size_bytes']:,.0f} B on {r['world_size']} ranks (this run's "
                "machine profile)", predicted=r["model"] * 1e3, measured=r["measured"] * 1e3,
                unit="ms", tolerance_pct=STEP_TOLERANCE_PCT, note=collective_note(r),
                split=machine_formulas.fastest_split(transfer_s=r["measured"],
                                                     fastest_s=r.get("fastest_s") or math.nan)))
    for r in check[check.quantity != "time_s"].to_dict("records"):
        name = f"P = {int(r['num_stages'])}, M = {int(r['num_microbatches'])}"
        split = r.get("split")
        split = split if isinstance(split, dict) else None
        if r["quantity"] == "bubble_fraction":
            formula = r.get("formula")
            if not laws.given(formula):  # no profile: the formula is the model
                rows.append(laws.check(f"pipeline bubble fraction, {name}", predicted=r["model"],
                                       measured=r["measured"],
                                       tolerance_abs=BUBBLE_TOLERANCE_ABS, split=split))
                continue
            rows.append(laws.check(
                f"pipeline bubble fraction, the step model's (its bubble over its step), {name}",
                predicted=r["model"], measured=r["measured"], tolerance_abs=BUBBLE_TOLERANCE_ABS,
                split=split))
            rows.append(laws.check(
                f"pipeline bubble fraction = (P-1)/(P-1+M), {name}", kind="naive",
                predicted=formula, measured=r["measured"], tolerance_abs=BUBBLE_TOLERANCE_ABS,
                split=split, note="equal blocks and free messages: the measured step's own "
                                  "blocks (the last stage computes the loss), transfers, waits "
                                  "and the schedule's own work change its fill and drain and its "
                                  "length (the split)"))
        else:  # in ms, as the lab's other step laws (the check's columns stay in seconds)
            rows.append(laws.check(
                f"pipeline step time, {name}", predicted=r["model"] * 1e3,
                measured=r["measured"] * 1e3, unit="ms", tolerance_pct=STEP_TOLERANCE_PCT,
                split={k: v * 1e3 for k, v in split.items()} if split else None,
                note=step_note(r)))
    return rows
