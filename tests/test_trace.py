"""Chrome traces of measured timelines: the format (labkit.trace), the pipeline lab's rows as
events (labkit.pipeline.trace), the figure, and ``--trace DIR`` end to end."""

from __future__ import annotations

import json
import subprocess

import pytest

from labkit import trace
from labkit.ddp.trace import trace_events as ddp_events
from labkit.errors import UsageError
from labkit.launch import LaunchOptions, launch_lab
from labkit.pipeline import formulas
from labkit.pipeline.schedules import simulate
from labkit.pipeline.trace import idle_gaps, trace_events


def _row(schedule, p, m, v=1, **kw):
    """A pipeline row whose blocks are an ideal step, in milliseconds, shifted so that the
    first block starts after the step's start (as a measured one does)."""
    blocks = [dict(b, start_s=b["start_s"] + 1e-4, end_s=b["end_s"] + 1e-4)
              for b in simulate(schedule, p, m, virtual_stages=v, forward_s=1e-3,
                                backward_s=2e-3)]
    return {"schedule": schedule, "num_stages": p, "num_microbatches": m, "virtual_stages": v,
            "world_size": p, "blocks": blocks, "step_time_s": 0.01, **kw}


# --- the format ----------------------------------------------------------------------------

def _doc():
    return trace.document(trace.names([0], {1: "t"}) + [
        trace.event("F0", cat="forward", start_s=0, end_s=1e-3, pid=0, tid=1),
        trace.instant("end", at_s=1e-3, pid=0, tid=1),
        trace.counter("busy", at_s=0, pid=0, values={"ranks": 1})])


def test_a_document_has_the_fields_viewers_need():
    doc = trace.check(_doc())
    assert doc["displayTimeUnit"] == "ms"
    x = trace.slices(doc["traceEvents"])[0]
    assert {k: x[k] for k in ("name", "cat", "ph", "ts", "dur", "pid", "tid")} == {
        "name": "F0", "cat": "forward", "ph": "X", "ts": 0.0, "dur": 1000.0, "pid": 0, "tid": 1}
    meta = {(e["name"], json.dumps(e["args"])) for e in doc["traceEvents"] if e["ph"] == "M"}
    assert ("process_name", '{"name": "rank 0"}') in meta
    assert ("thread_name", '{"name": "t"}') in meta


@pytest.mark.parametrize("drop", ["name", "cat", "ts", "dur", "pid", "tid"])
def test_check_names_a_slice_without_a_required_field(drop):
    doc = _doc()
    x = trace.slices(doc["traceEvents"])[0]
    del x[drop]
    with pytest.raises(UsageError, match=f"lacks {drop}"):
        trace.check(doc)


@pytest.mark.parametrize("change, message", [
    ({"ph": "Q"}, "ph must be one of"),
    ({"dur": -1.0}, "dur must be microseconds >= 0"),
    ({"ts": float("nan")}, "ts must be microseconds >= 0"),
    ({"pid": "0"}, "pid an integer"),
    ({"tid": 0.5}, "tid must be an integer"),
])
def test_check_refuses_bad_values(change, message):
    doc = _doc()
    trace.slices(doc["traceEvents"])[0].update(change)
    with pytest.raises(UsageError, match=message):
        trace.check(doc)


def test_check_refuses_unknown_metadata_and_a_counter_without_numbers():
    doc = _doc()
    doc["traceEvents"].append({"name": "colour", "ph": "M", "pid": 0, "args": {}})
    with pytest.raises(UsageError, match="metadata must be one of"):
        trace.check(doc)
    doc = _doc()
    doc["traceEvents"][-1]["args"] = {"ranks": "two"}
    with pytest.raises(UsageError, match="counter's args must be numbers"):
        trace.check(doc)
    with pytest.raises(UsageError, match="traceEvents list"):
        trace.check({"events": []})


