"""The CP pass model with its K/V exchanges as transfers plus the scheduler waits counted in
the row's median pass (labkit.cp.exchanges), and each rank's compute as fixed work + its blocks
at their kinds' times alone (labkit.cp.formulas.rank_compute), on synthetic rows and a
synthetic two-kind machine profile. No launch."""

from __future__ import annotations

import pytest

from labkit.book import laws
from labkit.cp import exchanges, formulas, verdicts

from ._waits_profile import WAIT_S, profile

PROF = profile()
KV = 131072


def _timeline(transfer: float, *, forward_wait=0.0, backward_wait=0.0) -> list[dict]:
    """A pass of two ranks: each posts its K/V block (0.1 ms), computes 2 ms of blocks (the
    transfer hides behind them) and then waits for the block: a sliver, or ``forward_wait``
    on rank 1; in the backward rank 0 posts the gradients 1 ms before rank 1 (it had fewer
    blocks: that wait is rank 1's compute, not the message), which arrive a transfer after
    rank 1's posting, ``backward_wait`` later."""
    tl = []
    for r in (0, 1):
        tl += [{"rank": r, "thread": "compute", "name": "post K/V", "direction": "forward",
                "ring_step": 0, "start_s": 0.0, "end_s": 1e-4},
               {"rank": r, "thread": "compute", "name": "F0", "direction": "forward",
                "ring_step": 0, "start_s": 1e-4, "end_s": 2.1e-3},
               {"rank": r, "thread": "compute", "name": "wait K/V", "direction": "forward",
                "ring_step": 0, "start_s": 2.1e-3,
                "end_s": 2.11e-3 + (forward_wait if r == 1 else 0.0)}]
    for r, posted in ((0, 5e-3), (1, 6e-3)):
        tl.append({"rank": r, "thread": "compute", "name": "wait grad K/V 0",
                   "direction": "backward", "ring_step": 0, "start_s": posted,
                   "end_s": 6e-3 + transfer + backward_wait})
    return tl


def test_what_an_exchange_cost_a_rank_leaves_out_the_compute_and_the_later_posting():
    t = PROF.transfer_s(KV, measurement="message", busy=True)
    times = exchanges.exchange_times(_timeline(t), 2)
    assert [(x["direction"], x["ring_step"]) for x in times] == [("forward", 0),
                                                                  ("backward", 0)]
    # the forward: its posting and a sliver of wait; the backward: a transfer after rank 1's
    assert times[0]["message_s"] == pytest.approx(1e-4 + 1e-5)
    assert times[1]["message_s"] == pytest.approx(t)
    got = exchanges.count(_timeline(t), world_size=2, transfer_s=t)
    assert (got["exchanges"], got["count"]) == (2, 0)
    late = exchanges.count(_timeline(t, forward_wait=4e-3, backward_wait=WAIT_S),
                           world_size=2, transfer_s=t)
    assert late["count"] == 2
    assert exchanges.count([], world_size=2, transfer_s=t) is None


#: the counted fields every law row reads (exact counts that hold)
COUNTS = {"ring_bytes_formula": 1, "ring_bytes_forward_measured": 1,
          "ring_bytes_backward_measured": 1, "saved_bytes_formula": 1, "saved_bytes_measured": 1,
          "saved_bytes_one_rank_measured": 2}


def _row(**over) -> dict:
    row = {**COUNTS, "variant": "causal_balanced", "world_size": 2, "kv_block_bytes": KV,
           "compute_alone_s": 0.004, "compute_time_p50_s": 0.0048, "message_time_s": 0.001,
           "blocks_per_rank": [5, 5], "compute_alone_per_rank_s": [0.004, 0.004]}
    row.update(over)
    return row


