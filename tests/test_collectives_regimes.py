"""Collectives in context: the regimes of a sweep on synthetic rows, the regime-aware model and
the naive line beside it, the machine profile's in-context predictions, the computed sentences
(each flips when its numbers flip), the kind of every law row, and the budget refusal of
notebook 06's documented parameter values. All pure: nothing launches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labkit import collectives
from labkit.collectives import config as cconfig
from labkit.collectives import context, formulas, regimes, verdicts, waits
from labkit.collectives.regimes import Regimes, find_regimes, time_at
from labkit.errors import UsageError

SIZES = [8 * 4**k for k in range(11)]  # 8 B .. 8 MiB, the notebook's sweep


def line(alpha=250e-6, beta=1.2e9, sizes=SIZES, op="all_reduce", n=2):
    return list(formulas.collective_time(op=op, ranks=n, size_bytes=np.array(sizes, float),
                                         alpha_s=alpha, beta_bytes_per_s=beta))


def floor_then_line(floor=(1e-3, 3.5e-3, 1.1e-3, 0.9e-3, 4e-3, 1.2e-3), alpha=100e-6, beta=1.2e9):
    """A scattered floor over the smallest sizes, then an α–β line: what gloo on 2 busy
    cores shows (small messages wait for the peer to be scheduled, whatever their size)."""
    return list(floor) + line(alpha, beta)[len(floor):]


# -- regimes -------------------------------------------------------------------------------

def test_regimes_recover_the_line_and_the_floor():
    times = floor_then_line()
    r = find_regimes("all_reduce", 2, sizes=SIZES, times=times)
    assert r.bandwidth_from_bytes == SIZES[6]
    assert r.alpha_s == pytest.approx(100e-6, rel=1e-6)
    assert r.beta_bytes_per_s == pytest.approx(1.2e9, rel=1e-6)
    assert r.latency_sizes == SIZES[:6] and r.bandwidth_sizes == SIZES[6:]
    assert r.floor_s == pytest.approx(np.median(times[:6]))
    assert r.floor_range_s == (0.9e-3, 4e-3)
    # the regime-aware model: the floor below, the line above
    assert r.time_s(8) == r.floor_s and r.time_s(SIZES[-1]) == pytest.approx(times[-1])
    # the naive line misses the floor's scatter; the regime-aware model does not miss the line
    lo, _, hi = r.naive_residuals_pct()["latency"]
    assert lo < -25 or hi > 25
    assert max(abs(e) for e in r.naive_residuals_pct()["bandwidth"]) < 100


def test_a_clean_line_is_one_bandwidth_regime():
    r = find_regimes("all_reduce", 2, sizes=SIZES, times=line())
    assert r.latency_sizes == [] and r.bandwidth_from_bytes == SIZES[0]
    # its floor: the sizes the latency term decides (bandwidth term under a tenth), 2 α there
    fixed = r.line_s(0)
    assert r.floor_sizes and all(r.line_s(s) - fixed <= 0.1 * r.line_s(s) for s in r.floor_sizes)
    assert r.line_s(r.sizes[len(r.floor_sizes)]) - fixed > 0.1 * r.line_s(r.sizes[len(r.floor_sizes)])
    assert r.floor_s == pytest.approx(2 * r.alpha_s, rel=0.1)
    law = verdicts.sweep_laws(r, profile_floor_s=r.floor_s)[3]
    assert law["holds"] and "one line through the whole sweep" in law["note"]
    assert r.naive_alpha_s == pytest.approx(r.alpha_s, rel=1e-6)


def test_a_sweep_below_its_crossover_has_no_bandwidth_regime():
    small = SIZES[:6]  # up to 8 KiB, S* = 2 α β = 600 KB
    r = find_regimes("all_reduce", 2, sizes=small, times=line(sizes=small))
    assert not r.has_bandwidth and r.latency_sizes == small
    assert math.isnan(r.crossover_bytes) and math.isnan(r.line_s(8))
    assert "below the crossover" in r.notes[0]


def test_fit_min_bytes_sets_the_bandwidth_regime_by_hand():
    r = find_regimes("all_reduce", 2, sizes=SIZES, times=floor_then_line(), fit_min_bytes=1 << 20)
    assert r.bandwidth_from_bytes == 2 << 20
    assert r.regime(512 << 10) == "latency"
    above = find_regimes("all_reduce", 2, sizes=SIZES, times=floor_then_line(),
                         fit_min_bytes=16 << 20)  # nothing swept up there
    assert not above.has_bandwidth and ">= " in above.notes[0]


def test_regimes_refuse_repeated_sizes_and_read_rows():
    with pytest.raises(UsageError):
        find_regimes("all_reduce", 2, sizes=[8, 8, 64], times=[1e-3, 1e-3, 1e-3])
    rows = [{"op": "all_gather", "world_size": 2, "size_bytes": s, "time_p50_s": t}
            for s, t in zip(SIZES, floor_then_line())]
    assert regimes.of_rows(rows).op == "all_gather"
    with pytest.raises(UsageError):
        regimes.of_rows(rows + [dict(rows[0], world_size=4)])


def test_add_fit_puts_the_regime_aware_model_and_the_naive_line_beside_each_row():
    times = floor_then_line()
    rows = [{"op": "all_reduce", "world_size": 2, "dtype": "float32", "size_bytes": s,
             "time_p50_s": t} for s, t in zip(SIZES, times)]
    out = regimes.add_fit(rows)
    assert [r["regime"] for r in out] == ["latency"] * 6 + ["bandwidth"] * 5
    assert all(r["model_time_s"] == pytest.approx(np.median(times[:6])) for r in out[:6])
    assert all(abs(r["model_error_pct"]) < 1e-6 for r in out[6:])
    assert all(math.isfinite(r["naive_time_s"]) for r in out)
    assert "regime" not in rows[0]  # the input is unchanged


def test_time_at_reads_between_sizes_and_never_extrapolates():
    assert regimes.time_at(2048, sizes=[1024, 4096], times=[1e-3, 4e-3]) == pytest.approx(2e-3)
    assert math.isnan(regimes.time_at(8192, sizes=[1024, 4096], times=[1e-3, 4e-3]))


# -- sentences flip with their numbers -------------------------------------------------------

def _reg(times, sizes=SIZES):
    return find_regimes("all_reduce", 2, sizes=sizes, times=times)


def test_regimes_sentence_flips_flat_and_scattered():
    scattered = verdicts.regimes_sentence(_reg(floor_then_line()))
    flat = verdicts.regimes_sentence(_reg(floor_then_line(floor=(1e-3, 1.05e-3, 1e-3, 1.1e-3,
                                                                  1e-3, 1.02e-3))))
    assert "scattered" in scattered and "flat" not in scattered
    assert "flat" in flat and "scattered" not in flat
    assert "no latency regime" in verdicts.regimes_sentence(_reg(line()))
    assert "no bandwidth regime" in verdicts.regimes_sentence(_reg(line()[:6], SIZES[:6]))


def test_naive_sentence_flips_within_and_outside():
    clean = verdicts.naive_sentence(_reg(line()))
    rough = verdicts.naive_sentence(_reg(floor_then_line()))
    assert "within 25%" in clean and "outside" not in clean
    assert "in the latency regime" in rough and "outside 25%" in rough


def test_crossover_sentence_flips_inside_and_above():
    inside = verdicts.crossover_sentence(_reg(floor_then_line()))
    assert "lies inside the sweep" in inside and "the sweep measured" in inside
    # a line whose S* lies above the sweep's top, with the regime set by hand
    r = find_regimes("all_reduce", 2, sizes=SIZES[:9], times=floor_then_line()[:9],
                     fit_min_bytes=SIZES[6])
    r_above = Regimes("all_reduce", 2, r.sizes, r.times, r.bandwidth_from_bytes, 5e-3, 1.2e9,
                      r.naive_alpha_s, r.naive_beta_bytes_per_s)
    assert "lies above the largest size swept" in verdicts.crossover_sentence(r_above)
    assert "no S*" in verdicts.crossover_sentence(_reg(line()[:6], SIZES[:6]))


def test_busy_sentence_flips_slower_and_no_slower():
    ctx = {"size_bytes": 2 << 20, "idle_s": 2e-3}
    assert context.busy_sentence(dict(ctx, busy_s=3e-3)).endswith("1.50x, slower.")
    assert context.busy_sentence(dict(ctx, busy_s=1.9e-3)).endswith("0.95x, no slower.")
    assert "not timed" in context.busy_sentence(dict(ctx, busy_s=math.nan))


# -- law rows: kinds, holds, mechanisms -------------------------------------------------------

def test_sweep_laws_kinds_and_the_naive_reason():
    r = _reg(floor_then_line())
    busbw = SIZES[-1] / r.times[-1] / 1e9
    rows = verdicts.sweep_laws(r, busbw_gb_per_s=busbw, profile_floor_s=r.floor_s * 1.1)
    kinds = [x["kind"] for x in rows]
    assert kinds == ["model", "model", "model", "model", "naive"]
    assert all(x["tolerance_pct"] <= 25 for x in rows)
    line_row, busbw_row, star_row, floor_row, naive_row = rows
    assert line_row["holds"] and busbw_row["holds"] and floor_row["holds"]
    assert star_row["holds"]  # on an exact line the time at S* is the line's
    assert "latency regime residuals" in naive_row["note"]
    # the floor law flips when the profile's floor is twice this sweep's
    worse = verdicts.sweep_laws(r, busbw_gb_per_s=busbw, profile_floor_s=r.floor_s * 2)
    assert not worse[3]["holds"]


def test_a_line_with_no_latency_term_has_no_s_star_and_every_size_on_the_plateau():
    """A bandwidth line fitted with α = 0 puts S* at 0: the sentence says there is none,
    busbw is judged at its plateau, and the crossover law reads the sweep where the line
    reaches the floor (the regimes' crossover), flipping with the time measured there; with no
    floor to reach it has no mechanism."""
    r = _reg(floor_then_line())
    flat = Regimes(r.op, 2, r.sizes, r.times, r.bandwidth_from_bytes, 0.0, r.beta_bytes_per_s,
                   r.naive_alpha_s, r.naive_beta_bytes_per_s)
    assert flat.crossover_bytes == 0
    assert "no latency term" in verdicts.crossover_sentence(flat)
    rows = verdicts.sweep_laws(flat, busbw_gb_per_s=flat.beta_bytes_per_s / 1e9)
    assert rows[1]["holds"] and "no latency term" in rows[1]["note"]
    # a sweep that is a fixed cost plus its bytes, its line fitted over the largest sizes
    # through the origin: the line reaches the floor where both terms are equal, and the
    # time there is their sum, twice the floor
    summed = tuple(3e-4 + s / 1.2e9 for s in SIZES)
    band = 2 << 20
    both = Regimes("all_reduce", 2, tuple(SIZES), summed, band, 0.0, 1.2e9, 3e-4, 1.2e9)
    meet = both.meeting_bytes
    assert both.line_s(meet) == pytest.approx(both.floor_s)
    law = verdicts.sweep_laws(both, busbw_gb_per_s=1.0)[2]
    assert "where the line reaches the floor" in law["note"]
    assert law["predicted"] == pytest.approx(2 * both.floor_s * 1e3)
    assert law["measured"] == pytest.approx(time_at(meet, sizes=SIZES, times=summed) * 1e3)
    assert law["holds"]
    # the sweep measured 3x as long on both sides of that size: the law flips
    i = next(k for k, s in enumerate(SIZES) if s > meet)
    slow = list(summed)
    slow[i - 1] *= 3
    slow[i] *= 3
    worse = Regimes("all_reduce", 2, tuple(SIZES), tuple(slow), band, 0.0, 1.2e9, 3e-4, 1.2e9)
    assert not verdicts.sweep_laws(worse, busbw_gb_per_s=1.0)[2]["holds"]
    # no latency regime: no floor to reach, nothing to read the sweep at
    none = Regimes(r.op, 2, r.sizes, r.times, r.sizes[0], 0.0, r.beta_bytes_per_s,
                   r.naive_alpha_s, r.naive_beta_bytes_per_s)
    row = verdicts.sweep_laws(none, busbw_gb_per_s=1.0)[2]
    assert not row["holds"] and "mechanism not observed" in row["note"]
    assert row["note"].startswith("no S*: the bandwidth regime's line has no latency term")


def test_time_at_s_star_flips_when_the_measurement_there_moves():
    times = floor_then_line()
    r = _reg(times)
    s_star = r.crossover_bytes
    i = next(k for k, s in enumerate(SIZES) if s > s_star)
    bumped = list(times)
    bumped[i - 1] *= 2.5  # both neighbours of S* measured far slower than the line
    bumped[i] *= 2.5
    moved = Regimes(r.op, 2, r.sizes, tuple(bumped), r.bandwidth_from_bytes, r.alpha_s,
                    r.beta_bytes_per_s, r.naive_alpha_s, r.naive_beta_bytes_per_s)
    assert not verdicts.sweep_laws(moved, busbw_gb_per_s=1.0)[2]["holds"]


def test_laws_without_their_mechanism_do_not_hold():
    no_band = _reg(line()[:6], SIZES[:6])
    rows = verdicts.sweep_laws(no_band, busbw_gb_per_s=1.0, profile_floor_s=no_band.floor_s)
    assert [x["holds"] for x in rows[:3]] == [False, False, False]
    assert all("mechanism not observed" in x["note"] for x in rows[:3])
    assert rows[3]["holds"] and rows[3]["kind"] == "model"  # the floor is still there
    assert not verdicts.line_law(no_band)["holds"]
    # busbw -> beta is judged only where the largest size is >= 4 S*
    r = _reg(floor_then_line(alpha=2e-3))  # S* = 4.8 MB: 8 MiB is 1.7 S*
    assert not verdicts.sweep_laws(r, busbw_gb_per_s=1.2)[1]["holds"]


def test_busbw_law_compares_the_top_segments_beta_and_flips_with_it():
    """busbw at the largest size against the marginal β of the top segment, not the regime's
    compromise: a sweep whose last size costs twice as much per byte as the line below it."""
    times = floor_then_line(alpha=50e-6)
    r = _reg(times)
    law = verdicts.sweep_laws(r, busbw_gb_per_s=1.2)[1]
    assert law["holds"] and law["predicted"] == pytest.approx(r.top_beta_bytes_per_s / 1e9)
    assert r.top_beta_bytes_per_s == pytest.approx(1.2e9)
    bent = list(times)
    bent[-1] = times[-2] + 1.25 * (times[-1] - times[-2])  # the top segment at 0.8 the rate
    b = _reg(bent)
    busbw = SIZES[-1] / bent[-1] / 1e9
    law = verdicts.sweep_laws(b, busbw_gb_per_s=busbw)[1]
    assert b.top_beta_bytes_per_s == pytest.approx(0.96e9)
    assert law["predicted"] == pytest.approx(0.96) and "top segment" in law["note"]
    # at half the rate the three largest sizes lie on no one line within 25 %: the regime
    # keeps them, and the line law at the largest size misses
    broken = list(times)
    broken[-1] = times[-2] + 2 * (times[-1] - times[-2])
    nb = _reg(broken)
    assert nb.has_bandwidth and len(nb.bandwidth_sizes) == 3
    assert not verdicts.line_law(nb)["holds"]
    # a top size no slower than the one below: no marginal rate, the law is not judged
    flat = list(times)
    flat[-1] = flat[-2]
    law = verdicts.sweep_laws(_reg(flat), busbw_gb_per_s=1.2)[1]
    assert not law["holds"] and "no top segment" in law["note"]
    # a sweep of one size: no regime, no segment, and a note all the same
    one = find_regimes("all_reduce", 2, sizes=[8 << 20], times=[7e-3])
    assert "no top segment" in verdicts.sweep_laws(one, busbw_gb_per_s=1.2)[1]["note"]


class _Profile:
    """A stand-in machine profile: an idle sweep whose transfers (p10) are half its p50s (a
    scattered floor), busy 1.5x slower."""

    world_size = 2
    rows = [{"measurement": "allreduce", "context": c, "size_bytes": s, "time_p50_s": t * k,
             "time_p10_s": t * k / 2}
            for c, k in (("idle", 1.0), ("busy", 1.5))
            for s, t in ((8, 1e-3), (512, 1.2e-3), (32768, 0.9e-3), (2 << 20, 3e-3))]

    def transfer_s(self, size, *, ranks=2, busy=False, steady=False):
        pts = [(r["size_bytes"], r["time_p10_s"]) for r in self.rows
               if r["context"] == ("busy" if busy else "idle")]
        return float(np.exp(np.interp(np.log(size), *np.log(np.array(pts)).T)))


def test_profile_floor_is_the_same_statistic_over_the_profiles_own_sizes():
    got = verdicts.profile_floor_s([8, 32, 128, 512, 2048, 8192, 32768], _Profile(), ranks=2)
    assert got == pytest.approx(0.5e-3)  # median of the transfers 0.5, 0.6, 0.45 ms
    got = verdicts.profile_floor_s([8, 32, 128, 512, 2048, 8192, 32768], _Profile(), ranks=2,
                                   statistic="p50")
    assert got == pytest.approx(1e-3)  # median of the p50s 1.0, 1.2, 0.9 ms
    assert verdicts.profile_floor_s([], _Profile(), ranks=2) is None


def test_profile_floor_reads_the_transfers_not_a_percentile_below_them():
    """The sweep's floor is a median of transfers: the profile's is too, never its p10."""
    prof = _Profile()
    prof.rows = [{**r, "transfer_s": r["time_p10_s"] * 1.4} for r in _Profile.rows]
    got = verdicts.profile_floor_s([8, 32, 128, 512, 2048, 8192, 32768], prof, ranks=2)
    assert got == pytest.approx(0.7e-3)  # median of the transfers 0.7, 0.84, 0.63 ms
    assert got > verdicts.profile_floor_s([8, 512, 32768], _Profile(), ranks=2)  # the p10s'
    with pytest.raises(UsageError, match="statistic"):
        verdicts.profile_floor_s([8, 512], prof, ranks=2, statistic="p10")


def test_in_context_judges_at_the_largest_size_both_swept_and_its_laws():
    rows = [{"size_bytes": s, "time_p50_s": t, "busy_time_p50_s": 1.4 * t, "busy_matmuls": 9,
             "time_p10_s": t / 2, "busy_time_p10_s": 1.5 * t / 2}
            for s, t in zip(SIZES, floor_then_line())]
    ctx = context.in_context(rows, _Profile(), ranks=2)
    assert ctx["size_bytes"] == 2 << 20  # 8 MiB is past the profile's sweep
    assert ctx["ratio"] == pytest.approx(1.4)
    laws_rows = context.context_laws(ctx, ranks=2)
    assert [x["kind"] for x in laws_rows] == ["model", "model"]
    # transfers against transfers: the profile's p10 (1.5 ms) against the sweep's
    assert laws_rows[0]["predicted"] == pytest.approx(1.5)
    assert laws_rows[0]["measured"] == pytest.approx(ctx["idle_transfer_s"] * 1e3)
    assert "p50" in laws_rows[0]["note"]
    # a sweep whose transfers are twice the profile's misses, whatever its p50s
    slow = dict(ctx, idle_transfer_s=2 * ctx["predicted_idle_s"])
    assert not context.context_laws(slow, ranks=2)[0]["holds"]
    # no busy thread computing: the busy law cannot hold, whatever its numbers
    idle_only = dict(ctx, matmuls=0)
    assert not context.context_laws(idle_only, ranks=2)[1]["holds"]
    # busy not measured: only the idle law
    plain = [dict(r, busy_time_p50_s=None, busy_matmuls=None) for r in rows]
    ctx2 = context.in_context(plain, _Profile(), ranks=2)
    assert math.isnan(ctx2["busy_s"]) and len(context.context_laws(ctx2, ranks=2)) == 1


# -- notebook 06's documented parameter values: run within its budget, or refused -------------

NOTEBOOK = dict(ops=("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"),
                min_bytes="8", max_bytes="8M", factor=4, dense_top=True, iters=16, warmup=2,
                check=True, busy=True)
BUDGET_S = 14.0


def _estimate(world_sizes=(2,), **change):
    cfg = collectives.CollectivesConfig(**{**NOTEBOOK, **change})
    return cconfig.estimate_s(cfg, list(world_sizes), cores=2)


@pytest.mark.parametrize("change", [{}, {"ops": ("all_reduce", "all_gather", "broadcast",
                                                 "reduce_scatter")},
                                    {"ops": ("all_reduce", "all_gather", "broadcast")},
                                    {"ops": ("all_reduce",)}, {"busy": False},
                                    {"dense_top": False}, {"factor": 2}])
def test_documented_values_run_within_the_budget(change):
    cfg = collectives.CollectivesConfig(**{**NOTEBOOK, **change})
    est = cconfig.check_budget(cfg, [2], budget_s=BUDGET_S, cores=2)
    assert 5 < est <= BUDGET_S


@pytest.mark.parametrize("world_sizes,change", [((2, 4), {}), ((2,), {"max_bytes": "64M"})])
def test_documented_values_over_the_budget_are_refused_before_launch(world_sizes, change):
    cfg = collectives.CollectivesConfig(**{**NOTEBOOK, **change})
    with pytest.raises(UsageError) as e:
        cconfig.check_budget(cfg, list(world_sizes), budget_s=BUDGET_S, cores=2)
    text = str(e.value)
    assert "\n" not in text and f"budget of {BUDGET_S:g} s" in text
    assert f"estimated at {_estimate(world_sizes, **change):.0f} s" in text
    assert "lower max_bytes" in text


def test_estimate_grows_with_what_the_sweep_does():
    assert _estimate(busy=False) < _estimate()
    assert _estimate(max_bytes="2M") < _estimate() < _estimate(max_bytes="32M")
    assert _estimate((2, 4)) > _estimate() + cconfig.LAUNCH_S  # oversubscribed: slower too


def test_the_model_is_fitted_to_the_transfers_and_the_naive_line_to_the_p50s():
    """Rows with transfers: the regimes fit them (a p50 disturbed by waits moves nothing), the
    naive line runs through the p50s. Rows without: the p50s, and a miss's split takes the p50
    apart into its p10 and the rest."""
    from labkit.book import laws as book_laws

    times = floor_then_line()
    rows = [{"op": "all_reduce", "world_size": 2, "size_bytes": s, "time_p50_s": 2 * t,
             "time_p10_s": t} for s, t in zip(SIZES, times)]
    rows[-1]["time_p50_s"] *= 3  # the largest size's calls waited: its p50 far above its p10
    r = regimes.of_rows(rows, fit_min_bytes=SIZES[6])
    assert r.statistic == "transfer" and r.times == tuple(times)
    assert r.medians == tuple(x["time_p50_s"] for x in rows)
    line_row = verdicts.line_law(r)
    assert line_row["holds"] and line_row["split"] is None  # a transfer has nothing to split
    naive = verdicts.sweep_laws(r, profile_floor_s=1e-4)[-1]
    assert naive["measured"] == pytest.approx(rows[0]["time_p50_s"] * 1e3)
    # a transfer off the line misses
    rows[-1]["time_p10_s"] *= 1.6
    off = verdicts.line_law(regimes.of_rows(rows, fit_min_bytes=SIZES[6]))
    assert not off["holds"]
    # the note sets the top segment's beta beside the line's, which the slower top size lowers
    top, fitted = (float(x.split(" GB/s")[0].split()[-1]) for x in off["note"].split("beta ")[1:])
    assert off["note"].startswith("the line's alpha ") and top < fitted
    # p50s only: the old statistic, and a miss split into the p10 and the rest
    p50s = [{"op": "all_reduce", "world_size": 2, "size_bytes": s, "time_p50_s": t,
             "time_p10_s": 0.6 * t} for s, t in zip(SIZES, times)]
    p50s[-1]["time_p50_s"] *= 1.6
    old = find_regimes("all_reduce", 2, sizes=SIZES, times=[x["time_p50_s"] for x in p50s],
                       p10s=[x["time_p10_s"] for x in p50s], fit_min_bytes=SIZES[6])
    line_row = verdicts.line_law(old)
    assert not line_row["holds"] and book_laws.split_sums(line_row)
    assert line_row["split"]["p10"] == pytest.approx(0.6 * times[-1] * 1e3)
    bare = find_regimes("all_reduce", 2, sizes=SIZES, times=times)
    assert bare.split(SIZES[-1], times[-1]) is None


def test_the_wait_law_counts_the_calls_that_waited_and_judges_their_wait():
    def row(t, waited):
        calls = [{"rank": rank, "call": k, "start_s": 0.0,
                  "end_s": t + (3.6e-3 if k <= waited and rank == 0 else 0.0)}
                 for rank in (0, 1) for k in range(1, 9)]
        return {"transfer_s": t, "timeline_s": calls}

    w = waits.waits_of([row(0.3e-3, 2), row(1e-3, 1), row(5e-3, 0)])
    assert (w["calls"], w["waited"]) == (24, 3)
    assert waits.wait_law(w, predicted_s=3.5e-3, ranks=2)["holds"]
    assert not waits.wait_law(w, predicted_s=1.5e-3, ranks=2)["holds"]
    few = waits.waits_of([row(0.3e-3, 1)])
    law = waits.wait_law(few, predicted_s=3.6e-3, ranks=2)
    assert not law["holds"] and "mechanism not observed" in law["note"]


def test_the_wait_law_is_priced_at_the_profiles_calls_timed_as_the_sweep_times_its_own():
    from labkit.machine.profile import Profile

    base = [{"measurement": m, "context": "alone", "size_bytes": 8}
            for m in ("matmul", "step", "copy")]
    calls = [{"measurement": "allreduce", "context": "idle", "size_bytes": 8,
              "wait_excess_s": [2.5e-3] * 3},
             {"measurement": "allreduce", "context": "busy", "size_bytes": 8,
              "wait_excess_s": [5.5e-3] * 5},
             {"measurement": "message", "context": "idle", "size_bytes": 8,
              "wait_excess_s": [2.5e-3]}]
    steady = [{"measurement": "allreduce_steady", "context": c, "size_bytes": 8,
               "wait_excess_s": [x] * 4} for c, x in (("idle", 3.6e-3), ("busy", 4.4e-3))]
    prof = Profile.from_rows(base + calls + steady)
    # back to back with the cores idle, as 06 calls its own: 3.6 ms, where the pooled
    # median is the busy sweep's 5.5 ms and the idle sweep's 2.5 ms
    assert prof.steady_wait_s() == pytest.approx(3.6e-3)
    assert prof.steady_wait_s(busy=True) == pytest.approx(4.4e-3)
    assert prof.scheduler_wait_s == pytest.approx(5.5e-3)
    assert prof.scheduler_wait_in_s(busy=False) == pytest.approx(2.5e-3)
    w = {"calls": 40, "waited": 9, "share": 0.225, "excess_s": [3.5e-3] * 9}
    assert waits.wait_law(w, predicted_s=prof.steady_wait_s(), ranks=2)["holds"]
    assert not waits.wait_law(w, predicted_s=prof.scheduler_wait_s, ranks=2)["holds"]
    assert prof.steady_waited() and "called back to back" in waits.profile_wait_sentence(w, prof)
    # an older profile without the back-to-back calls: the pooled wait, and the sentence says so
    older = Profile.from_rows(base + calls)
    assert older.steady_wait_s() == pytest.approx(5.5e-3) and not older.steady_waited()
    assert "every kind" in waits.profile_wait_sentence(w, older)


def test_busy_law_compares_p50s_where_most_of_the_profiles_busy_calls_waited():
    rows = [{"size_bytes": s, "time_p50_s": t, "busy_time_p50_s": 1.4 * t, "busy_matmuls": 9,
             "time_p10_s": t / 2, "busy_time_p10_s": 1.5 * t / 2}
            for s, t in zip(SIZES, floor_then_line())]
    # the stand-in keeps no wait shares: the busy law compares transfers
    ctx = context.in_context(rows, _Profile(), ranks=2)
    assert math.isnan(ctx["profile_busy_wait_share"])
    assert ctx["predicted_busy_p50_s"] == pytest.approx(4.5e-3)  # 1.5 x 3 ms at 2 MiB
    assert "transfer" in context.context_laws(ctx, ranks=2)[1]["law"]

    class Waited(_Profile):  # 10 of 11 busy calls waited at every size
        rows = [dict(r, wait_share=10 / 11 if r["context"] == "busy" else 0.1)
                for r in _Profile.rows]

    ctx = context.in_context(rows, Waited(), ranks=2)
    busy = context.context_laws(ctx, ranks=2)[1]
    assert busy["law"].startswith("all-reduce p50 while every core computes")
    assert busy["predicted"] == pytest.approx(4.5) and busy["measured"] == pytest.approx(
        ctx["busy_s"] * 1e3)
    assert "91% of the profile's busy calls" in busy["note"]
    # at half or fewer, the transfers again
    half = dict(ctx, profile_busy_wait_share=0.5)
    assert "transfer" in context.context_laws(half, ranks=2)[1]["law"]
