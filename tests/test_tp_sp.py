"""Sequence parallelism in the tensor-parallel lab (labkit.tp.sp): its formulas (collectives,
saved activations, Korthikanti et al.'s terms taken apart), the layer on one process, and
(slow) one real 2-rank gloo launch: the same outputs and gradients as one process, its
collectives counted equal to the formulas, its saved activations equal to the lab's count."""

from __future__ import annotations

import numpy as np
import pytest

from labkit import results, tp
from labkit.launch import LaunchOptions
from labkit.tp import activations, formulas, report
from labkit.tp.config import TPConfig

from .conftest import LAUNCH_TIMEOUT_S

TINY = {"hidden": 32, "num_heads": 4, "seq_len": 8, "batch_size": 2, "num_layers": 2,
        "steps": 4, "warmup": 1}
SHAPE = {k: TINY[k] for k in ("batch_size", "seq_len", "hidden", "num_heads", "num_layers")}


@pytest.mark.parametrize("p", [2, 4, 8])
def test_sequence_parallelism_splits_everything_one_process_keeps(p):
    one = formulas.saved_activation_bytes(**SHAPE)
    sp = formulas.saved_activation_bytes(**SHAPE, world_size=p, sequence_parallel=True)
    tp_only = formulas.saved_activation_bytes(**SHAPE, world_size=p)
    assert sp == pytest.approx(one / p) and sp < tp_only < one
    # what TP keeps whole: the LayerNorms' inputs, outputs and statistics, and the loss
    b, s, h, L = (SHAPE[k] for k in ("batch_size", "seq_len", "hidden", "num_layers"))
    whole = (L * (4 * s * b * h + 4 * b * s) + 2 * s * b * h) * formulas.BYTES_PER_VALUE
    assert tp_only - sp == pytest.approx(whole * (1 - 1 / p))


def test_korthikanti_formulas_as_published_and_in_the_labs_terms():
    kw = dict(batch_size=1, seq_len=2048, hidden=4096, num_heads=32, num_layers=1)
    sbh, t = 2048 * 4096, 8
    # as published, flash attention: s b h (10 + 24/t) without, s b h 34/t with
    no_sp = formulas.korthikanti_activation_bytes(**kw, tp=t, flash=True)
    with_sp = formulas.korthikanti_activation_bytes(**kw, tp=t, flash=True,
                                                    sequence_parallel=True)
    assert no_sp == pytest.approx(sbh * (10 + 24 / t))
    assert with_sp == pytest.approx(sbh * 34 / t)
    # the lab's terms: 4 bytes a value, no masks: 64 s b h / t with, (16 + 48/t) s b h without
    lab = dict(bytes_per_value=4, mask_bytes=0, flash=True)
    assert formulas.korthikanti_activation_bytes(**kw, tp=t, sequence_parallel=True, **lab) == \
        pytest.approx(64 * sbh / t)
    assert formulas.korthikanti_activation_bytes(**kw, tp=t, **lab) == \
        pytest.approx(sbh * (16 + 48 / t))


@pytest.mark.parametrize("variant", ["naive", "sp"])
def test_the_papers_count_taken_apart_adds_up_to_the_labs(variant):
    row = {**SHAPE, "variant": variant, "world_size": 2}
    row["activation_bytes_formula"] = formulas.saved_activation_bytes(
        **SHAPE, world_size=2, sequence_parallel=variant == "sp")
    row["activation_bytes_measured"] = row["activation_bytes_formula"]
    t = activations.korthikanti_terms(row)
    assert t["published"] - t["masks"] - t["softmax"] + t["fp32"] == pytest.approx(t["lab_terms"])
    assert t["lab_terms"] + t["extra"] == pytest.approx(row["activation_bytes_formula"])
    # what the paper leaves out: the LayerNorms' statistics, the log-sum-exp, the loss
    b, s, h, a, L = (SHAPE[k] for k in ("batch_size", "seq_len", "hidden", "num_heads",
                                        "num_layers"))
    if variant == "naive":
        extra = L * (4 * b * s + a * b * s / 2) + 2 * s * b * h
    else:
        extra = (L * (4 * b * s + a * b * s) + 2 * s * b * h) / 2
    assert t["extra"] == pytest.approx(extra * 4)
    text = activations.korthikanti_sentence(row)
    assert ("with sequence parallelism" in text) == (variant == "sp")
    assert "no dropout" in text and "fp32" in text and "flash attention" in text