def test_overlaps_finds_crossing_and_nested_slices_of_one_thread_only():
    def x(name, a, b, tid=0):
        return trace.event(name, cat="c", start_s=a, end_s=b, pid=0, tid=tid)

    crossing = [x("a", 0, 2), x("b", 1, 3)]
    nested = [x("outer", 0, 4), x("inner", 1, 2)]
    touching = [x("c", 0, 1), x("d", 1, 2)]
    other_thread = [x("e", 0, 2), x("f", 1, 3, tid=1)]
    assert [(a["name"], b["name"]) for a, b in trace.overlaps(crossing)] == [("a", "b")]
    assert [(a["name"], b["name"]) for a, b in trace.overlaps(nested)] == [("outer", "inner")]
    assert trace.overlaps(touching) == [] and trace.overlaps(other_thread) == []


def test_write_is_checked_and_read_back(tmp_path):
    events = _doc()["traceEvents"]
    path = trace.write(tmp_path / "a.trace.json", events, other={"lab": "x", "bad": float("nan")})
    doc = trace.load(path)
    assert doc["traceEvents"] == events and doc["otherData"] == {"lab": "x", "bad": None}
    assert [p.name for p in tmp_path.iterdir()] == ["a.trace.json"]  # no temporary left
    with pytest.raises(UsageError):
        trace.write(tmp_path / "b.trace.json", [{"ph": "X", "name": "no times"}])
    assert not (tmp_path / "b.trace.json").exists()


def test_trace_folders_are_checked_before_anything_is_written(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    assert trace.check_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    with pytest.raises(UsageError, match="is not a folder"):
        trace.check_folder(afile / "sub")
    with pytest.raises(UsageError, match="is not a folder"):
        LaunchOptions(trace_dir=str(afile))
    # a lab whose rows hold no timeline refuses it before it launches anything
    with pytest.raises(UsageError, match="rows hold no timeline"):
        launch_lab("machine", None, LaunchOptions(trace_dir=str(tmp_path)))


def test_launch_paths_never_overwrite(tmp_path):
    first = trace.launch_path(tmp_path, lab="pipeline", world_size=2, stamp="T")
    first.write_text("{}")
    assert first.name == "pipeline-2ranks-T.trace.json"
    assert trace.launch_path(tmp_path, lab="pipeline", world_size=2, stamp="T").name == \
        "pipeline-2ranks-T-2.trace.json"


def test_write_launches_writes_one_file_per_world_size(tmp_path):
    rows = [_row("gpipe", 2, 2), _row("1f1b", 2, 2), _row("gpipe", 4, 4)]
    assert trace.write_launches(None, "pipeline", rows, trace_events) == []
    paths = trace.write_launches(tmp_path / "traces", "pipeline", rows, trace_events)
    assert [p.name.split("-")[:2] for p in paths] == [["pipeline", "2ranks"],
                                                     ["pipeline", "4ranks"]]
    two = trace.load(paths[0])
    assert two["otherData"] == {"lab": "pipeline", "world_size": 2, "rows": 2}
    assert set(trace.threads(two)) == {"gpipe M=2", "1f1b M=2"}


# --- the pipeline lab's rows ---------------------------------------------------------------

@pytest.mark.parametrize("schedule, p, m, v", [("gpipe", 2, 4, 1), ("1f1b", 4, 8, 1),
                                               ("interleaved", 2, 4, 2),
                                               ("zero_bubble", 2, 4, 1)])
def test_one_slice_per_block_at_the_rows_times_and_none_overlapping(schedule, p, m, v):
    row = _row(schedule, p, m, v)
    events = trace.check(trace.document(trace_events([row])))["traceEvents"]
    work = [e for e in trace.slices(events) if e["cat"] != trace.IDLE]
    assert len(work) == len(row["blocks"])
    for e, b in zip(sorted(work, key=lambda e: (e["pid"], e["ts"])),
                    sorted(row["blocks"], key=lambda b: (b["rank"], b["start_s"]))):
        assert (e["pid"], e["cat"], e["args"]["microbatch"], e["args"]["stage"]) == \
            (b["rank"], formulas_kind(b["kind"]), b["microbatch"], b["stage"])
        assert e["ts"] == pytest.approx(b["start_s"] * 1e6, abs=1e-3)
        assert e["ts"] + e["dur"] == pytest.approx(b["end_s"] * 1e6, abs=1e-3)
    assert trace.overlaps(events) == []  # each rank ran one block at a time, idle between
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(p)}


