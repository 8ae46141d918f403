"""The machine profile: its arithmetic on synthetic rows, where it is found, the warning a
foreign profile gets, and one real measurement (slow)."""

from __future__ import annotations

import json
import socket

import pytest

from labkit import machine, results
from labkit.errors import UsageError
from labkit.machine import formulas, report
from labkit.machine.config import MachineConfig
from labkit.machine.profile import Profile, foreign
from labkit.procs import available_cores


def synthetic_rows(*, co_run=1.25, copy=1.6, busy=1.5, host=None, cores=None):
    """A profile whose every number is known: alpha 100 us, beta 1 GB/s on 2 ranks."""
    base = {"hostname": host or socket.gethostname(), "cores": cores or available_cores(),
            "torch_version": None, "world_size": 2, "timestamp": "2026-11-25T03:00:00+00:00"}
    rows = []
    for n in (64, 512):
        t = 2 * n ** 3 / 1e10
        rows += [{**base, "measurement": "matmul", "context": "alone", "n": n, "size_bytes": None,
                  "time_p50_s": t, "flop_per_s": 2 * n ** 3 / t},
                 {**base, "measurement": "matmul", "context": "together", "n": n,
                  "size_bytes": None, "time_p50_s": t * co_run,
                  "flop_per_s": 2 * n ** 3 / (t * co_run)}]
    rows += [{**base, "measurement": "step", "context": c, "n": 512, "size_bytes": None,
              "time_p50_s": t, "flop_per_s": 1e9 / t}
             for c, t in (("alone", 0.01), ("together", 0.01 * co_run))]
    rows += [{**base, "measurement": "copy", "context": c, "n": None, "size_bytes": 1 << 20,
              "time_p50_s": t, "bytes_per_s": 2 * (1 << 20) / t}
             for c, t in (("alone", 1e-3), ("together", 1e-3 * copy))]
    for s in (8, 4096, 1 << 20):
        t = 2 * 1e-4 + s / 1e9  # 2 (N-1) alpha + 2 (N-1)/N S / beta at N = 2
        for ctx, f in (("idle", 1.0), ("busy", busy)):
            rows.append({**base, "measurement": "allreduce", "context": ctx, "n": None,
                         "size_bytes": s, "time_p50_s": t * f, "bytes_per_s": s / (t * f)})
            rows.append({**base, "measurement": "message", "context": ctx, "n": None,
                         "size_bytes": s, "time_p50_s": (1e-4 + s / 1e9) * f,
                         "bytes_per_s": s / ((1e-4 + s / 1e9) * f)})
    return rows


def test_co_run_and_oversubscription_from_synthetic_rows():
    p = Profile.from_rows(synthetic_rows(co_run=1.25, cores=2))
    assert p.co_run_slowdown == pytest.approx(1.25)
    assert p.compute_slowdown(1) == 1.0
    assert p.compute_slowdown(2) == pytest.approx(1.25)
    assert p.compute_slowdown(4) == pytest.approx(2.5)  # two ranks a core, in turn
    assert p.compute_slowdown(2, n=64) == pytest.approx(1.25)
    assert p.copy_slowdown == pytest.approx(1.6)
    assert p.matmul_flop_per_s(256) == pytest.approx(1e10)


def test_collectives_in_context_from_synthetic_rows():
    p = Profile.from_rows(synthetic_rows(busy=1.5))
    assert p.alpha_s == pytest.approx(1e-4, rel=1e-3)
    assert p.beta_bytes_per_s == pytest.approx(1e9, rel=1e-3)
    assert p.allreduce_s(4096) == pytest.approx(2e-4 + 4096 / 1e9)
    assert p.allreduce_s(4096, busy=True) == pytest.approx(1.5 * (2e-4 + 4096 / 1e9))
    assert p.allreduce_s(4, busy=False) == pytest.approx(p.allreduce_s(8))  # no extrapolation down
    assert p.allreduce_s(1 << 20, ranks=1) == 0.0
    # another world size: the ring model with the sweep's fit, 2 (N-1) alpha + 2 (N-1)/N S / beta
    assert p.allreduce_s(1 << 20, ranks=4) == pytest.approx(6e-4 + 1.5 * (1 << 20) / 1e9,
                                                            rel=1e-3)
    assert p.message_s(4096) == pytest.approx(1e-4 + 4096 / 1e9)


