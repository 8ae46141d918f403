"""The expert-parallel lab's Chrome trace: the worker's spans (every phase the layer times, on
the rank's clock, their totals the row's phase times), the rows' timeline as events
(labkit.moe.trace: required fields, one slice per recorded span at the row's times, no rank
doing two things at once on one thread), the figure, and (slow) ``labkit moe --trace DIR``
end to end on two gloo ranks."""

from __future__ import annotations

import subprocess

import pytest
import torch

from labkit import results, trace
from labkit.moe import formulas, layer, report
from labkit.moe.trace import CATEGORIES, label, slice_name, trace_events


def _span(rank, phase, direction, start_s, end_s):
    return {"rank": rank, "phase": phase, "direction": direction, "start_s": start_s,
            "end_s": end_s}


def _row(world_size=2, skew_s=4e-4, **over):
    """A row whose timeline is every rank's seven spans of one step, each rank starting
    ``skew_s`` after the one before, with gaps between the spans (as measured ones have)."""
    spans = []
    for r in range(world_size):
        t = r * skew_s
        for phase, direction in layer.STEP_ORDER:
            spans.append(_span(r, phase, direction, t + 1e-5, t + 1e-5 + 5e-4 * (1 + r)))
            t = spans[-1]["end_s"]
    return {"world_size": world_size, "num_experts": 4, "top_k": 2, "tokens_per_rank": 64,
            "measured_steps": 4, "timeline_step": 2, "timeline_s": spans, **over}


def test_one_slice_per_span_at_the_rows_times_and_none_overlapping():
    row = _row()
    doc = trace.check(trace.document(trace_events([row])))
    events = doc["traceEvents"]
    got = sorted((e["pid"], e["ts"], e["ts"] + e["dur"], e["name"], e["cat"])
                  for e in trace.slices(events))
    want = sorted((s["rank"], s["start_s"] * 1e6, s["end_s"] * 1e6,
                   slice_name(s["phase"], s["direction"]), CATEGORIES[s["phase"]])
                  for s in row["timeline_s"])
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[3:] for g in got] == [w[3:] for w in want]
    assert [t for g in got for t in g[1:3]] == pytest.approx(
        [t for w in want for t in w[1:3]], abs=1e-3)
    assert trace.overlaps(events) == []
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert list(trace.threads(doc)) == ["EP P=2 E=4 top-2 T=64, step 2 of 4"]


def test_the_all_to_alls_are_labelled_and_every_phase_has_its_category():
    events = trace.slices(trace_events([_row()]))
    assert {e["cat"] for e in events} == {"routing", "dispatch all-to-all", "experts",
                                          "combine all-to-all"}
    assert {e["args"]["phase"] for e in events} == set(formulas.PHASES)
    a2a = {e["name"]: e["args"]["all_to_all"] for e in events if "all_to_all" in e["args"]}
    assert sorted(a2a) == ["CF+B", "DB", "DF"]
    assert "split sizes" in a2a["DF"]
    assert all(e["cat"].endswith("all-to-all") == (e["name"] in a2a) for e in events)
    assert [e["name"] for e in events if e["pid"] == 0] == ["RF", "DF", "EF", "CF+B", "EB", "DB",
                                                            "RB"]


def test_rows_without_a_timeline_are_left_out_and_each_row_is_a_thread():
    one = _row(world_size=1)
    assert trace_events([{"world_size": 2, "timeline_s": None}]) == []
    doc = trace.document(trace_events([one, {"world_size": 2}, _row()]))
    assert list(trace.threads(doc)) == [label(one), label(_row())]
    assert {e["pid"] for e in trace.slices(doc["traceEvents"]) if e["tid"] == 1} == {0}


def test_the_figure_draws_every_slice_and_says_what_it_shows():
    import matplotlib.pyplot as plt

    from labkit.figures import trace_timeline

    doc = trace.document(trace_events([_row()]))
    fig, alt = trace_timeline(doc)
    bars = sum(len(c.get_paths()) for c in fig.axes[0].collections)
    assert bars == len(trace.slices(doc["traceEvents"])) == 14
    assert alt == trace.describe(doc) and alt.startswith(f"Timeline of {label(_row())} on 2 ranks")
    assert "dispatch all-to-all 1.00 ms (2 slices)" in alt
    assert "combine all-to-all 1.00 ms (1 slice)" in alt
    plt.close(fig)


# -- the worker's clock ----------------------------------------------------------------------

def test_the_worker_keeps_every_phase_span_and_the_same_totals():
    """One step of a one-rank layer timed with the worker's SpanWatch: seven spans in the
    layer's order, one after the other from its start, whose sums by phase are the totals a
    Stopwatch reports (the row's phase times)."""
    from labkit.moe.worker import SpanWatch

    w = layer.init_weights(num_experts=4, hidden=8, ffn=16, seed=0, dtype=torch.float32)
    lay = layer.ExpertLayer(w, rank=0, world_size=1, top_k=2, capacity=6, renormalize=True,
                            device="cpu")
    x = torch.randn(12, 8).requires_grad_(True)
    sw = SpanWatch(torch.device("cpu"))
    lay.step(x, torch.randn(12, 8), sw)
    assert [name for name, _, _ in sw.spans] == [phase for phase, _ in layer.STEP_ORDER]
    ends = [0.0] + [b for _, _, b in sw.spans]
    assert all(a >= end and b > a for (_, a, b), end in zip(sw.spans, ends))
    for phase in formulas.PHASES:
        assert sw.totals[phase] == pytest.approx(
            sum(b - a for name, a, b in sw.spans if name == phase), rel=1e-9)


# -- the command line, end to end ------------------------------------------------------------

@pytest.mark.slow
def test_trace_end_to_end_on_two_ranks(labkit_cmd, tmp_path):
    """One small launch: one trace file, valid, one slice per span of every rank at the row's
    times, seven per rank, the median timed step's, no rank doing two things at once."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "moe", "--nproc", "2", "--tokens", "16", "--hidden", "16",
                        "--steps", "4", "--warmup", "1", "--json", str(rows_path),
                        "--trace", str(folder)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("moe-2ranks-") and path.name.endswith(".trace.json")
    assert f"wrote trace {path}" in p.stderr
    (row,) = results.load(rows_path).to_dict("records")
    assert results.undeclared([row], report.COLUMNS) == []
    assert row["timeline_step"] in (1, 2, 3)
    step = sorted(row["step_times_s"])[(len(row["step_times_s"]) - 1) // 2]
    assert row["step_times_s"][row["timeline_step"] - 1] == step  # the median step's
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    (by_pid,) = trace.threads(doc).values()
    assert sorted(by_pid) == [0, 1]
    for rank, mine in by_pid.items():
        spans = sorted((s for s in row["timeline_s"] if s["rank"] == rank),
                       key=lambda s: s["start_s"])
        assert [(s["phase"], s["direction"]) for s in spans] == list(layer.STEP_ORDER)
        assert [e["name"] for e in mine] == [slice_name(s["phase"], s["direction"])
                                             for s in spans]
        assert [t for e in mine for t in (e["ts"], e["ts"] + e["dur"])] == pytest.approx(
            [t * 1e6 for s in spans for t in (s["start_s"], s["end_s"])], abs=1e-3)
        # within the step: no span outlasts the slowest rank's step
        assert max(s["end_s"] for s in spans) <= step * (1 + 1e-6) + max(
            s["start_s"] for s in row["timeline_s"])
