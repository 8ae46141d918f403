"""What a pipeline sweep's rows hold, and the tables made of them (pure: pandas only).

:data:`COLUMNS` declares every field of a row; :data:`KEY` the fields a results file upserts
by; :func:`bubble_table` the table ``labkit pipeline`` prints, with the verdicts of
:mod:`labkit.pipeline.verdicts`; :func:`main_rows` and :func:`conventions` notebook 07's
selections; :func:`add_model` the step model on this machine (the profile's co-run slowdown
and transfers, the scheduler waits of :mod:`labkit.pipeline.messages`, the schedule's own work
of :mod:`labkit.pipeline.overhead`); :func:`bubble_laws`, :func:`step_laws`,
:func:`best_m_laws` and :func:`over_ideal_laws` its law rows (kind ``model``);
:func:`recv_ahead_table` GPipe and 1F1B with and without their receives posted ahead;
:func:`schedule_blocks` and :func:`ideal_blocks` one row's measured and ideal blocks, for
:func:`labkit.pipeline.plots.schedule_diagram`. Stage 0's activations have their formula,
laws and sentence in :mod:`labkit.pipeline.activations`.
"""

from __future__ import annotations

from labkit.pipeline import verdicts
from labkit.pipeline.imbalance import bubble_laws, over_ideal_laws  # noqa: F401 (the report's)
from labkit.pipeline.verdicts import STEP_TOLERANCE_PCT
from labkit.results import DEVICE_MEMORY_COLUMNS, Column, select_rows

#: the selections every verdict starts from, offered here beside this module's own (they sit in
#: :mod:`labkit.pipeline.verdicts`, whose sentences the table of :func:`bubble_table` prints)

#: what makes a row a different measurement of the same point: the schedule, P, M, V, where
#: GPipe and 1F1B post their receives, the model's size, the backend and node count
KEY = ("schedule", "num_stages", "num_microbatches", "virtual_stages", "recv_ahead", "layers",
       "hidden", "batch", "backend", "nnodes")