def test_one_buffer_reads_the_repeated_calls_up_to_their_largest_size():
    """Notebook 01 calls one size again and again on one buffer; the profile's sweep
    calls each size after the others. Up to the repeated calls' largest size a prediction
    for the first reads them, beyond it (or without them) the sweep."""
    rows = synthetic_rows()
    sweep = Profile.from_rows(rows)
    assert sweep.transfer_s(8, one_buffer=True) == sweep.transfer_s(8)  # an older profile
    repeated = [{**rows[0], "measurement": "allreduce_repeated", "context": "idle", "n": None,
                 "size_bytes": s, "time_p50_s": t, "transfer_s": t}
                for s, t in ((8, 1.5e-4), (4096, 1.8e-4))]
    p = Profile.from_rows(rows + repeated)
    assert p.transfer_s(8, one_buffer=True) == pytest.approx(1.5e-4)
    assert p.transfer_s(8) == pytest.approx(2e-4 + 8 / 1e9)  # the sweep's, sizes in turns
    assert 1.5e-4 < p.transfer_s(512, one_buffer=True) < 1.8e-4  # log-log between them
    assert p.transfer_s(1 << 20, one_buffer=True) == p.transfer_s(1 << 20)  # beyond them
    assert p.transfer_s(8, one_buffer=True, busy=True) == p.transfer_s(8, busy=True)
    assert p.transfer_s(8, one_buffer=True, ranks=4) == p.transfer_s(8, ranks=4)
    assert p.scheduler_wait_s == sweep.scheduler_wait_s  # its calls price no wait


def test_sentences_flip_with_their_numbers():
    p = Profile.from_rows(synthetic_rows(co_run=1.25, busy=1.5))
    text = report.describe(p)
    assert "1.25x slower with 2 ranks" in text[0]
    assert "1.50x slower" in text[2]
    q = Profile.from_rows(synthetic_rows(co_run=0.8, busy=0.5))
    text = report.describe(q)
    assert "1.25x faster" in text[0] and "2.00x faster" in text[2]
    assert "about as fast" in report.describe(Profile.from_rows(synthetic_rows(co_run=1.0)))[0]


def test_a_sweep_without_a_bandwidth_term_is_described_not_failed():
    """A short noisy sweep (flat times) holds no alpha-beta line: the profile still says what
    it measured, and names the missing term."""
    rows = [dict(r, time_p50_s=5e-4) if r["measurement"] == "allreduce" else r
            for r in synthetic_rows()]
    text = report.describe(Profile.from_rows(rows))
    assert "no line with a bandwidth term" in text[-1]


def test_interpolation_and_slowdown_rules():
    assert formulas.loglog_interp(2, [1, 4], [10, 40]) == pytest.approx(20)
    with pytest.raises(ValueError):
        formulas.loglog_interp(1, [], [])
    with pytest.raises(ValueError):
        formulas.slowdown(t_together_s=0, t_alone_s=1)


def test_a_foreign_profile_is_used_with_a_visible_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(machine.ENV, raising=False)
    results.upsert(tmp_path / machine.FILE, synthetic_rows(host="elsewhere", cores=64),
                   ("measurement", "context", "n", "size_bytes"))
    p = machine.profile(tmp_path, measure=False)
    out = capsys.readouterr().out
    assert "WARNING" in out and "measured on host elsewhere" in out and str(tmp_path) in out
    assert p.warnings and p.host == "elsewhere"


def test_an_old_profile_outside_a_run_is_flagged():
    rows = [{"hostname": "a", "cores": 2, "timestamp": "2026-11-20T00:00:00+00:00"}]
    why = foreign(rows, host="a", cores=2, torch_version=None, now=1_800_000_000, in_run=False)
    assert why and "older run" in why[0]
    assert foreign(rows, host="a", cores=2, torch_version=None, in_run=True) == []


def test_a_missing_profile_without_measuring_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.delenv(machine.ENV, raising=False)
    with pytest.raises(UsageError, match="no machine profile"):
        machine.profile(tmp_path, measure=False)


def test_a_file_that_is_not_a_profile_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(machine.ENV, raising=False)
    results.upsert(tmp_path / machine.FILE, [{"measurement": "matmul", "context": "alone"}])
    with pytest.raises(UsageError, match="not a machine profile"):
        machine.profile(tmp_path, measure=False)


