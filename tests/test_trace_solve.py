"""The solve lab's trace: the recorder of a solve's phases (labkit.solve.timeline), the rows as
Chrome trace events (labkit.solve.trace), the time-split figure's labels, and ``--trace DIR``
end to end on a 2-rank launch."""

from __future__ import annotations

import re
import subprocess

import pytest

from labkit import trace
from labkit.errors import UsageError
from labkit.solve import krylov
from labkit.solve.timeline import FIRST, LAST, PhaseRecorder, one_clock
from labkit.solve.trace import PHASES, pick, shown_iteration, thread_name, trace_events
from tests.conftest import LAUNCH_TIMEOUT_S

from ._solve_helpers import one_rank

# --- the recorder ------------------------------------------------------------------------------

#: loop passes a method makes beyond its iteration count (the last one tests the residual)
EXTRA_PASS = {"cg": 1, "pcg": 1, "pipecg": 1, "bicgstab": 0, "gmres": 0, "minres": 0}


def _recorded_solve(method, dims=(20, 20)):
    """A solve of ``method`` on one rank with a recorder on its operator: (solution, totals,
    recorded iterations, solve start, solve end)."""
    import time

    op, b = one_rank(dims)
    rec = op.sw = PhaseRecorder(op.sw.device)
    t0 = time.perf_counter()
    sol = krylov.solve(method, op, b, rtol=1e-8, maxiter=1000, restart=10)
    end = time.perf_counter()
    return sol, dict(rec.totals), rec.iterations(start_s=t0, end_s=end), end - t0


@pytest.mark.parametrize("method", sorted(EXTRA_PASS))
def test_each_method_marks_every_pass_and_the_recorder_keeps_the_first_and_last(method):
    sol, totals, its, span = _recorded_solve(method)
    passes = sol.iterations + EXTRA_PASS[method]
    assert passes > FIRST + LAST
    assert [it["iteration"] for it in its] == \
        list(range(1, FIRST + 1)) + list(range(passes - LAST + 1, passes + 1))
    for it in its:
        assert 0 <= it["start_s"] < it["end_s"] <= span
        for name, a, b in it["pieces"]:  # each piece inside its iteration, in order
            assert name in PHASES and it["start_s"] <= a <= b <= it["end_s"]
        starts = [a for _, a, _ in it["pieces"]]
        assert starts == sorted(starts)
        # a piece's time counts in its bucket's total: no piece is invented
        for bucket in {name for name, _, _ in it["pieces"]}:
            assert sum(b - a for n, a, b in it["pieces"] if n == bucket) <= totals[bucket] + 1e-12
    # consecutive recorded iterations touch: one ends where the next starts
    for x, y in zip(its, its[1:]):
        if y["iteration"] == x["iteration"] + 1:
            assert x["end_s"] == pytest.approx(y["start_s"], abs=1e-12)
    assert its[-1]["end_s"] == pytest.approx(span)


def test_the_recorder_keeps_the_totals_a_plain_stopwatch_keeps():
    op, b = one_rank((20, 20))
    plain = krylov.solve("cg", op, b, rtol=1e-8, maxiter=1000)
    plain_buckets = set(op.sw.totals)
    sol, totals, _, span = _recorded_solve("cg")
    assert sol.iterations == plain.iterations and set(totals) == plain_buckets
    assert 0 < sum(totals.values()) < span


def test_a_short_solve_is_recorded_whole_and_a_plain_stopwatch_records_nothing():
    op, b = one_rank((20, 20))
    rec = op.sw = PhaseRecorder(op.sw.device)
    sol = krylov.solve("cg", op, b, rtol=0.0, maxiter=2)
    its = rec.iterations(start_s=0.0, end_s=1e9)
    assert sol.iterations == 2 and [it["iteration"] for it in its] == [1, 2, 3]
    assert its[-1]["end_s"] == 1e9  # the last runs to the solve's end
    op, b = one_rank((20, 20))
    krylov.solve("cg", op, b, rtol=1e-8, maxiter=1000)
    assert not hasattr(op.sw, "iterations")


def test_one_clock_shifts_ranks_of_one_host_and_not_across_hosts():
    it = {"iteration": 7, "start_s": 0.001, "end_s": 0.002, "pieces": [("halo", 0.0012, 0.0015)]}
    same = one_clock([("a", 5.0, [it]), ("a", 5.0004, [it])])
    assert [p["start_s"] for p in same["timeline_s"]] == pytest.approx([0.0012, 0.0016])
    assert same["timeline_iterations"] == [7]
    apart = one_clock([("a", 5.0, [it]), ("b", 9.0, [it])])
    assert [p["start_s"] for p in apart["timeline_s"]] == pytest.approx([0.0012, 0.0012])
    assert [(s["rank"], s["iteration"]) for s in apart["timeline_iterations_s"]] == [(0, 7), (1, 7)]


# --- rows -> events ------------------------------------------------------------------------------

