"""The context-parallel lab's Chrome trace: the ring's clock (each ring step's posting, blocks
and wait in the forward, each step's blocks and gradient exchange in the backward; the same
arithmetic with and without it), the rows' timeline as events (labkit.cp.trace: required
fields, one slice per recorded span at the row's times, overlapping slices on threads of their
own, the messages' peers), the figure, and (slow) ``labkit cp --trace DIR`` end to end on two
gloo ranks."""

from __future__ import annotations

import subprocess

import pytest
import torch

from labkit import results, trace
from labkit.cp import formulas, report
from labkit.cp.ring import LocalRing, local_chunks, ring_attention
from labkit.cp.timeline import RingClock
from labkit.cp.trace import label, trace_events


def _span(rank, thread, name, cat, start_s, end_s, step, direction):
    return {"rank": rank, "thread": thread, "name": name, "cat": cat, "start_s": start_s,
            "end_s": end_s, "ring_step": step, "direction": direction}


def _row(**over):
    """Two ranks' pass: rank 0 posts, computes F0, waits, computes F1, then B1, B0 and waits
    through the gradient exchange; rank 1 the same 0.2 ms later; the messages beside."""
    spans = []
    for r in range(2):
        t = 2e-4 * r
        spans += [
            _span(r, "compute", "post K/V", "ring", t, t + 1e-4, 0, "forward"),
            _span(r, "compute", "F0", "forward", t + 1e-4, t + 1.1e-3, 0, "forward"),
            _span(r, "compute", "wait K/V", trace.IDLE, t + 1.1e-3, t + 1.3e-3, 0, "forward"),
            _span(r, "compute", "F1", "forward", t + 1.3e-3, t + 2.3e-3, 1, "forward"),
            _span(r, "compute", "B1", "backward", t + 2.4e-3, t + 4.4e-3, 1, "backward"),
            _span(r, "compute", "B0", "backward", t + 4.4e-3, t + 6.4e-3, 0, "backward"),
            _span(r, "compute", "wait grad K/V 0", trace.IDLE, t + 6.5e-3, t + 7e-3, 0,
                  "backward"),
            _span(r, "ring", "K/V block 0", "ring", t, t + 1.3e-3, 0, "forward"),
            _span(r, "ring", "grad K/V block 0", "ring", t + 6.5e-3, t + 7e-3, 0, "backward")]
    return {"variant": "causal_balanced", "world_size": 2, "timeline_step": 3,
            "measured_steps": 5, "kv_block_bytes": 4096, "timeline_s": spans, **over}


def test_one_slice_per_span_at_the_rows_times_and_none_overlapping():
    row = _row()
    doc = trace.check(trace.document(trace_events([row])))
    events = doc["traceEvents"]
    assert len(trace.slices(events)) == len(row["timeline_s"])
    by_thread = trace.threads(doc)
    assert list(by_thread) == [label(row), label(row) + ": ring"]
    for name, thread in zip(by_thread, ("compute", "ring")):
        for rank, mine in by_thread[name].items():
            spans = sorted((s for s in row["timeline_s"]
                            if s["rank"] == rank and s["thread"] == thread),
                           key=lambda s: s["start_s"])
            assert [(e["name"], e["cat"]) for e in mine] == [(s["name"], s["cat"]) for s in spans]
            assert [t for e in mine for t in (e["ts"], e["ts"] + e["dur"])] == pytest.approx(
                [t * 1e6 for s in spans for t in (s["start_s"], s["end_s"])], abs=1e-3)
    assert trace.overlaps(events) == []


def test_messages_name_their_peers_and_bytes():
    ring = [e for e in trace.slices(trace_events([_row()])) if e["cat"] == "ring"
            and e["name"] != "post K/V"]
    peers = {(e["pid"], e["name"]): (e["args"]["to_rank"], e["args"]["from_rank"])
             for e in ring}
    # a K/V block goes on to rank r+1; its gradient comes back from there
    assert peers == {(0, "K/V block 0"): (1, 1), (1, "K/V block 0"): (0, 0),
                     (0, "grad K/V block 0"): (1, 1), (1, "grad K/V block 0"): (0, 0)}
    assert {e["args"]["bytes_each_way"] for e in ring} == {4096}


def test_overlapping_slices_of_a_rank_go_on_a_thread_of_their_own():
    row = _row()
    spans = [dict(s) for s in row["timeline_s"]]
    b0 = next(s for s in spans if s["rank"] == 0 and s["name"] == "B0")
    b0["start_s"] -= 1e-3  # autograd ran step 0's blocks while step 1's were still going
    doc = trace.document(trace_events([dict(row, timeline_s=spans)]))
    assert trace.overlaps(doc["traceEvents"]) == []
    threads = trace.threads(doc)
    assert list(threads) == [label(row), label(row) + " (2)", label(row) + ": ring"]
    assert [e["name"] for e in threads[label(row) + " (2)"][0]] == ["B0"]
    assert trace_events([dict(row, timeline_s=None)]) == []


