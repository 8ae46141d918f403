"""The DDP lab: config, models, formulas, the CLI's bad input, and (slow) real gloo launches.

Three launches in all (1 and 2 ranks with bucket 25 MB, then 2 ranks with bucket 1 MB), shared
by the slow tests through module-scoped fixtures; the model is tiny so a launch costs about what
torchrun's start costs. No test asserts on speed (benchmarks/ddp_bench.py measures).
"""

from __future__ import annotations

import doctest
import json
import re

import numpy as np
import pytest
import torch

from labkit import cli, ddp, results
from labkit.collectives.formulas import busbw_gb_per_s
from labkit.ddp import config as ddp_config
from labkit.ddp import diff as ddp_diff
from labkit.ddp import formulas, report, verdicts
from labkit.ddp.config import DDPConfig
from labkit.ddp.diff import compare, delta_pct
from labkit.ddp.models import build_model, grad_bytes, num_params, synthetic_batches
from labkit.errors import ResultsFileError, UsageError
from labkit.launch import LaunchOptions

from .conftest import LAUNCH_TIMEOUT_S

TINY = {"model": "mlp", "input_dim": 16, "hidden_dim": 32, "output_dim": 5, "num_layers": 2,
        "batch_size": 8, "steps": 6, "warmup": 2}
TINY_ARGS = ["--model", "mlp", "--input-dim", "16", "--hidden-dim", "32", "--output-dim", "5",
             "--num-layers", "2", "--batch-size", "8", "--steps", "6", "--warmup", "2",
             "--timeout", str(LAUNCH_TIMEOUT_S)]


# ---------------------------------------------------------------- pure and in-process parts

@pytest.mark.parametrize("bad, message", [
    ({"model": "resnet50"}, "unknown model"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": -3}, "batch_size"),
    ({"batch_size": (64, 0)}, "batch_size"),
    ({"batch_size": (64, 64)}, "repeats"),
    ({"batch_size": ()}, "batch_size"),
    ({"steps": 0}, "steps"),
    ({"steps": 5, "warmup": 5}, "warmup"),
    ({"steps": 5, "warmup": 9}, "warmup"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb"),
    ({"bucket_cap_mb": -1.5}, "bucket_cap_mb"),
    ({"static_graph": "yes"}, "static_graph"),
    ({"model": "transformer", "hidden_dim": 30, "num_heads": 4}, "divisible"),
    ({"model": "cnn", "image_size": 4, "num_layers": 3}, "image_size"),
    ({"batch_size": (16, 64), "all_cores_batches": (32,)}, "all_cores_batches"),
    ({"all_cores_batches": (0,)}, "all_cores_batches"),
])
def test_config_refuses_bad_input(bad, message):
    with pytest.raises(UsageError, match=message):
        DDPConfig(**bad)


def test_config_resolves_model_defaults():
    assert DDPConfig(model="mlp").hidden_dim == 1024
    assert DDPConfig(model="transformer").hidden_dim == 128
    assert DDPConfig(model="cnn", hidden_dim=8).hidden_dim == 8
    assert DDPConfig(bucket_cap_mb=25).bucket_cap_mb == 25.0
    assert DDPConfig(steps=10, warmup=3).measured_steps == 7
    two = DDPConfig(batch_size=[64, 1024])
    assert two.batch_size == (64, 1024) and two.at(1024).describe()["batch_size"] == 1024
    with pytest.raises(UsageError):
        two.describe()


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_models_train_one_step(model):
    cfg = DDPConfig(model=model, batch_size=4, hidden_dim=16, num_layers=2, num_heads=2,
                    image_size=8, seq_len=6, input_dim=3, num_batches=2)
    net = build_model(cfg)
    # same seed, same weights: what lets every rank start from one model
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(),
                                                  build_model(cfg).state_dict().values()))
    (x, y), _ = synthetic_batches(cfg, rank=0)
    out = net(x)
    assert out.shape == (4, cfg.output_dim)
    torch.nn.functional.cross_entropy(out, y).backward()
    assert all(p.grad is not None for p in net.parameters())
    assert grad_bytes(net) == 4 * num_params(net)