def test_the_wait_term_is_count_x_wait_and_the_law_holds_on_transfers_plus_waits():
    t = PROF.transfer_s(KV, measurement="message", busy=True)
    row = _row(timeline_s=_timeline(t, backward_wait=WAIT_S))
    ctx = verdicts.context(row, PROF)
    assert ctx["exchange_s"] == pytest.approx(t)
    assert ctx["waits"]["count"] == 1
    assert ctx["waits_s"] == pytest.approx(1 * PROF.scheduler_wait_s)
    assert ctx["step_s"] == pytest.approx(0.004 * 1.2 + 2 * t + WAIT_S)
    measured = {**row, "step_time_p50_s": ctx["step_s"]}
    law = verdicts.laws(measured, PROF)[-1]
    assert law["holds"] and law["kind"] == "model"
    assert "1 of 2 K/V exchanges waited for the scheduler in the median pass" in law["note"]
    split = law["split"]
    assert split[verdicts.WAITS_TERM] == pytest.approx(WAIT_S * 1e3)
    assert laws.split_sums(law) and sum(split.values()) == pytest.approx(law["measured"])
    # a pass as long whose timeline shows no wait: transfers only, and the law fails
    quiet = {**measured, "timeline_s": _timeline(t)}
    assert verdicts.context(quiet, PROF)["waits"]["count"] == 0
    assert not verdicts.laws(quiet, PROF)[-1]["holds"]
    assert verdicts.WAITS_TERM not in verdicts.laws(quiet, PROF)[-1]["split"]


def test_the_waits_sentence_flips_with_the_count():
    t = PROF.transfer_s(KV, measurement="message", busy=True)
    some = verdicts.waits_sentence(_row(timeline_s=_timeline(t, forward_wait=4e-3)), PROF)
    assert "1 of the median pass's 2 K/V exchanges waited for the scheduler" in some
    assert "(the profile's 3.6 ms a wait)" in some
    none = verdicts.waits_sentence(_row(timeline_s=_timeline(t)), PROF)
    assert "none of the median pass's 2 K/V exchanges waited" in none
    assert "no K/V block travels" in verdicts.waits_sentence(_row(world_size=1), PROF)


def _late(timeline, late_s: float) -> list[dict]:
    """``timeline`` with rank 1 leaving the pass's barrier ``late_s`` after rank 0: its slices
    later, and rank 0 waiting for rank 1's block until just after rank 1 posted it."""
    out = []
    for s in timeline:
        s = dict(s)
        if s["rank"] == 1 and s["direction"] == "forward":
            s["start_s"], s["end_s"] = s["start_s"] + late_s, s["end_s"] + late_s
        elif s["rank"] == 0 and s["name"] == "wait K/V":
            s["end_s"] = max(s["end_s"], late_s + 1.1e-4)
        out.append(s)
    return out


def test_a_rank_late_to_the_pass_counts_as_one_wait_and_its_split_term_sums():
    t = PROF.transfer_s(KV, measurement="message", busy=True)
    late = _late(_timeline(t), 3e-3)
    # what the exchange cost leaves out the later rank's posting: the late start is no
    # exchange's wait, so it is counted once, as the ranks' arrival
    assert exchanges.count(late, world_size=2, transfer_s=t)["count"] == 0
    got = exchanges.late_start(late)
    assert got["late_s"] == pytest.approx(3e-3) and got["waited"]
    assert not exchanges.late_start(_late(_timeline(t), 1e-3))["waited"]  # within the rule
    row = _row(timeline_s=late)
    ctx = verdicts.context(row, PROF)
    assert ctx["waits_s"] == pytest.approx(PROF.scheduler_wait_s)
    law = verdicts.laws({**row, "step_time_p50_s": ctx["step_s"]}, PROF)[-1]
    assert law["holds"] and "started the median pass 3.0 ms after the first" in law["note"]
    assert law["split"][verdicts.LATE_TERM] == pytest.approx(3.0)
    assert laws.split_sums(law)
    # the same pass measured with the ranks together: no late start, the law fails
    on_time = {**row, "timeline_s": _timeline(t), "step_time_p50_s": ctx["step_s"]}
    assert not verdicts.laws(on_time, PROF)[-1]["holds"]
    assert "A rank also started" in verdicts.waits_sentence(row, PROF)
    assert "A rank also started" not in verdicts.waits_sentence(on_time, PROF)


# -- each rank's compute: fixed work + its blocks ---------------------------------------------
def _causal(alone, block_s=None) -> dict:
    return {"variant": "causal", "world_size": 2, "blocks_per_rank": [1, 2],
            "block_kinds_per_rank": [formulas.block_kinds(r, 2, "causal") for r in range(2)],
            "block_time_alone_s": block_s or {"full": 0.8e-3, "causal": 1.4e-3},
            "compute_alone_per_rank_s": alone}


