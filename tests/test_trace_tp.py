"""The tensor-parallel lab's Chrome trace: a timed step's slices on one clock
(labkit.tp.timeline.step_slices), the rows as events (labkit.tp.trace), the figure, and
``labkit tp --trace DIR`` end to end on two ranks."""

from __future__ import annotations

import subprocess

import pytest

from labkit import trace
from labkit.tp import timeline
from labkit.tp.trace import trace_events


def _call(name, before, a, b, op="all_reduce"):
    return {"op": op, "name": name, "before": before, "phase": "forward", "entry_s": a,
            "exit_s": b}


def _records(offset=0.0):
    """Two ranks, two all-reduces: rank 1 starts 0.5 ms later (on one clock) and enters the
    first call late, rank 0 the second."""
    r0 = {"origin_s": 100.0, "end_s": 0.020, "tail": "rest",
          "calls": [_call("g L0 attn", "L0 attn fwd", 0.002, 0.008),
                    _call("g L0 mlp", "L0 mlp fwd", 0.014, 0.016)]}
    r1 = {"origin_s": 100.0005 + offset, "end_s": 0.019, "tail": "rest",
          "calls": [_call("g L0 attn", "L0 attn fwd", 0.006, 0.0075),
                    _call("g L0 mlp", "L0 mlp fwd", 0.010, 0.0155)]}
    return [r0, r1]


def test_a_step_tiles_every_rank_and_splits_each_call_as_the_columns_do():
    slices = timeline.step_slices(_records())
    for rank in (0, 1):
        mine = [s for s in slices if s["rank"] == rank]
        # compute, wait, message ... tile the rank's step, one after the other
        assert all(a["end_s"] == pytest.approx(b["start_s"]) for a, b in zip(mine, mine[1:]))
        assert [s["name"] for s in mine if s["cat"] == "compute"] == ["L0 attn fwd",
                                                                       "L0 mlp fwd", "rest"]
    # the waits and messages are split_waits' split, call by call
    tls = [[(c["entry_s"] + r["origin_s"], c["exit_s"] + r["origin_s"]) for c in r["calls"]]
           for r in _records()]
    for rank, split in enumerate(timeline.split_waits(tls)):
        mine = [s for s in slices if s["rank"] == rank]
        wait = sum(s["end_s"] - s["start_s"] for s in mine if s["cat"] == "idle")
        msg = sum(s["end_s"] - s["start_s"] for s in mine if s["cat"] == "all-reduce")
        assert wait == pytest.approx(split["wait"]) and msg == pytest.approx(split["message"])
    # every message of one call starts together: at the last rank's entry
    starts = {s["start_s"] for s in slices if s["name"] == "g L0 attn"}
    assert len(starts) == 1 and starts.pop() == pytest.approx(0.0065)


def test_ranks_without_one_clock_are_aligned_by_their_exits():
    shared = timeline.step_slices(_records())
    # rank 1's host clock 7 s off: no common clock, aligned by the median offset of the exits
    apart = timeline.step_slices(_records(offset=7.0), shared_clock=False)
    assert min(s["start_s"] for s in apart) == 0.0
    # both ranks leave each call at the same moment here: the same slices as on one clock
    assert [(s["rank"], s["name"], s["cat"]) for s in apart] == \
        [(s["rank"], s["name"], s["cat"]) for s in shared]
    assert [t for s in apart for t in (s["start_s"], s["end_s"])] == pytest.approx(
        [t for s in shared for t in (s["start_s"], s["end_s"])])
    bad = _records()
    bad[1]["calls"] = bad[1]["calls"][:1]
    with pytest.raises(ValueError, match="same calls"):
        timeline.step_slices(bad)


def _row(**kw):
    return {"variant": "naive", "world_size": 2, "timeline_step": 2,
            "timeline_step_time_s": 0.02, "step_time_p50_s": 0.021,
            "timeline_s": timeline.step_slices(_records()), **kw}


def test_one_slice_per_timeline_entry_at_the_rows_times_and_none_overlapping():
    rows = [_row(), _row(variant="sp"), {"variant": "library", "world_size": 2},
            {"variant": "naive", "world_size": 1}]
    doc = trace.check(trace.document(trace_events(rows)))
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    assert list(by_thread) == ["TP by hand P=2, step 2", "TP + SP by hand P=2, step 2"]
    for row, name in zip(rows, by_thread):
        _slices_are_the_rows(by_thread[name], row)
    idle = [e for e in trace.slices(doc["traceEvents"]) if e["cat"] == trace.IDLE]
    assert idle and {e["name"] for e in idle} == {"wait"}
    ends = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(ends) == 2 * 2 and all(e["args"]["timeline_step_time_s"] == 0.02 for e in ends)
    assert trace_events([{"variant": "library", "world_size": 2}]) == []


def test_the_figure_draws_every_slice_and_only_names_that_fit():
    import matplotlib.pyplot as plt

    from labkit.figures import text_overlaps, trace_timeline

    doc = trace.document(trace_events([_row()]))
    fig, alt = trace_timeline(doc, thread=["TP by hand P=2, step 2"])
    ax = fig.axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(trace.slices(doc["traceEvents"]))
    assert alt == trace.describe(doc, "TP by hand P=2, step 2")
    assert text_overlaps(fig) == []
    plt.close(fig)


def test_trace_is_a_flag_of_the_tp_command(labkit_cmd, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    p = subprocess.run([*labkit_cmd, "tp", "--trace", str(afile / "t")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"labkit tp: error: trace folder {afile / 't'}: {afile} is not a folder"]


@pytest.mark.slow
def test_trace_end_to_end_on_two_tp_ranks(labkit_cmd, tmp_path):
    """One small launch: one trace file, valid, one slice per timeline entry of every
    hand-written row at the row's times, no rank doing two things at once on one thread."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "tp", "--nproc", "2", "--variant", "naive", "sp",
                        "--hidden", "32", "--num-heads", "4", "--seq-len", "8",
                        "--batch-size", "2", "--num-layers", "2", "--steps", "3", "--warmup",
                        "1", "--no-baseline", "--json", str(rows_path), "--trace", str(folder)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("tp-2ranks-") and f"wrote trace {path}" in p.stderr
    from labkit import results

    rows = results.load(rows_path).to_dict("records")
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    assert sorted(n.split(",")[0] for n in by_thread) == ["TP + SP by hand P=2", "TP by hand P=2"]
    for row in rows:
        name = next(n for n in by_thread if n.startswith(
            {"naive": "TP by hand", "sp": "TP + SP by hand"}[row["variant"]]))
        _slices_are_the_rows(by_thread[name], row)
        # every collective counted is in the step: a message slice per call on every rank
        calls = sum(int(row[f"{op}_calls_measured"]) for op in ("allreduce", "allgather",
                                                                "reduce_scatter"))
        msgs = [s for s in row["timeline_s"] if s["cat"] not in ("compute", "idle")]
        assert len(msgs) == 2 * calls
        assert row["timeline_step_time_s"] == row["step_times_s"][int(row["timeline_step"]) - 1]


def _slices_are_the_rows(by_pid: dict, row: dict) -> None:
    """One thread's slices are the row's timeline: the same (rank, name) at the same times."""
    got = sorted((e["pid"], e["name"], e["ts"], e["ts"] + e["dur"])
                 for mine in by_pid.values() for e in mine)
    want = sorted((s["rank"], s["name"], s["start_s"] * 1e6, s["end_s"] * 1e6)
                  for s in row["timeline_s"])
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [t for g in got for t in g[2:]] == pytest.approx([t for w in want for t in w[2:]],
                                                            abs=1e-3)
