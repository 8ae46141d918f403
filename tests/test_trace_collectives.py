"""The collectives lab's timed calls on one clock and as a Chrome trace
(labkit.collectives.trace), the file's size bound, ``--trace DIR``, and a 2-rank launch whose
trace holds exactly what its rows measured."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from labkit import collectives, results, trace
from labkit.collectives import formulas, report
from labkit.collectives.config import BUSY_CALLS_PER_ITER
from labkit.collectives.trace import (
    TRACED_CALLS,
    call_timeline,
    calls_of,
    calls_sentence,
    one_clock,
    thread_name,
    trace_events,
    widest_spread,
)
from labkit.launch import LaunchOptions


def _stamps(ranks: int, iters: int, *, seed: int = 0, start: float = 100.0) -> np.ndarray:
    """Readings of ``ranks`` ranks on one host: barrier exits a little apart, then calls back
    to back whose ends are close across ranks (a collective ends once all have joined)."""
    rng = np.random.default_rng(seed)
    exits = start + rng.uniform(0, 2e-4, ranks)
    ends = exits.max() + np.cumsum(rng.uniform(1e-4, 3e-3, iters))
    return np.column_stack([exits, ends[None, :] + rng.uniform(0, 5e-5, (ranks, iters))])


def _row(op: str, size: int, *, ranks: int = 2, iters: int = 8, busy: bool = False,
         origin: float = 100.0, seed: int = 0) -> dict:
    stamps = _stamps(ranks, iters, seed=seed, start=origin + 1e-3 * seed)
    times = (np.diff(stamps, axis=1)).max(axis=0)
    row = {"op": op, "size_bytes": size, "world_size": ranks, "iters": iters, "nnodes": 1,
           "time_p10_s": float(np.percentile(times, 10)),
           "time_p50_s": float(np.percentile(times, 50)),
           "time_p90_s": float(np.percentile(times, 90)),
           "timeline_s": call_timeline(stamps, origin_s=origin), "busy_timeline_s": None}
    if busy:
        row["busy_timeline_s"] = call_timeline(_stamps(ranks, BUSY_CALLS_PER_ITER * iters,
                                                       seed=seed + 1000,
                                                       start=origin + 1e-3 * seed + 0.5),
                                               origin_s=origin)
    return row


# --- one clock ------------------------------------------------------------------------------

def test_call_timeline_holds_the_calls_the_rows_are_made_of():
    stamps = _stamps(3, 5)
    calls = call_timeline(stamps, origin_s=100.0)
    assert [(c["rank"], c["call"]) for c in calls] == [(r, k) for r in range(3) for k in range(1, 6)]
    for r in range(3):  # back to back: each call starts where the one before it ended
        mine = [c for c in calls if c["rank"] == r]
        assert mine[0]["start_s"] == pytest.approx(stamps[r, 0] - 100.0)
        assert [c["end_s"] - c["start_s"] for c in mine] == pytest.approx(np.diff(stamps[r]))
        assert all(a["end_s"] == b["start_s"] for a, b in zip(mine, mine[1:]))
    # the slowest rank's time per call, as the worker counts it, read back from the timeline
    assert calls_of({"timeline_s": calls})["time_s"] == pytest.approx(
        np.diff(stamps, axis=1).max(axis=0))


def test_the_first_traced_calls_only():
    calls = call_timeline(_stamps(2, TRACED_CALLS + 10), origin_s=100.0)
    assert len(calls) == 2 * TRACED_CALLS
    assert max(c["call"] for c in calls) == TRACED_CALLS
    assert len(call_timeline(_stamps(2, 5), origin_s=100.0, limit=3)) == 2 * 3


def test_across_hosts_each_rank_is_aligned_at_the_barrier():
    stamps = np.array([[10.0, 10.4, 10.9], [500.0, 500.5, 500.9]])  # two unrelated clocks
    same = one_clock(stamps, same_host=False)
    assert same[:, 0].tolist() == [10.0, 10.0]
    assert np.diff(same, axis=1) == pytest.approx(np.diff(stamps, axis=1))
    assert one_clock(stamps, same_host=True).tolist() == stamps.tolist()
    with pytest.raises(ValueError):
        one_clock([1.0, 2.0], same_host=True)


# --- the trace ------------------------------------------------------------------------------

def test_one_slice_per_call_at_the_rows_times_and_none_overlapping():
    rows = [_row("all_reduce", 8, busy=True), _row("all_reduce", 8 << 20, busy=True, seed=1),
            _row("broadcast", 8, seed=2), {"op": "all_gather", "size_bytes": 8, "world_size": 2}]
    events = trace.check(trace.document(trace_events(rows)))["traceEvents"]
    assert trace.overlaps(events) == []  # each rank made one call at a time
    by_thread = trace.threads({"traceEvents": events})
    assert list(by_thread) == ["all_reduce 8 B", "all_reduce 8 B, cores busy", "all_reduce 8 MiB",
                               "all_reduce 8 MiB, cores busy", "broadcast 8 B"]
    for row in rows[:3]:
        for column, busy in (("timeline_s", False), ("busy_timeline_s", True)):
            if not row[column]:
                continue
            got = sorted((e["pid"], e["name"], e["ts"], e["ts"] + e["dur"], e["cat"])
                         for mine in by_thread[thread_name(row, busy=busy)].values() for e in mine)
            want = sorted((c["rank"], f"#{c['call']}", c["start_s"] * 1e6, c["end_s"] * 1e6,
                           row["op"]) for c in row[column])
            assert [g[:2] + g[4:] for g in got] == [w[:2] + w[4:] for w in want]
            assert [t for g in got for t in g[2:4]] == pytest.approx(
                [t for w in want for t in w[2:4]], abs=1e-3)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert trace_events([{"op": "all_reduce", "size_bytes": 8, "timeline_s": []}]) == []


def test_a_thread_says_when_it_holds_only_the_first_calls():
    row = _row("all_to_all", 1 << 20, iters=TRACED_CALLS + 8)
    assert thread_name(row) == f"all_to_all 1 MiB, calls 1-{TRACED_CALLS} of {TRACED_CALLS + 8}"
    assert "of" not in thread_name(_row("all_to_all", 1 << 20, iters=TRACED_CALLS))


def _sweep(*, ops, max_bytes, factor, iters, ranks, busy):
    rows = []
    for op in ops:
        for k, (size, _) in enumerate(formulas.size_sweep(op, ranks, 8, max_bytes, factor)):
            rows.append(_row(op, size, ranks=ranks, iters=iters, seed=k,
                             busy=busy and op == "all_reduce"))
    return rows


def test_the_default_sweeps_file_is_small_and_a_long_one_is_bounded(tmp_path):
    # notebook 06's defaults: every op, 8 B to 8 MiB by 4, 8 calls, busy all-reduces
    rows = _sweep(ops=formulas.OPS, max_bytes=8 << 20, factor=4, iters=8, ranks=2, busy=True)
    (path,) = trace.write_launches(tmp_path / "a", "collectives", rows, trace_events)
    slices = trace.slices(trace.load(path)["traceEvents"])
    assert len(slices) == sum(2 * 8 * (1 + BUSY_CALLS_PER_ITER * bool(r["busy_timeline_s"]))
                              for r in rows)
    assert path.stat().st_size < 400_000  # embedded in the page as a download link
    # 1000 calls per size on 4 ranks: the trace keeps the first TRACED_CALLS of each
    rows = _sweep(ops=formulas.OPS, max_bytes=64 << 20, factor=2, iters=1000, ranks=4, busy=True)
    (path,) = trace.write_launches(tmp_path / "b", "collectives", rows, trace_events)
    doc = trace.load(path)
    threads = sum(1 + bool(r["busy_timeline_s"]) for r in rows)
    assert len(trace.slices(doc["traceEvents"])) == threads * 4 * TRACED_CALLS
    assert path.stat().st_size < 300 * threads * 4 * TRACED_CALLS


# --- what the notebook prints ---------------------------------------------------------------

def test_the_size_shown_is_the_one_whose_calls_varied_most():
    rows = [dict(_row("all_reduce", s, seed=k), time_p10_s=a, time_p90_s=b)
            for k, (s, a, b) in enumerate(((8, 1e-4, 1e-3), (64, 1e-4, 4e-3), (1 << 20, 1e-3, 2e-3)))]
    rows.append(dict(_row("broadcast", 8), time_p10_s=1e-5, time_p90_s=1.0))
    assert widest_spread(rows, "all_reduce")["size_bytes"] == 64
    with pytest.raises(ValueError, match="no all_gather row"):
        widest_spread(rows, "all_gather")


def test_the_calls_sentence_is_computed_from_the_timeline():
    row = _row("all_reduce", 512, iters=6)
    c = calls_of(row)
    text = calls_sentence(row)
    assert text.startswith("all_reduce 512 B on 2 ranks, 6 timed calls back to back: each took "
                           f"{c['time_s'].min() * 1e3:.3g} ms to {c['time_s'].max() * 1e3:.3g} ms")
    assert f"up to {c['start_gap_s'].max() * 1e3:.3g} ms apart" in text
    # rank 1 leaves the 2nd call 5 ms after rank 0 and so joins the 3rd late: rank 0 waits
    late = call_timeline([[0, 1e-3, 2e-3, 8e-3, 9e-3], [0, 1e-3, 7e-3, 8e-3, 9e-3]], origin_s=0)
    text = calls_sentence(dict(row, iters=4, timeline_s=late))
    assert ("A late rank explains up to 5 ms of the 5 ms between the shortest and the longest "
            "call") in text and text.endswith("Rank 1 started last in 1 of the 4 calls.")
    assert "several hosts" in calls_sentence(dict(row, nnodes=2))
    one = dict(row, timeline_s=[c for c in row["timeline_s"] if c["rank"] == 0])
    assert calls_sentence(one).endswith("One rank: no other rank to wait for.")
    assert "the first 6 of 50 timed calls" in calls_sentence(dict(row, iters=50))


# --- the command line and a launch ----------------------------------------------------------

def test_collectives_takes_trace(labkit_cmd, tmp_path):
    p = subprocess.run([*labkit_cmd, "collectives", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "--trace DIR" in p.stdout
    afile = tmp_path / "file"
    afile.write_text("")
    p = subprocess.run([*labkit_cmd, "collectives", "--trace", str(afile / "t")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"labkit collectives: error: trace folder {afile / 't'}: {afile} is not a folder"]


@pytest.mark.slow
def test_a_two_rank_sweep_writes_the_calls_its_rows_measured(tmp_path):
    """One small launch: one trace file, valid, one slice per timed call of every rank at the
    row's times, whose slowest-rank durations are the row's percentiles; the sizes on one
    clock, in two passes over each op's sizes (a size's second half of calls after the first
    half of every size of its op)."""
    config = collectives.CollectivesConfig(ops=("all_reduce", "broadcast"), max_bytes="4K",
                                           factor=8, iters=4, warmup=1, check=False, busy=True)
    folder = tmp_path / "traces"
    df = collectives.run(config, launch=LaunchOptions(nprocs=(2,), progress=False, timeout_s=180,
                                                      trace_dir=str(folder)),
                         store=tmp_path / "rows.json")
    (path,) = folder.iterdir()
    assert df.attrs["trace_paths"] == [str(path)]
    assert path.name.startswith("collectives-2ranks-") and path.name.endswith(".trace.json")
    rows = df.to_dict("records")
    assert results.undeclared(rows, report.COLUMNS) == []
    assert results.undeclared(results.read_rows(tmp_path / "rows.json"), report.COLUMNS) == []
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    expected = [thread_name(r, busy=b) for r in rows for b in (False, True)
                if r["busy_timeline_s" if b else "timeline_s"]]
    assert list(by_thread) == expected
    assert len(expected) == len(rows) + int((df.op == "all_reduce").sum())
    for name in expected:
        mine = [e for es in by_thread[name].values() for e in es]
        calls = (BUSY_CALLS_PER_ITER if name.endswith("cores busy") else 1) * config.iters
        assert sorted(by_thread[name]) == [0, 1] and len(mine) == 2 * calls
    # the sweep on one clock, its sizes in two passes: a rank runs one call at a time
    for rank in (0, 1):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for name in expected
                       for e in by_thread[name][rank])
        bad = [(a, b) for a, b in zip(spans, spans[1:]) if a[1] > b[0] + 1e-3]
        assert not bad, bad[:3]
    # each size's calls in two passes over its op's sizes: an op's second half of calls
    # starts after the first half of every size of that op ended
    late = []
    for op in config.ops:
        # (the call's number, its half: the busy all-reduce numbers its more calls on alike)
        mine = [(int(e["name"][1:]), (BUSY_CALLS_PER_ITER if name.endswith("cores busy") else 1)
                 * (config.iters // 2), e) for name in expected if name.startswith(op + " ")
                for e in by_thread[name][0]]
        first_pass = max(e["ts"] + e["dur"] for k, half, e in mine if k <= half)
        late += [(op, e["ts"], first_pass) for k, half, e in mine
                 if k > half and e["ts"] < first_pass - 1e-3]
    assert not late, late[:3]
    for row in rows:
        for column, prefix in (("timeline_s", "time"), ("busy_timeline_s", "busy_time")):
            if not row[column]:
                continue
            got = sorted((e["pid"], int(e["name"][1:]), e["ts"], e["ts"] + e["dur"])
                         for es in by_thread[thread_name(row, busy=column != "timeline_s")].values()
                         for e in es)
            want = sorted((c["rank"], c["call"], c["start_s"] * 1e6, c["end_s"] * 1e6)
                          for c in row[column])
            assert [g[:2] for g in got] == [w[:2] for w in want]
            assert [t for g in got for t in g[2:]] == pytest.approx(
                [t for w in want for t in w[2:]], abs=1e-3)
            times = calls_of(row, column)["time_s"]  # what the row's percentiles are made of
            for q in (10, 50, 90):
                assert float(np.percentile(times, q)) == pytest.approx(row[f"{prefix}_p{q}_s"],
                                                                       rel=1e-9)