def test_synthetic_batches_are_seeded_per_rank():
    cfg = DDPConfig(**TINY)
    a0, b0, a1 = synthetic_batches(cfg, 0), synthetic_batches(cfg, 0), synthetic_batches(cfg, 1)
    assert len(a0) == cfg.num_batches
    assert torch.equal(a0[0][0], b0[0][0]) and not torch.equal(a0[0][0], a1[0][0])
    assert not torch.equal(a0[0][0], a0[1][0])


@pytest.mark.parametrize("module", [formulas, ddp_config, ddp_diff, report, verdicts,
                                    ddp.predict, ddp.budget])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_formulas():
    # algbw 2 GB/s: 2e9 bytes in 1 s
    assert busbw_gb_per_s(op="all_reduce", ranks=1, size_bytes=2e9, time_s=1.0) == 0.0
    assert busbw_gb_per_s(op="all_reduce", ranks=2, size_bytes=2e9, time_s=1.0) == 2.0
    assert busbw_gb_per_s(op="all_reduce", ranks=8, size_bytes=2e9, time_s=1.0) == pytest.approx(3.5)
    assert formulas.exposed_comm_s(0.02, 0.03) == 0.0  # noise cannot make comm negative
    assert formulas.overlap_fraction(0.0, 0.01) == 1.0
    assert formulas.overlap_fraction(0.02, 0.01) == 0.0
    assert delta_pct(0.1, 0.2) == pytest.approx(-50.0)
    rows = formulas.add_scaling_columns([
        {"variant": "no_ddp", "world_size": 1, "step_time_p50_s": 0.010},
        {"variant": "ddp", "world_size": 1, "step_time_p50_s": 0.012},
        {"variant": "ddp", "world_size": 2, "step_time_p50_s": 0.016}])
    assert np.isnan(rows[0]["speedup"]) and rows[0]["speedup_vs_no_ddp"] == 1.0
    assert rows[2]["speedup"] == pytest.approx(1.5)
    assert rows[2]["scaling_efficiency"] == pytest.approx(0.75)
    assert rows[2]["speedup_vs_no_ddp"] == pytest.approx(1.25)
    with pytest.raises(UsageError):
        busbw_gb_per_s(op="all_reduce", ranks=0, size_bytes=1e9, time_s=1.0)