def formulas_kind(kind):
    return {"F": "forward", "B": "backward", "W": "weight"}[kind]


@pytest.mark.parametrize("schedule, p, m", [("gpipe", 2, 1), ("gpipe", 4, 4), ("1f1b", 4, 8),
                                            ("zero_bubble", 2, 4)])
def test_idle_slices_fill_each_rank_and_split_as_the_timeline_does(schedule, p, m):
    row = _row(schedule, p, m)
    late = dict(row["blocks"][-1])  # one block delayed: a wait that is not the schedule's
    late.update(start_s=late["start_s"] + 5e-4, end_s=late["end_s"] + 5e-4)
    blocks = row["blocks"][:-1] + [late]
    split = formulas.timeline_split(blocks, step_start_s=0.0)
    gaps = idle_gaps(blocks)
    for r in split["per_rank"]:
        mine = [g for g in gaps if g["rank"] == r["rank"]]
        assert sum(g["bubble_s"] for g in mine) == pytest.approx(r["bubble_s"])
        assert sum(g["other_s"] for g in mine) == pytest.approx(r["other_s"])
    events = trace_events([dict(row, blocks=blocks)])
    end = max(b["end_s"] for b in blocks) * 1e6
    for rank in range(p):  # blocks and idle slices tile the step on every rank
        mine = sorted((e for e in trace.slices(events) if e["pid"] == rank), key=lambda e: e["ts"])
        assert mine[0]["ts"] == 0 and mine[-1]["ts"] + mine[-1]["dur"] == pytest.approx(end)
        assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(mine, mine[1:]))


