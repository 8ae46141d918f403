"""The solve lab's models read the machine profile's copies at their own size (notebooks 03 and
04): the floor of one rank at the whole problem's bytes, the ranks' co-run slowdown at each
rank's share, with a share that streams below what each rank gets with every rank copying not
slowed at all. Synthetic profiles with copies at several sizes; pure, no launch."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from labkit.book import laws
from labkit.errors import UsageError
from labkit.solve import crossover, formulas, memory
from tests._copy_profiles import CACHE_AND_MEMORY, MiB, copy_profile

PROF = copy_profile(CACHE_AND_MEMORY)


def _row(*, nbytes, compute1, computep, ranks=2, its=100):
    """A P-rank row with its inline baseline: compute only (no messages, no rest), ``nbytes``
    per iteration over all ranks, rank 0 alone computing it in ``compute1`` seconds and each
    of the ranks its share in ``computep``."""
    return {"world_size": ranks, "iterations": its, "time_per_iteration_s": computep,
            "spmv_time_s": its * computep / 2, "vector_time_s": its * computep / 2,
            "halo_time_s": 0.0, "allreduce_time_s": 0.0, "message_time_alone_s": 0.0,
            "compute_imbalance": 1.0, "baseline_time_per_iteration_s": compute1,
            "baseline_iterations": its, "baseline_compute_time_s": its * compute1,
            "bytes_per_iteration": nbytes, "minimal_bytes_per_iteration": 0.76 * nbytes}


def _loglog(x, x0, y0, x1, y1):
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


def test_the_profiles_copies_are_read_at_the_size_of_each_ranks_share():
    # 250,000 DOF on 2 ranks: 50 MB an iteration, 25 MB a rank, the copy of 12.5 MB; one rank
    # alone streamed the 50 MB in 1.14 ms (43.9 GB/s), each rank got about that beside the other
    m = memory.point(_row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3), profile=PROF,
                     message_s=0.0)
    r = m["reading"]
    assert r["bytes_per_rank"] == 25e6 and r["copy_size_bytes"] == 12.5e6
    together = _loglog(12.5e6, 4 * MiB, 95e9, 16 * MiB, 34e9)
    assert r["together_bytes_per_s"] == pytest.approx(together)
    assert m["slowdown"] == pytest.approx(50e6 / 1.14e-3 / together)
    # the largest copy's slowdown (1.8), what the model read before, misses by far; this holds
    law = laws.check(**memory.laws(m, dof=250_000)[1])
    assert law["holds"], law
    assert not laws.check(**{**memory.laws(m, dof=250_000)[1],
                             "predicted": PROF.copy_slowdown})["holds"]


def test_a_share_that_streams_below_the_together_rate_is_not_slowed():
    # 40,000 DOF: 4 MB a rank, the copy of 2 MB, where copies barely slow each other and each
    # rank still copies at ~97 GB/s; one rank alone streamed 59 GB/s: s = 1, not the copy's
    m = memory.point(_row(nbytes=8e6, compute1=0.136e-3, computep=0.068e-3), profile=PROF,
                     message_s=0.0)
    assert m["reading"]["together_bytes_per_s"] > m["reading"]["demand_bytes_per_s"]
    assert m["slowdown"] == 1.0
    assert "the ranks do not wait for the memory" in memory.reading_sentence(m["reading"])


def test_a_share_that_streams_from_the_memory_reads_the_largest_copy():
    # 1M DOF: 100 MB a rank, the copy of 50 MB, past the largest measured (32 MiB): its rate,
    # not an extrapolation
    m = memory.point(_row(nbytes=200e6, compute1=6.2e-3, computep=3.6e-3), profile=PROF,
                     message_s=0.0)
    assert m["reading"]["together_bytes_per_s"] == pytest.approx(25e9)
    assert m["slowdown"] == pytest.approx(200e6 / 6.2e-3 / 25e9)
    assert "asks more of the memory than it gets" in memory.reading_sentence(m["reading"])


def test_the_floor_reads_the_copy_alone_at_the_whole_problems_bytes():
    m = memory.point(_row(nbytes=50e6, compute1=1.14e-3, computep=0.57e-3), profile=PROF,
                     message_s=0.0)
    whole = _loglog(25e6, 16 * MiB, 60e9, 32 * MiB, 45e9)  # the 1-rank iteration's 50 MB
    assert m["floor_bytes_per_s"] == pytest.approx(whole)
    assert m["floor1_s"] == pytest.approx(50e6 / whole)
    # not the rate of each rank's share (12.5 MB, served by the caches: faster, a lower floor)
    assert PROF.copy_bytes_per_s(size_bytes=12.5e6) > 1.2 * whole
    # the fewest bytes: at their own copy's rate
    assert m["minimal_floor1_s"] == pytest.approx(
        38e6 / PROF.copy_bytes_per_s(size_bytes=19e6))


def test_more_ranks_than_cores_take_turns():
    r = memory.co_run_reading(copy_profile(CACHE_AND_MEMORY, cores=2), bytes_per_iteration=8e6,
                              ranks=4, demand_bytes_per_s=59e9)
    assert r["slowdown"] == pytest.approx(2.0)  # not slowed by the memory, 2 ranks a core
    assert "4 ranks take turns on 2 cores" in memory.reading_sentence(r, cores=2)


@pytest.mark.parametrize("copy, words", [(1.04, "barely slow each other (1.04x"),
                                         (1.8, "slow each other 1.80x (they share")])
def test_reading_sentence_names_what_the_copies_did(copy, words):
    r = memory.co_run_reading(PROF, bytes_per_iteration=8e6, ranks=2, demand_bytes_per_s=59e9)
    assert words in memory.reading_sentence({**r, "copy_slowdown": copy})


# -- notebook 03: the crossover reads s at every size ----------------------------------------
K, C, C_P, PER_DOF = 5e-9, 30e-6, 130e-6, 200.0  # 200 bytes per DOF per iteration
SIZES = [2_000, 10_000, 40_000, 100_000, 250_000, 1_000_000]


def _expected_s(n):
    """s at N worked out by hand: one rank streams 200 / 5 ns = 40 GB/s; each rank's share is
    the copy of 200 N / 2 / 2 bytes, its together rate read log-log between the measured
    sizes (clamped to them)."""
    size = PER_DOF * n / 4
    xs = sorted(CACHE_AND_MEMORY)
    size = min(max(size, xs[0]), xs[-1])
    for a, b in zip(xs, xs[1:]):
        if a <= size <= b:
            together = _loglog(size, a, CACHE_AND_MEMORY[a][1], b, CACHE_AND_MEMORY[b][1])
            return max(1.0, (PER_DOF / K) / together)
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
                         "bytes_per_iteration": PER_DOF * n})
    return pd.DataFrame(rows)


def test_the_crossover_reads_s_at_every_size_of_the_sweep():
    table, summary = crossover.crossover(_sweep(), message_s=40e-6, profile=PROF)
    assert table["slowdown"].tolist() == pytest.approx([_expected_s(n) for n in SIZES])
    assert table["slowdown"].iloc[0] == 1.0 and table["slowdown"].iloc[-1] > 1.5
    assert table["error_pct"].abs().max() < 1e-6  # the machine follows the model exactly
    assert summary["slowdown"] == pytest.approx(_expected_s(SIZES[-1]))
    assert summary["reading"]["copy_size_bytes"] == pytest.approx(PER_DOF * SIZES[-1] / 4)
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