def test_sp_collectives_move_what_tp_moves_plus_the_gathers_again():
    kw = dict(batch_size=8, seq_len=32, hidden=256, num_layers=2)
    c = formulas.sp_collectives(**kw, world_size=2)
    each = 8 * 32 * 256 * 4
    assert c == {"all_gather": (12, 12 * each), "reduce_scatter": (8, 8 * each),
                 "all_reduce": (1, 6 * 256 * 2 * 4)}
    assert all(n == 0 for n, _ in formulas.sp_collectives(**kw, world_size=1).values())
    # a ring: (P-1)/P of a gather's or scatter's buffer, twice that of an all-reduce's
    sent_sp = (c["all_gather"][1] + c["reduce_scatter"][1]) / 2
    sent_tp = 2 * formulas.allreduce_bytes(**kw, world_size=2) / 2
    assert sent_sp / sent_tp == pytest.approx(10 / 8)


def test_sentences_say_what_sequence_parallelism_changed():
    naive = {**SHAPE, "world_size": 2, "activation_bytes_measured": 45824.0,
             "comm_bytes_measured": 16384, "step_time_p50_s": 0.02}
    sp = {"activation_bytes_measured": 35328.0, "comm_bytes_measured": 42496,
          "step_time_p50_s": 0.03}
    text = activations.sp_sentence(naive, sp)
    one = formulas.saved_activation_bytes(**SHAPE)
    assert f"one rank's {one / 1e6:.2f} MB" in text and "(0.77x)" in text
    assert "the step 30.0 ms against 20.0 ms" in text


def test_one_sp_rank_is_the_whole_model_and_saves_its_count():
    """On one rank the collectives are identities: the layer is the whole model, and what it
    saves for backward is one process's count (the sharded input kept by the linears)."""
    import torch

    from labkit.memory import SavedActivations
    from labkit.tp.comm import Comm
    from labkit.tp.models import build_model, naive_tp_model, synthetic_batch
    from labkit.tp.sp import SPLayer, check_sp, sp_loss
    from labkit.tp.worker import _reference

    full = build_model(hidden=32, num_heads=4, num_layers=2, seed=0)
    x, y = synthetic_batch(batch_size=2, seq_len=8, hidden=32, seed=0)
    ref = _reference(full, x, y)
    comm = Comm(1)
    model = naive_tp_model(full, 0, 1, comm, layer=SPLayer)
    assert check_sp(model, ref, x, y, 0, 1, comm) < 1e-5
    with SavedActivations(exclude=list(model.parameters())) as meter:
        loss = sp_loss(model(x.clone().requires_grad_(True)), y.clone(), 1)
    assert meter.peak_bytes == formulas.saved_activation_bytes(**SHAPE, sequence_parallel=True)
    loss.backward()
    assert comm.calls == 0 and isinstance(loss, torch.Tensor)