def _row(mode="strong", ranks=2, iterations=(1, 2, 8, 9, 10), late_s=2e-5, **kw):
    """A solve row whose recorded iterations each take 100 us: halo post, interior SpMV, halo
    wait, boundary SpMV, vector, all-reduce; rank 1 ``late_s`` behind rank 0."""
    pieces, spans = [], []
    for rank in range(ranks):
        for k, n in enumerate(iterations):
            t0 = 1e-4 * k + rank * late_s
            spans.append({"rank": rank, "iteration": n, "start_s": t0, "end_s": t0 + 1e-4})
            cursor = t0 + 2e-6
            for phase, d in (("halo", 5e-6), ("spmv", 3e-5), ("halo", 1e-5), ("spmv", 5e-6),
                             ("vector", 2e-5), ("allreduce", 2e-5)):
                pieces.append({"rank": rank, "iteration": n, "phase": phase,
                               "start_s": cursor, "end_s": cursor + d})
                cursor += d + 1e-6
    return {"mode": mode, "world_size": ranks, "dof_global": 40000, "partitioner": "simple",
            "method": "cg", "timeline_iterations": list(iterations), "timeline_s": pieces,
            "timeline_iterations_s": spans, **kw}


def test_one_slice_per_recorded_phase_at_the_rows_times_and_none_overlapping():
    row = _row()
    events = trace.check(trace.document(trace_events([row])))["traceEvents"]
    work = sorted((e for e in trace.slices(events) if e["cat"] != "other"),
                  key=lambda e: (e["pid"], e["ts"]))
    assert len(work) == len(row["timeline_s"])
    for e, p in zip(work, sorted(row["timeline_s"], key=lambda p: (p["rank"], p["start_s"]))):
        assert (e["pid"], e["cat"], e["name"], e["args"]["iteration"]) == \
            (p["rank"], p["phase"], PHASES[p["phase"]], p["iteration"])
        assert e["ts"] == pytest.approx(p["start_s"] * 1e6, abs=1e-3)
        assert e["ts"] + e["dur"] == pytest.approx(p["end_s"] * 1e6, abs=1e-3)
    assert trace.overlaps(events) == []
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert {e["name"] for e in trace.slices(events) if e["cat"] == "allreduce"} == {"all-reduce"}


def test_each_recorded_iteration_is_a_thread_its_slices_tiling_it():
    row = _row()
    doc = trace.document(trace_events([row]))
    by_thread = trace.threads(doc)
    assert list(by_thread) == [thread_name(row, n) for n in row["timeline_iterations"]]
    assert list(by_thread)[-1] == "strong 40,000 DOF simple cg, iteration 10 of 10"
    for n, by_pid in zip(row["timeline_iterations"], by_thread.values()):
        for rank, mine in by_pid.items():
            (span,) = [s for s in row["timeline_iterations_s"]
                       if s["rank"] == rank and s["iteration"] == n]
            assert mine[0]["ts"] == pytest.approx(span["start_s"] * 1e6)
            assert mine[-1]["ts"] + mine[-1]["dur"] == pytest.approx(span["end_s"] * 1e6)
            assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(mine, mine[1:]))
            other = sum(e["dur"] for e in mine if e["cat"] == "other")
            assert other == pytest.approx(100 - 90, abs=1e-3)  # us: the iteration less its phases


def test_rows_of_one_solve_are_one_thread_and_rows_without_a_timeline_are_left_out():
    weak, thr = _row("weak"), _row("throughput")
    sla = {"mode": "strong", "world_size": 2, "engine": "torch-sla", "timeline_s": None}
    doc = trace.document(trace_events([weak, thr, sla, _row(late_s=3e-5)]))
    assert [t for t in trace.threads(doc) if t.endswith("iteration 9 of 10")] == [
        "weak/throughput 40,000 DOF simple cg, iteration 9 of 10",
        "strong 40,000 DOF simple cg, iteration 9 of 10"]
    assert trace_events([sla]) == []


def test_pick_finds_the_shown_iteration_of_a_rows_launch(tmp_path):
    rows = [_row("weak"), _row("throughput"), _row(ranks=1, world_size=1)]
    paths = trace.write_launches(tmp_path, "solve", rows, trace_events)
    assert [p.name.split("-")[1] for p in paths] == ["1ranks", "2ranks"]
    assert shown_iteration(rows[1]) == 9
    path, thread = pick(paths, rows[1])
    assert path == str(paths[1]) and thread == "weak/throughput 40,000 DOF simple cg, iteration 9 of 10"
    assert thread in trace.threads(trace.load(path))
    with pytest.raises(UsageError, match="no trace of the 4-rank launch"):
        pick(paths, {**rows[0], "world_size": 4})


def test_the_figure_of_an_iteration_says_what_it_shows():
    import matplotlib.pyplot as plt

    from labkit.figures import text_overlaps, trace_timeline

    row = _row()
    fig, alt = trace_timeline(trace.document(trace_events([row])), thread=thread_name(row, 9))
    assert alt.startswith("Timeline of strong 40,000 DOF simple cg, iteration 9 of 10 on 2 ranks")
    assert re.search(r"rank 1: other 0\.01 ms \(7 slices\), halo 0\.0\d ms \(2 slices\)", alt)
    assert "allreduce 0.02 ms (1 slice)" in alt
    assert text_overlaps(fig) == []
    plt.close(fig)


