"""The sharded-data-parallel lab's Chrome trace: a recorded step's slices on one clock
(labkit.fsdp.trace.step_slices), the rows as events, what overlapped, the sentence, and
``labkit fsdp --trace DIR`` end to end on two ranks."""

from __future__ import annotations

import subprocess

import pytest

from labkit import trace
from labkit.fsdp import verdicts
from labkit.fsdp.trace import overlap, step_slices, trace_events


def _mark(kind, layer, at):
    return {"kind": kind, "layer": layer, "at_s": at}


def _record(*, blocking=True, origin=10.0):
    """Two layers of FSDP: forward gathers, backward gathers (layer 0's issued inside layer
    1's backward: prefetched) and reduce-scatters, times in ms."""
    ms = 1e-3
    marks = [_mark("fwd_start", 0, 2 * ms), _mark("fwd_end", 0, 4 * ms),
             _mark("fwd_start", 1, 6 * ms), _mark("fwd_end", 1, 8 * ms),
             _mark("bwd_start", 1, 9 * ms), _mark("bwd_end", 1, 14 * ms),
             _mark("bwd_start", 0, 15 * ms), _mark("bwd_end", 0, 18 * ms)]
    coll = [("AG L0 (fwd)", "all_gather", 1, 2), ("AG L1 (fwd)", "all_gather", 4.5, 6),
            ("AG L1 (bwd)", "all_gather", 9, 10), ("AG L0 (bwd)", "all_gather", 10, 11),
            ("RS L1", "reduce_scatter", 14, 15), ("RS L0", "reduce_scatter", 18, 19.5)]
    return {"origin_s": origin, "end_s": 21 * ms, "blocking": blocking, "marks": marks,
            "collectives": [{"name": n, "op": op, "entry_s": a * ms, "exit_s": b * ms}
                            for n, op, a, b in coll]}


def test_blocking_collectives_are_left_out_of_the_compute():
    slices = step_slices([_record()])
    work = [s for s in slices if s["cat"] in ("forward", "backward", "other")]
    comm = [s for s in slices if s["cat"] in ("all-gather", "reduce-scatter")]
    assert len(comm) == 6
    assert overlap(slices)[0][2] == 0.0  # nothing ran beside a collective that held the rank
    backward1 = [t for s in work if s["name"] == "B L1" for t in (s["start_s"], s["end_s"])]
    assert backward1 == pytest.approx([0.011, 0.014])  # after both gathers it waited for
    # compute and collectives tile the step from the first forward on
    union = sorted((s["start_s"], s["end_s"]) for s in slices)
    assert union[0][0] == 0.0 and max(b for _, b in union) == pytest.approx(0.021)
    # the work around the layers less the gathers and scatters inside it
    other = [(s["name"], s["start_s"], s["end_s"]) for s in work if s["cat"] == "other"]
    assert [n for n, *_ in other] == ["before forward", "loss", "after backward"]
    assert [t for _, *ts in other for t in ts] == pytest.approx([0, 0.001, 0.008, 0.009, 0.0195,
                                                                 0.021])


def test_collectives_on_streams_of_their_own_overlap_the_compute():
    slices = step_slices([_record(blocking=False)])
    comm, work, both = overlap(slices)[0]
    assert both > 0 and comm == pytest.approx(0.007)  # the two backward gathers touch: one span
    b1 = [s for s in slices if s["name"] == "B L1"]
    assert len(b1) == 1 and b1[0]["end_s"] - b1[0]["start_s"] == pytest.approx(0.005)
    # overlapping collectives go on a second thread, so no thread holds two at once
    rec = _record(blocking=False)
    rec["collectives"].append({"name": "RS L1 again", "op": "reduce_scatter",
                               "entry_s": 0.0145, "exit_s": 0.016})
    events = trace_events([{"variant": "fsdp", "world_size": 1, "timeline_step": 1,
                            "timeline_s": step_slices([rec])}])
    assert trace.overlaps(events) == []
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"fsdp N=1, step 1", "fsdp N=1, step 1: collectives",
                     "fsdp N=1, step 1: collectives (2)"}


def test_ranks_on_one_clock_are_shifted_by_their_starts():
    slices = step_slices([_record(), _record(origin=10.002)])
    first = {r: min(s["start_s"] for s in slices if s["rank"] == r) for r in (0, 1)}
    assert first == pytest.approx({0: 0.0, 1: 0.002})
    apart = step_slices([_record(), _record(origin=99.0)], shared_clock=False)
    assert {min(s["start_s"] for s in apart if s["rank"] == r) for r in (0, 1)} == {0.0}


