"""Notebook 09's step models with each collective priced as its transfer plus the scheduler
waits counted in the row's own median step (labkit.tp.waits): the TP lab's (teaching version,
sequence parallelism, the library without a timeline) and the FSDP lab's (ZeRO-1, ZeRO-2,
FSDP; DDP without a timeline), on synthetic rows and a synthetic two-kind machine profile. The
wait term is count x the profile's wait, the count comes from the row's timeline, a law holds
on a measurement that is transfers + counted waits and fails on one that is not. No launch."""

from __future__ import annotations

import pytest

from labkit.book import laws
from labkit.fsdp import model as fsdp_model
from labkit.fsdp import verdicts as fsdp_verdicts
from labkit.machine import Profile
from labkit.tp import library as tp_library
from labkit.tp import verdicts as tp_verdicts
from labkit.tp import waits

from ._waits_profile import WAIT_S, profile

PROF = profile()
TP_EACH = 8 * 32 * 256 * 4  # one all-reduced activation: b s h x 4 bytes
TP_NAMES = ("g L0 attn", "g L0 mlp", "g L1 attn", "g L1 mlp", "f L1 mlp", "f L1 attn",
            "f L0 mlp", "f L0 attn")


def _calls(durations, names, cats, *, skew_s: float = 2e-3) -> list[dict]:
    """Two ranks' collectives as a timeline: rank 1 enters each ``skew_s`` after rank 0 (rank
    0 waits for it there: not the message's time); each lasts ``durations[i]`` after that on
    both ranks."""
    out = []
    for i, (d, name, cat) in enumerate(zip(durations, names, cats)):
        start = 0.02 * i
        out += [{"rank": 0, "name": name, "cat": cat, "start_s": start,
                 "end_s": start + skew_s + d},
                {"rank": 1, "name": name, "cat": cat, "start_s": start + skew_s,
                 "end_s": start + skew_s + d}]
    return out


def _tp_timeline(waited=(), *, extra_s: float = WAIT_S) -> list[dict]:
    t = PROF.transfer_s(TP_EACH)
    return _calls([t + (extra_s if i in waited else 0.0) for i in range(8)], TP_NAMES,
                  ["all-reduce"] * 8)


def _tp_row(**kw) -> dict:
    row = {"variant": "naive", "world_size": 2, "hidden": 256, "num_heads": 8, "seq_len": 32,
           "batch_size": 8, "num_layers": 2, "bytes_per_allreduce": TP_EACH,
           "allreduce_calls_formula": 8, "allreduce_calls_measured": 8,
           "comm_bytes_formula": 8 * TP_EACH, "comm_bytes_measured": 8 * TP_EACH,
           "params_per_rank_formula": 10, "params_per_rank": 10, "backend": "gloo",
           "predicted_compute_s": 0.054, "compute_time_p50_s": 0.066, "timeline_step": 2}
    return {**row, **kw}


def _tp_measured(row, ctx, *, messages_s: float) -> dict:
    """The row's step measured as the model's compute plus ``messages_s`` inside the
    all-reduces (no wait for the later rank in the average)."""
    return {**row, "allreduce_message_in_step_s": messages_s, "allreduce_wait_in_step_s": 0.0,
            "allreduce_time_in_step_s": messages_s,
            "step_time_p50_s": ctx["compute_s"] + messages_s}


# ---------------------------------------------------------------- TP

