"""The speedup lab's trace: every rank's timed runs of the workshare job (labkit.speedup.worker's
timeline), the rows as Chrome trace events (labkit.speedup.trace), and ``labkit workshare
--trace DIR`` end to end on a 2-rank launch."""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest

from labkit import trace
from labkit.errors import UsageError
from labkit.speedup.trace import median_run, pick, thread_name, trace_events
from labkit.speedup.worker import timeline
from tests.conftest import LAUNCH_TIMEOUT_S


def _marks(start, serial_s, serial_wait_s, share_s, end_s):
    """A run's marks on one rank's clock: start, serial products done, barrier passed, share
    done, end."""
    a = start + serial_s
    b = a + serial_wait_s
    c = b + share_s
    return (start, a, b, c, c + end_s)


def test_each_rank_and_run_has_its_segments_on_one_clock():
    rank0 = [_marks(10.0, 2e-3, 1e-4, 3e-3, 1e-4), _marks(20.0, 2e-3, 1e-4, 3e-3, 2e-4)]
    rank1 = [_marks(10.0005, 0.0, 1.6e-3, 3e-3, 1e-4), _marks(20.0001, 0.0, 2e-3, 3.2e-3, 0.0)]
    segs = timeline([("h", rank0, True), ("h", rank1, False)])
    assert [(s["run"], s["rank"], s["name"]) for s in segs if s["run"] == 1] == [
        (1, 0, "serial"), (1, 0, "wait for the serial part"), (1, 0, "parallel"),
        (1, 0, "wait for the last rank"),
        (1, 1, "wait for the serial part"), (1, 1, "parallel"), (1, 1, "wait for the last rank")]
    assert {s["cat"] for s in segs} == {"serial", "parallel", trace.IDLE}
    # one host: rank 1 started 0.5 ms after rank 0, and its run 2 0.1 ms after
    first = {}
    for s in segs:
        key = (s["run"], s["rank"])
        first[key] = min(first.get(key, s["start_s"]), s["start_s"])
    assert first[(1, 0)] == 0.0 and first[(1, 1)] == pytest.approx(5e-4)
    assert first[(2, 1)] == pytest.approx(1e-4)
    # rank 0's serial part (products and the barrier) and parallel part, as the row takes them
    for k, m in enumerate(rank0, 1):
        mine = {s["name"]: s["end_s"] - s["start_s"] for s in segs if (s["run"], s["rank"]) == (k, 0)}
        assert mine["serial"] + mine["wait for the serial part"] == pytest.approx(m[2] - m[0])
        assert mine["parallel"] + mine["wait for the last rank"] == pytest.approx(m[4] - m[2])
    # across hosts each rank's run starts at its own barrier's exit
    apart = timeline([("a", rank0, True), ("b", rank1, False)])
    assert {s["start_s"] for s in apart if s["name"] == "wait for the serial part" and s["rank"] == 1} == {0.0}


def _row(world_size=2, repeat=3):
    marks = [[_marks(float(k), 2e-3 * (r == 0), 1e-4 if r == 0 else 2e-3, 3e-3 + 1e-3 * k, 1e-4)
              for k in range(repeat)] for r in range(world_size)]
    return {"world_size": world_size, "serial_fraction": 0.1, "repeat": repeat,
            "timeline_s": timeline([("h", m, r == 0) for r, m in enumerate(marks)])}


def test_one_slice_per_segment_at_the_rows_times_and_none_overlapping():
    row = _row()
    events = trace.check(trace.document(trace_events([row])))["traceEvents"]
    got = sorted((e["args"]["run"], e["pid"], e["name"], e["cat"], e["ts"], e["ts"] + e["dur"])
                 for e in trace.slices(events))
    want = sorted((s["run"], s["rank"], s["name"], s["cat"], s["start_s"] * 1e6, s["end_s"] * 1e6)
                  for s in row["timeline_s"])
    assert [g[:4] for g in got] == [w[:4] for w in want]
    assert [t for g in got for t in g[4:]] == pytest.approx([t for w in want for t in w[4:]],
                                                            abs=1e-3)
    assert trace.overlaps(events) == []
    assert list(trace.threads(trace.document(events))) == [
        "2 ranks, serial fraction 0.1, run 1 of 3", "2 ranks, serial fraction 0.1, run 2 of 3",
        "2 ranks, serial fraction 0.1, run 3 of 3"]
    assert trace_events([{"world_size": 1, "time_s": 1.0}]) == []