def test_one_slice_per_timeline_entry_at_the_rows_times():
    rows = [{"variant": v, "world_size": 2, "timeline_step": 2,
             "timeline_s": step_slices([_record(), _record(origin=10.001)])}
            for v in ("zero2", "fsdp")] + [{"variant": "ddp", "world_size": 2}]
    doc = trace.check(trace.document(trace_events(rows)))
    assert trace.overlaps(doc["traceEvents"]) == []
    got = sorted((e["pid"], e["name"], e["ts"], e["ts"] + e["dur"])
                 for e in trace.slices(doc["traceEvents"]) if e["tid"] in (1, 2))
    want = sorted((s["rank"], s["name"], s["start_s"] * 1e6, s["end_s"] * 1e6)
                  for s in rows[0]["timeline_s"])
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [t for g in got for t in g[2:]] == pytest.approx([t for w in want for t in w[2:]],
                                                            abs=1e-3)
    assert list(trace.threads(doc)) == ["zero2 N=2, step 2", "zero2 N=2, step 2: collectives",
                                        "fsdp N=2, step 2", "fsdp N=2, step 2: collectives"]
    assert trace_events([{"variant": "ddp", "world_size": 2}]) == []


def test_the_sentence_counts_prefetches_and_what_ran_at_once():
    row = {"variant": "fsdp", "world_size": 1, "timeline_step": 1, "timeline_step_time_s": 0.021,
           "timeline_s": step_slices([_record()])}
    text = verdicts.timeline_sentence(row)
    assert "none of it at once" in text
    assert "1 of 1 backward all-gathers were issued while the layer above" in text
    assert "1 of 2 reduce-scatters before backward was over" in text
    beside = verdicts.timeline_sentence({**row, "timeline_s": step_slices(
        [_record(blocking=False)])})
    assert "% of the collectives) at once" in beside


def test_the_figure_draws_compute_and_collectives_of_every_rank():
    import matplotlib.pyplot as plt

    from labkit.errors import UsageError
    from labkit.figures import text_overlaps
    from labkit.fsdp.plots import step_trace

    row = {"variant": "fsdp", "world_size": 2, "timeline_step": 1,
           "timeline_s": step_slices([_record(), _record(origin=10.001)])}
    doc = trace.document(trace_events([row]))
    fig, alt = step_trace(doc, "fsdp")
    ax = fig.axes[0]
    assert len(ax.get_yticks()) == 4  # per rank: compute, collectives
    assert sum(len(c.get_paths()) for c in ax.collections) == len(row["timeline_s"])
    assert alt.startswith("Timeline of fsdp N=2, step 1 on 2 ranks") and "collectives" in alt
    assert text_overlaps(fig) == []
    plt.close(fig)
    with pytest.raises(UsageError, match="no recorded step of zero1"):
        step_trace(doc, "zero1")


@pytest.mark.slow
def test_trace_end_to_end_on_two_fsdp_ranks(labkit_cmd, tmp_path):
    """One small launch: one trace file, valid, one slice per timeline entry of every recorded
    row at the row's times; every collective of the step is in it (FSDP: two all-gathers and a
    reduce-scatter a layer), no thread holding two slices at once."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "fsdp", "--nproc", "2", "--variant", "ddp", "zero2", "fsdp",
                        "--hidden", "32", "--num-heads", "4", "--seq-len", "8",
                        "--batch-size", "2", "--num-layers", "2", "--steps", "3", "--warmup",
                        "1", "--json", str(rows_path), "--trace", str(folder)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("fsdp-2ranks-") and f"wrote trace {path}" in p.stderr
    from labkit import results

    rows = {r["variant"]: r for r in results.load(rows_path).to_dict("records")}
    assert not isinstance(rows["ddp"].get("timeline_s"), list)  # DDP: not recorded
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    for variant in ("zero2", "fsdp"):
        row = rows[variant]
        mine = [e for name, by_pid in by_thread.items() if name.startswith(f"{variant} N=2")
                for es in by_pid.values() for e in es]
        got = sorted((e["pid"], e["name"], e["ts"], e["ts"] + e["dur"]) for e in mine)
        want = sorted((s["rank"], s["name"], s["start_s"] * 1e6, s["end_s"] * 1e6)
                      for s in row["timeline_s"])
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert [t for g in got for t in g[2:]] == pytest.approx([t for w in want for t in w[2:]],
                                                                abs=1e-3)
        for rank in (0, 1):
            names = sorted(s["name"] for s in row["timeline_s"] if s["rank"] == rank
                           and s["cat"] in ("all-gather", "reduce-scatter"))
            layers = {s["name"] for s in row["timeline_s"] if s["rank"] == rank
                      and s["cat"] in ("forward", "backward")}
            assert layers == {"F L0", "F L1", "B L0", "B L1"}
            if variant == "fsdp":  # the root holds no parameters: the layers' units only
                assert names == ["AG L0 (bwd)", "AG L0 (fwd)", "AG L1 (bwd)", "AG L1 (fwd)",
                                 "RS L0", "RS L1"]
            else:
                assert names == ["AG L0", "AG L1", "RS L0", "RS L1"]
        assert row["timeline_step_time_s"] == row["step_times_s"][int(row["timeline_step"]) - 1]
