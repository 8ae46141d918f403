"""The DDP step model with each bucket's all-reduce as its transfer plus the scheduler waits
counted in the row's median step (labkit.ddp.waits), and the standalone all-reduce's law on
transfers, on synthetic rows and a synthetic two-kind machine profile. No launch."""

from __future__ import annotations

import pytest

from labkit.book import laws
from labkit.ddp import formulas, predict, waits

from ._waits_profile import WAIT_S, profile

PROF = profile()
BUCKETS = [4 << 20] * 4
GRAD = sum(BUCKETS)


def _intervals(durations, *, start=0.03) -> list:
    """One step's buckets launched 15 ms apart (one after the other), each lasting its
    ``durations[i]``."""
    return [[start + 15e-3 * i, start + 15e-3 * i + d] for i, d in enumerate(durations)]


def _rows(step_s: float, durations, *, steps=(1.1, 1.0, 0.9, 1.2)) -> list[dict]:
    """A no-DDP row (5 ms) and a 2-rank DDP row of four buckets on a CPU without a spare core,
    whose timed steps are ``step_s`` times ``steps``: the median is the second (1.0), whose
    buckets took ``durations``; the others' buckets all waited."""
    common = {"model": "mlp", "batch_size": 16, "device": "cpu", "grad_bytes": GRAD,
              "cores": 2, "threads_per_rank": 1}
    waited_all = [PROF.transfer_s(b) + WAIT_S for b in BUCKETS]
    return [{**common, "variant": "no_ddp", "world_size": 1, "step_time_p50_s": 0.005},
            {**common, "variant": "ddp", "world_size": 2, "nproc_per_node": 2,
             "bucket_bytes": BUCKETS, "step_time_p50_s": step_s,
             "step_times_s": [step_s * f for f in steps],
             "comm_intervals_s": [_intervals(durations if f == 1.0 else waited_all)
                                  for f in steps]}]


def _model(rows) -> dict:
    return predict.add_prediction_columns(formulas.add_scaling_columns(rows), profile=PROF)[-1]


def test_the_count_comes_from_the_median_steps_timeline():
    transfers = [PROF.transfer_s(b) for b in BUCKETS]
    durations = [transfers[0] + WAIT_S, transfers[1], transfers[2] + 2 * WAIT_S, transfers[3]]
    (row,) = _rows(0.05, durations)[1:]
    assert waits.median_step(row) == 1
    got = waits.count(row, transfers)
    assert (got["step"], got["buckets"], got["count"]) == (1, 4, 2)
    assert got["waited"] == [True, False, True, False]
    assert got["excess_s"] == pytest.approx(3 * WAIT_S)
    assert waits.count({**row, "comm_intervals_s": None}, transfers) is None
    assert waits.count(row, transfers[:2]) is None  # not the same buckets


def test_the_wait_term_is_count_x_wait_and_the_law_holds_on_transfers_plus_waits():
    transfers = [PROF.transfer_s(b) for b in BUCKETS]
    durations = [transfers[0] + WAIT_S, transfers[1], transfers[2] + WAIT_S,
                 transfers[3] + WAIT_S]
    guess = _model(_rows(0.05, durations))
    assert (guess["allreduces_counted"], guess["allreduces_waited"]) == (4, 3)
    assert guess["model_scheduler_waits_s"] == pytest.approx(3 * PROF.scheduler_wait_s)
    assert guess["model_transfers_s"] == pytest.approx(sum(transfers))
    assert guess["model_comm_s"] == pytest.approx(sum(transfers) + 3 * WAIT_S)
    # no spare core: every all-reduce exposed, one after the other
    want = (0.005 * PROF.compute_slowdown(2) + 4 * GRAD / PROF.copy_bytes_per_s(together=True)
            + sum(transfers) + 3 * WAIT_S)
    assert guess["predicted_step_time_s"] == pytest.approx(want)
    # a measured step that is transfers + the counted waits: the law holds
    row = _model(_rows(want, durations))
    law = laws.check(
        "DDP step", predicted=row["predicted_step_time_s"], measured=row["step_time_p50_s"],
        note=waits.step_note(row))
    assert law["holds"]
    assert "3 of 4 all-reduces waited for the scheduler in the median step" in law["note"]
    assert row["allreduce_waits_measured_s"] == pytest.approx(3 * WAIT_S)
    split = predict.measured_split(row, scale=1e3)
    assert split[predict.WAITS_TERM] == pytest.approx(3 * WAIT_S * 1e3)
    # as long a step whose median timeline shows no wait: transfers only, and it misses
    quiet = _model(_rows(want, transfers))
    assert quiet["allreduces_waited"] == 0 and quiet["model_scheduler_waits_s"] == 0.0
    assert abs(quiet["predicted_step_error_pct"]) > 25
    # without a timeline nothing is counted and the note says so
    bare = _rows(want, durations)
    bare[1].pop("comm_intervals_s")
    assert _model(bare)["allreduces_counted"] is None
    assert "no all-reduce's wait was counted" in waits.step_note(_model(bare))