def test_sp_laws_are_exact_counts_and_the_activation_count():
    row = {"variant": "sp", "world_size": 2, "params_per_rank_formula": 10.0,
           "params_per_rank": 10, "allgather_calls_formula": 12, "allgather_calls_measured": 12,
           "reduce_scatter_calls_formula": 8, "reduce_scatter_calls_measured": 8,
           "allreduce_calls_formula": 1, "allreduce_calls_measured": 1,
           "comm_bytes_formula": 42496, "comm_bytes_measured": 42496,
           "activation_bytes_formula": 35328.0, "activation_bytes_measured": 35328.0,
           "activation_korthikanti_sp_fp32_bytes": 32768.0}
    laws = activations.sp_laws(row)
    assert len(laws) == 7 and all(r["holds"] for r in laws)
    assert [r["tolerance_pct"] for r in laws] == [0, 0, 0, 0, 0, 10.0, 10.0]
    assert [r["kind"] for r in laws][-2:] == ["model", "published"] and laws[-1]["source"]
    assert not activations.sp_laws({**row, "allgather_calls_measured": 14})[1]["holds"]
    # a formula further than 10 % from the count does not hold
    assert not activations.sp_laws({**row, "activation_korthikanti_sp_fp32_bytes": 30000.0})[-1][
        "holds"]


# ---------------------------------------------------------------- one real launch (gloo)

@pytest.mark.slow
def test_two_sp_ranks_match_one_process_and_count_their_formulas(tmp_path):
    store = tmp_path / "tp.json"
    df = tp.run(TPConfig(**TINY, variants=("naive", "sp")),
                launch=LaunchOptions(nprocs=(2,), timeout_s=LAUNCH_TIMEOUT_S, progress=False),
                store=str(store))
    assert sorted(df[df.world_size == 1].variant) == ["naive"]  # one rank: sp is naive
    sp, naive = report.one(df, "sp", world_size=2), report.one(df, "naive", world_size=2)
    assert sp.matches_single_process and sp.max_rel_error <= sp.tolerance
    L = TINY["num_layers"]
    each = TINY["batch_size"] * TINY["seq_len"] * TINY["hidden"] * 4
    assert (sp.allgather_calls_measured, sp.reduce_scatter_calls_measured,
            sp.allreduce_calls_measured) == (6 * L, 4 * L, 1)
    assert sp.allgather_bytes_measured == sp.allgather_bytes_formula == 6 * L * each
    assert sp.reduce_scatter_bytes_measured == sp.reduce_scatter_bytes_formula == 4 * L * each
    assert sp.comm_bytes_measured == sp.comm_bytes_formula == 10 * L * each + 6 * 32 * L * 4
    # what each rank saved for backward: the count exactly, one process's over P
    assert sp.activation_bytes_measured == sp.activation_bytes_formula == \
        formulas.saved_activation_bytes(**SHAPE) / 2
    assert naive.activation_bytes_measured == naive.activation_bytes_formula
    assert sp.activation_korthikanti_sp_fp32_bytes < sp.activation_bytes_measured
    assert sp.params_per_rank == naive.params_per_rank
    assert np.isfinite(sp.step_time_p50_s) and sp.step_time_p50_s > 0
    assert sp.allreduce_wait_in_step_s + sp.allreduce_message_in_step_s == \
        pytest.approx(sp.allreduce_time_in_step_s)
    assert all(r["holds"] for r in activations.sp_laws(sp))
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    frame = report.activation_frames([naive, sp])
    assert list(frame.variant) == ["naive"] * 3 + ["sp"] * 3


def test_a_launch_whose_sweep_fits_no_line_predicts_no_communication_for_every_variant():
    """A 2-rank row's fields where the launch's all-reduce sweep gave no α–β fit (NaN): every
    variant's predicted step is NaN, none raises (sequence parallelism's collectives too)."""
    import math

    from labkit.tp.models import build_model
    from labkit.tp.worker import _common

    cfg = TPConfig(hidden=32, num_heads=4, num_layers=1, seq_len=8, batch_size=2)
    full = build_model(hidden=32, num_heads=4, num_layers=1, seed=0)
    none = {"alpha_s": math.nan, "beta_bytes_per_s": math.nan, "sweep": []}
    for variant in ("naive", "sp"):
        got = _common(cfg, full, 2, none, 1e9, variant)
        assert math.isnan(got["predicted_step_s"]) and got["predicted_compute_s"] > 0, variant
