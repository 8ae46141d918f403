"""Notebook 01's computed sentences, the kinds of its law rows and its time budget (pure)."""

from __future__ import annotations

import pytest

from labkit.checks import formulas, verdicts
from labkit.errors import UsageError


def test_corun_sentence_flips_with_the_slowdown():
    assert "25% slower" in verdicts.corun_sentence(slowdown=1.25, ranks=2)
    assert "20% faster" in verdicts.corun_sentence(slowdown=0.8, ranks=2)
    assert "as fast" in verdicts.corun_sentence(slowdown=1.0, ranks=2)


def test_busy_sentence_flips_when_busy_is_faster():
    slow = verdicts.busy_sentence(size_bytes=1 << 20, idle_s=1e-3, busy_s=2e-3)
    fast = verdicts.busy_sentence(size_bytes=1 << 20, idle_s=2e-3, busy_s=1e-3)
    assert "100% slower when busy" in slow and "50% faster when busy" in fast


def test_alpha_beta_sentence_says_within_or_not_from_the_sweep():
    from labkit.collectives.formulas import allreduce_time

    sizes = [8, 512, 32768, 1 << 20]
    exact = [allreduce_time(size_bytes=s, ranks=2, alpha_s=1e-4, beta_bytes_per_s=1e9)
             for s in sizes]
    on_line = verdicts.alpha_beta_sentence(alpha_s=1e-4, beta_bytes_per_s=1e9, ranks=2,
                                           sizes=sizes, times=exact)
    assert "is within 25% of every measured size" in on_line
    bumpy = list(exact)
    bumpy[1] *= 3  # one size three times slower than the line
    off_line = verdicts.alpha_beta_sentence(alpha_s=1e-4, beta_bytes_per_s=1e9, ranks=2,
                                            sizes=sizes, times=bumpy)
    assert "3x below the measured time at 512 B" in off_line
    bumpy[1] = exact[1] / 3
    assert "3x above the measured time at 512 B" in verdicts.alpha_beta_sentence(
        alpha_s=1e-4, beta_bytes_per_s=1e9, ranks=2, sizes=sizes, times=bumpy)


def test_allreduce_sentence_flips_around_the_profile():
    kw = dict(world_size=2, size_bytes=1 << 20, predicted_s=1e-3)
    slower = verdicts.allreduce_sentence(measured_s=1.5e-3, p50_s=1.6e-3, **kw)
    assert "50% slower than the profile" in slower and "few calls waited" in slower
    faster = verdicts.allreduce_sentence(measured_s=0.5e-3, p50_s=4.5e-3, **kw)
    assert "50% faster than the profile" in faster and "waited for the scheduler" in faster


@pytest.mark.parametrize("world_size,kind", [(2, "model"), (4, "naive")])
def test_allreduce_law_kind_follows_the_cores(world_size, kind):
    row = verdicts.allreduce_law(world_size=world_size, size_bytes=1 << 20, predicted_s=1e-3,
                                 measured_s=1.1e-3, cores=2)
    assert row["kind"] == kind and row["unit"] == "ms" and row["tolerance_pct"] == 25
    assert row["holds"]  # 10 % off: within 25 % either way
    assert ("oversubscribed" in row["note"]) == (kind == "naive")
    # scored both ways: the same miss, the other side, is judged the same
    other = verdicts.allreduce_law(world_size=world_size, size_bytes=1 << 20, predicted_s=1.1e-3,
                                   measured_s=1e-3, cores=2)
    assert other["holds"] and other["error_pct"] == pytest.approx(-row["error_pct"])


def test_allreduce_law_misses_a_measurement_far_from_the_profile():
    row = verdicts.allreduce_law(world_size=2, size_bytes=1 << 20, predicted_s=1e-3,
                                 measured_s=2e-3, cores=2)
    assert row["kind"] == "model" and not row["holds"]