def test_the_figure_draws_the_ranks_thread_and_says_what_it_shows():
    import matplotlib.pyplot as plt

    from labkit.figures import trace_timeline

    doc = trace.document(trace_events([_row()]))
    fig, alt = trace_timeline(doc, thread=label(_row()))
    bars = sum(len(c.get_paths()) for c in fig.axes[0].collections)
    assert bars == 2 * 7
    assert "forward 2.00 ms (2 slices), backward 4.00 ms (2 slices)" in alt
    assert "idle 0.70 ms (wait K/V 0.20 ms, wait grad K/V 0 0.50 ms)" in alt
    plt.close(fig)


# -- the ring's clock, in one process -------------------------------------------------------

@pytest.mark.parametrize("variant", formulas.VARIANTS)
def test_the_clock_records_each_ring_step_and_changes_nothing(variant):
    """Rank 1 of 2 simulated in one process (the blocks handed over by LocalRing): with a
    clock, the same output and gradients; its pass holds per ring step a posted exchange, the
    step's blocks and the wait in the forward, and in the backward each step that computed
    blocks, none of a thread's slices overlapping, all within the pass."""
    g = torch.Generator().manual_seed(0)
    q, k, v, go = [torch.randn(1, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(4)]
    k, v = k.requires_grad_(), v.requires_grad_()  # the blocks handed over carry gradients
    p, rank = 2, 1
    got = []
    for clock in (None, RingClock("cpu")):
        leaves = [local_chunks(t, rank, p, variant).detach().requires_grad_() for t in (q, k, v)]
        if clock is not None:
            clock.start()
        kw = {} if clock is None else {"clock": clock}
        out = ring_attention(*leaves, rank=rank, world_size=p, variant=variant,
                             exchange=LocalRing(k, v, rank=rank, world_size=p, variant=variant),
                             **kw)
        out.backward(local_chunks(go, rank, p, variant))
        got.append([out.detach(), *(t.grad for t in leaves)])
    for a, b in zip(*got):
        assert torch.equal(a, b)
    origin, spans = clock.spans(0)
    assert origin > 0
    names = [s["name"] for s in spans if s["thread"] == "compute"]
    busy = [t for t in range(p) if formulas.work_items(rank, t, p, variant)]
    assert names[:4] == ["post K/V", "F0", "wait K/V", "F1"]
    assert sorted(n for n in names if n.startswith("B")) == sorted(f"B{t}" for t in busy)
    assert [s["name"] for s in spans if s["thread"] == "ring"] == ["K/V block 0"]
    for thread in ("compute", "ring"):
        mine = [s for s in spans if s["thread"] == thread]
        assert all(0 <= s["start_s"] <= s["end_s"] for s in mine)
        assert all(a["end_s"] <= b["start_s"] for a, b in zip(mine, mine[1:]))


# -- the command line, end to end ------------------------------------------------------------

@pytest.mark.slow
def test_trace_end_to_end_on_two_ranks(labkit_cmd, tmp_path):
    """One small launch of two variants: one trace file, valid, per variant one slice per span
    of every rank at the row's times, the median timed pass's, every exchange of the ring
    there (forward and backward), no rank doing two things at once on one thread."""
    rows_path, folder = tmp_path / "rows.json", tmp_path / "traces"
    p = subprocess.run([*labkit_cmd, "cp", "--nproc", "2", "--seq-len", "32", "--hidden", "16",
                        "--variant", "full", "causal_balanced", "--steps", "3", "--warmup", "1",
                        "--json", str(rows_path), "--trace", str(folder)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (path,) = folder.iterdir()
    assert path.name.startswith("cp-2ranks-") and f"wrote trace {path}" in p.stderr
    rows = results.load(rows_path).to_dict("records")
    assert results.undeclared(rows, report.COLUMNS) == []
    doc = trace.load(path)
    assert trace.overlaps(doc["traceEvents"]) == []
    by_thread = trace.threads(doc)
    assert len(trace.slices(doc["traceEvents"])) == sum(len(r["timeline_s"]) for r in rows)
    for row in rows:
        assert row["timeline_step"] in (1, 2)
        for thread, suffix in (("compute", ""), ("ring", ": ring")):
            for rank in (0, 1):
                spans = sorted((s for s in row["timeline_s"]
                                if s["rank"] == rank and s["thread"] == thread),
                               key=lambda s: s["start_s"])
                mine = by_thread[label(row) + suffix][rank]
                assert [e["name"] for e in mine] == [s["name"] for s in spans]
                assert [t for e in mine for t in (e["ts"], e["ts"] + e["dur"])] == \
                    pytest.approx([t * 1e6 for s in spans for t in (s["start_s"], s["end_s"])],
                                  abs=1e-3)
        for rank in (0, 1):
            names = {s["name"] for s in row["timeline_s"] if s["rank"] == rank}
            assert {"F0", "F1", "K/V block 0", "grad K/V block 0", "wait K/V"} <= names