def test_rows_are_threads_named_by_what_they_measured():
    rows = [_row("gpipe", 2, 2, recv_ahead=True), _row("gpipe", 2, 2, recv_ahead=False),
            _row("interleaved", 2, 2, 2), {"schedule": "1f1b", "num_microbatches": 2}]
    doc = trace.document(trace_events(rows))
    assert list(trace.threads(doc)) == ["gpipe M=2, receives ahead", "gpipe M=2, receives at use",
                                        "interleaved M=2 V=2"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(ends) == 3 * 2 and all(e["args"]["step_time_s"] == 0.01 for e in ends)


def test_the_figure_draws_every_slice_and_says_what_it_shows():
    import matplotlib.pyplot as plt

    from labkit.figures import trace_timeline

    doc = trace.document(trace_events([_row("gpipe", 2, 2), _row("1f1b", 2, 2)]))
    fig, alt = trace_timeline(doc, thread="1f1b M=2")
    ax = fig.axes[0]
    assert ax.get_title() == "1f1b M=2"
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len([e for e in trace.slices(doc["traceEvents"]) if e["tid"] == 2])
    assert alt == trace.describe(doc, "1f1b M=2")
    assert alt.startswith("Timeline of 1f1b M=2 on 2 ranks over 9.10 ms")
    assert "forward 2.00 ms (2 slices), backward 4.00 ms (2 slices)" in alt
    plt.close(fig)
    with pytest.raises(UsageError, match="no thread 'zb'"):
        trace_timeline(doc, thread="zb")


# --- the DDP lab's rows ---------------------------------------------------------------------

def test_ddp_steps_are_threads_of_rank_0_at_the_rows_times():
    import pandas as pd

    timed = {"variant": "ddp", "world_size": 2, "batch_size": 8, "bucket_cap_mb": 25.0,
             "timeline_backward_start_s": [0.010, 0.012], "timeline_backward_end_s": [0.040, 0.041],
             "timeline_step_end_s": [0.055, 0.050],
             "comm_intervals_s": [[[0.030, 0.045], [0.020, 0.032]], [[0.025, 0.030], [0.035, 0.048]]]}
    untimed = {"variant": "no_ddp", "world_size": 1, "batch_size": 8}
    events = ddp_events(pd.DataFrame([untimed, timed]))
    doc = trace.check(trace.document(events))
    assert trace.overlaps(events) == [] and {e["pid"] for e in events} == {0}
    by_thread = trace.threads(doc)
    assert list(by_thread) == ["ddp N=2 batch 8 bucket 25 MB, step 1",
                               "ddp N=2 batch 8 bucket 25 MB, step 1: all-reduce",
                               "ddp N=2 batch 8 bucket 25 MB, step 1: all-reduce (2)",
                               "ddp N=2 batch 8 bucket 25 MB, step 2",
                               "ddp N=2 batch 8 bucket 25 MB, step 2: all-reduce"]
    for k in range(2):
        label = f"ddp N=2 batch 8 bucket 25 MB, step {k + 1}"
        (step,) = by_thread[label].values()
        marks = [0.0] + [timed[f"timeline_{c}_s"][k] * 1e6
                         for c in ("backward_start", "backward_end", "step_end")]
        assert [e["name"] for e in step] == ["before backward", "backward", "after backward"]
        assert [t for e in step for t in (e["ts"], e["ts"] + e["dur"])] == pytest.approx(
            [marks[0], marks[1], marks[1], marks[2], marks[2], marks[3]])
        comm = sorted((x["args"]["bucket"], x["ts"], x["ts"] + x["dur"])
                      for lane, by_pid in by_thread.items() if lane.startswith(label + ":")
                      for x in by_pid[0])
        assert [c[0] for c in comm] == [0, 1]
        assert [t for c in comm for t in c[1:]] == pytest.approx(
            [t * 1e6 for pair in timed["comm_intervals_s"][k] for t in pair])
    assert ddp_events([untimed]) == []


# --- the command line ----------------------------------------------------------------------

def test_trace_is_a_flag_of_the_labs_with_a_timeline_only(labkit_cmd, tmp_path):
    # the machine profile and the placement check time no steps: no timeline, no flag
    for command in ("calibrate", "placement"):
        p = subprocess.run([*labkit_cmd, command, "--trace", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "unrecognized arguments: --trace" in p.stderr, command
    afile = tmp_path / "file"
    afile.write_text("")
    p = subprocess.run([*labkit_cmd, "pipeline", "--trace", str(afile / "t")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"labkit pipeline: error: trace folder {afile / 't'}: {afile} is not a folder"]


@pytest.mark.slow
def test_trace_end_to_end_on_a_two_rank_pipeline(labkit_cmd, tmp_path):
    """One small launch: one trace file for it, valid, one slice per block of every row at the
    row's times, no rank doing two things at once."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "pipeline", "--nproc", "2", "--schedule", "gpipe", "1f1b",
                        "--microbatches", "2", "--layers", "2", "--hidden", "64", "--batch", "8",
                        "--steps", "1", "--warmup", "1", "--no-check", "--json", str(rows_path),
                        "--trace", str(folder)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("pipeline-2ranks-") and path.name.endswith(".trace.json")
    assert f"wrote trace {path}" in p.stderr
    from labkit import results

    rows = results.load(rows_path).to_dict("records")
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    assert sorted(by_thread) == ["1f1b M=2", "gpipe M=2"]
    for row in rows:
        got = sorted((e["pid"], e["name"], e["ts"], e["ts"] + e["dur"])
                     for mine in by_thread[f"{row['schedule']} M=2"].values() for e in mine
                     if e["cat"] != trace.IDLE)
        want = sorted((b["rank"], f"{b['kind']}{b['microbatch']}", b["start_s"] * 1e6,
                       b["end_s"] * 1e6) for b in row["blocks"])
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert [t for g in got for t in g[2:]] == pytest.approx(
            [t for w in want for t in w[2:]], abs=1e-3)