COLUMNS = (
    Column("schedule", "", "naive_gpipe, gpipe, 1f1b, interleaved or zero_bubble"),
    Column("num_stages", "", "P: pipeline stages, one per rank"),
    Column("num_microbatches", "", "M: microbatches per step"),
    Column("virtual_stages", "", "V: model chunks per rank (1 unless interleaved)"),
    Column("recv_ahead", "", "gpipe, 1f1b: every receive of a step posted at its start (True) "
                             "or right before the block that needs it (False, torch's "
                             "placement); None for the other schedules"),
    Column("compared_placement", "", "True on a row measured with the other receive placement "
                                     "only to set beside the main one (compare_placement_at); "
                                     "main_rows leaves it out"),
    Column("layers", "", "Linear+tanh blocks of the model"),
    Column("hidden", "", "width of every layer"),
    Column("batch", "", "samples per step"),
    Column("microbatch_size", "", "samples per microbatch: batch / M"),
    Column("steps", "", "timed steps"),
    Column("step_time_s", "s", "step time, the slowest rank's, median over steps"),
    Column("step_time_p10_s", "s", "10th percentile of the step times"),
    Column("step_time_p90_s", "s", "90th percentile of the step times"),
    Column("busy_time_s", "s", "time inside forward and backward, summed over ranks (median step)"),
    Column("busy_per_microbatch_s", "s", "busy_time_s / (P x M): one stage's F + B of a microbatch"),
    Column("forward_time_s", "s", "one stage's forward of one microbatch, median"),
    Column("backward_time_s", "s", "one stage's backward of one microbatch, median (zero_bubble: "
                                   "the input-gradient pass B; its first stage runs all of the "
                                   "backward there)"),
    Column("weight_time_s", "s", "zero_bubble: one stage's weight-gradient pass W of one "
                                 "microbatch, median (None for the other schedules)"),
    Column("bubble_measured", "", "1 - busy_time_s / (P x step_time_s), median over steps"),
    Column("bubble_formula", "", "(P-1)/(P-1+M); interleaved (P-1)/(V M+P-1); zero_bubble "
                                 "(P-1)/(P-1+3M)"),
    Column("bubble_error", "", "bubble_measured - bubble_formula"),
    Column("bubble_fill_drain", "", "share of P x step the ranks idle waiting for another rank's "
                                    "compute (fill and drain), read off the timeline "
                                    "(formulas.timeline_split), median over steps"),
    Column("bubble_fill_drain_error", "", "bubble_fill_drain - bubble_formula"),
    Column("idle_other", "", "share of P x step idle for other reasons: messages in flight, "
                             "scheduling, waits the schedule does not need (median over steps)"),
    Column("compute_share", "", "share of P x step inside forward and backward blocks (median)"),
    Column("bubble_over_ideal_formula", "", "the other convention, bubble time / ideal step: "
                                            "(P-1)/M; interleaved (P-1)/(V M); zero_bubble "
                                            "(P-1)/(3M)"),
    Column("bubble_over_ideal_measured", "", "fill/drain bubble time / compute time, read off "
                                             "the timeline (median over steps)"),
    Column("slot_time_s", "s", "t_slot(M): one stage's forward + backward (+ W) of one "
                               "microbatch, mean over the step's P x M (median over steps)"),
    Column("step_time_predicted_s", "s", "M t_slot / (1 - bubble_formula): (M+P-1) t_slot for "
                                         "gpipe and 1f1b"),
    Column("step_time_error_pct", "%", "100 (step_time_predicted_s - step_time_s) / step_time_s"),
    Column("block_times", "", "per rank and kind (F, B, W): alone_s, the median block that ran "
                              "alone (another rank computing for at most 10% of it; None if "
                              "none did), median_s of all, their median overlap "
                              "(formulas.block_times, over the timed steps)"),
    Column("step_split_s", "s", "the median step taken apart, per rank (averaged): compute, "
                                "fill/drain bubble, messages and other waits; they sum to it"),
    Column("median_step_blocks", "", "the median step's blocks (the step step_time_s and "
                                     "step_split_s describe), as blocks"),
    Column("step_messages", "", "each activation or gradient that crossed to another rank in "
                                "the median step (messages.step_messages): kind, stage, "
                                "microbatch of the block that needed it, from_rank, to_rank, "
                                "delay_s (its start - the later of the sender's block end and "
                                "its own rank's previous block end)"),
    Column("fixed_width", "", "the width the same (schedule, M) was also timed at, where the "
                              "arithmetic is almost nothing (fixed_width; None: not timed)"),
    Column("fixed_step_s", "s", "that step at fixed_width, median over its steps: what a step "
                                "costs besides arithmetic and bytes (blocks' overhead, hops, "
                                "the scheduler's turns)"),
    Column("fixed_step_p10_s", "s", "10th percentile of the steps at fixed_width"),
    Column("fixed_step_p90_s", "s", "90th percentile of the steps at fixed_width"),
    Column("block_alone_s", "s", "one microbatch's forward + backward through a rank's stages, "
                                 "each rank alone in turn (the slowest rank's median)"),
    Column("fixed_block_alone_s", "s", "the same at fixed_width: the part of a block that is "
                                       "not arithmetic"),
    Column("step_time_model_s", "s", "the step model on this machine (report.add_model): alone "
                                     "blocks x the profile's co-run slowdown while ranks compute "
                                     "at once, the profile's transfer per message, a "
                                     "scheduler wait on each message that waited in the median "
                                     "step, the schedule's gap between blocks and the step's "
                                     "edges"),
    Column("step_model_error_pct", "%", "symmetric error of step_time_model_s against "
                                        "step_time_s (laws.symmetric_error_pct)"),
    Column("bubble_model", "", "the fill/drain share of the step model's replayed step "
                               "(report.add_model), read off it as bubble_fill_drain is off "
                               "the measured one"),
    Column("corun_slowdown", "", "the profile's compute slowdown with P ranks at once"),
    Column("message_transfer_s", "s", "the profile's one-way transfer of one activation (a "
                                      "message that waited for nothing), cores busy"),
    Column("scheduler_wait_s", "s", "the profile's scheduler wait: what a message that waited "
                                    "took beyond its transfer (about a scheduler tick)"),
    Column("messages", "", "messages in the median step (None: the row has no step_messages)"),
    Column("messages_waited", "", "of them, those whose delay exceeded the transfer + "
                                  "max(1.5 ms, transfer / 4) (machine.formulas.counted_waits)"),
    Column("schedule_gap_s", "s", "the schedule's own work between two blocks of a rank "
                                  "(overhead.launch_overhead: the launch's median)"),
    Column("step_edges_s", "s", "a step's time before its first block and after its last"),
    Column("step_waits_model_s", "s", "what the counted waits, each priced at scheduler_wait_s "
                                      "where it happened, add to the modelled step"),
    Column("step_waits_measured_s", "s", "what the counted waits took of the median step, read "
                                         "off its timeline (messages.wait_share_s)"),
    Column("block_flop", "FLOP", "one stage's forward + backward of one microbatch, 6 x "
                                 "(layers / P) x microbatch_size x hidden^2 (rates.add_rates)"),
    Column("block_flop_per_s", "FLOP/s", "block_flop / slot_time_s: a stage's compute rate in "
                                         "the step"),
    Column("block_alone_flop_per_s", "FLOP/s", "the same rate from the blocks that ran alone "
                                               "(block_times' alone_s; None where no rank's "
                                               "every kind did)"),
    Column("block_samples_per_s", "samples/s", "microbatch_size / slot_time_s"),
    Column("matmul_n", "", "n of the n x n product with as many operations as one of a "
                           "block's: (microbatch_size x hidden^2)^(1/3)"),
    Column("matmul_n_read", "", "the n the profile's rate is read at: matmul_n, or the nearest "
                                "size the profile measured"),
    Column("matmul_flop_per_s", "FLOP/s", "the machine profile's matrix product at matmul_n, "
                                          "one rank alone"),
    Column("matmul_together_flop_per_s", "FLOP/s", "the same with every rank computing at "
                                                   "once"),
    Column("matches_single_process", "", "output and gradients equal one process running "
                                          "every layer (absent with check off)"),
    Column("max_output_diff", "", "largest |output - single-process output|"),
    Column("max_grad_diff", "", "largest |gradient - single-process gradient|"),
    Column("blocks", "", "the last timed step's F/B (and W) blocks on one clock from the step's "
                         "start: rank, stage, kind, microbatch, start_s, end_s"),
    Column("peak_activation_bytes", "bytes",
           "stage 0's (rank 0's) most saved-activation bytes alive at once in a timed step "
           "(labkit.memory.SavedActivations: what autograd saves for backward, each storage once, "
           "without the weights and the batch), the largest over the timed steps"),
    Column("peak_activation_bytes_formula", "bytes",
           "what the schedule makes stage 0 hold at once (activations.peak_activation_formula): "
           "GPipe M microbatches, 1F1B min(P, M), interleaved and zero_bubble replayed from "
           "their ideal schedule, each (layers of the stage) x b/M x hidden x 4 bytes"),
    *DEVICE_MEMORY_COLUMNS,
)