def test_tp_count_comes_from_the_timeline_and_the_wait_term_is_count_x_wait():
    row = _tp_row(timeline_s=_tp_timeline(waited=(0, 2, 4)))
    ctx = tp_verdicts.context(row, PROF)
    assert ctx["waits"]["count"] == 3 and ctx["waits"]["calls"] == 8
    assert ctx["waits"]["waited"] == ["g L0 attn", "g L1 attn", "f L1 mlp"]
    assert ctx["scheduler_wait_s"] == pytest.approx(PROF.scheduler_wait_s)
    assert ctx["waits_s"] == pytest.approx(3 * PROF.scheduler_wait_s)
    # each all-reduce at its transfer (peers idle), not at the profile's average in context
    assert ctx["allreduce_s"] == pytest.approx(PROF.transfer_s(TP_EACH))
    assert ctx["transfers_s"] == pytest.approx(8 * PROF.transfer_s(TP_EACH))
    assert ctx["comm_s"] == pytest.approx(ctx["transfers_s"] + ctx["waits_s"])
    # the wait for the later rank (rank 0 entering 2 ms early) is not counted as a wait
    assert tp_verdicts.context(_tp_row(timeline_s=_tp_timeline()), PROF)["waits"]["count"] == 0


def test_tp_laws_hold_on_transfers_plus_counted_waits_and_fail_without_them():
    waited = (0, 2, 4)
    row = _tp_row(timeline_s=_tp_timeline(waited=waited))
    ctx = tp_verdicts.context(row, PROF)
    truth = 8 * PROF.transfer_s(TP_EACH) + len(waited) * WAIT_S
    rows = tp_verdicts.naive_laws(_tp_measured(row, ctx, messages_s=truth), PROF)
    inside = next(r for r in rows if "time inside" in r["law"])
    step = next(r for r in rows if ": step =" in r["law"])
    assert inside["holds"] and step["holds"] and inside["kind"] == step["kind"] == "model"
    assert "3 of 8 all-reduces waited for the scheduler in the median step" in inside["note"]
    # the split takes what the counted waits took apart from the messages, and still sums
    assert inside["split"][tp_verdicts.WAITS_TERM] == pytest.approx(len(waited) * WAIT_S * 1e3)
    assert sum(inside["split"].values()) == pytest.approx(inside["measured"])
    assert sum(step["split"].values()) == pytest.approx(step["measured"])
    # the same measured step, but a timeline in which no message waited: transfers alone
    quiet = {**_tp_measured(row, ctx, messages_s=truth), "timeline_s": _tp_timeline()}
    rows = tp_verdicts.naive_laws(quiet, PROF)
    inside = next(r for r in rows if "time inside" in r["law"])
    assert not inside["holds"] and inside["predicted"] == pytest.approx(
        8 * PROF.transfer_s(TP_EACH) * 1e3)
    assert tp_verdicts.WAITS_TERM not in inside["split"]


def _every_step(waited_per_step) -> list[dict]:
    """Every timed step's all-reduces (:func:`labkit.tp.waits.call_messages_s`'s form): step
    k's calls at their transfer, those in ``waited_per_step[k]`` a scheduler wait longer."""
    t = PROF.transfer_s(TP_EACH)
    return [{"cat": "all-reduce", "message_s": t + (WAIT_S if i in waited else 0.0)}
            for waited in waited_per_step for i in range(8)]