def test_without_a_spare_core_only_the_time_after_backward_counts():
    """Four buckets launched during backward on a rank whose one core runs it: their waits for
    that core cost nothing the model does not count (one job after the other); after
    backward's last gradient each is judged from the completion before it (one scheduler wait
    delays every bucket in flight at once: it is counted once). The third took a tick more."""
    t = PROF.transfer_s(BUCKETS[0])
    end = 0.020
    spans = [[0.005, end + t], [0.008, end + 2 * t], [0.012, end + 3 * t + WAIT_S],
             [0.015, end + 4 * t + WAIT_S]]
    row = {"step_times_s": [0.05], "timeline_backward_end_s": [end],
           "comm_intervals_s": [spans]}
    got = waits.count(row, [t] * 4, spare_core=False)
    assert got["waited"] == [False, False, True, False]
    assert got["excess_s"] == pytest.approx(WAIT_S)
    # the buckets completed during backward: nothing left for the step to pay
    early = {**row, "comm_intervals_s": [[[0.005, 0.010], [0.008, end + t]]]}
    assert waits.bucket_times(early["comm_intervals_s"][0], backward_end_s=end) == \
        [0.0, pytest.approx(t)]
    # from their launches (a spare core), the first took far longer than a transfer
    assert waits.count(row, [t] * 4, spare_core=True)["waited"][0]


def test_a_spare_core_hides_transfers_first_then_waits():
    def two_ms(size, busy):
        return 2e-3

    kw = dict(compute_alone_s=0.1, slowdown=1.0, copy_s=0.0, bucket_bytes=[1e6] * 4,
              transfer_s=two_ms, waited=[True, True, True, True], wait_s=WAIT_S)
    spare = predict.step_in_context(**kw, spare_core=True)
    # a window of 2/3 x 100 ms x 3/4 = 50 ms hides the three during-backward all-reduces whole
    assert spare["exposed_transfers_s"] == pytest.approx(2e-3)
    assert spare["exposed_waits_s"] == pytest.approx(WAIT_S)
    shared = predict.step_in_context(**kw, spare_core=False)
    assert shared["exposed_waits_s"] == pytest.approx(4 * WAIT_S)
    assert shared["waits_s"] == pytest.approx(4 * WAIT_S)
    with pytest.raises(ValueError, match="one waited flag per bucket"):
        predict.step_in_context(**{**kw, "waited": [True]}, spare_core=False)


def test_the_waits_sentence_flips_with_the_count():
    transfers = [PROF.transfer_s(b) for b in BUCKETS]
    some = waits.waits_sentence(_model(_rows(0.05, [transfers[0] + WAIT_S, *transfers[1:]])))
    assert some.startswith("1 of the median step's 4 all-reduces waited for the scheduler")
    assert "(the profile's 3.6 ms a wait)" in some and "The model adds 3.6 ms for it" in some
    none = waits.waits_sentence(_model(_rows(0.05, transfers)))
    assert none.startswith("none of the median step's 4 all-reduces waited")


def test_the_standalone_all_reduce_law_compares_transfers():
    t = PROF.transfer_s(GRAD)
    # a call of 17 ms waited when it took 4.2 ms (a quarter of it) more: two did
    calls = [t * 1.02, t * 0.99, t + 1.5 * WAIT_S, t * 1.01, t + 1.6 * WAIT_S]
    row = {"grad_bytes": GRAD, "allreduce_times_s": calls}
    law = waits.allreduce_law(row, PROF, ranks=2)
    assert law["holds"] and law["kind"] == "model" and law["unit"] == "ms"
    assert law["predicted"] == pytest.approx(t * 1e3)
    assert "2 of 5 calls (40%) waited for the scheduler" in law["note"]
    # the calls' p50 would have judged a transfer the waits inflated; the p10 does not move
    assert law["measured"] < sorted(calls)[2] * 1e3
    # a profile whose transfer is half the calls' fails
    slow = {**row, "allreduce_times_s": [2 * c for c in calls]}
    assert not waits.allreduce_law(slow, PROF, ranks=2)["holds"]