# --- the time split's labels --------------------------------------------------------------------

def test_the_time_split_bars_say_their_size():
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkit.figures import text_overlaps
    from labkit.solve.plots import time_split_figure

    rows = [{"mode": "strong", "world_size": p, "partitioner": "simple", "method": "cg",
             "dof_global": n, "iterations": 10, "gate_passed": True, "spmv_time_s": 1e-3 * n / 1e4,
             "halo_time_s": 1e-4 * (p - 1), "allreduce_time_s": 2e-4 * (p - 1),
             "vector_time_s": 5e-4, "other_time_s": 1e-4}
            for n in (80_000, 2_000, 10_000, 40_000) for p in (2, 1)]
    rows.append({**rows[0], "mode": "weak"})
    fig = time_split_figure(pd.DataFrame(rows), mode="strong")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:2] == ["2,000 DOF\nP=1\nsimple\ncg", "2,000 DOF\nP=2\nsimple\ncg"]
    assert [lab.split("\n")[0] for lab in labels] == [
        f"{n:,} DOF" for n in (2_000, 10_000, 40_000, 80_000) for _ in (1, 2)]
    assert ax.get_title() == "time split per iteration (strong scaling)"
    assert text_overlaps(fig) == []
    plt.close(fig)
    # rows of several modes: the mode is on the bar too
    fig = time_split_figure(pd.DataFrame(rows[:1] + rows[-1:]))
    assert [t.get_text().split("\n")[-1] for t in fig.axes[0].get_xticklabels()] == ["strong", "weak"]
    plt.close(fig)


# --- the command line and a launch -------------------------------------------------------------

def test_solve_takes_trace_and_refuses_a_bad_folder_before_launching(labkit_cmd, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    p = subprocess.run([*labkit_cmd, "solve", "--total-dof", "400", "--trace", str(afile / "t")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"labkit solve: error: trace folder {afile / 't'}: {afile} is not a folder"]


@pytest.mark.slow
def test_trace_end_to_end_on_a_two_rank_solve(tmp_path):
    """One small 2-rank launch: one trace file, valid, one slice per recorded phase at the row's
    times, no rank doing two things at once, and the recorded phases within the row's totals."""
    from labkit import results, solve
    from labkit.launch import LaunchOptions
    from labkit.solve.report import COLUMNS

    cfg = solve.SolveConfig(modes=("strong", "weak"), total_dof=(1600,), dof_per_rank=800,
                            warmup=0, repeat=2, rtol=1e-6)
    store, folder = tmp_path / "rows.json", tmp_path / "traces"
    df = solve.run(cfg, launch=LaunchOptions(nprocs=(2,), threads_per_rank=1, progress=False,
                                             timeout_s=LAUNCH_TIMEOUT_S, trace_dir=str(folder)),
                   store=store)
    (path,) = folder.iterdir()
    assert path.name.startswith("solve-2ranks-") and df.attrs["trace_paths"] == [str(path)]
    rows = results.read_rows(store)
    assert results.undeclared(rows, COLUMNS) == []
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    work = [e for e in trace.slices(doc["traceEvents"]) if e["cat"] != "other"]
    # strong and weak solve the same grid once: one solve, one set of threads
    assert len(work) == len(rows[0]["timeline_s"]) and rows[0]["timeline_s"] == rows[1]["timeline_s"]
    for row in rows:
        its = row["timeline_iterations"]
        passes = row["iterations_per_repeat"][-1] + 1  # CG: one more pass than iterations
        assert its == [1, 2, passes - 2, passes - 1, passes]
        assert {p["rank"] for p in row["timeline_s"]} == {0, 1}
        assert {p["phase"] for p in row["timeline_s"]} == {"spmv", "halo", "allreduce", "vector"}
        spans = row["timeline_iterations_s"]
        assert len(spans) == 2 * len(its)
        for p in row["timeline_s"]:  # every phase inside its rank's iteration
            (span,) = [s for s in spans if (s["rank"], s["iteration"]) == (p["rank"], p["iteration"])]
            assert span["start_s"] <= p["start_s"] <= p["end_s"] <= span["end_s"]
    got = sorted((e["pid"], e["cat"], e["ts"], e["ts"] + e["dur"]) for e in work)
    want = sorted((p["rank"], p["phase"], p["start_s"] * 1e6, p["end_s"] * 1e6)
                  for p in rows[0]["timeline_s"])
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [t for g in got for t in g[2:]] == pytest.approx([t for w in want for t in w[2:]],
                                                            abs=1e-3)
    path_, thread = pick(df.attrs["trace_paths"], df.iloc[0])
    assert thread.startswith("strong/weak ") and thread in trace.threads(doc)