@pytest.mark.parametrize("world_size,kind", [(2, "model"), (3, "naive")])
def test_launch_cost_law_kind_follows_the_cores(world_size, kind):
    row = verdicts.launch_cost_law(world_size=world_size, one_rank_s=2.5, measured_s=2.7, cores=2)
    assert row["kind"] == kind and row["unit"] == "s"


def test_launch_cost_law_carries_the_co_run_slowdown_and_flips_without_it():
    """2 ranks importing torch side by side, 1.3x slower each: 2.1 s x 1.3 against 2.8 s holds;
    the same launch against t_launch(1) alone misses. Beyond the cores the slowdown is not
    applied (the naive law: the ranks take turns)."""
    kw = dict(world_size=2, one_rank_s=2.1, measured_s=2.8, cores=2)
    held = verdicts.launch_cost_law(**kw, slowdown=1.3)
    assert held["holds"] and held["predicted"] == pytest.approx(2.73)
    assert "x 1.30, the profile's co-run slowdown of 2 ranks" in held["note"]
    assert not verdicts.launch_cost_law(**kw, slowdown=1.0)["holds"]
    crowded = verdicts.launch_cost_law(world_size=4, one_rank_s=2.1, measured_s=2.8, cores=2,
                                       slowdown=2.6)
    assert crowded["kind"] == "naive" and crowded["predicted"] == pytest.approx(2.1)
    assert crowded["law"] == "a launch of 4 ranks costs what a 1-rank launch does"


@pytest.mark.parametrize("world_sizes,show_failure", [([1, 2], True), ([1, 2], False),
                                                      ([1, 2, 4], False), ([2], False)])
@pytest.mark.parametrize("allreduce_bytes", [8, 1 << 20, 8 << 20])
def test_documented_values_fit_the_budget(world_sizes, show_failure, allreduce_bytes):
    """Every value the parameters cell documents runs within notebook 01's share."""
    est = formulas.check_budget(world_sizes=world_sizes, allreduce_bytes=allreduce_bytes,
                                show_failure=show_failure, cores=2, profile_stored=True)
    assert 0 < est <= formulas.BUDGET_S


def test_more_launches_cost_more():
    kw = dict(allreduce_bytes=1 << 20, cores=2, profile_stored=True)
    assert (formulas.notebook_seconds(world_sizes=[1, 2], show_failure=False, **kw)
            < formulas.notebook_seconds(world_sizes=[1, 2], show_failure=True, **kw)
            < formulas.notebook_seconds(world_sizes=[1, 2, 4], show_failure=True, **kw))
    # ranks beyond the cores take turns: a 4-rank launch costs two 2-rank launches
    assert formulas.launch_seconds(4, cores=2) == pytest.approx(2 * formulas.launch_seconds(2, cores=2))
    # the profile, when this run has none, is measured first
    assert formulas.notebook_seconds(world_sizes=[1, 2], show_failure=True, allreduce_bytes=1 << 20,
                                     cores=2, profile_stored=False) == pytest.approx(
        formulas.notebook_seconds(world_sizes=[1, 2], show_failure=True, **kw) + formulas.PROFILE_S)


@pytest.mark.parametrize("run", [
    dict(world_sizes=[1, 2, 4], show_failure=True, allreduce_bytes=8 << 20),
    dict(world_sizes=[1, 2, 4, 8], show_failure=False, allreduce_bytes=1 << 20),
    dict(world_sizes=[1, 2], show_failure=False, allreduce_bytes=1 << 30),
])
def test_over_budget_is_refused_in_one_line(run):
    with pytest.raises(UsageError) as err:
        formulas.check_budget(cores=2, profile_stored=True, **run)
    text = str(err.value)
    assert "\n" not in text and "would take about" in text and "budget of 20 s" in text


def test_a_run_by_hand_may_also_measure_the_profile():
    """Defaults without a stored profile are not refused: the profile is no parameter's cost."""
    est = formulas.check_budget(world_sizes=[1, 2], show_failure=True, allreduce_bytes=1 << 20,
                                cores=2, profile_stored=False)
    assert est > formulas.BUDGET_S  # over the share, yet run: the profile is counted apart