def test_the_split_counts_an_all_reduce_slower_in_the_step_than_standalone():
    """A step whose one all-reduce took 10 ms after backward where its standalone transfer took
    5 ms and the count saw no wait (under the profile's 9 ms + threshold): the split carries the
    5 ms as its own term, so it sums to the step; without a timeline that term is 0 and the
    rest of the step holds it."""
    row = {"step_time_p50_s": 0.0286, "nosync_step_time_p50_s": 0.0116,
           "bucket_copy_time_p50_s": 0.0028, "grad_bytes": 16.8e6, "bucket_bytes": [16.8e6],
           "allreduce_fit_bytes": [16.8e6], "allreduce_fit_times_s": [0.0097],
           "allreduce_fit_transfers_s": [0.0052], "allreduce_waits_measured_s": 0.0,
           "rank_step_times_s": [[0.0286], [0.0285]], "step_times_s": [0.0286],
           "timeline_backward_end_s": [0.0085], "comm_intervals_s": [[[0.0096, 0.0196]]]}
    split = predict.measured_split(row, scale=1e3)
    assert split[predict.SLOWER_TERM] == pytest.approx(10.0 - 5.2)
    law = laws.check("DDP step", predicted=20.0, measured=28.6, unit="ms", split=split)
    assert not law["holds"] and laws.split_sums(law)
    assert sum(split.values()) == pytest.approx(28.6)
    # without a timeline that slower time is not timed apart: the rest holds it too, and the
    # split still sums to the step
    bare = {k: v for k, v in row.items() if k != "comm_intervals_s"}
    short = predict.measured_split(bare, scale=1e3)
    assert short[predict.SLOWER_TERM] == 0.0
    assert short[predict.REST_TERM] == pytest.approx(split[predict.REST_TERM] + 10.0 - 5.2)
    assert sum(short.values()) == pytest.approx(28.6)
    assert laws.split_sums(laws.check("DDP step", predicted=20.0, measured=28.6, unit="ms",
                                      split=short))
    # a step shorter than its terms: backward hid part of the all-reduce, a negative rest
    hid = predict.measured_split({**bare, "step_time_p50_s": 0.0166}, scale=1e3)
    assert hid[predict.REST_TERM] < 0 and sum(hid.values()) == pytest.approx(16.6)


def _outside_row(*, launch_ms, shared=False, other_ms=0.0):
    """A 2-rank DDP row of one bucket (1 ms all-reduce) whose five timed steps' launches took
    ``launch_ms``; the median step is the first. ``shared``: the bucket launched during
    backward, whose median step then ran 2 ms longer. ``other_ms``: rank 1's median step that
    much longer than rank 0's."""
    ends = [5e-3 + (2e-3 if shared and j == 0 else 0.0) for j in range(5)]
    spans = [[[(4e-3 if shared else e) + x * 1e-3, e + x * 1e-3 + 1e-3]]
             for e, x in zip(ends, launch_ms)]
    stops = [s[0][1] + 1e-3 for s in spans]
    rank0 = list(stops)
    return {"step_times_s": [stops[0] + other_ms * 1e-3, 0.001, 0.002, 0.1, 0.2],
            "timeline_backward_start_s": [1e-3] * 5, "timeline_backward_end_s": ends,
            "timeline_step_end_s": stops, "comm_intervals_s": spans,
            "rank_step_times_s": [rank0, [rank0[0] + other_ms * 1e-3, *rank0[1:]]]}


def test_waits_outside_the_all_reduces_are_counted_where_they_happened():
    late = _outside_row(launch_ms=[4.6, 0.1, 0.2, 0.1, 0.2])
    got = waits.outside(late)
    assert (got["count"], got["where"]) == (1, ["rank 0: launch"])
    assert got["excess_s"] == pytest.approx(4.4e-3)  # beyond the median launch, 0.2 ms
    assert waits.outside(_outside_row(launch_ms=[0.2] * 5))["count"] == 0
    # another rank's step 3 ms longer than rank 0's in the median step: one more wait
    both = waits.outside(_outside_row(launch_ms=[4.6, 0.1, 0.2, 0.1, 0.2], other_ms=3.0))
    assert both["where"] == ["rank 0: launch", "another rank after the all-reduces"]
    # 1 ms longer: within the margin
    assert waits.outside(_outside_row(launch_ms=[0.2] * 5, other_ms=1.0))["count"] == 0
    # backward beside an all-reduce launched during it is not judged
    assert waits.outside(_outside_row(launch_ms=[0.2] * 5, shared=True))["count"] == 0
    assert waits.outside({**late, "timeline_step_end_s": None}) is None