def test_tp_time_inside_counts_the_waits_of_every_timed_step_as_it_is_their_mean():
    # five timed steps: 0, 1, 3, 1 and 1 waits (6 in all, 1.2 a step); the median step's 3
    steps = [(), (2,), (0, 2, 4), (1,), (5,)]
    row = _tp_row(timeline_s=_tp_timeline(waited=(0, 2, 4)), collective_calls_s=_every_step(steps),
                  step_times_s=[0.07] * 5)
    ctx = tp_verdicts.context(row, PROF)
    assert ctx["waits"]["count"] == 3  # the median step's, for the step law
    assert (ctx["every"]["count"], ctx["every"]["per_step"]) == (6, 1.2)
    assert ctx["inside_s"] == pytest.approx(ctx["transfers_s"] + 1.2 * PROF.scheduler_wait_s)
    mean = 8 * PROF.transfer_s(TP_EACH) + 1.2 * WAIT_S  # the mean step's time inside
    inside = next(r for r in tp_verdicts.naive_laws(_tp_measured(row, ctx, messages_s=mean), PROF)
                  if "time inside" in r["law"])
    assert inside["holds"] and "6 of the 40 all-reduces of the 5 timed steps" in inside["note"]
    assert inside["split"][tp_verdicts.WAITS_TERM] == pytest.approx(1.2 * WAIT_S * 1e3)
    assert laws.split_sums(inside)
    # the step law counts the median step's three waits, and its split shows those
    step = next(r for r in tp_verdicts.naive_laws(_tp_measured(row, ctx, messages_s=mean), PROF)
                if ": step =" in r["law"])
    assert "in the median step" in step["note"]
    assert step["split"][tp_verdicts.WAITS_TERM] == pytest.approx(
        min(3 * WAIT_S, mean - ctx["transfers_s"]) * 1e3)  # beyond the transfers, at most
    # against the median step's three waits the same mean would have missed
    alone = {k: v for k, v in row.items() if k != "collective_calls_s"}
    miss = next(r for r in tp_verdicts.naive_laws(_tp_measured(alone, ctx, messages_s=mean), PROF)
                if "time inside" in r["law"])
    assert not miss["holds"] and "in the median step" in miss["note"]
    assert "1.2 scheduler waits a step (counted over the 5 timed steps)" in \
        tp_verdicts.inside_sentence(_tp_measured(row, ctx, messages_s=mean), PROF)


def test_tp_time_inside_prices_its_waits_at_the_profiles_idle_calls():
    # busy calls that waited twice as long as idle ones: the pooled price lies between
    busy_longer = [dict(r, wait_excess_s=[2 * WAIT_S] * len(r["wait_excess_s"]))
                   if r.get("context") == "busy" and r.get("wait_excess_s") else r
                   for r in PROF.rows]
    prof = Profile.from_rows(busy_longer, source="synthetic")
    assert prof.scheduler_wait_in_s(busy=False) == pytest.approx(WAIT_S)
    assert prof.scheduler_wait_in_s(busy=True) == pytest.approx(2 * WAIT_S)
    assert prof.scheduler_wait_s == pytest.approx(2 * WAIT_S)  # more busy calls waited
    row = _tp_row(timeline_s=_tp_timeline(waited=(0, 2, 4)),
                  collective_calls_s=_every_step([(), (2,), (0, 2, 4), (1,), (5,)]),
                  step_times_s=[0.07] * 5)
    ctx = tp_verdicts.context(row, prof)
    assert ctx["inside_s"] == pytest.approx(ctx["transfers_s"] + 1.2 * WAIT_S)
    assert ctx["waits_s"] == pytest.approx(3 * 2 * WAIT_S)  # the step law's: pooled
    assert "priced at 3.6 ms each (the profile's calls that waited with the peers idle)" in \
        tp_verdicts.inside_note(ctx)


def test_tp_speedup_law_carries_the_counted_waits():
    one = _tp_row(world_size=1, allreduce_calls_formula=0, predicted_compute_s=0.09)
    quiet, noisy = (_tp_row(timeline_s=_tp_timeline(waited=w), speedup_vs_1_rank=1.1)
                    for w in ((), (0, 1, 2, 3)))
    assert tp_verdicts.predicted_speedup(one, noisy, PROF) < \
        tp_verdicts.predicted_speedup(one, quiet, PROF)
    assert "4 of 8 all-reduces waited" in tp_verdicts.speedup_law(one, noisy, PROF)["note"]


def test_tp_library_without_a_timeline_is_priced_at_the_average_and_says_so():
    row = _tp_row(variant="library", step_time_p50_s=0.08)
    ctx = tp_verdicts.context(row, PROF)
    assert ctx["waits"] is None and ctx["waits_s"] == 0.0
    assert ctx["allreduce_s"] == pytest.approx(PROF.allreduce_s(TP_EACH, busy=False))
    assert ctx["allreduce_s"] == pytest.approx(PROF.transfer_s(TP_EACH)
                                               + PROF.wait_share() * PROF.scheduler_wait_s)
    law = tp_library.library_laws(row, PROF, bookkeeping=0.01)[-1]
    assert "no timeline" in law["note"] and "average in context" in law["note"]