@pytest.mark.parametrize("args", [
    ["--warmup", "10", "--steps", "10"],
    ["--model", "resnet50"],
    ["--batch-size", "0"],
    ["--steps", "0"],
    ["--bucket-cap-mb", "0"],
    ["--bucket-cap-mb", "-2"],
])
def test_cli_bad_input_exits_2_and_writes_nothing(args, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["ddp", "--nproc", "1", "--json", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit ddp: error:") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_threads_per_rank_above_the_cores_exits_2_before_launching(tmp_path, capsys):
    from labkit.procs import allocated_cores

    out = tmp_path / "r.json"
    too_many = str(allocated_cores() + 1)
    assert cli.main(["ddp", "--nproc", "1", "2", "--threads-per-rank", too_many,
                     "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit ddp: error:") and "\n" not in err and "cores" in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match="cores"):
        LaunchOptions(nprocs=1, threads_per_rank=allocated_cores() + 1)
    # as many threads as cores on 2 ranks is oversubscription: allowed (marked at launch)
    assert LaunchOptions(nprocs=2, threads_per_rank=allocated_cores()).threads_per_rank >= 1


# ---------------------------------------------------------------- the model of a DDP step

def test_fit_step_time_recovers_the_line_and_refuses_one_batch():
    b = [16, 32, 64, 1024]
    assert formulas.fit_step_time(b, [0.01 + 3e-4 * x for x in b]) == pytest.approx((0.01, 3e-4))
    with pytest.raises(UsageError):
        formulas.fit_step_time([64, 64], [0.1, 0.1])
    with pytest.raises(UsageError):
        formulas.crossover_batch([64], [1.2])


def test_verdict_sentences_flip_with_the_numbers():
    b = [16, 32, 64, 128]
    wins = verdicts.pays_sentence(b, [0.8, 0.9, 1.1, 1.3])
    assert wins.startswith("DDP on 2 ranks pays from batch 45 per rank on")
    never = verdicts.pays_sentence(b, [0.5, 0.6, 0.7, 0.8])
    assert "does not pay at any batch" in never and "0.80x, at batch 128" in never
    always = verdicts.pays_sentence(b, [1.1, 1.2, 1.3, 1.4])
    assert "pays at every batch swept, from batch 16" in always
    assert "does not pay at the largest batch" in verdicts.pays_sentence(b, [0.8, 1.1, 1.2, 0.9])
    # the crossover moves with the numbers: a later crossing, a later batch
    assert "from batch 91 per rank on" in verdicts.pays_sentence(b, [0.7, 0.8, 0.9, 1.1])
    assert "within 25% at every batch" in verdicts.model_sentence(b, [1, -2, 3, 24.9])
    assert "more than 25% at 1 of 4 batches: batch 128 (+26%)" in verdicts.model_sentence(
        b, [1, -2, 3, 26])
    assert verdicts.threads_sentence(batch=64, ranks=2, threads=2, ratio=0.8).endswith(
        "the one process wins.")
    assert verdicts.threads_sentence(batch=64, ranks=2, threads=2, ratio=1.2).endswith(
        "the ranks win.")
    nan, inf = float("nan"), float("inf")
    assert "measured batch 45 per rank, predicted 40" in verdicts.crossover_sentence(
        {"world_size": 2, "measured": 45.2, "predicted": 40.0, "batches": b})
    text = verdicts.crossover_sentence({"world_size": 2, "measured": nan, "predicted": inf,
                                        "batches": b})
    assert "measured not inside the sweep (16 to 128 per rank), predicted never" in text


def test_diff_refuses_non_ddp_files(tmp_path, capsys):
    other = tmp_path / "placement.json"
    results.record(other, [{"world_size": 2, "rank": 0, "allreduce_time_p50_s": 1e-4}])
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"benchmark_results": []}))
    for a, b in ((other, other), (foreign, other), (tmp_path / "missing.json", other)):
        assert cli.main(["diff", str(a), str(b)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("labkit diff: error:") and "\n" not in err
    assert cli.main(["diff", str(other), str(other)]) == 2
    assert "not a DDP result" in capsys.readouterr().err


def test_report_selects_rows():
    import pandas as pd

    df = pd.DataFrame([{"variant": v, "world_size": n, "batch_size": b}
                       for b in (64, 8) for v, n in (("ddp", 2), ("no_ddp", 1), ("ddp", 1))])
    assert list(report.select(df, "ddp", batch_size=8).world_size) == [1, 2]
    assert report.one(df, "no_ddp", batch_size=64).world_size == 1
    with pytest.raises(UsageError, match="2 rows"):
        report.one(df, "ddp", world_size=2)


def test_run_warns_without_a_one_rank_launch_and_checks_before_launching(tmp_path):
    store = tmp_path / "missing" / "r.json"
    with pytest.warns(UserWarning, match="no 1-rank launch"), pytest.raises(ResultsFileError):
        ddp.run(DDPConfig(**TINY), launch=LaunchOptions(nprocs=(2,)), store=str(store))
    with pytest.raises(UsageError, match="DDPConfig"):
        ddp.run(TINY)


# ---------------------------------------------------------------- real launches (gloo)

@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    """1 and 2 ranks, bucket 25 MB, two batch sizes in each launch, every rank's parameters."""
    path = tmp_path_factory.mktemp("ddp") / "a.json"
    config = ddp.DDPConfig(**{**TINY, "batch_size": (8, 12)}, return_params=True)
    df = ddp.run(config, launch=LaunchOptions(nprocs=(1, 2), timeout_s=LAUNCH_TIMEOUT_S,
                                              progress=False), store=str(path))
    return df, path


@pytest.fixture(scope="module")
def run_b(tmp_path_factory):
    """2 ranks, bucket 1 MB, through the CLI; returns (stdout, path)."""
    path = tmp_path_factory.mktemp("ddp") / "b.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["ddp", "--nproc", "2", "--bucket-cap-mb", "1", "--json", str(path),
                       *TINY_ARGS])
    assert rc == 0
    return buf.getvalue(), path