def test_the_outside_waits_are_priced_in_the_step_and_said():
    kw = dict(compute_alone_s=0.01, slowdown=1.0, copy_s=0.0, bucket_bytes=[1e6],
              transfer_s=lambda size, busy: 1e-3, spare_core=False, wait_s=WAIT_S)
    base = predict.step_in_context(**kw)
    more = predict.step_in_context(**kw, outside_waits=2)
    assert more["outside_waits_s"] == pytest.approx(2 * WAIT_S)
    assert more["step_s"] - base["step_s"] == pytest.approx(2 * WAIT_S)
    row = {"allreduces_counted": 1, "allreduces_waited": 0, "scheduler_wait_s": WAIT_S,
           "outside_waits": 1, "outside_waits_where": ["rank 0: launch"],
           "model_outside_waits_s": WAIT_S, "outside_waits_measured_s": 4.4e-3}
    assert "Outside the all-reduces, 1 part of the median step waited too (rank 0: launch" \
        in waits.waits_sentence(row)
    assert "1 part of it outside them (rank 0: launch)" in waits.step_note(row)
    quiet = {**row, "outside_waits": 0}
    assert "Outside" not in waits.waits_sentence(quiet) and "outside" not in waits.step_note(quiet)
    split = predict.measured_split({"step_time_p50_s": 0.02, "outside_waits_measured_s": 4.4e-3},
                                   scale=1e3)
    assert split[predict.OUTSIDE_TERM] == pytest.approx(4.4)


def test_a_rank_always_slower_is_imbalance_not_a_wait():
    row = _outside_row(launch_ms=[0.2] * 5)
    row["rank_step_times_s"] = [row["rank_step_times_s"][0],
                                [t + 3e-3 for t in row["rank_step_times_s"][0]]]
    assert waits.outside(row)["count"] == 0
    # step times that do not line up with the ranks' lists: that part is not judged
    odd = {**row, "rank_step_times_s": [[0.01] * 4, [0.02] * 4]}
    assert waits.outside(odd)["count"] == 0
    assert waits.outside({**row, "rank_step_times_s": float("nan")})["count"] == 0


def test_a_launch_that_waited_adds_one_wait_to_the_predicted_step_and_its_sentence():
    common = {"model": "mlp", "batch_size": 16, "device": "cpu", "grad_bytes": 1 << 20,
              "cores": 2, "threads_per_rank": 1}

    def model(timeline):
        rows = [{**common, "variant": "no_ddp", "world_size": 1, "step_time_p50_s": 0.005},
                {**common, "variant": "ddp", "world_size": 2, "nproc_per_node": 2,
                 "bucket_bytes": [1 << 20], "step_time_p50_s": 0.012,
                 "nosync_step_time_p50_s": 0.005, "bucket_copy_time_p50_s": 5e-4,
                 "allreduce_fit_bytes": [1 << 20], "allreduce_fit_times_s": [1e-3], **timeline}]
        return _model(rows)

    late, quiet = model(_outside_row(launch_ms=[4.6, 0.1, 0.2, 0.1, 0.2])), \
        model(_outside_row(launch_ms=[0.2] * 5))
    assert (late["outside_waits"], late["outside_waits_where"]) == (1, ["rank 0: launch"])
    assert quiet["outside_waits"] == 0
    assert late["model_outside_waits_s"] == pytest.approx(PROF.scheduler_wait_s)
    assert late["predicted_step_time_s"] - quiet["predicted_step_time_s"] == \
        pytest.approx(PROF.scheduler_wait_s)
    said = waits.waits_sentence(late)
    assert f"the model adds {PROF.scheduler_wait_s * 1e3:.1f} ms for it; it took 4.4 ms" in said
    assert "Outside" not in waits.waits_sentence(quiet)
    split = predict.measured_split(late, scale=1e3)
    assert split[predict.OUTSIDE_TERM] == pytest.approx(4.4)
    assert sum(split.values()) == pytest.approx(12.0)