#: the table ``labkit pipeline`` prints
TABLE_COLUMNS = ("schedule", "num_stages", "num_microbatches", "recv_ahead", "microbatch_size",
                 "step_ms",
                 "predicted_ms", "step_error_pct", "slot_ms", "bubble_fill_drain",
                 "bubble_formula", "idle_other", "bubble_measured", "matches_single_process",
                 "oversubscribed")

FORMULA_LINE = ("fill/drain bubble = idle waiting for another rank's compute, read off the "
                "timeline; formula (P−1)/(P−1+M), interleaved (P−1)/(V·M+P−1), zero_bubble "
                "(P−1)/(P−1+3M)\npredicted step = M·t_slot/(1 − formula) = (M+P−1)·t_slot; "
                "bubble_measured = 1 − Σ busy / (P × step time)")

OVERSUBSCRIBED_NOTE = ("note: oversubscribed (more rank-threads than cores): ranks take turns "
                       "on cores, so idle time is not only the pipeline's bubble")


def bubble_table(df) -> str:
    """The table ``labkit pipeline`` prints: the formulas, one line per (schedule, P, M) with
    the measured and predicted step, t_slot, the fill/drain bubble beside the formula, the rest
    of the idle time, and per (schedule, P) which M gave the shortest step and why."""
    import io

    from labkit.tables import print_frame

    out = io.StringIO()
    shown = df.assign(step_ms=df.step_time_s * 1e3, predicted_ms=df.step_time_predicted_s * 1e3,
                      step_error_pct=df.step_time_error_pct, slot_ms=df.slot_time_s * 1e3)
    print(FORMULA_LINE, file=out)
    print_frame(shown, TABLE_COLUMNS, file=out)
    for (s, p), part in main_rows(df).groupby(["schedule", "num_stages"], sort=False):
        print(verdicts.bubble_sentence(part, s, num_stages=p), file=out)
        if part.num_microbatches.nunique() > 1 and "step_time_model_s" in part:
            print(verdicts.best_m_sentence(part, s, num_stages=p), file=out)
    if (df.recv_ahead == False).any() and (df.recv_ahead == True).any():  # noqa: E712
        for line in recv_ahead_table(df).itertuples(index=False):
            print(verdicts.recv_ahead_sentence(line), file=out)
    return out.getvalue().rstrip("\n")