def test_tp_library_takes_the_teaching_versions_waits_a_step():
    # the teaching version's five timed steps counted 6 waits (1.2 a step): the library's
    # step, whose collectives are unstamped, is priced with its transfers and 1.2 waits
    steps = [(), (2,), (0, 2, 4), (1,), (5,)]
    naive = _tp_row(timeline_s=_tp_timeline(waited=(0, 2, 4)), step_time_p50_s=0.07,
                    collective_calls_s=_every_step(steps), step_times_s=[0.07] * 5)
    assert tp_library.borrowed_waits(naive, PROF) == pytest.approx(1.2)
    lib = _tp_row(variant="library")
    alone = tp_verdicts.context(lib, PROF)
    ctx = tp_verdicts.context(lib, PROF, waits_per_step=1.2)
    assert ctx["borrowed"] == 1.2 and ctx["allreduce_s"] == pytest.approx(PROF.transfer_s(TP_EACH))
    assert ctx["waits_s"] == pytest.approx(1.2 * PROF.scheduler_wait_s)
    assert ctx["step_s"] - alone["step_s"] == pytest.approx(
        1.2 * PROF.scheduler_wait_s - 8 * PROF.wait_share() * PROF.scheduler_wait_s)
    # a library step that took the teaching model's step, those waits and DTensor's own work
    # holds, its note saying whose waits it counted
    measured = ctx["step_s"] + 0.01  # DTensor's own work, 10 ms
    row = {**lib, "step_time_p50_s": measured}
    law = tp_library.library_laws(row, PROF, bookkeeping=0.01, naive=naive)[-1]
    assert law["holds"] and "the teaching version's waits, 1.2 a step" in law["note"]
    assert laws.split_sums(law)
    # a row with its own timeline keeps its own count
    assert tp_verdicts.context(naive, PROF, waits_per_step=9.0)["borrowed"] is None
    # the summary table and the figure price the library's row so too, from the teaching row
    # of the same P and shape, and only from that one
    import pandas as pd

    rows = pd.DataFrame([naive, row])
    got = tp_library.model_context(rows.iloc[1], rows, PROF, bookkeeping=0.01)
    assert got["borrowed"] == pytest.approx(1.2)
    assert got["step_s"] == pytest.approx(ctx["step_s"] + 0.01)
    other = pd.DataFrame([{**naive, "hidden": 2 * naive["hidden"]}, row])
    assert tp_library.model_context(other.iloc[1], other, PROF)["borrowed"] is None


def test_tp_sequence_parallel_counts_each_operation_against_its_transfer():
    t = PROF.transfer_s(TP_EACH)
    # gloo: an all-gather about an all-reduce, a reduce-scatter about two
    durations = [t, 2 * t, t, 2 * t + WAIT_S, PROF.transfer_s(12288)]
    cats = ["all-gather", "reduce-scatter", "all-gather", "reduce-scatter", "all-reduce"]
    names = ["AG L0 attn", "RS L0 attn", "AG L0 mlp", "RS L0 mlp", "AR LN + bias grads"]
    row = _tp_row(variant="sp", allreduce_calls_formula=1, allreduce_bytes_formula=12288,
                  allgather_calls_formula=2, reduce_scatter_calls_formula=2,
                  timeline_s=_calls(durations, names, cats))
    ctx = tp_verdicts.context(row, PROF)
    # the reduce-scatter at twice the all-reduce's transfer moved at its pace; the other waited
    assert ctx["waits"]["waited"] == ["RS L0 mlp"]
    assert ctx["transfers_s"] == pytest.approx(PROF.transfer_s(12288) + 2 * t + 2 * 2 * t)
    assert ctx["comm_s"] == pytest.approx(ctx["transfers_s"] + PROF.scheduler_wait_s)