def _reference_params(cfg: DDPConfig, world_size: int, ranks=None) -> np.ndarray:
    """One process, no DDP, on the ranks' batches concatenated: what DDP must equal."""
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    data = [synthetic_batches(cfg, r) for r in (ranks if ranks is not None else range(world_size))]
    for s in range(cfg.steps):  # every step: warm-up steps train too
        x = torch.cat([d[s % cfg.num_batches][0] for d in data])
        y = torch.cat([d[s % cfg.num_batches][1] for d in data])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).numpy()


@pytest.mark.slow
def test_ddp_params_match_concatenated_batch(run_a):
    df, _ = run_a
    for batch in (8, 12):
        cfg = DDPConfig(**{**TINY, "batch_size": batch})
        for ws in (1, 2):
            row = df[(df.variant == "ddp") & (df.world_size == ws) & (df.batch_size == batch)].iloc[0]
            params = np.array(row["params_by_rank"])
            assert params.shape[0] == ws
            assert np.array_equal(params[0], params[-1]), "replicas drifted apart"
            assert row["replicas_in_sync"] and row["replica_drift"] == 0.0
            ref = _reference_params(cfg, ws)
            np.testing.assert_allclose(params[0], ref, rtol=1e-5, atol=1e-6)
    # the check has teeth: training on rank 0's batches alone ends elsewhere
    assert not np.allclose(params[0], _reference_params(cfg, 1, ranks=[0]), atol=1e-6)


@pytest.mark.slow
def test_percentiles_ordered_over_slowest_rank(run_a):
    df, _ = run_a
    for _, row in df.iterrows():
        p = [row[f"step_time_p{q}_s"] for q in (50, 75, 90, 95)]
        assert p == sorted(p) and p[0] > 0
        steps = np.array(row["step_times_s"])
        assert len(steps) == row["measured_steps"] == row["step_time_count"] == 4
        by_rank = np.array(row["rank_step_times_s"])
        assert by_rank.shape == (row["world_size"], 4)
        np.testing.assert_array_equal(steps, by_rank.max(axis=0))
        for q in (50, 75, 90, 95):
            assert row[f"step_time_p{q}_s"] == pytest.approx(np.percentile(steps, q))
        assert row["samples_per_s"] == pytest.approx(row["world_size"] * row["batch_size"] / p[0])


@pytest.mark.slow
def test_baseline_row_scaling_and_stored_rows(run_a):
    df, path = run_a
    base = df[df.variant == "no_ddp"]
    assert sorted(base.batch_size) == [8, 12] and (base.world_size == 1).all() and not base.ddp.any()
    assert sorted(df[df.variant == "ddp"].world_size) == [1, 1, 2, 2]
    df = df[df.batch_size == 8]
    one = df[(df.variant == "ddp") & (df.world_size == 1)].iloc[0]
    two = df[(df.variant == "ddp") & (df.world_size == 2)].iloc[0]
    assert one.speedup == pytest.approx(1.0) and one.scaling_efficiency == pytest.approx(1.0)
    assert two.speedup == pytest.approx(2 * one.step_time_p50_s / two.step_time_p50_s)
    assert two.allreduce_busbw_gb_per_s == pytest.approx(two.allreduce_algbw_gb_per_s)  # N = 2
    assert two.grad_bytes == 4 * two.num_params and 0.0 <= two.overlap_fraction <= 1.0
    stored = results.read_rows(path)
    assert len(stored) == 6 and all("git_commit" in r and "timestamp" in r for r in stored)
    assert {r["bucket_cap_mb"] for r in stored} == {25.0}