def test_config_refuses_bad_values_in_one_line():
    with pytest.raises(UsageError, match="max_bytes"):
        MachineConfig(min_bytes=64, max_bytes=8)
    with pytest.raises(UsageError, match="2 ranks"):
        MachineConfig().check_world_size(1)


@pytest.mark.slow
def test_calibrate_measures_and_a_notebook_reads_it(tmp_path, monkeypatch, capsys):
    """``labkit calibrate --json`` stores a profile every row of which has a finite time, and
    :func:`labkit.machine.profile` finds it (no warning: this machine, just now)."""
    from labkit.cli import main

    monkeypatch.delenv(machine.ENV, raising=False)
    path = tmp_path / machine.FILE
    assert main(["calibrate", "--json", str(path), "--iters", "3", "--max-bytes", "4096",
                 "--matmul-sizes", "32", "64"]) == 0
    out = capsys.readouterr().out
    # a 4 KiB sweep on busy gloo may find no bandwidth term: the sentence then says so
    assert "training step runs" in out
    assert "alpha-beta fit" in out or "no line with a bandwidth term" in out
    doc = json.loads(path.read_text())
    assert {r["measurement"] for r in doc["rows"]} == {"matmul", "step", "copy", "allreduce",
                                                       "message", "allreduce_repeated",
                                                       "allreduce_steady"}
    # the small all-reduces once more, one size call after call: notebook 01's 8 B reads them
    repeated = [r for r in doc["rows"] if r["measurement"] == "allreduce_repeated"]
    assert [r["size_bytes"] for r in repeated] == [8, 64, 512, 4096]
    assert all(r["context"] == "idle" and r["transfer_s"] > 0 for r in repeated)
    p = machine.profile(tmp_path, measure=False)
    assert not p.warnings and p.compute_slowdown(2) > 0 and p.allreduce_s(1024) > 0
    # the training step's rounds, each together over its alone: the co-run slowdown's samples
    together = [r for r in doc["rows"] if r["measurement"] == "step"
                and r["context"] == "together"]
    assert all(len(r["paired_slowdowns"]) == 3 and min(r["paired_slowdowns"]) > 0
               for r in together)
    assert min(x for r in together for x in r["paired_slowdowns"]) <= p.co_run_slowdown
    assert p.transfer_s(8, one_buffer=True) == pytest.approx(repeated[0]["transfer_s"])
    # every size once more, its calls back to back, idle and busy: the collectives lab's way
    steady = [r for r in doc["rows"] if r["measurement"] == "allreduce_steady"]
    assert sorted((r["context"], r["size_bytes"]) for r in steady) == sorted(
        (c, s) for c in ("busy", "idle") for s in (8, 64, 512, 4096))
    idle = {r["size_bytes"]: r["transfer_s"] for r in steady if r["context"] == "idle"}
    assert p.transfer_s(512, steady=True) == pytest.approx(idle[512])
    # a profile without them (an older one) answers with the sweep's
    older = machine.Profile.from_rows([r for r in doc["rows"]
                                       if r["measurement"] != "allreduce_steady"])
    assert older.transfer_s(512, steady=True) == older.transfer_s(512)


def _two_kinds(rows, *, share_idle=0.2, share_busy=0.5, wait_s=3.6e-3):
    """The synthetic profile's messages as two kinds of call: its p50s are the transfers (p10),
    a share of calls also waited ``wait_s`` for the scheduler."""
    out = []
    for r in rows:
        if r["measurement"] in ("allreduce", "message"):
            share = share_busy if r["context"] == "busy" else share_idle
            r = {**r, "time_p10_s": r["time_p50_s"], "wait_share": share,
                 "wait_excess_s": [wait_s] * round(10 * share)}
        out.append(r)
    return out