def main_rows(df):
    """The rows of the main measurement: without those measured with the other receive
    placement only for the side-by-side comparison (``compared_placement``).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": ["gpipe", "gpipe", "zero_bubble"], "num_stages": 2,
    ...                    "num_microbatches": 4, "recv_ahead": [True, False, None],
    ...                    "compared_placement": [False, True, False]})
    >>> main_rows(df).recv_ahead.tolist()
    [True, None]
    """
    if "compared_placement" not in df:
        return df
    return df[df.compared_placement != True]  # noqa: E712 - None and NaN count as False


def recv_ahead_table(*frames):
    """Each schedule measured with torch's receive placement and with every receive posted
    ahead (:mod:`labkit.pipeline.ahead`), one line per (schedule, P, M) that has both: the step,
    t_slot, the predicted step's error and the idle time outside the fill and drain, each way.
    The rows may come in several frames.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": 8,
    ...                    "recv_ahead": [False, True], "step_time_s": [0.24, 0.18],
    ...                    "slot_time_s": [0.020, 0.019], "step_time_error_pct": [-21.0, -6.0],
    ...                    "idle_other": [0.17, 0.06]})
    >>> recv_ahead_table(df).iloc[0, 3:].astype(float).round(2).tolist()
    [240.0, 180.0, 20.0, 19.0, -21.0, -6.0, 0.17, 0.06]
    """
    import pandas as pd

    from labkit.errors import UsageError

    rows = pd.concat(frames, ignore_index=True)
    part = rows[rows.recv_ahead.notna()]

    def error(r):  # the step model's where it was added (add_model), else the t_slot formula's
        return getattr(r, "step_model_error_pct", r.step_time_error_pct)

    lines = []
    for (s, p, m), g in part.groupby(["schedule", "num_stages", "num_microbatches"], sort=False):
        ways = {bool(r.recv_ahead): r for r in g.itertuples()}
        if len(ways) < 2:
            continue
        line = {"schedule": s, "num_stages": p, "num_microbatches": m}
        for field, get in (("step_ms", lambda r: r.step_time_s * 1e3),
                           ("slot_ms", lambda r: r.slot_time_s * 1e3),
                           ("error_pct", error),
                           ("idle_other", lambda r: r.idle_other)):
            line.update({f"{field}_torch": get(ways[False]), f"{field}_ahead": get(ways[True])})
        lines.append(line)
    if not lines:
        raise UsageError("no (schedule, P, M) was measured both with and without recv_ahead")
    return pd.DataFrame(lines)


def conventions(df):
    """The two ways of writing the bubble side by side, formula and measured, per row: share
    of the step ((P−1)/(P−1+M)) and time over the ideal step ((P−1)/M)."""
    cols = ["schedule", "num_stages", "num_microbatches", "bubble_formula", "bubble_fill_drain",
            "bubble_over_ideal_formula", "bubble_over_ideal_measured"]
    return df[cols].rename(columns={
        "bubble_formula": "share (P-1)/(P-1+M)", "bubble_fill_drain": "share measured",
        "bubble_over_ideal_formula": "over ideal (P-1)/M",
        "bubble_over_ideal_measured": "over ideal measured"})