@pytest.mark.slow
def test_every_row_field_is_declared(run_a):
    df, path = run_a
    assert df.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert results.undeclared(results.read_rows(path), report.COLUMNS) == []


@pytest.mark.slow
def test_placement_one_line_per_rank(run_a, run_b):
    df, _ = run_a
    for ws in (1, 2):
        row = df[(df.variant == "ddp") & (df.world_size == ws)].iloc[0]
        assert [p["rank"] for p in row["placement"]] == list(range(ws))
        assert row["placement_ok"]
    text = report.placement_table(df)
    assert len([ln for ln in text.splitlines() if ln.lstrip().startswith("rank ")]) == 3
    out, _ = run_b
    assert len(re.findall(r"^\s+rank \d \(local \d\) on ", out, flags=re.M)) == 2


@pytest.mark.slow
def test_cli_prints_pytorch_layout(run_b):
    out, path = run_b
    assert "Benchmark: mlp with batch size 8 per rank" in out
    assert re.search(r"^\s+2 ranks --\s+1M/2C:  p50: +\d+\.\d+s +\d+/s  p75:.*p95:", out, re.M)
    assert "speedup" in out and "efficiency" in out
    assert {r["bucket_cap_mb"] for r in results.read_rows(path)} == {1.0}


@pytest.mark.slow
def test_diff_bucket_25_vs_1(run_a, run_b, capsys):
    _, a = run_a
    _, b = run_b
    assert cli.main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr()
    assert re.search(r"^bucket_cap_mb:\s+25\.0 <vs>\s+1\.0$", out.out, re.M)
    line = re.search(r"^\s+2 ranks --\s+ddp:  p75: .*$", out.out, re.M).group(0)
    assert len(re.findall(r"[+-]\d+\.\d%", line)) == 2  # p75 and p95 deltas
    assert "WARNING" not in out.err
    settings, table, notes = compare(a, b)
    assert list(table.world_size) == [2] and list(table.batch_size) == [8] and not notes
    r = table.iloc[0]
    assert r.delta_p75_pct == pytest.approx(delta_pct(r.a_p75_s, r.b_p75_s))


