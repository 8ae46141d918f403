"""The tensor-parallel lab: config, formulas, bad input refused before launch, and (slow) one
real 2-rank gloo launch that checks everything: both variants equal one process, their
all-reduces counted equal the formula exactly, every row field is declared. No test asserts on
speed (benchmarks/split_bench.py measures)."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

from labkit import cli, results, tp
from labkit.errors import UsageError
from labkit.launch import LaunchOptions
from labkit.tp import config as tp_config
from labkit.tp import formulas, report
from labkit.tp.config import TPConfig

from .conftest import LAUNCH_TIMEOUT_S

TINY = {"hidden": 32, "num_heads": 4, "seq_len": 8, "batch_size": 2, "num_layers": 2,
        "steps": 4, "warmup": 1}


@pytest.mark.parametrize("bad, message", [
    ({"variants": ("megatron",)}, "unknown variant"),
    ({"variants": ()}, "empty"),
    ({"variants": ("naive", "naive")}, "repeat"),
    ({"hidden": 30, "num_heads": 4}, "not divisible by num_heads"),
    ({"hidden": 0}, "hidden"),
    ({"steps": 3, "warmup": 3}, "warmup"),
    ({"lr": 0}, "lr"),
])
def test_config_refuses_bad_input(bad, message):
    with pytest.raises(UsageError, match=message):
        TPConfig(**{**TINY, **bad})


@pytest.mark.parametrize("world_size, message", [
    (8, "too small to shard over 8 ranks"),   # 4 heads: a rank without a whole head
    (3, "num_heads 4 is not divisible by 3"),
])
def test_check_world_size(world_size, message):
    with pytest.raises(UsageError, match=message):
        TPConfig(**TINY).check_world_size(world_size)
    TPConfig(**TINY).check_world_size(2)


@pytest.mark.parametrize("module", [formulas, tp_config, report,
                                    importlib.import_module("labkit.tp.run")])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_formulas_count_four_allreduces_per_layer():
    kw = dict(batch_size=2, seq_len=8, hidden=32, num_layers=3)
    assert formulas.allreduce_count(num_layers=3, world_size=4) == 12
    assert formulas.allreduce_bytes(**kw, world_size=4) == 12 * 2 * 8 * 32 * 4
    assert formulas.allreduce_bytes(**kw, world_size=1) == 0
    assert formulas.params_per_rank(hidden=32, num_layers=3, world_size=1) == \
        formulas.param_count(hidden=32, num_layers=3)
    assert formulas.flops_per_rank(**kw, world_size=2) == formulas.flops_per_rank(**kw) / 2
    # TP pays above the break-even width, not below it
    link = dict(compute_flop_per_s=40e9, alpha_s=100e-6, beta_bytes_per_s=1e9)
    h0 = formulas.breakeven_hidden(batch_size=8, seq_len=32, ranks=2, **link)
    for h, pays in ((int(h0) - 8, False), (int(h0) + 8, True)):
        s = formulas.tp_speedup(batch_size=8, seq_len=32, hidden=h, num_layers=1, ranks=2, **link)
        assert (s > 1) == pays


@pytest.mark.parametrize("args", [
    ["--nproc", "3"],                              # 8 heads over 3 ranks
    ["--nproc", "16"],                             # 8 heads: too small to shard
    ["--variant", "megatron"],
    ["--hidden", "100"],                           # not divisible by 8 heads
    ["--steps", "2", "--warmup", "2"],
])
def test_cli_bad_input_exits_2_and_writes_nothing(args, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["tp", "--json", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit tp: error:") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_checks_before_launching(tmp_path):
    with pytest.raises(UsageError, match="TPConfig"):
        tp.run(TINY)
    with pytest.raises(UsageError, match="too small"):
        tp.run(TPConfig(**TINY), launch=LaunchOptions(nprocs=(8,)))


# ---------------------------------------------------------------- one real launch (gloo)

@pytest.mark.slow
def test_two_ranks_match_one_process_and_count_the_formula(tmp_path):
    store = tmp_path / "tp.json"
    df = tp.run(TPConfig(**TINY), launch=LaunchOptions(nprocs=(2,), timeout_s=LAUNCH_TIMEOUT_S,
                                                       progress=False), store=str(store))
    assert sorted(df.variant) == ["library", "naive"] and set(df.world_size) == {2}
    for _, r in df.iterrows():
        # correctness first: output, input gradient, every weight-gradient slice
        assert r.matches_single_process and r.max_rel_error <= r.tolerance
        # the formula is exact: 4 all-reduces of b s h fp32 values per layer
        assert r.allreduce_calls_measured == r.allreduce_calls_formula == 4 * TINY["num_layers"]
        assert r.comm_bytes_measured == r.comm_bytes_formula == \
            4 * 2 * TINY["batch_size"] * TINY["seq_len"] * TINY["hidden"] * 4
        assert r.other_collective_calls == 0
        assert r.params_per_rank == r.params_per_rank_formula < r.num_params
        p = [r[f"step_time_p{q}_s"] for q in (50, 75, 90, 95)]
        assert p == sorted(p) and p[0] > 0
        assert len(r.step_times_s) == r.step_time_count == TINY["steps"] - TINY["warmup"]
        assert r.compute_flop_per_s > 0 and r.predicted_compute_s > 0
        if np.isfinite(r.beta_gb_per_s):  # NaN only where the sweep gave no α–β fit (noise)
            assert r.alpha_s >= 0 and r.beta_gb_per_s > 0
            assert r.predicted_step_s == pytest.approx(r.predicted_compute_s + r.predicted_comm_s)
            assert np.isfinite(r.prediction_error_pct)
    assert report.one(df, "naive").allreduce_time_in_step_s > 0
    assert df.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    stored = results.read_rows(store)
    assert len(stored) == 2 and results.undeclared(stored, report.COLUMNS) == []
    laws = report.laws_frame(report.one(df, "library"))
    assert (laws.error_pct.iloc[:3] == 0).all()
    assert list(report.summary_frame(df).matches) == [True, True]
    import matplotlib

    matplotlib.use("Agg")
    assert tp.plots.step_breakdown(df).axes


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_uses_nccl_one_gpu_per_rank():
    import torch

    n = min(2, torch.cuda.device_count())
    df = tp.run(TPConfig(**TINY),
                launch=LaunchOptions(nprocs=n, timeout_s=LAUNCH_TIMEOUT_S, progress=False))
    assert (df.backend == "nccl").all() and df.device.str.startswith("cuda").all()
    assert df.matches_single_process.all()
    assert (df.comm_bytes_measured == df.comm_bytes_formula).all()
    assert (df.device_memory_peak_bytes > 0).all()  # measured on the GPUs