def test_tp_sentences_flip_with_the_count():
    noisy = _tp_row(timeline_s=_tp_timeline(waited=(1, 5)))
    text = tp_verdicts.waits_sentence(noisy, PROF)
    assert text.startswith("2 of the 8 collectives of the median timed step (step 2) waited")
    assert "g L0 mlp, f L1 attn" in text and "scheduler's next turn" in text
    quiet = tp_verdicts.waits_sentence(_tp_row(timeline_s=_tp_timeline()), PROF)
    assert quiet.startswith("none of the 8 collectives")
    assert "not counted" in tp_verdicts.waits_sentence(_tp_row(), PROF)
    ctx = tp_verdicts.context(noisy, PROF)
    fits = _tp_measured(noisy, ctx, messages_s=ctx["comm_s"])
    far = _tp_measured(noisy, ctx, messages_s=3 * ctx["comm_s"])
    assert "within 25%" in tp_verdicts.inside_sentence(fits, PROF)
    assert "2 scheduler waits counted" in tp_verdicts.inside_sentence(fits, PROF)
    assert "more than 25%" in tp_verdicts.inside_sentence(far, PROF)


def test_a_timeline_whose_ranks_disagree_is_refused():
    tl = _tp_timeline()
    with pytest.raises(ValueError, match="same collectives"):
        waits.call_messages(tl[:-1])


# ---------------------------------------------------------------- FSDP, ZeRO-1/2, DDP

UNIT = (12 * 64 * 64 + 13 * 64) * 4  # one layer's parameter bytes at h = 64


def _dp_row(stage="zero3", variant="fsdp", **kw) -> dict:
    row = {"variant": variant, "stage": stage, "world_size": 2, "hidden": 64, "num_layers": 2,
           "reshard_after_forward": True, "predicted_compute_s": 0.05, "backend": "gloo",
           "device": "cpu", "compute_time_p50_s": 0.062, "collectives_time_alone_s": 0.006,
           "timeline_step": 3, "state_bytes_formula": 1000.0, "state_bytes_per_rank": 1000}
    return {**row, **kw}


def _fsdp_timeline(waited=()) -> list[dict]:
    """FSDP's six collectives of a 2-layer step, in the order they run, each at its transfer
    on gloo (the cores idle: each holds the rank's thread), + a wait for those in ``waited``."""
    t = PROF.transfer_s(UNIT)
    order = [("AG L0 (fwd)", "all-gather", t), ("AG L1 (fwd)", "all-gather", t),
             ("AG L1 (bwd)", "all-gather", t), ("RS L1", "reduce-scatter", 2 * t),
             ("AG L0 (bwd)", "all-gather", t), ("RS L0", "reduce-scatter", 2 * t)]
    return _calls([d + (WAIT_S if i in waited else 0.0) for i, (_, _, d) in enumerate(order)],
                  [n for n, _, _ in order], [c for _, c, _ in order])


def _dp_measured(row, ctx, *, comm_s: float) -> dict:
    return {**row, "step_time_p50_s": ctx["compute_s"] + comm_s}


def _step_laws(rows) -> list[dict]:
    return [r for r in fsdp_verdicts.laws(rows, [], PROF) if ": step =" in r["law"]]


def test_fsdp_count_comes_from_the_timeline_and_the_wait_term_is_count_x_wait():
    row = _dp_row(timeline_s=_fsdp_timeline(waited=(1, 5)))
    ctx = fsdp_model.context(row, PROF)
    t = PROF.transfer_s(UNIT)  # idle: FSDP2 on a CPU holds the rank's thread
    assert ctx["transfers_s"] == pytest.approx(4 * t + 2 * 2 * t)
    assert ctx["waits"]["count"] == 2 and ctx["waits"]["waited"] == ["AG L1 (fwd)", "RS L0"]
    assert ctx["waits_s"] == pytest.approx(2 * PROF.scheduler_wait_s)
    assert ctx["comm_s"] == pytest.approx(ctx["transfers_s"] + ctx["waits_s"])


