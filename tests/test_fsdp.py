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
