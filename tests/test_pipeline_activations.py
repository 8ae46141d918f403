"""Pipeline memory: what each schedule holds (1F1B at most P microbatches), the activation
formula replayed from the schedules against the saved-tensor meter, its laws and sentence."""

from __future__ import annotations

import pytest

from labkit.pipeline import activations, schedules
from labkit.pipeline.config import PipelineConfig


def test_1f1b_holds_at_most_p_microbatches():
    blocks = sorted(schedules.simulate("1f1b", 4, 8), key=lambda b: b["start_s"])
    for r in range(4):
        live = peak = 0
        for b in (b for b in blocks if b["rank"] == r):
            live += 1 if b["kind"] == "F" else -1
            peak = max(peak, live)
        assert peak <= 4 - r


def test_activation_formula_closed_forms():
    """Replayed from the ideal schedules: GPipe holds M microbatches on every rank, 1F1B
    min(P − r, M) on rank r, ZB-H1 min(P, M) (a microbatch's activations wait for its W)."""
    for p, m in ((2, 2), (2, 8), (4, 4), (4, 8)):
        kw = dict(num_stages=p, num_microbatches=m, layers=2 * p, hidden=8, batch=16)
        for r in range(p):
            one = activations.stage_activation_bytes(layers=2, microbatch_size=16 // m, hidden=8,
                                                  first_stage=r == 0)
            held = {s: activations.peak_activation_formula(s, rank=r, **kw) / one
                    for s in ("gpipe", "1f1b", "zero_bubble")}
            assert held == {"gpipe": m, "1f1b": min(p - r, m), "zero_bubble": min(p, m)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stage_activations_formula_matches_the_meter(schedule):
    """One process plays stage 0 of P = 2 (3 of the model's 6 Linear+tanh blocks) in the
    schedule's order at M = 4, excluding the weights and the batch as the worker does: each
    microbatch saves stage_activation_bytes, and the peak is the formula's to the byte."""
    import time

    import torch

    from labkit.memory import SavedActivations
    from labkit.pipeline.worker import Timed, build_model, synthetic_batch

    cfg = PipelineConfig(layers=6, hidden=16, batch=8, microbatches=(4,))
    cpu, m, mb = torch.device("cpu"), 4, 2
    model = build_model(cfg, cpu)
    x, target = synthetic_batch(cfg, cpu)
    stage = Timed(model[:3], 0, device=cpu)
    stage.reset(time.perf_counter())
    held = [*model.parameters(), x, target]
    for first in (True, False):  # a later stage's input is a received activation: it counts
        with SavedActivations(exclude=held) as meter:
            out = stage(x[:mb] if first else x[:mb].clone().requires_grad_())
        assert meter.live_bytes == activations.stage_activation_bytes(
            layers=3, microbatch_size=mb, hidden=16, first_stage=first)
        out.sum().backward()
        assert meter.live_bytes == 0
    order = sorted((b for b in schedules.simulate(schedule, 2, m) if b["rank"] == 0),
                   key=lambda b: b["start_s"])
    outs = {}
    with SavedActivations(exclude=held) as meter:
        for b in order:
            i = b["microbatch"]
            if b["kind"] == "F":
                outs[i] = stage(x[i * mb:(i + 1) * mb])
            else:
                outs.pop(i).sum().backward()
    assert meter.live_bytes == 0
    assert meter.peak_bytes == activations.peak_activation_formula(
        schedule, num_stages=2, num_microbatches=m, layers=6, hidden=16, batch=8)


def test_activation_laws_and_sentence_follow_the_numbers():
    import pandas as pd

    from labkit.book.consistency import line_problems

    mib = activations.MIB
    df = pd.DataFrame({"schedule": ["gpipe", "1f1b", "zero_bubble"], "num_stages": 2,
                       "num_microbatches": 8,
                       "peak_activation_bytes": [8 * mib, 2 * mib, 3 * mib],
                       "peak_activation_bytes_formula": [8 * mib, 2 * mib, 2 * mib]})
    rows = activations.activation_laws(df)
    assert [(r["law"], r["holds"]) for r in rows] == [
        ("peak activations of stage 0, gpipe P=2 M=8", True),
        ("peak activations of stage 0, 1f1b P=2 M=8", True),
        ("peak activations of stage 0, zero_bubble P=2 M=8", False),
        ("peak activations GPipe over 1F1B, P=2 M=8", True)]
    assert rows[-1]["predicted"] == 4 and rows[-1]["measured"] == 4
    text = activations.activation_sentence(df)
    assert "zero_bubble more than 10% from what its schedule implies (-50.0%)" in text
    assert "GPipe held 4.00x 1F1B's (M/P = 4): within 10% (+0.0%)" in text
    assert line_problems(text) == []