def model_inputs(row, machine) -> dict:
    """What the step model reads off the machine profile for one row: the co-run slowdown with
    k = 1..P ranks computing at once (the profile's training-step slowdown, times k/cores
    beyond the cores), one activation's one-way transfer with the cores busy (float32: 4 bytes
    a number; a message that waited for nothing) and the scheduler wait of a message that did.
    ``machine``: a :class:`labkit.machine.Profile` (or anything with its
    ``compute_slowdown``, ``transfer_s`` and ``scheduler_wait_s``).

    >>> class Machine:
    ...     scheduler_wait_s = 3.6e-3
    ...     def compute_slowdown(self, ranks): return 1.0 if ranks == 1 else 1.25 * ranks / 2
    ...     def transfer_s(self, size_bytes, *, measurement, busy): return 1e-4 + size_bytes / 1e9
    >>> got = model_inputs({"num_stages": 2, "microbatch_size": 16, "hidden": 1024}, Machine())
    >>> got["slowdown"], round(got["transfer_s"] * 1e6, 1), got["scheduler_wait_s"]
    ({1: 1.0, 2: 1.25}, 165.5, 0.0036)
    """
    p = int(row["num_stages"])
    size = 4 * row["microbatch_size"] * row["hidden"]
    return {"slowdown": {k: float(machine.compute_slowdown(k)) for k in range(1, p + 1)},
            "transfer_s": float(machine.transfer_s(size, measurement="message", busy=True)),
            "scheduler_wait_s": float(machine.scheduler_wait_s)}


def add_model(df, machine):
    """``df`` with the step model's columns (``step_time_model_s``, ``step_model_error_pct``,
    ``corun_slowdown``, ``message_transfer_s``, ``scheduler_wait_s``, ``messages``,
    ``messages_waited``, ``step_waits_model_s``, ``step_waits_measured_s``, ``schedule_gap_s``,
    ``step_edges_s``): each row's alone blocks (``block_times``) replayed in its schedule
    (:func:`labkit.pipeline.schedules.model_step`) with the profile's co-run slowdown and
    transfer, its scheduler wait on each message that waited in the row's median step
    (:func:`labkit.pipeline.messages.row_waits`), and the schedule's own work, the same for
    every row: a gap between blocks and beside each message, and the step's edges
    (:mod:`labkit.pipeline.overhead`).
    ``bubble_model``: the fill/drain share of that replayed step, read as a measured one is
    (:func:`labkit.pipeline.formulas.timeline_split`)."""
    from labkit.book.laws import symmetric_error_pct
    from labkit.pipeline.formulas import alone_seconds, timeline_split
    from labkit.pipeline.messages import row_waits
    from labkit.pipeline.overhead import launch_overhead
    from labkit.pipeline.schedules import model_blocks, model_step

    cols = {k: [] for k in ("step_time_model_s", "step_model_error_pct", "bubble_model",
                            "corun_slowdown",
                            "message_transfer_s", "scheduler_wait_s", "messages",
                            "messages_waited", "step_waits_model_s", "step_waits_measured_s",
                            "schedule_gap_s", "step_edges_s")}
    records = df.to_dict("records")
    own = launch_overhead(records)
    for row in records:
        got = model_inputs(row, machine)
        p = int(row["num_stages"])
        waits = row_waits(row, transfer_s=got["transfer_s"])
        at = {k: got["scheduler_wait_s"] for k in (waits["waited"] if waits else {})}
        kw = dict(alone=alone_seconds(row["block_times"], slowdown=got["slowdown"][p]),
                  slowdown=got["slowdown"], message_s=got["transfer_s"],
                  virtual_stages=int(row["virtual_stages"]), gap_s=own["gap_s"])
        args = (row["schedule"], p, int(row["num_microbatches"]))
        blocks = model_blocks(*args, wait_s=at, **kw)
        replayed = max(b["end_s"] for b in blocks)
        # a wait off the critical path adds nothing, but the two replays add their blocks in
        # another order: their difference can read -1e-18 s
        added = max(0.0, replayed - model_step(*args, **kw)) if at else 0.0
        t = replayed + own["edges_s"]
        for k, v in (("step_time_model_s", t),
                     ("step_model_error_pct", symmetric_error_pct(t, row["step_time_s"])),
                     ("bubble_model", timeline_split(blocks, step_end_s=t)["bubble_share"]),
                     ("corun_slowdown", got["slowdown"][p]),
                     ("message_transfer_s", got["transfer_s"]),
                     ("scheduler_wait_s", got["scheduler_wait_s"]),
                     ("messages", waits["messages"] if waits else None),
                     ("messages_waited", waits["count"] if waits else None),
                     ("step_waits_model_s", added),
                     ("step_waits_measured_s", waits["measured_s"] if waits else None),
                     ("schedule_gap_s", own["gap_s"]), ("step_edges_s", own["edges_s"])):
            cols[k].append(v)
    return df.copy().assign(**cols)