def _ratio_law(row) -> dict:
    full = {**COUNTS, **row, "kv_block_bytes": KV,
            "compute_alone_s": max(row["compute_alone_per_rank_s"]),
            "step_time_p50_s": 0.01, "compute_time_p50_s": 0.005, "message_time_s": 0.001}
    (law,) = [r for r in verdicts.laws(full, PROF) if "rank's compute" in r["law"]]
    return law


def test_the_compute_ratio_is_fixed_work_plus_blocks_at_their_kinds_times():
    assert formulas.block_kinds(0, 2, "causal") == {"full": 0, "causal": 1}
    assert formulas.block_kinds(1, 2, "causal") == {"full": 1, "causal": 1}
    # a pass of 0.15 ms fixed work + its blocks: 1.55 and 2.35 ms, 1.52x, not the 2x of the
    # block count
    row = _causal([0.15e-3 + 1.4e-3, 0.15e-3 + 2.2e-3])
    model = verdicts.compute_model(row)
    assert model["fixed_s"] == pytest.approx(0.15e-3)
    assert model["per_rank_s"] == pytest.approx(row["compute_alone_per_rank_s"])
    law = _ratio_law(row)
    assert law["holds"] and law["kind"] == "model"
    assert law["predicted"] == pytest.approx(2.35 / 1.55)
    assert "0.15 ms of fixed work" in law["note"] and "causal 1.40 ms" in law["note"]
    # the ranks' compute in the blocks' count's ratio (2x) is not what fixed work and these
    # blocks make: the law fails
    assert not _ratio_law(_causal([1.2e-3, 2.4e-3]))["holds"]
    # equal blocks and no fixed work: the block count's ratio again
    even = _causal([1e-3, 2e-3], block_s={"full": 1e-3, "causal": 1e-3})
    assert verdicts.compute_model(even)["ratio"] == pytest.approx(2.0)
    assert _ratio_law(even)["holds"]
    text = verdicts.balance_sentence(row)
    assert "fixed work + blocks at their time alone: 1.52x" in text
    assert "a causal block costing 1.75x a full one" in text
    # a row that timed no blocks keeps the block count's law
    old = {k: v for k, v in row.items() if k not in ("block_kinds_per_rank",
                                                      "block_time_alone_s")}
    assert "most / fewest blocks" in _ratio_law(old)["law"]


def test_the_shares_timed_on_one_core_decide_the_ratio_not_the_cores_speeds():
    # the full split's equal shares on two cores, one running 1.57x slower than the other: on
    # their own cores the ratio misses 1.0; timed on one core (every share on each rank in
    # turn) they are the work's, and the law holds
    own = [7.7e-3, 12.1e-3]
    row = {"variant": "full", "world_size": 2, "blocks_per_rank": [2, 2],
           "block_kinds_per_rank": [formulas.block_kinds(r, 2, "full") for r in range(2)],
           "block_time_alone_s": {"full": 4.5e-3}, "compute_alone_per_rank_s": own}
    assert not _ratio_law(row)["holds"]
    law = _ratio_law({**row, "share_alone_s": [9.8e-3, 9.9e-3]})
    assert law["holds"] and law["measured"] == pytest.approx(9.9 / 9.8)
    assert "each rank on its own core: 7.70, 12.10 ms" in law["note"]
    assert sum(law["split"].values()) == pytest.approx(law["measured"])
    text = verdicts.balance_sentence({**row, "share_alone_s": [9.8e-3, 9.9e-3]})
    assert "the cores ran at different speeds" in text and "the slowest share 1.01x" in text
    # each core ran its rank's share at the pace one core ran it: the sentence says so
    same = verdicts.balance_sentence({**row, "share_alone_s": [7.6e-3, 12.0e-3]})
    assert "the same ratio within 10%" in same
    # the same spread the other way round is two cores' speeds, not the same ratio
    swapped = verdicts.balance_sentence({**row, "compute_alone_per_rank_s": [1.2e-3, 1.0e-3],
                                         "share_alone_s": [1.0e-3, 1.2e-3]})
    assert "the cores ran at different speeds" in swapped