def test_a_call_is_its_transfer_plus_its_share_of_scheduler_waits():
    p = Profile.from_rows(_two_kinds(synthetic_rows(busy=1.5)))
    t = 2 * 1e-4 + (1 << 20) / 1e9
    assert p.transfer_s(1 << 20) == pytest.approx(t)
    assert p.transfer_s(1 << 20, busy=True) == pytest.approx(1.5 * t)
    assert p.transfer_s(1 << 20, measurement="message") == pytest.approx(1e-4 + (1 << 20) / 1e9)
    assert p.scheduler_wait_s == pytest.approx(3.6e-3)
    assert (p.wait_share(), p.wait_share(busy=True)) == (0.2, 0.5)
    # the average call in context: its transfer and its share of waits
    assert p.allreduce_s(1 << 20) == pytest.approx(t + 0.2 * 3.6e-3)
    assert p.allreduce_s(1 << 20, busy=True) == pytest.approx(1.5 * t + 0.5 * 3.6e-3)
    assert p.message_s(8) == pytest.approx(1e-4 + 8 / 1e9 + 0.2 * 3.6e-3)
    # alpha and beta are fitted to the transfers: the waits do not bend the line
    assert p.alpha_s == pytest.approx(1e-4, rel=1e-3)
    assert p.beta_bytes_per_s == pytest.approx(1e9, rel=1e-3)
    # at another rank count: the ring line through the transfers, plus the waits
    assert p.allreduce_s(1 << 20, ranks=4) == pytest.approx(
        6 * 1e-4 + 1.5 * (1 << 20) / 1e9 + 0.2 * 3.6e-3, rel=1e-3)
    # a profile without the two kinds kept apart: its p50s are its transfers, no waits
    old = Profile.from_rows(synthetic_rows(busy=1.5))
    assert old.transfer_s(1 << 20) == pytest.approx(t) and old.scheduler_wait_s == 0
    assert old.allreduce_s(1 << 20) == pytest.approx(t)


def test_waits_split_calls_into_their_two_kinds():
    w = formulas.waits([0.3e-3] * 7 + [4.0e-3, 3.9e-3, 0.35e-3])
    assert w["transfer_s"] == pytest.approx(0.3e-3)
    assert w["wait_share"] == pytest.approx(0.2)
    assert sorted(round(x * 1e3, 2) for x in w["wait_excess_s"]) == [3.6, 3.7]
    # a large message's own spread is no wait: the threshold grows with the transfer
    assert formulas.waits([10e-3] * 9 + [12e-3])["wait_share"] == 0
    counted = formulas.counted_waits([0.3e-3, 4e-3, 12e-3], [0.3e-3, 0.3e-3, 10e-3])
    assert counted["count"] == 1 and counted["excess_s"] == [pytest.approx(3.7e-3)]
    with pytest.raises(ValueError):
        formulas.counted_waits([1.0], [])


# -- copies at several sizes ---------------------------------------------------------------------
def test_copies_are_read_log_log_between_their_sizes():
    from tests._copy_profiles import CACHE_AND_MEMORY, MiB, copy_profile

    p = copy_profile(CACHE_AND_MEMORY)
    assert p.copy_sizes == [MiB, 4 * MiB, 16 * MiB, 32 * MiB]
    # no size: the largest copy, the memory's bandwidth (what the profile read before sizes)
    assert p.copy_bytes_per_s() == pytest.approx(45e9)
    assert p.copy_slowdown == pytest.approx(45 / 25)
    assert p.copy_slowdown_at() == p.copy_slowdown
    # at a measured size its rate; between two, log-log; outside them, the nearest one's
    assert p.copy_bytes_per_s(size_bytes=16 * MiB, together=True) == pytest.approx(34e9)
    assert p.copy_bytes_per_s(size_bytes=8 * MiB) == pytest.approx((100e9 * 60e9) ** 0.5)
    assert p.copy_bytes_per_s(size_bytes=64 << 10) == pytest.approx(100e9)
    assert p.copy_bytes_per_s(size_bytes=1 << 30, together=True) == pytest.approx(25e9)
    # copies that fit the caches side by side barely slow each other
    assert p.copy_slowdown_at(MiB) == pytest.approx(100 / 98)
    assert p.copy_slowdown_at(16 * MiB) == pytest.approx(60 / 34)


def test_a_profile_of_one_copy_size_reads_it_at_every_size():
    p = Profile.from_rows(synthetic_rows(copy=1.6))  # one copy of 1 MiB, as profiles were
    assert p.copy_sizes == [1 << 20]
    assert p.copy_slowdown_at(64 << 20) == pytest.approx(1.6) == p.copy_slowdown
    assert p.copy_bytes_per_s(size_bytes=4096) == p.copy_bytes_per_s()