def counted(r) -> bool:
    """Whether a row's messages were counted (:func:`add_model` on a row with
    ``step_messages``); a row read back into a DataFrame has NaN for None."""
    n = getattr(r, "messages", None)
    return n is not None and n == n


def step_split(r) -> dict:
    """A row's measured step taken apart from its timeline (per rank, averaged), in ms:
    compute, the fill/drain bubble, and the other idle time (messages, the scheduler's work,
    waits). The median step's own split (``step_split_s``) where the row has it, else the
    median shares times the step. Where :func:`add_model` counted the messages that waited,
    the other idle time splits in two: what those scheduler waits took
    (``step_waits_measured_s``) and the rest (transfers, other waits).

    >>> import pandas as pd
    >>> r = pd.Series({"step_time_s": 0.1, "compute_share": 0.7, "bubble_fill_drain": 0.2,
    ...                "idle_other": 0.1})
    >>> {k: round(float(v), 6) for k, v in step_split(r).items()}
    {'compute': 70.0, 'fill/drain bubble': 20.0, 'messages and other waits': 10.0}
    >>> r = pd.concat([r, pd.Series({"messages": 16, "step_waits_measured_s": 0.004})])
    >>> {k: round(float(v), 6) for k, v in step_split(r).items()}
    {'compute': 70.0, 'fill/drain bubble': 20.0, 'scheduler waits (counted)': 4.0, 'transfers and other waits': 6.0}
    """
    got = getattr(r, "step_split_s", None)
    if isinstance(got, dict):
        out = {k: v * 1e3 for k, v in got.items()}
    else:
        step = r.step_time_s * 1e3
        out = {"compute": r.compute_share * step, "fill/drain bubble": r.bubble_fill_drain * step,
               "messages and other waits": r.idle_other * step}
    if not counted(r):
        return out
    other = out.pop("messages and other waits")
    waits = min(float(r.step_waits_measured_s) * 1e3, other)
    return {**out, "scheduler waits (counted)": waits, "transfers and other waits": other - waits}


def step_note(r) -> str:
    """The note of a step law: the profile's numbers the model used, the schedule's own work
    it read off the launch's timelines, and what it counted.

    >>> import pandas as pd
    >>> r = pd.Series({"corun_slowdown": 1.25, "message_transfer_s": 2e-4, "messages": 16,
    ...                "messages_waited": 3, "scheduler_wait_s": 3.6e-3,
    ...                "step_waits_model_s": 7.1e-3, "step_waits_measured_s": 6.8e-3,
    ...                "schedule_gap_s": 6.5e-4, "step_edges_s": 2.1e-3})
    >>> print(step_note(r))
    co-run slowdown 1.25, transfer 0.20 ms a message (the profile's, cores busy), 0.65 ms of the schedule's own work before each block and 2.1 ms at the step's edges (the launch's timelines); 3 of 16 messages waited for the scheduler in the median step (counted from its timeline), priced at the profile's 3.6 ms each where they waited: +7.1 ms on the predicted step (measured: 6.8 ms of the step)
    """
    from labkit.book import laws

    head = (f"co-run slowdown {r.corun_slowdown:.2f}, transfer {r.message_transfer_s * 1e3:.2f} "
            "ms a message (the profile's, cores busy)")
    if laws.given(getattr(r, "schedule_gap_s", None)):
        head += (f", {r.schedule_gap_s * 1e3:.2f} ms of the schedule's own work before each "
                 f"block and {r.step_edges_s * 1e3:.1f} ms at the step's edges (the launch's "
                 "timelines)")
    if not counted(r):
        return head + "; scheduler waits not counted (the row holds no per-message timeline)"
    return (head + f"; {int(r.messages_waited)} of {int(r.messages)} messages waited for the "
            "scheduler in the median step (counted from its timeline), priced at the profile's "
            f"{r.scheduler_wait_s * 1e3:.1f} ms each where they waited: "
            f"+{r.step_waits_model_s * 1e3:.1f} ms on the predicted step (measured: "
            f"{r.step_waits_measured_s * 1e3:.1f} ms of the step)")


