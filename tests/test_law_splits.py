"""Every kind of model law carries a measured split that adds (or multiplies) up to its
measurement: collective transfers (their fastest call), ratios (their measured factors or
terms), bubbles (the schedule, the stages' unequal means, unequal blocks within a stage, the
messages and waits, the other steps)."""

from __future__ import annotations

import math

import pytest

from labkit import metrics
from labkit.book import laws
from labkit.collectives import context, regimes, verdicts
from labkit.cp import verdicts as cp_verdicts
from labkit.machine import formulas as machine_formulas
from labkit.perfmodel import modelcheck
from labkit.pipeline import imbalance, schedules
from labkit.solve import memory


def _calls(times):
    """A timeline of two ranks whose call k took ``times[k]`` on rank 1 (rank 0 half that)."""
    out, t = [], 0.0
    for k, d in enumerate(times, 1):
        out += [{"rank": 0, "call": k, "start_s": t, "end_s": t + d / 2},
                {"rank": 1, "call": k, "start_s": t, "end_s": t + d}]
        t += d
    return out


def _sweep(sizes, per_size):
    rows = []
    for s, times in zip(sizes, per_size):
        rows.append({"op": "all_reduce", "world_size": 2, "size_bytes": s,
                     "time_p50_s": sorted(times)[len(times) // 2],
                     "time_p10_s": min(times), "transfer_s": machine_formulas.transfer_of(times),
                     "timeline_s": _calls(times)})
    return rows


def test_a_transfer_split_is_its_fastest_call_and_the_rest_and_sums():
    times = [1.0e-3, 1.2e-3, 1.1e-3, 6e-3]
    split = machine_formulas.transfer_split(times)
    assert split["fastest call"] == pytest.approx(1.0)
    assert sum(split.values()) == pytest.approx(machine_formulas.transfer_of(times) * 1e3)
    assert machine_formulas.transfer_split([]) is None
    assert machine_formulas.fastest_split(transfer_s=1e-3, fastest_s=math.nan) is None


def test_the_regimes_of_transfers_split_each_law_by_the_fastest_call():
    sizes = [8, 512, 32768, 1 << 20, 4 << 20, 16 << 20]
    base = [1e-3, 3e-4, 9e-4, 1.2e-3, 4e-3, 16e-3]  # a scattered floor, then a line
    per_size = [[t, 1.1 * t, 1.05 * t, 3 * t] for t in base]
    reg = regimes.of_rows(_sweep(sizes, per_size))
    assert reg.statistic == "transfer" and len(reg.fastests) == len(sizes)
    s, t = reg.sizes[-1], reg.times[-1]
    split = reg.split(s, t)
    assert split["fastest call"] == pytest.approx(16.0)
    assert sum(split.values()) == pytest.approx(t * 1e3)
    assert reg.latency_sizes
    floor = reg.floor_split()
    assert sum(floor.values()) == pytest.approx(reg.floor_s * 1e3)
    # the line law's split is the same fastest call: a miss prints it and it sums
    law = verdicts.line_law(reg)
    assert laws.split_sums(law)


def test_the_context_laws_split_the_idle_transfer_and_the_busy_p50():
    times = [2e-3, 2.2e-3, 2.1e-3, 9e-3]
    rows = [{**r, "busy_time_p50_s": 3e-3, "busy_time_p10_s": 2.5e-3, "busy_matmuls": 4,
             "busy_transfer_s": 2.6e-3, "busy_timeline_s": _calls([2.5e-3, 2.6e-3, 2.7e-3])}
            for r in _sweep([2 << 20], [times])]

    class Prof:
        world_size = 2
        rows = [{"measurement": "allreduce", "context": c, "size_bytes": 2 << 20,
                 "time_p50_s": 4e-3, "wait_share": 0.1} for c in ("idle", "busy")]

        def transfer_s(self, size, *, ranks=2, busy=False, steady=False):
            return 5e-3 if busy else 4e-3

    ctx = context.in_context(rows, Prof(), ranks=2)
    idle, busy = context.context_laws(ctx, ranks=2)
    assert not idle["holds"] and laws.split_sums(idle)
    assert idle["split"]["fastest call"] == pytest.approx(2.0)
    assert not busy["holds"] and laws.split_sums(busy)
    assert busy["split"]["fastest call"] == pytest.approx(2.5)


def test_a_product_split_multiplies_to_its_measurement():
    split = metrics.ratio_split(ranks=2, base_s=10.0, compute_s=12.0, step_s=30.0)
    law = laws.check("2 ranks vs no DDP", predicted=1.5, measured=2 * 10.0 / 30.0,
                     split=split, split_op="product")
    assert not law["holds"] and laws.split_sums(law)
    assert " x " in laws.verdict(law)
    assert metrics.ratio_split(ranks=2, base_s=None, compute_s=1.0, step_s=1.0) is None
    assert "N" not in metrics.ratio_split(base_s=2.0, compute_s=1.0, step_s=1.5)  # TP: T(1)/T(P)
    with pytest.raises(ValueError, match="split_op"):
        laws.check("x", predicted=1, measured=1, split={"a": 1}, split_op="ratio")


def test_the_solve_co_run_slowdown_splits_into_its_parts():
    row = {"share_alone_compute_per_iteration_s": 2e-3,
           "share_together_compute_per_iteration_s": 2.8e-3,
           "share_alone_spmv_per_iteration_s": 1.5e-3,
           "share_together_spmv_per_iteration_s": 1.9e-3}
    split = memory.slowdown_split(row)
    assert sum(split.values()) == pytest.approx(1.4)
    assert split["the SpMV beside the others"] == pytest.approx(0.2)
    assert memory.slowdown_split({**row, "share_alone_spmv_per_iteration_s": None}) is None


def test_the_cp_compute_ratio_splits_into_blocks_and_the_rest():
    row = {"compute_alone_per_rank_s": [3e-3, 2e-3]}
    split = cp_verdicts.compute_split(row, {"blocks_s": [2.2e-3, 1.4e-3]})
    assert sum(split.values()) == pytest.approx(1.5)
    assert split["its extra blocks at their time alone"] == pytest.approx(0.4)


def _simulated(schedule, p, m, slow_stage=None):
    """An ideal schedule's blocks, stage ``slow_stage``'s forwards twice as long."""
    blocks = schedules.simulate(schedule, num_stages=p, num_microbatches=m, forward_s=1.0,
                                backward_s=2.0)
    if slow_stage is None:
        return blocks
    orders = {}
    for b in sorted(blocks, key=lambda b: b["start_s"]):
        d = (b["end_s"] - b["start_s"]) * (2 if b["stage"] == slow_stage and b["kind"] == "F"
                                            else 1)
        orders.setdefault(b["rank"], []).append((b["kind"], b["stage"], b["microbatch"], d))
    from labkit.pipeline.formulas import ideal_replay

    placed = ideal_replay(orders, last_stage=p - 1)
    return [{"rank": r, "stage": s, "kind": k, "microbatch": mb, "start_s": a, "end_s": z}
            for r, order in orders.items() for i, (k, s, mb, _) in enumerate(order)
            for a, z in [placed[(r, i)]]]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_bubble_splits_into_the_schedule_unequal_blocks_and_the_other_steps(schedule):
    even = _simulated(schedule, 2, 4)
    step = max(b["end_s"] for b in even)
    split = imbalance.bubble_split(even, step_s=step, measured=0.26, over="compute")
    assert split["the schedule, equal blocks"] == pytest.approx(0.25)  # (P-1)/M
    assert split["the stages' unequal means"] == pytest.approx(0.0, abs=1e-9)
    assert split["unequal blocks within a stage"] == pytest.approx(0.0, abs=1e-9)
    assert sum(split.values()) == pytest.approx(0.26)
    assert imbalance.stage_bubble(even) == pytest.approx(0.25)
    uneven = _simulated(schedule, 2, 4, slow_stage=1)
    step = max(b["end_s"] for b in uneven)
    split = imbalance.bubble_split(uneven, step_s=step, measured=0.3, over="step")
    # rank 0 waits through stage 1's longer forwards: the stages' means, each block at its own
    assert split["the stages' unequal means"] > 0.0
    assert split["unequal blocks within a stage"] == pytest.approx(0.0, abs=1e-9)
    assert sum(split.values()) == pytest.approx(0.3)
    by_compute = imbalance.bubble_split(uneven, step_s=step, measured=0.3, over="compute")
    assert imbalance.stage_bubble(uneven) == pytest.approx(
        by_compute["the schedule, equal blocks"] + by_compute["the stages' unequal means"])
    assert imbalance.stage_bubble(uneven) > 0.25
    assert imbalance.bubble_split(None, step_s=1.0, measured=0.3, over="step") is None


def test_the_3d_lab_bubble_and_collective_laws_carry_their_splits():
    import pandas as pd

    blocks = _simulated("1f1b", 2, 4, slow_stage=1)
    check = pd.DataFrame([
        {"lab": "pipeline", "what": "1f1b", "num_stages": 2, "num_microbatches": 4,
         "quantity": "bubble_fraction", "measured": 0.3, "model": 0.2,
         "split": imbalance.bubble_split(blocks, step_s=max(b["end_s"] for b in blocks),
                                         measured=0.3, over="step")},
        {"lab": "collectives", "what": "all_reduce", "world_size": 2, "size_bytes": 1 << 20,
         "quantity": "time_s", "measured": 2e-3, "model": 1e-3, "fastest_s": 1.5e-3,
         "statistic": "transfer", "calls": 8, "calls_waited": 0, "wait_share": 0.0,
         "scheduler_wait_s": 3e-3, "in_context_s": 1e-3, "measured_p50_s": 2e-3}])
    rows = modelcheck.check_laws(check)
    assert all(not r["holds"] and laws.split_sums(r) for r in rows)


def test_the_ddp_choice_law_splits_the_wrong_side_into_measured_factors():
    import pandas as pd

    from labkit.ddp.report import _choice_split

    frame = pd.DataFrame({"no_ddp_ms": [10.0, 20.0], "measured_compute_ms": [12.0, 22.0],
                          "measured_ms": [30.0, 25.0], "predicted": [1.2, 0.9]})
    chose_ddp = _choice_split(frame, 0, 2)  # DDP chosen, measured 2 x 10 / 30 = 0.667
    assert math.prod(chose_ddp.values()) == pytest.approx(2 * 10 / 30)
    chose_one = _choice_split(frame, 1, 2)  # the one process chosen where DDP ran 1.6x
    assert math.prod(chose_one.values()) == pytest.approx(25 / (2 * 20))
    assert _choice_split(frame, None, 2) is None


def test_busbw_at_the_largest_size_splits_into_the_top_beta_and_two_ratios():
    sizes = [8, 512, 32768, 1 << 20, 4 << 20, 16 << 20]
    base = [1e-3, 3e-4, 9e-4, 1.2e-3, 4e-3, 16e-3]
    reg = regimes.of_rows(_sweep(sizes, [[t, 1.1 * t, 1.05 * t] for t in base]))
    rows = verdicts.sweep_laws(reg)
    busbw = next(r for r in rows if r["law"].startswith("busbw"))
    assert busbw["split_op"] == "product"
    assert laws.split_total(busbw) == pytest.approx(busbw["measured"])


def test_a_co_run_time_splits_into_the_work_alone_and_the_slowdown_measured():
    split = metrics.slowdown_split(alone_s=0.040, together_s=0.050)
    law = laws.check("compute on 2 ranks", predicted=56.0, measured=50.0, unit="ms",
                     split=split, split_op="product")
    assert laws.split_sums(law) and laws.split_total(law) == pytest.approx(50.0)
    assert metrics.slowdown_split(alone_s=0.0, together_s=0.05) is None


def test_a_launch_splits_into_the_slowest_ranks_start_to_joined_and_the_rest():
    from labkit.checks import verdicts as checks_verdicts

    law = checks_verdicts.launch_cost_law(world_size=2, one_rank_s=1.2, measured_s=2.0, cores=2,
                                          slowdown=1.1, ready_s=1.5)
    assert not law["holds"] and laws.split_sums(law)
    assert checks_verdicts.launch_cost_law(world_size=2, one_rank_s=1.2, measured_s=2.0,
                                           cores=2)["split"] is None


def test_the_scheduler_wait_law_splits_into_the_shortest_wait_and_the_rest():
    from labkit.collectives import waits

    w = {"calls": 40, "waited": 5, "share": 0.125, "excess_s": [2e-3, 3e-3, 6e-3, 7e-3, 8e-3]}
    law = waits.wait_law(w, predicted_s=3.5e-3, ranks=2)
    assert not law["holds"] and laws.split_sums(law)
    assert law["split"]["the shortest wait"] == pytest.approx(2.0)


def test_the_over_ideal_law_predicts_with_the_stages_as_they_ran():
    """Stage 1's forwards twice as long: (P-1)/M misses the measured bubble over ideal, the
    schedule replayed with the stages' means predicts it; a row without its median step's
    blocks is judged against the formula."""
    import pandas as pd

    blocks = _simulated("gpipe", 2, 4, slow_stage=1)
    measured = imbalance.bubble_split(blocks, step_s=max(b["end_s"] for b in blocks),
                                      measured=0.0, over="compute")
    measured = sum(v for k, v in measured.items() if k != "the other steps")
    row = {"schedule": "gpipe", "num_stages": 2, "num_microbatches": 4,
           "bubble_over_ideal_formula": 0.25, "bubble_over_ideal_measured": measured,
           "median_step_blocks": blocks, "step_time_s": max(b["end_s"] for b in blocks)}
    (law,) = imbalance.over_ideal_laws(pd.DataFrame([row]))
    assert law["holds"] and law["predicted"] == pytest.approx(measured)
    assert "the stages as they ran" in law["law"] and "(P−1)/M says 0.250" in law["note"]
    assert abs(0.25 - measured) > 0.05  # the formula alone would miss
    (plain,) = imbalance.over_ideal_laws(pd.DataFrame([{**row, "median_step_blocks": None}]))
    assert plain["predicted"] == 0.25 and not plain["holds"]


def test_a_bubble_tells_the_stages_means_from_the_spread_within_a_stage():
    """1F1B, stage 0's first forward twice its others: the stages' means carry part of the
    bubble, the first forward's own excess the rest (its term > 0), and the over-ideal law's
    prediction is the first two terms."""
    import pandas as pd

    blocks = _simulated("1f1b", 2, 4)
    first = next(b for b in blocks if (b["stage"], b["kind"], b["microbatch"]) == (0, "F", 0))
    orders = {}
    for b in sorted(blocks, key=lambda b: b["start_s"]):
        d = (b["end_s"] - b["start_s"]) * (2 if b is first else 1)
        orders.setdefault(b["rank"], []).append((b["kind"], b["stage"], b["microbatch"], d))
    from labkit.pipeline.formulas import ideal_replay

    placed = ideal_replay(orders, last_stage=1)
    spread = [{"rank": r, "stage": st, "kind": k, "microbatch": mb, "start_s": a, "end_s": z}
              for r, order in orders.items() for i, (k, st, mb, _) in enumerate(order)
              for a, z in [placed[(r, i)]]]
    step = max(b["end_s"] for b in spread)
    split = imbalance.bubble_split(spread, step_s=step, measured=0.3, over="compute")
    assert split["the stages' unequal means"] > 0.0
    assert split["unequal blocks within a stage"] > 0.0
    assert sum(split.values()) == pytest.approx(0.3)
    row = {"schedule": "1f1b", "num_stages": 2, "num_microbatches": 4,
           "bubble_over_ideal_formula": 0.25, "bubble_over_ideal_measured": 0.3,
           "median_step_blocks": spread, "step_time_s": step}
    (law,) = imbalance.over_ideal_laws(pd.DataFrame([row]))
    assert law["predicted"] == pytest.approx(split["the schedule, equal blocks"]
                                             + split["the stages' unequal means"])
    assert laws.split_sums(law)


def test_a_weight_pass_recorded_inside_its_backward_counts_its_own_part():
    """Zero bubble's W stamped from 0.5 s inside the block before it (its B, or a forward):
    the replays read each block's own part, as the timeline split does, so the bubble is the
    schedule's, (P-1)/(3M), not that of W passes 0.5 s longer."""
    apart = schedules.simulate("zero_bubble", num_stages=2, num_microbatches=4, forward_s=1.0,
                               backward_s=2.0)
    assert imbalance.stage_bubble(apart) == pytest.approx(1 / 12)  # (P-1)/(3M)
    nested = [dict(b, start_s=b["start_s"] - 0.5) if b["kind"] == "W" else b for b in apart]
    assert imbalance.stage_bubble(nested) == pytest.approx(1 / 12)
    split = imbalance.bubble_split(nested, step_s=max(b["end_s"] for b in nested),
                                   measured=1 / 12, over="compute")
    assert all(v == pytest.approx(0.0, abs=1e-9) for k, v in split.items()
               if k != "the schedule, equal blocks")


def test_the_replays_refuse_what_they_cannot_read():
    blocks = _simulated("gpipe", 2, 2)
    with pytest.raises(ValueError, match="durations"):
        imbalance.replayed_bubble(blocks, durations="alone")
    with pytest.raises(ValueError, match="over"):
        imbalance.stage_bubble(blocks, over="comp")
    with pytest.raises(ValueError, match="blocks"):
        imbalance.stage_bubble([])
    assert imbalance.stage_bubble(blocks, over="step") == pytest.approx(1 / 3)  # (P-1)/(P-1+M)
