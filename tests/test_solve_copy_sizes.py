"""The solve lab's models read the machine profile's copies at the iteration's footprint
(notebooks 03 and 04): the floor of one rank at the whole problem's matrix and vectors, the
ranks' co-run slowdown at each rank's share of them, the copy's own slowdown there, where
notebook 04's launch timed no copies of its own (with them, s is theirs). Synthetic profiles
with copies at several sizes; pure, no launch."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from labkit.book import laws
from labkit.errors import UsageError
from labkit.solve import crossover, formulas, memory, memory_sentences
from tests._copy_profiles import CACHE_AND_MEMORY, MiB, copy_profile

PROF = copy_profile(CACHE_AND_MEMORY)


def _row(*, nbytes, compute1, computep, ranks=2, its=100, footprint=None):
    """A P-rank row with its inline baseline: compute only (no messages, no rest), ``nbytes``
    per iteration over all ranks (holding ``footprint``, about half of them, as CG's does),
    rank 0 alone computing it in ``compute1`` seconds and each of the ranks its share in
    ``computep``."""
    return {"world_size": ranks, "iterations": its, "time_per_iteration_s": computep,
            "spmv_time_s": its * computep / 2, "vector_time_s": its * computep / 2,
            "halo_time_s": 0.0, "allreduce_time_s": 0.0, "message_time_alone_s": 0.0,
            "compute_imbalance": 1.0, "baseline_time_per_iteration_s": compute1,
            "baseline_iterations": its, "baseline_compute_time_s": its * compute1,
            "bytes_per_iteration": nbytes, "minimal_bytes_per_iteration": 0.76 * nbytes,
            "footprint_bytes": 0.52 * nbytes if footprint is None else footprint}


def _loglog(x, x0, y0, x1, y1):
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


def test_the_profiles_copies_are_read_at_each_ranks_share_of_the_footprint():
    # 250,000 DOF on 2 ranks: 50 MB an iteration, 26 MB of matrix and vectors, 13 MB a rank:
    # the copy of 6.5 MB, whose alone and together rates give s
    m = memory.point(_row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3), profile=PROF,
                     message_s=0.0)
    r = m["reading"]
    assert r["footprint_per_rank"] == 13e6 and r["copy_size_bytes"] == 6.5e6
    alone = _loglog(6.5e6, 4 * MiB, 100e9, 16 * MiB, 60e9)
    together = _loglog(6.5e6, 4 * MiB, 95e9, 16 * MiB, 34e9)
    assert r["together_bytes_per_s"] == pytest.approx(together)
    assert m["slowdown"] == pytest.approx(alone / together)
    # the profile's copy that moves each rank's 25 MB (12.5 MB buffers) is well past the
    # caches: a larger s (the launch's own copies of that size are read as they are, timed in
    # the machine's state of the shares' seconds)
    before = memory.co_run_reading(PROF, footprint_bytes=50e6, ranks=2)
    assert before["slowdown"] > 1.2 * m["slowdown"]
    law = memory.laws({**m, "measured_slowdown": m["slowdown"]}, dof=250_000)[1]
    assert laws.check(**law)["holds"]
    assert not laws.check(**{**law, "predicted": before["slowdown"]})["holds"]


def test_the_launchs_own_copies_give_s_where_the_row_has_them():
    # the profile's copies at a share's footprint slow each other 1.24x; the launch's copies,
    # timed seconds from the shares, barely did (each rank 20 GB/s alone, 19.6 with both at
    # it): s is theirs, and the law holds where the shares ran 0.96x their time alone
    row = {**_row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3),
           "copy_bandwidth_alone_gb_per_s": 20.0, "copy_bandwidth_gb_per_s": 39.2,
           "share_alone_compute_per_iteration_s": 0.5e-3,
           "share_together_compute_per_iteration_s": 0.48e-3}
    m = memory.point(row, profile=PROF, message_s=0.0)
    alone = _loglog(6.5e6, 4 * MiB, 100e9, 16 * MiB, 60e9)
    together = _loglog(6.5e6, 4 * MiB, 95e9, 16 * MiB, 34e9)
    assert m["slowdown"] == pytest.approx(20 / 19.6)
    assert m["profile_slowdown"] == pytest.approx(alone / together)
    assert m["model_tp_s"] == pytest.approx(20 / 19.6 * 0.5e-3)
    law = memory.laws(m, dof=250_000)[1]
    assert laws.check(**law)["holds"] and law["note"].startswith("s: this launch's copies")
    assert "s = 1.02; the profile's copies, timed before this notebook, read 1.24" in \
        memory_sentences.launch_sentence(m)
    # a row without the launch's copies: the profile's s, which misses the same shares
    old = memory.point({k: v for k, v in row.items() if not k.startswith("copy_bandwidth")},
                       profile=PROF, message_s=0.0)
    assert old["launch_reading"] is None and old["slowdown"] == m["profile_slowdown"]
    assert not laws.check(**memory.laws(old, dof=250_000)[1])["holds"]
    assert "no copies of its own" in memory_sentences.launch_sentence(old)
    assert memory_sentences.reading_sentence(old["reading"]).startswith("The model reads")
    assert memory_sentences.reading_sentence(m["reading"], used=False).startswith(
        "The machine profile's copies, read at")


def test_a_share_within_the_caches_is_barely_slowed():
    # 40,000 DOF: 4 MB of data, 2 MB a rank, the copy of 1 MB, where copies barely slow each
    # other: s is that copy's 1.02
    m = memory.point(_row(nbytes=8e6, compute1=0.136e-3, computep=0.068e-3, footprint=4e6),
                     profile=PROF, message_s=0.0)
    assert m["slowdown"] == pytest.approx(100 / 98)
    assert "barely slow each other (1.02x" in memory_sentences.reading_sentence(m["reading"])


def test_a_share_that_streams_from_the_memory_reads_the_largest_copy():
    # 1M DOF: 104 MB of data, 52 MB a rank, the copy of 26 MB, past the largest measured
    # (32 MiB): its rates, not an extrapolation
    m = memory.point(_row(nbytes=200e6, compute1=6.2e-3, computep=3.6e-3, footprint=208e6),
                     profile=PROF, message_s=0.0)
    assert m["reading"]["together_bytes_per_s"] == pytest.approx(25e9)
    assert m["slowdown"] == pytest.approx(45 / 25)
    assert "slow each other 1.80x (they share" in memory_sentences.reading_sentence(m["reading"])


def test_the_floor_reads_the_copy_alone_at_the_whole_problems_footprint():
    m = memory.point(_row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3), profile=PROF,
                     message_s=0.0)
    whole = _loglog(13e6, 4 * MiB, 100e9, 16 * MiB, 60e9)  # the 1-rank iteration's 26 MB
    assert m["floor_bytes_per_s"] == pytest.approx(whole)
    assert m["floor1_s"] == pytest.approx(50e6 / whole)
    # not the copy that moves its 50 MB (25 MB buffers, past the caches: slower, a higher floor)
    assert PROF.copy_bytes_per_s(size_bytes=25e6) < 0.8 * whole
    # the fewest bytes: at the same rate (the same data held)
    assert m["minimal_floor1_s"] == pytest.approx(38e6 / whole)
    # an older row without its footprint reads the copy of its bytes, as the lab did
    old = {k: v for k, v in _row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3).items()
           if k != "footprint_bytes"}
    assert memory.point(old, profile=PROF, message_s=0.0)["floor_bytes_per_s"] == \
        pytest.approx(PROF.copy_bytes_per_s(size_bytes=25e6))


def test_the_footprint_counts_each_array_once():
    # CG on a 500 x 500 grid: 16 MB of matrix and 5 vectors of 2 MB, where it moves 50 MB
    one = formulas.footprint_bytes("cg", nnz=1_248_000, rows=250_000)
    assert one == 1_248_000 * 12 + 250_001 * 4 + 5 * 250_000 * 8
    assert one < 0.55 * formulas.bytes_per_iteration(
        "cg", formulas.spmv_bytes(1_248_000, 250_000, 0), 250_000)
    # GMRES holds its basis: more vectors with a longer restart
    assert formulas.vectors_held("gmres", restart=10) < formulas.vectors_held("gmres", restart=30)
    assert set(formulas.VECTORS_HELD) == set(formulas.SPMVS_PER_ITERATION)


def test_more_ranks_than_cores_take_turns():
    r = memory.co_run_reading(copy_profile(CACHE_AND_MEMORY, cores=2), footprint_bytes=4e6,
                              ranks=4)
    assert r["slowdown"] == pytest.approx(2.0 * 100 / 98)  # the cache's 1.02, 2 ranks a core
    assert "4 ranks take turns on 2 cores" in memory_sentences.reading_sentence(r, cores=2)


@pytest.mark.parametrize("copy, words", [(1.04, "barely slow each other (1.04x"),
                                         (1.8, "slow each other 1.80x (they share")])
def test_reading_sentence_names_what_the_copies_did(copy, words):
    r = memory.co_run_reading(PROF, footprint_bytes=8e6, ranks=2)
    assert words in memory_sentences.reading_sentence({**r, "copy_slowdown": copy})


# -- notebook 03: the crossover reads s at every size ----------------------------------------
K, C, C_P, PER_DOF = 5e-9, 30e-6, 130e-6, 200.0  # 200 bytes per DOF per iteration
FOOTPRINT_PER_DOF = 100.0  # of which each iteration holds half
SIZES = [2_000, 10_000, 40_000, 100_000, 250_000, 1_000_000]


def _expected_s(n):
    """s at N worked out by hand: each rank's share of the footprint (100 bytes a DOF) is the
    copy of 100 N / 2 / 2 bytes, its rates alone and together read log-log between the
    measured sizes (clamped to them)."""
    size = FOOTPRINT_PER_DOF * n / 4
    xs = sorted(CACHE_AND_MEMORY)
    size = min(max(size, xs[0]), xs[-1])
    for a, b in zip(xs, xs[1:]):
        if a <= size <= b:
            rates = [_loglog(size, a, CACHE_AND_MEMORY[a][i], b, CACHE_AND_MEMORY[b][i])
                     for i in (0, 1)]
            return max(1.0, rates[0] / rates[1])
    raise AssertionError


def _sweep():
    rows = []
    for n in SIZES:
        t1, tp = C + K * n, C_P + _expected_s(n) * K * n / 2
        for p, t in ((1, t1), (2, tp)):
            rows.append({"mode": "strong", "method": "cg", "partitioner": "simple",
                         "world_size": p, "dof_requested": n, "dof_global": n,
                         "time_per_iteration_s": t, "solve_time_s": 100 * t,
                         "speedup": t1 / t, "gate_passed": True,
                         "bytes_per_iteration": PER_DOF * n,
                         "footprint_bytes": FOOTPRINT_PER_DOF * n})
    return pd.DataFrame(rows)


def test_the_crossover_reads_s_at_every_size_of_the_sweep():
    table, summary = crossover.crossover(_sweep(), message_s=40e-6, profile=PROF)
    assert table["slowdown"].tolist() == pytest.approx([_expected_s(n) for n in SIZES])
    assert table["slowdown"].iloc[0] < 1.05 and table["slowdown"].iloc[-1] > 1.5
    assert table["error_pct"].abs().max() < 1e-6  # the machine follows the model exactly
    assert summary["slowdown"] == pytest.approx(_expected_s(SIZES[-1]))
    assert summary["reading"]["copy_size_bytes"] == pytest.approx(FOOTPRINT_PER_DOF * SIZES[-1] / 4)
    # N* where k N (1 - s(N)/2) = c_P - c, with s read at N itself
    n_star = summary["predicted_crossover_dof"]
    assert K * n_star * (1 - _expected_s(n_star) / 2) == pytest.approx(C_P - C, rel=1e-6)
    # one s for every size (the largest copy's) puts N* elsewhere and misses the small sizes
    flat, one = crossover.crossover(_sweep(), message_s=40e-6, slowdown=PROF.copy_slowdown)
    assert flat["error_pct"].abs().max() > 25
    assert one["predicted_crossover_dof"] != pytest.approx(n_star, rel=0.1)


def test_a_crossover_read_off_the_profile_needs_the_rows_bytes():
    with pytest.raises(UsageError, match="bytes_per_iteration"):
        crossover.crossover(_sweep().drop(columns="bytes_per_iteration"), message_s=40e-6,
                            profile=PROF)


def test_crossover_dof_reads_a_slowdown_that_changes_with_the_size():
    n = formulas.crossover_dof(seconds_per_dof_iteration=K, ranks=2, added_s=100e-6,
                               slowdown=lambda dof: 1.0 if dof < 50_000 else 1.9)
    assert n == pytest.approx(40_000, rel=1e-6)  # 100 us / (5 ns x 0.5), below the step
    never = formulas.crossover_dof(seconds_per_dof_iteration=K, ranks=2, added_s=100e-6,
                                   slowdown=lambda dof: 1.0 if dof < 20_000 else 2.5)
    assert never == math.inf  # 2 ranks lose below 20,000 and can never win beyond
