"""The sharded-data-parallel lab: config, formulas, the memory explorer, bad input refused
before launch, and (slow) one real 2-rank gloo launch that checks everything: DDP, ZeRO-1 and
FSDP2 equal one process, the bytes counted match the formulas, FSDP holds half of DDP's
weights and Adam states, every row field is declared. No test asserts on speed."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from labkit import cli, fsdp, results
from labkit.errors import UsageError
from labkit.fsdp import config as fsdp_config
from labkit.fsdp import formulas, report, widgets
from labkit.fsdp.config import FSDPConfig
from labkit.launch import LaunchOptions

from .conftest import LAUNCH_TIMEOUT_S

TINY = {"hidden": 32, "num_heads": 4, "seq_len": 8, "batch_size": 2, "num_layers": 2,
        "steps": 4, "warmup": 1}


@pytest.mark.parametrize("bad, message", [
    ({"variants": ("zero4",)}, "unknown variant"),
    ({"variants": ()}, "empty"),
    ({"hidden": 30}, "not divisible by num_heads"),
    ({"steps": 2, "warmup": 2}, "warmup"),
    ({"reshard_after_forward": "yes"}, "reshard_after_forward"),
    ({"lr": 1.5}, "lr"),
])
def test_config_refuses_bad_input(bad, message):
    with pytest.raises(UsageError, match=message):
        FSDPConfig(**{**TINY, **bad})


def test_check_world_size():
    FSDPConfig(**TINY).check_world_size(2)
    with pytest.raises(UsageError, match="too small to shard over 64 ranks"):
        FSDPConfig(**TINY).check_world_size(64)
    with pytest.raises(UsageError, match="hidden size 32 is not divisible by 3 ranks"):
        FSDPConfig(**TINY).check_world_size(3)


@pytest.mark.parametrize("module", [formulas, fsdp_config, report, widgets])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_formulas():
    psi = 1000
    ddp = formulas.state_bytes(params=psi, stage="ddp")
    assert ddp["total"] == 16 * psi  # fp32 weights and gradients, Adam's m and v
    z1 = formulas.state_bytes(params=psi, stage="zero1", dp=4)
    assert z1["optimizer"] == 8 * psi / 4 and z1["params"] == 4 * psi
    z3 = formulas.state_bytes(params=psi, stage="zero3", dp=4, tp=2)
    assert z3["total"] == 16 * psi / 8
    units = [400, 600]
    vol = {s: formulas.volume_bytes(formulas.collectives_per_step(stage=s, unit_bytes=units))
           for s in ("ddp", "zero1", "zero3")}
    assert vol == {"ddp": 2000.0, "zero1": 2000.0, "zero3": 3000.0}
    assert formulas.volume_bytes(formulas.collectives_per_step(
        stage="zero3", unit_bytes=units, reshard_after_forward=False)) == 2000.0
    assert formulas.comm_time([("all_reduce", 1e6)], ranks=1, alpha_s=1.0,
                              beta_bytes_per_s=1.0) == 0.0


def test_memory_explorer_renders_from_its_state():
    import matplotlib

    matplotlib.use("Agg")
    box = widgets.memory_explorer("Llama-3-8B", dp=8, tp=1)
    text, plot = box.children[3], box.children[4]
    assert "ZeRO-3 (FSDP)" in text.value
    assert plot.outputs and "image/png" in plot.outputs[0]["data"]  # drawn before any kernel event
    n_slider, t_slider = box.children[1].children
    t_slider.value = 2
    assert "ZeRO-1, TP=2" in text.value


@pytest.mark.parametrize("args", [
    ["--nproc", "3"],                                       # 256 not divisible by 3 ranks
    ["--hidden", "4", "--num-heads", "2", "--nproc", "8"],  # too small to shard
    ["--variant", "zero4"],
    ["--hidden", "100", "--num-heads", "3"],
])
def test_cli_bad_input_exits_2_and_writes_nothing(args, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["fsdp", "--json", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit fsdp: error:") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_checks_before_launching():
    with pytest.raises(UsageError, match="FSDPConfig"):
        fsdp.run(TINY)


# ---------------------------------------------------------------- one real launch (gloo)

@pytest.mark.slow
def test_two_ranks_match_one_process_and_hold_half(tmp_path):
    store = tmp_path / "fsdp.json"
    df = fsdp.run(FSDPConfig(**TINY), launch=LaunchOptions(
        nprocs=(2,), timeout_s=LAUNCH_TIMEOUT_S, progress=False), store=str(store))
    assert list(report.select(df).variant) == ["ddp", "zero1", "fsdp"]
    for _, r in df.iterrows():
        assert r.matches_single_process and r.max_rel_error <= r.tolerance
        # counted bytes against the formula: DDP within 10% (its few bytes of bookkeeping),
        # exactly where the formula is exact (the ZeRO-1 and FSDP collectives)
        assert r.comm_bytes_measured == pytest.approx(r.comm_bytes_formula, rel=0.10)
        for kind in ("param", "grad", "optimizer", "state"):
            assert r[f"{kind}_bytes_per_rank"] == pytest.approx(r[f"{kind}_bytes_formula"],
                                                                rel=0.10)
        assert r.predicted_compute_s > 0
        if np.isfinite(r.beta_gb_per_s):  # NaN only where the sweep gave no α–β fit (noise)
            assert r.predicted_step_s == pytest.approx(r.predicted_compute_s + r.predicted_comm_s)
    z1, f = report.one(df, "zero1"), report.one(df, "fsdp")
    assert z1.comm_bytes_measured == z1.comm_bytes_formula
    assert f.comm_bytes_measured == f.comm_bytes_formula
    assert f.collective_calls_measured == f.collective_calls_formula == 3 * TINY["num_layers"]
    # FSDP at 2 ranks: half of DDP's weights and Adam states, 1.5x its bytes moved
    assert f.param_bytes_per_rank == pytest.approx(f.ddp_param_bytes_per_rank / 2, rel=0.10)
    assert f.optimizer_bytes_per_rank == pytest.approx(f.ddp_optimizer_bytes_per_rank / 2,
                                                       rel=0.10)
    assert f.comm_ratio_vs_ddp == pytest.approx(1.5, rel=0.10)
    assert z1.optimizer_bytes_per_rank == pytest.approx(z1.ddp_optimizer_bytes_per_rank / 2,
                                                        rel=0.10)
    assert z1.param_bytes_per_rank == z1.ddp_param_bytes_per_rank
    assert df.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    # FSDP2's step with its collectives local was timed (its own work), and no other variant's;
    # its collectives are found in torch 2.13's internals (labkit.fsdp.record.fsdp_collectives),
    # and on another torch the time is NaN, as documented
    import torch

    own_work = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"
    assert (f.local_step_time_p50_s > 0) == own_work
    assert df[df.variant != "fsdp"].local_step_time_p50_s.isna().all()
    # each variant's Adam alone: torch's over all Ψ for DDP, and for FSDP2 where its own work
    # was timed against the plain model (the same number; else FSDP2's Adam steps its Ψ/N
    # slice, as ZeRO-1's does), the hand-written update of ZeRO-1's Ψ/N slice for ZeRO-1
    d = report.one(df, "ddp")
    assert d.optimizer_time_s > 0
    assert f.optimizer_time_s == (d.optimizer_time_s if own_work else z1.optimizer_time_s)
    assert 0 < z1.optimizer_time_s != d.optimizer_time_s
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    stored = results.read_rows(store)
    assert len(stored) == 3 and results.undeclared(stored, report.COLUMNS) == []
    mem = report.memory_frame(df)
    assert (mem.error_pct.abs() < 10).all() and len(report.comm_frame(df)) == 3
    import matplotlib

    matplotlib.use("Agg")
    assert len(fsdp.plots.memory_and_comm(df).axes) == 3


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_uses_nccl_one_gpu_per_rank():
    import torch

    n = min(2, torch.cuda.device_count())
    df = fsdp.run(FSDPConfig(**TINY),
                  launch=LaunchOptions(nprocs=n, timeout_s=LAUNCH_TIMEOUT_S, progress=False))
    assert (df.backend == "nccl").all() and df.device.str.startswith("cuda").all()
    assert df.matches_single_process.all()
    assert (df.device_memory_peak_bytes > 0).all()  # measured on the GPUs


# ---------------------------------------------------------------- honest laws (pure)

def _dp_row(stage="zero3", variant="fsdp", **kw):
    row = {"variant": variant, "stage": stage, "world_size": 2, "hidden": 64, "num_layers": 2,
           "reshard_after_forward": True, "predicted_compute_s": 0.05,
           "compute_time_p50_s": 0.062, "step_time_p50_s": 0.08,
           "collectives_time_alone_s": 0.006, "state_bytes_formula": 1000.0,
           "state_bytes_per_rank": 1000, "state_ratio_vs_ddp": 0.5,
           "ddp_state_bytes_per_rank": 2000,
           "comm_ratio_vs_ddp": 1.5, "step_ratio_vs_ddp": 1.3}
    return {**row, **kw}


def test_collectives_priced_in_context():
    from labkit.fsdp import model
    from labkit.tp.verdicts import FakeProfile

    # a profile that timed no all-gather or reduce-scatter prices each as a ring's: half an
    # all-reduce of the buffer
    ring = FakeProfile(slowdown=1.25, allreduce_s=1e-3, busy_factor=2.0, ops={})
    # FSDP on NCCL (GPUs): 2 layers x (2 all-gathers + 1 reduce-scatter), busy (they run
    # beside the compute)
    nccl = dict(backend="nccl")
    assert model.comm_in_context(_dp_row(**nccl), ring) == pytest.approx(6 * 0.5 * 2e-3)
    # without resharding one all-gather less per layer
    assert model.comm_in_context(_dp_row(reshard_after_forward=False, **nccl), ring) == \
        pytest.approx(4 * 0.5 * 2e-3)
    # a profile that timed them (on gloo here: an all-gather as long as an all-reduce of the
    # buffer, a reduce-scatter twice), on a CPU where each holds the rank's thread (idle)
    prof = FakeProfile(slowdown=1.25, allreduce_s=1e-3, busy_factor=2.0)
    assert model.comm_in_context(_dp_row(backend="gloo"), prof) == \
        pytest.approx((4 + 2 * 2) * 1e-3)
    # DDP: one all-reduce during backward (busy); ZeRO-1: two halves with the ranks idle
    assert model.comm_in_context(_dp_row("ddp", "ddp"), prof) == pytest.approx(2e-3)
    assert model.comm_in_context(_dp_row("zero1", "zero1", **nccl), ring) == \
        pytest.approx(1e-3)
    ctx = model.context(_dp_row(), prof)
    assert ctx["compute_s"] == pytest.approx(0.05 * 1.25)
    assert model.context(_dp_row(world_size=1), prof)["step_s"] == pytest.approx(0.05)


def test_dp_laws_say_their_kind_and_split_their_misses():
    from labkit.book import laws
    from labkit.fsdp import verdicts
    from labkit.tp.verdicts import FakeProfile

    rows = [_dp_row("ddp", "ddp"), _dp_row("zero1", "zero1"), _dp_row()]
    comm = [{"variant": r["variant"], "ranks": 2, "law": "x", "predicted_MB": 1.0,
             "measured_MB": 1.0} for r in rows]
    out = verdicts.laws(rows, comm, FakeProfile())
    assert len(out) == 9 and {r["kind"] for r in out} == {"model"}
    assert all(r["tolerance_pct"] <= 25 for r in out)
    steps = out[-3:]
    assert all(laws.split_sums(r) and "its collectives (timed alone)" in r["split"]
               for r in steps)
    # a miss prints its split
    assert "measured split" in laws.verdict(verdicts.laws(
        [_dp_row(step_time_p50_s=0.2)], [], FakeProfile())[-1])
    # one rank: no collectives timed, two terms
    assert list(verdicts.step_split(_dp_row(collectives_time_alone_s=float("nan")))) == \
        ["the plain model", "the rest (the wrapper's work, waits)"]


def test_dp_sentences_flip_with_their_numbers():
    from labkit.fsdp import verdicts

    assert "(50% less)" in verdicts.against_ddp_sentence(_dp_row())
    assert "more)" in verdicts.against_ddp_sentence(_dp_row(state_ratio_vs_ddp=1.2))
    assert "(longer)" in verdicts.against_ddp_sentence(_dp_row())
    assert "(shorter)" in verdicts.against_ddp_sentence(_dp_row(step_ratio_vs_ddp=0.8))
    kw = dict(gpus=8, gpu_gb=80)
    assert "DDP holds 128 GB a GPU (does not fit" in verdicts.fits_sentence(
        "m", ddp_bytes=128e9, fsdp_bytes=16e9, **kw)
    assert "DDP holds 60 GB a GPU (fits" in verdicts.fits_sentence(
        "m", ddp_bytes=60e9, fsdp_bytes=16e9, **kw)
    assert "fits with ZeRO-3" in verdicts.strategies_sentence(
        "m", fits=["ZeRO-3"], micro_batch=1, seq_len=8, **kw)
    assert "fits with none" in verdicts.strategies_sentence(
        "m", fits=[], micro_batch=1, seq_len=8, **kw)
    assert "(+32 ms" in verdicts.extra_comm_sentence(ddp_s=0.062, fsdp_s=0.094, compute_s=1,
                                                     tokens=8)
    assert "(-10 ms" in verdicts.extra_comm_sentence(ddp_s=0.062, fsdp_s=0.052, compute_s=1,
                                                     tokens=8)


def test_fsdp_own_work_enters_the_model_law_and_split():
    from labkit.book import laws
    from labkit.fsdp import model, verdicts
    from labkit.tp.verdicts import FakeProfile

    prof = FakeProfile(slowdown=1.25, allreduce_s=1e-3)
    plain = model.context(_dp_row(), prof)
    own = _dp_row(local_step_time_p50_s=0.092)  # 30 ms beyond the plain model's 62
    ctx = model.context(own, prof)
    assert ctx["own_s"] == pytest.approx(0.030) and plain["own_s"] == 0
    assert ctx["step_s"] == pytest.approx(plain["step_s"] + 0.030)
    law = verdicts.laws([own], [], prof)[-1]
    assert law["law"].endswith(model.OWN_TERM) and laws.split_sums(law)
    assert law["split"][model.OWN_TERM] == pytest.approx(30.0)
    assert model.OWN_TERM not in verdicts.laws([_dp_row()], [], prof)[-1]["law"]
    assert f"{model.OWN_TERM} 30.0" in verdicts.step_sentence(own, prof)
    assert model.OWN_TERM not in verdicts.step_sentence(_dp_row(), prof)
    # a local step no slower than the plain model's adds nothing
    assert model.own_work_s(_dp_row(local_step_time_p50_s=0.05)) == 0


@pytest.mark.slow
def test_fsdp_without_its_own_work_counts_the_adam_of_its_slice():
    # with checkpointing FSDP2's own work is not measured, so its model's Adam is its slice's
    # (the hand-written update of Ψ/N, as ZeRO-1's), not the plain model's over Ψ
    df = fsdp.run(FSDPConfig(**{**TINY, "variants": ("zero1", "fsdp"), "checkpoint": True}),
                  launch=LaunchOptions(nprocs=(2,), timeout_s=LAUNCH_TIMEOUT_S, progress=False))
    z1, f = report.one(df, "zero1"), report.one(df, "fsdp")
    assert np.isnan(f.local_step_time_p50_s)
    assert f.optimizer_time_s == z1.optimizer_time_s > 0


def test_adam_enters_the_compute_term_slowed_as_the_compute():
    from labkit.book import laws
    from labkit.fsdp import model, verdicts
    from labkit.tp.verdicts import FakeProfile

    prof = FakeProfile(slowdown=1.25, allreduce_s=1e-3)
    plain, adam = _dp_row(), _dp_row(optimizer_time_s=0.008)
    before, after = model.context(plain, prof), model.context(adam, prof)
    assert after["optimizer_s"] == 0.008 and before["optimizer_s"] == 0
    assert after["compute_s"] == pytest.approx(before["compute_s"] + 0.008 * 1.25)
    assert after["step_s"] == pytest.approx(before["step_s"] + 0.010)
    law = verdicts.laws([adam], [], prof)[-1]
    assert ": step = (F/R + Adam) x slowdown" in law["law"] and laws.split_sums(law)
    assert ": step = F/R x slowdown" in verdicts.laws([plain], [], prof)[-1]["law"]
    assert "the model: (F/R + Adam 8.0) alone x 1.25" in verdicts.step_sentence(adam, prof)
    assert "the model: F/R alone x 1.25" in verdicts.step_sentence(plain, prof)


def test_local_collectives_move_nothing_and_keep_the_shapes():
    import torch

    from labkit.fsdp.local import _LocalAllGather, _LocalReduceScatter

    class Alloc:
        def allocate(self, size, *, dtype, device):
            return torch.empty(size, dtype=dtype, device=device)

    out = _LocalAllGather(Alloc()).allocate((6,), dtype=torch.float32, device="cpu")
    _LocalAllGather(Alloc())(output_tensor=out, input_tensor=torch.tensor([1.0, 2.0]),
                             group=None, async_op=False)
    assert out.tolist() == [1.0, 2.0] * 3  # every rank's slot: this rank's shard
    part = torch.empty(2)
    _LocalReduceScatter(Alloc(), rank=1)(output_tensor=part,
                                         input_tensor=torch.arange(6.0), group=None, op=None)
    assert part.tolist() == [2.0, 3.0]  # rank 1's part, nothing summed