def test_the_copy_sentence_names_every_size_and_flips():
    from tests._copy_profiles import CACHE_AND_MEMORY, MiB, copy_profile

    text = report.describe(copy_profile(CACHE_AND_MEMORY))[1]
    assert text.startswith("memory: a copy of 32 MiB per rank runs 1.80x slower with 2 ranks")
    assert "of 16 MiB, 1.76x slower" in text and "of 1 MiB, about as fast (1.02x)" in text
    faster = report.describe(copy_profile({MiB: (100e9, 125e9)}))[1]
    assert "1.25x faster" in faster


def test_copy_sizes_are_validated_in_one_line():
    assert MachineConfig().copy_bytes[-1] == 32 << 20  # the largest: the copy profiles had
    assert MachineConfig(copy_bytes=4096).copy_bytes == (4096,)
    assert MachineConfig(copy_bytes=(4 << 20, 1 << 20)).copy_bytes == (1 << 20, 4 << 20)
    with pytest.raises(UsageError, match="copy_bytes has repeats"):
        MachineConfig(copy_bytes=(1 << 20, 1 << 20))
    with pytest.raises(UsageError, match="copy_bytes"):
        MachineConfig(copy_bytes=(2, 1 << 20))


def test_the_profile_times_reduce_scatters_and_all_gathers_where_sharding_moves_them():
    """Sharded data parallelism's collectives as the profile timed them on this backend, read
    against an all-reduce of the same buffer; an older profile without them: a ring's half."""
    from labkit.machine.config import SHARDED_FROM_BYTES
    from labkit.tp.verdicts import op_factor

    from ._waits_profile import profile as two_kinds

    prof = two_kinds()
    assert prof.measured("reduce_scatter") and prof.measured("all_gather")
    assert op_factor(prof, "reduce_scatter", 1 << 20, ranks=2, busy=False) == pytest.approx(2)
    assert op_factor(prof, "all_gather", 1 << 20, ranks=2, busy=True) == pytest.approx(1)
    assert op_factor(prof, "all_reduce", 1 << 20, ranks=2, busy=False) == 1.0
    old = Profile.from_rows(synthetic_rows())
    assert not old.measured("reduce_scatter")
    assert op_factor(old, "reduce_scatter", 1 << 20, ranks=2, busy=False) == 0.5
    assert SHARDED_FROM_BYTES in MachineConfig().sizes()  # timed at a size of the sweep


def test_step_rate_by_batch_and_the_median_co_run_over_batches():
    base = [r for r in synthetic_rows(co_run=1.25) if r["measurement"] != "step"]
    steps = []
    # 16 rows at 20 GFLOP/s, 64 at 40 (a small batch's products run slower); the co-run
    # slowdowns 1.1, 1.3 and an outlier 2.0: the median is the middle one
    for b, rate, co in ((16, 20e9, 1.1), (64, 40e9, 1.3), (128, 40e9, 2.0)):
        t = 12 * b * 512 ** 2 / rate
        steps += [{**base[0], "measurement": "step", "context": c, "n": 512, "batch": b,
                   "time_p50_s": t * f, "flop_per_s": rate / f}
                  for c, f in (("alone", 1.0), ("together", co))]
    p = Profile.from_rows(base + steps)
    assert p.co_run_slowdown == pytest.approx(1.3)
    assert p.step_flop_per_s(batch=32) == pytest.approx(20e9 * 2 ** 0.5)  # log-log halfway
    assert p.step_flop_per_s(batch=4) == pytest.approx(20e9)  # not extrapolated
    assert p.step_flop_per_s() == pytest.approx(40e9)  # the largest batch's
    assert p.step_flop_per_s(together=True, batch=16) == pytest.approx(20e9 / 1.1)
    # where every round's ratio is kept, the co-run slowdown is their median over every batch:
    # one batch's burst (2.0 in its p50s, 1.8-2.2 a round) moves it less than it moved the p50s'
    paired = {16: [1.0, 1.05, 1.1], 64: [1.02, 1.06, 1.08], 128: [1.8, 2.0, 2.2]}
    rows = [{**r, "paired_slowdowns": paired[r["batch"]]} if r["context"] == "together" else r
            for r in steps]
    assert Profile.from_rows(base + rows).co_run_slowdown == pytest.approx(1.08)
    # a profile of one step row without its batch (written before batches were timed)
    old = Profile.from_rows(synthetic_rows(co_run=1.25))
    assert old.step_flop_per_s(batch=16) == old.step_flop_per_s() == pytest.approx(1e11)