def step_laws(df, schedules=None, tolerance_pct: float = STEP_TOLERANCE_PCT) -> list[dict]:
    """One law-table row per (schedule, M): the step model on this machine (alone blocks, the
    profile's co-run slowdown and transfers, the scheduler waits counted in the median step:
    :func:`add_model`) against the measured step, with the measured step's split
    (:func:`step_split`) and what the model counted (:func:`step_note`)."""
    from labkit.book import laws

    return [laws.check(f"step model, {r.schedule} P={r.num_stages} M={r.num_microbatches}",
                       predicted=r.step_time_model_s * 1e3, measured=r.step_time_s * 1e3,
                       kind="model", unit="ms", tolerance_pct=tolerance_pct,
                       split=step_split(r), note=step_note(r))
            for r in select_rows(df, schedule=schedules).itertuples()]


def best_m_laws(df, schedules=None, tolerance_pct: float = STEP_TOLERANCE_PCT) -> list[dict]:
    """Per (schedule, P) with several M: the measured step at the M the model calls best
    against the best measured step (what choosing M by the model costs), and the sentence
    (:func:`labkit.pipeline.verdicts.best_m_sentence`) judges by the same row."""
    from labkit.book import laws

    rows = []
    for (s, p), part in select_rows(df, schedule=schedules).groupby(["schedule", "num_stages"],
                                                                    sort=False):
        if part.num_microbatches.nunique() < 2:
            continue
        pick = part.loc[part.step_time_model_s.idxmin()]
        best = part.loc[part.step_time_s.idxmin()]
        rows.append(laws.check(
            f"step at the model's best M, {s} P={p}", predicted=pick.step_time_s * 1e3,
            measured=best.step_time_s * 1e3, kind="model", unit="ms",
            tolerance_pct=tolerance_pct, split=step_split(best),
            note=f"model's best M = {pick.num_microbatches}, measured best M = "
                 f"{best.num_microbatches}; the split: the best measured step's"))
    return rows


def schedule_blocks(df, schedule: str, num_stages: int, num_microbatches: int):
    """The F/B blocks of one (schedule, P, M) row as a DataFrame (rank, stage, kind,
    microbatch, start_s, end_s), for :func:`labkit.pipeline.plots.schedule_diagram`."""
    import pandas as pd

    return pd.DataFrame(_row(df, schedule, num_stages, num_microbatches)["blocks"])


def ideal_blocks(df, schedule: str, num_stages: int, num_microbatches: int):
    """The ideal schedule of one row (:func:`labkit.pipeline.schedules.simulate`) with that
    row's forward time and t_slot (backward, and W, the rest of t_slot), in seconds: what the
    measured blocks would be with free messages, equal stages and steady compute."""
    import pandas as pd

    from labkit.pipeline.schedules import simulate

    r = _row(df, schedule, num_stages, num_microbatches)
    v = int(r.virtual_stages)
    forward = r.forward_time_s * v  # one microbatch through a rank's V chunks
    return pd.DataFrame(simulate(schedule, num_stages, num_microbatches, virtual_stages=v,
                                 forward_s=forward,
                                 backward_s=max(r.slot_time_s - forward, 0.0)))


def _row(df, schedule, num_stages, num_microbatches):
    from labkit.errors import UsageError

    sel = select_rows(df, schedule=schedule, num_stages=num_stages,
                      num_microbatches=num_microbatches)
    if sel.empty:
        have = sorted({(r.schedule, r.num_stages, r.num_microbatches) for r in df.itertuples()})
        raise UsageError(f"no row for {schedule} P={num_stages} M={num_microbatches} (have {have})")
    return sel.iloc[-1]
