"""Notebook 02's model on this machine, its law rows, its computed sentences and its time
budget (pure)."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit import metrics
from labkit.errors import UsageError
from labkit.speedup import formulas, verdicts
from labkit.speedup.config import WorkshareConfig


def _live(world_sizes, *, f=0.1, work=400, slowdown=None, noise=None, product_s=1e-3):
    """Workshare rows whose times follow the co-run model exactly (``slowdown`` per N), times
    ``noise`` per N: what a run on a machine the profile describes would store."""
    slowdown = slowdown or {}
    noise = noise or {}
    cfg = WorkshareConfig(total_work=work, serial_fraction=f)
    rows = []
    for n in world_sizes:
        serial, share = cfg.split(n, 0)
        t = product_s * (serial + share * slowdown.get(n, 1.0)) * noise.get(n, 1.0)
        rows.append({"world_size": n, "time_s": t, "total_work": work, "serial_products": serial,
                     "parallel_products_per_rank_max": share})
    live = pd.DataFrame(rows)
    table, _ = metrics.speedup_table(dict(zip(live.world_size, live.time_s)), cores_per_rank=1,
                                     gpus_per_rank=0)
    return live, table


def _by_kind(rows):
    return sorted((r["kind"], r["law"]) for r in rows)


def test_corun_model_is_amdahl_without_a_slowdown():
    for n in (2, 3, 4):
        cfg = WorkshareConfig(total_work=1200, serial_fraction=0.25)
        serial, share = cfg.split(n, 0)
        assert formulas.corun_speedup(total_work=1200, serial_products=serial,
                                      parallel_products_max=share, slowdown=1.0) == \
            pytest.approx(metrics.amdahl_speedup(0.25, n))


def test_the_slowdown_shows_as_serial_fraction():
    """Karp-Flatt reads the co-run slowdown as serial work: e - f = (1 - f)(sd - 1)/(N - 1)."""
    s = formulas.corun_speedup(total_work=1000, serial_products=100, parallel_products_max=450,
                               slowdown=1.3)
    added = formulas.parallel_added_fraction(serial_fraction=0.1, world_size=2, slowdown=1.3)
    assert metrics.karp_flatt(s, 2) - 0.1 == pytest.approx(added)


@pytest.mark.parametrize("world_sizes,sizes_with_kf", [([1, 2], False), ([1, 2, 4], True),
                                                       ([1, 4], True)])
def test_live_law_kinds_and_tolerances(world_sizes, sizes_with_kf):
    slowdown = {2: 1.5, 4: 3.0}  # about what this 2-core machine's profile measures
    live, table = _live(world_sizes, slowdown=slowdown)
    rows = verdicts.live_laws(live, table, designed_f=0.1, slowdowns={1: 1.0, **slowdown},
                              cores=2)
    kinds = [r["kind"] for r in rows]
    # each quantity twice, the model with the slowdown and plain Amdahl beside it, but the
    # Amdahl fit through two rank counts: it is t_2's number again, kept as the naive lesson
    assert kinds.count("model") + (2 in world_sizes) == kinds.count("naive") > 0
    times = [r for r in rows if " t_" in r["law"]]
    speedups = [r for r in rows if " s_" in r["law"]]
    assert len(times) == len(speedups) == len(world_sizes) - 1
    assert all(r["kind"] == "model" and r["unit"] == "ms" for r in times)
    assert all(r["tolerance_pct"] == 25 and r["tolerance_abs"] is None for r in times + speedups)
    fractions = [r for r in rows if "fit" in r["law"] or "Karp-Flatt" in r["law"]]
    assert fractions and all(r["tolerance_abs"] == 0.05 for r in fractions)
    assert any("Karp-Flatt" in r["law"] for r in rows) == sizes_with_kf
    assert any("fit" in r["law"] for r in rows) == (2 in world_sizes)
    assert not any("fit" in r["law"] for r in rows if r["kind"] == "model")  # two points at most
    # the machine behaves as the profile says: the model holds, plain Amdahl fails as taught
    assert all(r["holds"] for r in rows if r["kind"] == "model")
    assert not any(r["holds"] for r in rows if r["kind"] == "naive")
    assert all("slow" in r["note"] for r in rows if r["kind"] == "naive")
    if 4 in world_sizes:
        assert any("4 ranks on 2 cores take turns" in r["note"] for r in rows)


def test_live_model_misses_when_the_machine_is_slower_than_its_profile():
    live, table = _live([1, 2], slowdown={2: 1.25}, noise={2: 1.4})
    rows = verdicts.live_laws(live, table, designed_f=0.1, slowdowns={1: 1.0, 2: 1.25}, cores=2)
    assert not any(r["holds"] for r in rows if r["kind"] == "model")


def test_a_time_miss_prints_its_measured_split():
    from labkit.book import laws

    live, table = _live([1, 2], slowdown={2: 1.25}, noise={2: 1.4})
    t2 = float(live.time_s.iloc[1])
    live["serial_part_s"] = [float("nan"), 0.2 * t2]
    live["parallel_part_s"] = [float("nan"), 0.8 * t2]
    row = verdicts.live_laws(live, table, designed_f=0.1, slowdowns={1: 1.0, 2: 1.25},
                             cores=2)[0]
    assert row["law"].startswith("live: t_2") and not row["holds"]
    assert set(row["split"]) == {"serial part", "parallel part"} and laws.split_sums(row)
    assert "measured split: serial part" in laws.verdict(row)


def test_without_a_slowdown_plain_amdahl_holds_too():
    live, table = _live([1, 2])
    rows = verdicts.live_laws(live, table, designed_f=0.1, slowdowns={1: 1.0, 2: 1.0}, cores=2)
    assert all(r["holds"] for r in rows)


def test_published_rows_say_their_kind_and_source():
    naive = verdicts.perfect_scaling_law("K80", world_size=4, speedup=2.97,
                                         serial_fraction=0.135, source="UVA")
    fit = verdicts.amdahl_fit_law("K80", world_size=4, speedup=2.97, serial_fraction=0.135,
                                  source="UVA")
    kf = verdicts.karp_flatt_law("K80", world_size=4, karp_flatt=0.115, serial_fraction=0.135,
                                 source="UVA")
    assert [naive["kind"], fit["kind"], kf["kind"]] == ["naive", "model", "model"]
    assert all(r["source"] == "UVA" for r in (naive, fit, kf))
    assert "2.85" in naive["note"]  # the measured reason: the fitted f's cap
    assert kf["tolerance_abs"] == 0.05 and fit["tolerance_pct"] == 10
    assert not karp_flatt_holds(0.2, 0.135)  # 0.065 away: outside 0.05


def karp_flatt_holds(e, f):
    return verdicts.karp_flatt_law("x", world_size=4, karp_flatt=e, serial_fraction=f,
                                   source="s")["holds"]


def test_speedup_sentence_flips_around_amdahl():
    kw = dict(world_size=2, amdahl=1.82, model=1.5, slowdown=1.25)
    assert "below plain Amdahl (1.82) by" in verdicts.speedup_sentence(measured=1.5, **kw)
    assert "above plain Amdahl (1.82) by" in verdicts.speedup_sentence(measured=1.9, **kw)
    assert "equal to plain Amdahl" in verdicts.speedup_sentence(measured=1.82, **kw)


def test_karp_flatt_sentence_flips_around_the_designed_fraction():
    kw = dict(world_size=4, designed_f=0.1, cores=2)
    assert "is above the designed f" in verdicts.karp_flatt_sentence(e=0.3, **kw)
    assert "4 ranks on 2 cores" in verdicts.karp_flatt_sentence(e=0.3, **kw)
    assert "is below the designed f" in verdicts.karp_flatt_sentence(e=0.05, **kw)
    assert "equals the designed f" in verdicts.karp_flatt_sentence(e=0.101, **kw)
    assert "cores" not in verdicts.karp_flatt_sentence(e=0.3, world_size=2, designed_f=0.1,
                                                       cores=2)


#: a quiet 2-core machine's profile: one thread's 192 x 192 product rate, co-run slowdown
QUIET = dict(matrix_size=192, cores=2, flop_per_s=30e9, co_run=1.25)


@pytest.mark.parametrize("world_sizes", [[1, 2], [1, 4]])
@pytest.mark.parametrize("total_work,repeat", [(400, 3), (100, 3), (600, 3), (400, 2), (400, 5)])
@pytest.mark.parametrize("serial_fraction", [0.0, 0.1, 0.3])
def test_documented_values_fit_the_budget(world_sizes, total_work, repeat, serial_fraction):
    """Every value the parameters cell documents, the others at their defaults, runs within
    notebook 02's share."""
    est = formulas.check_budget(live_world_sizes=world_sizes, total_work=total_work,
                                repeat=repeat, serial_fraction=serial_fraction, **QUIET)
    assert 0 < est <= formulas.BUDGET_S