@pytest.mark.slow
def test_like_for_like_sweep_with_the_model_and_the_whole_machine(tmp_path):
    """One thread per process, the all-cores run at one batch, the model beside every DDP run."""
    from labkit.ddp.abtest import ABConfig
    from labkit.procs import allocated_cores

    # run B's buckets of 1 MB with run A's 25 MB timed in the same rounds
    config = ABConfig(**{**TINY, "batch_size": (8, 16)}, all_cores_batches=(16,),
                      bucket_cap_mb=1.0, compare_bucket_cap_mb=25.0)
    from types import SimpleNamespace

    prof = SimpleNamespace(compute_slowdown=lambda ranks, n=None: 1.2,  # a synthetic profile
                           copy_bytes_per_s=lambda together=False: 5e9,
                           transfer_s=lambda size, ranks=2, busy=False: 1e-4 + size / 1e9,
                           scheduler_wait_s=3.6e-3,
                           rows=[{"measurement": "matmul", "context": "alone", "n": 64}],
                           matmul_flop_per_s=lambda n, together=False: 1e10)
    df = ddp.run(config, launch=LaunchOptions(nprocs=(1, 2), threads_per_rank=1,
                                              timeout_s=LAUNCH_TIMEOUT_S, progress=False),
                 profile=prof)
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert (df[df.variant != report.ALL_CORES].threads_per_rank == 1).all()
    whole = report.one(df, report.ALL_CORES)
    assert whole.batch_size == 16 and whole.threads_per_rank == allocated_cores()
    two = report.one(df, "ddp", world_size=2, batch_size=16)
    assert two.speedup_vs_all_cores == pytest.approx(2 * whole.step_time_p50_s
                                                     / two.step_time_p50_s)
    assert sum(two.bucket_bytes) == two.grad_bytes and two.bucket_copy_time_p50_s > 0
    assert two.allreduce_fit_bytes[-1] == two.grad_bytes
    # the standalone all-reduce: several calls a round, as many as the profile's per size
    assert len(two.allreduce_times_s) == ddp.config.ALLREDUCE_CALLS * two.measured_steps
    assert len(two.step_times_s) == two.measured_steps
    assert two.predicted_step_time_s > two.model_compute_s > 0
    # the model starts from the plain step timed on rank 0 in the DDP launch's rounds
    assert len(two.alone_step_times_s) == two.measured_steps
    assert two.model_compute_alone_s == two.alone_step_time_p50_s > 0
    assert two.model_compute_s == pytest.approx(1.2 * two.alone_step_time_p50_s)
    assert two.replicas_in_sync  # the no_sync steps in between were undone
    frame = report.prediction_frame(df)
    assert list(frame.batch) == [8, 16] and frame.predicted.notna().all()
    threads = report.threads_frame(df)
    assert list(threads.batch) == [16]
    # the speedup stands on the one-thread steps timed in turn with the all-cores ones
    assert whole.one_thread_paired_p50_s > 0
    assert threads.thread_speedup.iloc[0] == pytest.approx(whole.one_thread_paired_p50_s
                                                           / whole.step_time_p50_s)
    # the overlap, measured: every timed step's buckets all-reduced inside that step
    steps = two.timeline_step_end_s
    assert len(steps) == len(two.comm_intervals_s) == two.measured_steps
    for k, end in enumerate(steps):
        start, last_grad = two.timeline_backward_start_s[k], two.timeline_backward_end_s[k]
        assert 0 <= start <= last_grad <= end
        intervals = two.comm_intervals_s[k]
        assert len(intervals) == len(two.bucket_bytes) >= 1
        for launched, done in intervals:
            assert start <= launched <= done <= end
    # the median step's buckets counted against their transfers: some waited, or none
    assert two.allreduces_counted == len(two.bucket_bytes)
    assert 0 <= two.allreduces_waited <= two.allreduces_counted
    assert two.model_scheduler_waits_s == pytest.approx(3.6e-3 * two.allreduces_waited)
    assert len(two.allreduce_fit_transfers_s) == len(two.allreduce_fit_bytes)
    assert all(p10 <= p50 for p10, p50 in zip(two.allreduce_fit_transfers_s,
                                               two.allreduce_fit_times_s))
    assert 0 <= two.comm_hidden_share <= 1 and two.comm_exposed_s >= 0
    assert two.comm_hidden_s + two.comm_exposed_s == pytest.approx(two.comm_total_s)
    assert two.nosync_backward_s > 0 and two.backward_s > 0
    # the A/B: run A's steps, one per round, beside run B's
    assert two.compare_bucket_cap_mb == 25.0 and two.bucket_cap_mb == 1.0
    assert len(two.compare_step_times_s) == len(two.step_times_s) == two.measured_steps
    # the compute rate against the profile's peak
    assert two.model_flop_per_step == pytest.approx(
        ddp.budget.flop_per_sample(config) * two.batch_size)
    assert two.mfu == pytest.approx(two.model_flop_per_s / 1e10)


@pytest.mark.slow
def test_diff_different_models_warns_loudly(run_a, tmp_path, capsys):
    _, a = run_a
    other = tmp_path / "other.json"
    results.upsert(other, [{**r, "model": "cnn"} for r in results.read_rows(a)])
    assert cli.main(["diff", str(a), str(other)]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "different models (mlp vs cnn)" in err


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_uses_nccl_one_rank_per_gpu():
    n = min(2, torch.cuda.device_count())
    df = ddp.run(DDPConfig(**TINY),
                 launch=LaunchOptions(nprocs=n, timeout_s=LAUNCH_TIMEOUT_S, progress=False))
    row = df[df.variant == "ddp"].iloc[0]
    assert row.backend == "nccl" and row.placement_ok
    assert row.device_memory_peak_bytes > 0  # measured on the GPUs
    assert [p["device"] for p in row.placement] == [f"cuda:{i}" for i in range(n)]