def test_dp_step_laws_hold_on_transfers_plus_counted_waits_and_fail_without_them():
    t, whole = PROF.transfer_s(UNIT), PROF.transfer_s(2 * UNIT)
    zero1 = [2 * whole + WAIT_S, whole]  # the reduce-scatter (two transfers) waited
    names, cats = ["RS all layers", "AG all layers"], ["reduce-scatter", "all-gather"]
    # little compute, so that the collectives decide whether a law holds
    rows = [_dp_row(predicted_compute_s=0.004, timeline_s=_fsdp_timeline(waited=(1, 5))),
            _dp_row("zero1", "zero1", predicted_compute_s=0.004,
                    timeline_s=_calls(zero1, names, cats))]
    truth = [8 * t + 2 * WAIT_S, 3 * whole + WAIT_S]
    measured = [_dp_measured(r, fsdp_model.context(r, PROF), comm_s=c)
                for r, c in zip(rows, truth)]
    steps = _step_laws(measured)
    assert all(r["holds"] and r["kind"] == "model" for r in steps)
    assert "2 of 6 collectives waited for the scheduler" in steps[0]["note"]
    assert "1 of 2 collectives waited" in steps[1]["note"]
    for r, ctx in zip(steps, (fsdp_model.context(m, PROF) for m in measured)):
        assert r["predicted"] == pytest.approx(r["measured"])  # transfers + counted waits
        assert ctx["waits_s"] == pytest.approx(ctx["waits"]["count"] * PROF.scheduler_wait_s)
        assert laws.split_sums(r) and tp_verdicts.WAITS_TERM in r["split"]
        assert sum(r["split"].values()) == pytest.approx(r["measured"])
    # the same measured steps, with timelines in which nothing waited: transfers alone miss
    quiet = [{**measured[0], "timeline_s": _fsdp_timeline()},
             {**measured[1], "timeline_s": _calls([2 * whole, whole], names, cats)}]
    assert [fsdp_model.context(r, PROF)["waits"]["count"] for r in quiet] == [0, 0]
    assert not any(r["holds"] for r in _step_laws(quiet))
    assert all(tp_verdicts.WAITS_TERM not in r["split"] for r in _step_laws(quiet))


def test_ddp_without_a_timeline_is_priced_at_the_average_and_says_so():
    row = _dp_row("ddp", "ddp")
    ctx = fsdp_model.context(row, PROF)
    assert ctx["waits"] is None and ctx["waits_s"] == 0.0
    # one all-reduce of the gradients during backward: busy, at its average in context
    assert ctx["comm_s"] == pytest.approx(PROF.allreduce_s(2 * UNIT, busy=True))
    law = _step_laws([_dp_measured(row, ctx, comm_s=ctx["comm_s"])])[0]
    assert law["holds"] and "C++ reducer" in law["note"]
    assert "average in context" in fsdp_verdicts.step_sentence(
        _dp_measured(row, ctx, comm_s=ctx["comm_s"]), PROF)


def test_dp_sentences_flip_with_the_count():
    noisy = _dp_row(timeline_s=_fsdp_timeline(waited=(0,)), step_time_p50_s=0.09)
    text = fsdp_verdicts.waits_sentence(noisy, PROF)
    assert text.startswith("fsdp: 1 of the 6 collectives of the median timed step (step 3)")
    assert "(AG L0 (fwd))" in text
    quiet = _dp_row(timeline_s=_fsdp_timeline(), step_time_p50_s=0.09)
    assert "none of the 6 collectives" in fsdp_verdicts.waits_sentence(quiet, PROF)
    assert "1 scheduler wait counted in the median step" in fsdp_verdicts.step_sentence(noisy,
                                                                                         PROF)
    assert "0 scheduler waits counted" in fsdp_verdicts.step_sentence(quiet, PROF)