def test_each_run_tiles_its_ranks_time_and_the_figure_says_so():
    import matplotlib.pyplot as plt

    from labkit.figures import text_overlaps, trace_timeline

    row = _row()
    doc = trace.document(trace_events([row]))
    for by_pid in trace.threads(doc).values():
        for mine in by_pid.values():  # segments touch: a rank is always working or waiting
            assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(mine, mine[1:]))
    fig, alt = trace_timeline(doc, thread=thread_name(row, 2))
    assert alt.startswith("Timeline of 2 ranks, serial fraction 0.1, run 2 of 3 on 2 ranks")
    assert "rank 0: serial 2.00 ms (1 slice), parallel 4.00 ms (1 slice), idle" in alt
    assert "rank 1: parallel 4.00 ms (1 slice), idle" in alt
    assert text_overlaps(fig) == []
    plt.close(fig)


def test_pick_shows_the_median_run_of_a_rows_launch(tmp_path):
    rows = [_row(world_size=1), _row()]
    assert median_run(rows[1]) == 2  # the runs' shares grow: run 2 is the middle one
    paths = trace.write_launches(tmp_path, "workshare", rows, trace_events)
    assert [p.name.split("-")[:2] for p in paths] == [["workshare", "1ranks"],
                                                     ["workshare", "2ranks"]]
    path, thread = pick(paths, rows[1])
    assert path == str(paths[1]) and thread in trace.threads(trace.load(path))
    with pytest.raises(UsageError, match="no trace of the 4-rank launch"):
        pick(paths, {**rows[1], "world_size": 4})


def test_workshare_refuses_a_bad_trace_folder_before_launching(labkit_cmd, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    p = subprocess.run([*labkit_cmd, "workshare", "--trace", str(afile / "t")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"labkit workshare: error: trace folder {afile / 't'}: {afile} is not a folder"]


@pytest.mark.slow
def test_trace_end_to_end_on_a_two_rank_workshare(labkit_cmd, tmp_path):
    """One small 2-rank launch: one trace file, valid, one slice per segment of the row at the
    row's times, no rank doing two things at once, rank 0's segments adding up to its parts."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "workshare", "--nproc", "2", "--total-work", "20",
                        "--serial-fraction", "0.25", "--matrix-size", "32", "--repeat", "3",
                        "--json", str(rows_path), "--trace", str(folder),
                        "--timeout", str(LAUNCH_TIMEOUT_S)],
                       capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S + 60)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("workshare-2ranks-") and f"wrote trace {path}" in p.stderr
    from labkit import results
    from labkit.speedup.report import COLUMNS

    (row,) = results.read_rows(rows_path)
    assert results.undeclared([row], COLUMNS) == []
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    got = sorted((e["args"]["run"], e["pid"], e["name"], e["ts"], e["ts"] + e["dur"])
                 for e in trace.slices(doc["traceEvents"]))
    want = sorted((s["run"], s["rank"], s["name"], s["start_s"] * 1e6, s["end_s"] * 1e6)
                  for s in row["timeline_s"])
    assert [g[:3] for g in got] == [w[:3] for w in want]
    assert [t for g in got for t in g[3:]] == pytest.approx([t for w in want for t in w[3:]],
                                                            abs=1e-3)
    assert {(s["run"], s["rank"]) for s in row["timeline_s"]} == {(k, r) for k in (1, 2, 3)
                                                                  for r in (0, 1)}
    assert {s["name"] for s in row["timeline_s"] if s["rank"] == 1} == {
        "wait for the serial part", "parallel", "wait for the last rank"}
    # rank 0's segments are the row's parts, run by run (the row holds their medians)
    parts = {}
    for s in row["timeline_s"]:
        if s["rank"] == 0:
            part = "serial" if s["name"] in ("serial", "wait for the serial part") else "parallel"
            parts.setdefault(part, {}).setdefault(s["run"], 0.0)
            parts[part][s["run"]] += s["end_s"] - s["start_s"]
    assert statistics.median(parts["serial"].values()) == pytest.approx(row["serial_part_s"])
    assert statistics.median(parts["parallel"].values()) == pytest.approx(row["parallel_part_s"])
    assert json.loads(path.read_text())["otherData"] == {"lab": "workshare", "world_size": 2,
                                                        "rows": 1}