@pytest.mark.parametrize("world_sizes,total_work", [([1, 2, 4], 400), ([1, 2], 20000),
                                                    ([1, 8], 400)])
def test_over_budget_is_refused_in_one_line(world_sizes, total_work):
    with pytest.raises(UsageError) as err:
        formulas.check_budget(live_world_sizes=world_sizes, total_work=total_work, repeat=3,
                              serial_fraction=0.1, **QUIET)
    text = str(err.value)
    assert "\n" not in text and "would take about" in text and "budget of 16 s" in text


def test_a_slower_machine_estimates_longer():
    kw = dict(live_world_sizes=[1, 2], total_work=400, repeat=3, serial_fraction=0.1,
              matrix_size=192, cores=2, co_run=1.25)
    assert formulas.notebook_seconds(flop_per_s=10e9, **kw) > \
        formulas.notebook_seconds(flop_per_s=30e9, **kw)


def test_the_amdahl_fit_is_a_model_law_through_three_rank_counts_or_more():
    slowdown = {2: 1.2, 4: 1.3}
    live, table = _live([1, 2, 4], slowdown=slowdown)
    rows = verdicts.live_laws(live, table, designed_f=0.1, slowdowns={1: 1.0, **slowdown},
                              cores=4)
    fits = {r["kind"]: r for r in rows if "fit" in r["law"]}
    assert set(fits) == {"model", "naive"} and fits["model"]["holds"]
