"""The 3-D parallelism model, catalogs, reference datasets, the model check and sbatch scripts (pure, fast)."""

import math
import shutil

import pytest
import yaml

from labkit import metrics
from labkit.cli import main
from labkit.collectives import formulas as collectives
from labkit.errors import UsageError
from labkit.perfmodel import catalog, model
from labkit.perfmodel.catalog import Fabric
from labkit.perfmodel.layouts import search
from labkit.perfmodel.model import Cluster, Layout, Workload, link_time, predict
from labkit.perfmodel.modelcheck import fit_local, model_check
from labkit.pipeline.formulas import bubble_fraction, bubble_time

LINK50 = Fabric("x", "x", bandwidth_gb_per_s=50, latency_us=0)


# --- formulas against hand-computed values --------------------------------------------------------

def test_ring_allreduce_140gb_over_32_nodes_at_50gbps():
    # 2 (N-1)/N * S / beta = 2 * 31/32 * 140e9 / 50e9 = 5.425 s; latency adds 2 (N-1) alpha
    assert link_time(op="all_reduce", size_bytes=140e9, ranks=32, link=LINK50) == pytest.approx(5.425)
    slow = Fabric("y", "y", 50, latency_us=5)
    assert link_time(op="all_reduce", size_bytes=140e9, ranks=32, link=slow) == pytest.approx(5.425 + 62 * 5e-6)
    assert link_time(op="all_reduce", size_bytes=140e9, ranks=1, link=LINK50) == 0


def test_tree_and_other_collectives():
    assert link_time(op="all_reduce", size_bytes=1e9, ranks=8, link=LINK50,
                     algorithm="tree") == pytest.approx(2 * 3 * 1e9 / 50e9)
    # all-gather / reduce-scatter / all-to-all: (N-1)/N * S / beta + (N-1) alpha
    lat = Fabric("z", "z", 10, latency_us=10)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert link_time(op=op, size_bytes=4e9, ranks=4, link=lat) == pytest.approx(
            3 / 4 * 4e9 / 10e9 + 3 * 10e-6)
    assert model.p2p_time(1e9, lat) == pytest.approx(0.1 + 10e-6)
    with pytest.raises(UsageError, match="algorithm"):
        link_time(op="all_reduce", size_bytes=1, ranks=2, link=LINK50, algorithm="butterfly")


def test_bubble_fraction_and_time():
    assert bubble_fraction(num_stages=8, num_microbatches=16) == pytest.approx(7 / 23)  # ~30 %
    assert bubble_fraction(num_stages=8, num_microbatches=1) == pytest.approx(7 / 8)
    assert bubble_fraction(num_stages=4, num_microbatches=8, schedule="interleaved",
                           virtual_stages=2) == pytest.approx(3 / 19)
    assert bubble_fraction(num_stages=1, num_microbatches=5) == 0
    # bubble time = (P-1)/M * T_stage, and the bubble's share of the step is the fraction
    t_stage = 8.0
    b = bubble_time(num_stages=8, num_microbatches=16, stage_compute_s=t_stage)
    assert b == pytest.approx(3.5)
    assert b / (t_stage + b) == pytest.approx(7 / 23)
    # mlsysim's formula applies the fraction to the unsplit compute: 7/23 * 64 = 19.5 s, not 3.5
    assert model.mlsysim_bubble_time(64.0, 8, 16) == pytest.approx(64 * 7 / 23)
    with pytest.raises(UsageError, match="num_microbatches"):
        bubble_fraction(num_stages=8, num_microbatches=0)


def _work(**kw):
    return Workload(catalog.model_preset("Llama-3-70B"), **kw)


def test_predict_by_hand():
    cl = Cluster.from_catalog("DGX_H100", 32)
    p = predict(_work(), cl, Layout(8, 8, 4, 32))
    flops = 6 * 70.6e9 * 256 * 8192
    compute = flops / (256 * 989.4e12 * 0.4)  # divided across DP x TP x PP = 256 GPUs
    assert p.compute_s == pytest.approx(compute)
    assert p.bubble_s == pytest.approx(3 / 32 * compute)  # (P-1)/M of the per-stage compute
    # DP all-reduce of params * 2 bytes / (TP * PP) over 8 ranks on IB NDR (50 GB/s, 5 us)
    grad = 70.6e9 * 2 / 32
    assert p.dp_comm_s == pytest.approx(2 * 7 / 8 * grad / 50e9 + 14 * 5e-6)
    assert p.dp_link == "IB_NDR"
    # TP: M * 4 per layer * (L / PP) layers, all-reduce of b * s * h * 2 bytes over 8 on NVLink4
    act = 1 * 8192 * 8192 * 2
    assert p.tp_comm_s == pytest.approx(32 * 4 * 20 * (2 * 7 / 8 * act / 450e9 + 14 * 1e-6))
    assert p.step_time_s == pytest.approx(p.compute_s + p.bubble_s + p.dp_comm_s + p.tp_comm_s + p.pp_comm_s)
    assert p.scaling_efficiency == pytest.approx(p.compute_s / p.step_time_s)
    assert p.samples_per_s == pytest.approx(256 / p.step_time_s)
    assert p.tokens_per_s == pytest.approx(256 * 8192 / p.step_time_s)
    cost = model.run_cost(p, cl, steps=100)
    assert cost["gpu_hours"] == pytest.approx(256 * 100 * p.step_time_s / 3600)
    assert cost["su"] == pytest.approx(metrics.service_units(100 * p.step_time_s, cores=32 * 112, gpus=256))


def test_dp_inside_a_node_uses_nvlink_and_faster_fabric_is_faster():
    small = Workload(catalog.model_preset("Llama-3-8B"), global_batch_size=64)
    one = predict(small, Cluster.from_catalog("DGX_H100", 1), Layout(8, 1, 1, 1))
    assert one.dp_link == "NVLink4"
    steps = [predict(small, Cluster.from_catalog("DGX_H100", 4, inter_fabric=f), Layout(32, 1, 1, 1)).step_time_s
             for f in ("100GbE", "IB_HDR", "IB_NDR")]
    assert steps[0] > steps[1] > steps[2]


def test_memory_and_oom_verdict():
    m = model.memory_per_gpu(_work(), Layout(8, 8, 4, 32))
    assert m["weights"] == pytest.approx(70.6e9 * 2 / 32)
    assert m["optimizer"] == pytest.approx(70.6e9 * 12 / 32)
    assert m["activations"] == pytest.approx(20 * 4 * 8192 * 1 * 8192 * 34 / 8)  # 1F1B: min(M, P) in flight
    gpipe = model.memory_per_gpu(_work(), Layout(8, 8, 4, 32, "gpipe"))
    assert gpipe["activations"] == pytest.approx(m["activations"] * 32 / 4)
    z = model.memory_per_gpu(_work(zero1=True), Layout(8, 8, 4, 32))
    assert z["optimizer"] == pytest.approx(m["optimizer"] / 8)
    p = predict(_work(), Cluster.from_catalog("DGX_H100", 32), Layout(256, 1, 1, 1))
    assert not p.fits and p.verdict().startswith("out of memory") and "optimizer" in p.verdict()


def test_bad_input_names_the_field():
    cl = Cluster.from_catalog("DGX_H100", 32)
    with pytest.raises(UsageError, match="gpus_per_node"):
        Layout(16, 16, 1).check(cl)
    with pytest.raises(UsageError, match="world_size"):
        Layout(3, 8, 1).check(cl)
    with pytest.raises(UsageError, match="num_microbatches"):
        Layout(8, 8, 4, 0)
    with pytest.raises(UsageError, match="schedule"):
        Layout(schedule="zigzag")
    with pytest.raises(UsageError, match="global_batch_size"):
        predict(_work(global_batch_size=100), cl, Layout(8, 8, 4, 32))
    with pytest.raises(UsageError, match="unknown accelerator"):
        catalog.accelerator("TPUv9")
    with pytest.raises(UsageError, match="unknown fabric"):
        Cluster.from_catalog("DGX_H100", 2, inter_fabric="carrier-pigeon")
    with pytest.raises(UsageError, match="unknown model"):
        catalog.model_preset("Llama-9")
    with pytest.raises(UsageError, match="precision"):
        predict(Workload(catalog.model_preset("Llama-3-8B"), precision="fp16"),
                Cluster.from_catalog("DGX1_V100", 1, accelerator="K80"), Layout(8, 1, 1, 1))


# --- search ---------------------------------------------------------------------------------------

def test_search_256_h100_for_70b():
    df = search(_work(), Cluster.from_catalog("DGX_H100", 32))
    assert len(df) == 45  # ordered factorizations of 2^8 into three factors
    ok, bad = df[df.fits], df[~df.fits]
    assert 0 < len(ok) < len(df)
    assert (ok.memory_total_gb <= 80).all()
    assert (ok.dp * ok.tp * ok.pp == 256).all() and (8 % ok.tp == 0).all()
    assert list(ok.samples_per_s) == sorted(ok.samples_per_s, reverse=True)
    assert list(ok["rank"]) == list(range(1, len(ok) + 1))
    assert bad.reason.str.len().gt(0).all()
    reasons = " ".join(bad.reason)
    assert "does not divide 8 GPUs per node" in reasons
    assert "out of memory" in reasons and "layers do not split" in reasons
    pure_dp = bad[(bad.dp == 256)].iloc[0]
    assert "out of memory" in pure_dp.reason


# --- catalogs -------------------------------------------------------------------------------------

def test_catalogs_load_and_have_sources():
    for name in catalog.CATALOGS:
        assert catalog.load_catalog(name)
    h100 = catalog.accelerator("H100_SXM")
    assert h100.memory_gb == 80 and h100.peak("bf16") == pytest.approx(989.4e12)
    for key in ("H100_SXM", "H200", "A100", "V100", "K80", "RTX_2080_Ti", "local"):
        assert catalog.accelerator(key).peak_flops
    for key in ("100GbE", "IB_HDR", "IB_NDR", "NVLink4"):
        assert catalog.fabric(key).latency_us > 0
    assert catalog.fabric("IB_NDR").bandwidth_gb_per_s == 50
    assert catalog.node("DGX_A100").gpus_per_node == 8
    assert catalog.model_preset("GPT-3-175B").num_layers == 96
    loc = catalog.local_entry()
    assert loc["alpha_s"] > 0 and loc["beta_bytes_per_s"] > 0 and "measure_local" in loc["measured"]
    assert catalog.fabric("local").alpha_s == pytest.approx(loc["alpha_s"])
    assert set(catalog.catalog_frame("accelerators").key) >= {"H100_SXM", "K80"}


def _copy_data(tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(catalog.data_dir(), dst)
    return dst


@pytest.mark.parametrize("field,value,match", [
    ("memory_gb", -80, "entry 'H100_SXM': field 'memory_gb' must be a non-negative number"),
    ("memory_gb", None, "entry 'H100_SXM': missing field 'memory_gb'"),
    ("peak_flops", {"bf16": -1}, "entry 'H100_SXM': field 'peak_flops.bf16'"),
])
def test_catalog_validation_names_file_entry_field(tmp_path, field, value, match):
    d = _copy_data(tmp_path)
    raw = yaml.safe_load((d / "accelerators.yaml").read_text())
    raw["H100_SXM"][field] = value
    (d / "accelerators.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match=f"accelerators.yaml: {match}"):
        catalog.load_catalog("accelerators", d)


def test_catalog_number_without_source_and_bad_reference(tmp_path):
    d = _copy_data(tmp_path)
    raw = yaml.safe_load((d / "fabrics.yaml").read_text())
    raw["IB_NDR"]["sources"] = {"latency_us": "x"}
    (d / "fabrics.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match="entry 'IB_NDR': field 'bandwidth_gb_per_s' has no source"):
        catalog.load_catalog("fabrics", d)
    d = _copy_data(tmp_path / "fresh")
    raw = yaml.safe_load((d / "nodes.yaml").read_text())
    raw["DGX_H100"]["inter_fabric"] = "IB_XDR"
    (d / "nodes.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match="inter_fabric"):
        catalog.load_catalog("nodes", d)


# --- reference datasets, checked through labkit.metrics ---------------------------------------------

def test_reference_k80_and_rtx_tables():
    k80 = catalog.load_reference("ddp_k80")
    assert k80.time_s.tolist() == [226, 134, 95, 76] and "Benchmarking" in k80.attrs["source"]
    rows, _ = metrics.speedup_table(dict(zip(k80.world_size, k80.time_s)))
    assert [round(x, 2) for x in rows.speedup] == [1.00, 1.69, 2.38, 2.97]  # the guide's column
    # the guide divides N by its rounded speedup (2 / 1.69 = 1.18); exactly 2 * 134 / 226 = 1.186
    assert list(rows.relative_su) == pytest.approx([1.00, 1.18, 1.26, 1.35], abs=0.01)
    rtx = catalog.load_reference("ddp_rtx2080ti")
    assert rtx.time_s.tolist() == [171, 108, 79, 64, 57, 52, 51, 49, 49, 49]
    rows, _ = metrics.speedup_table(dict(zip(rtx.world_size, rtx.time_s)))
    assert [round(x, 2) for x in rows.speedup] == [1.00, 1.58, 2.16, 2.67, 3.00, 3.29, 3.35, 3.49, 3.49, 3.49]
    assert list(rows.relative_su) == pytest.approx([1.00, 1.26, 1.39, 1.50, 1.67, 1.82, 2.09, 2.29, 2.58, 2.87],
                                                   abs=0.01)
    assert metrics.knee(rows.world_size, rows.efficiency, 0.5) == 6  # the guide: "no more than 6 GPUs"


def test_reference_v100_table():
    v = catalog.load_reference("ddp_v100")
    r50 = v[v.model == "resnet50"]
    assert r50[~r50.ddp].step_time_p50_s.tolist() == [0.097]
    assert r50[r50.ddp].world_size.tolist() == [1, 2, 4, 8, 16]
    assert r50[r50.ddp].step_time_p50_s.tolist() == [0.100, 0.103, 0.103, 0.104, 0.104]
    r101 = v[v.model == "resnet101"]
    assert r101[~r101.ddp].step_time_p50_s.tolist() == [0.162]
    assert r101[r101.ddp].step_time_p50_s.tolist() == [0.171, 0.176, 0.176, 0.179, 0.179]
    # weak scaling: efficiency T1 / TN stays above 0.9 up to 16 GPUs on 2 DGX-1s
    assert metrics.weak_efficiency(0.100, 0.104) > 0.9
    with pytest.raises(UsageError, match="unknown reference dataset"):
        catalog.load_reference("ddp_tpu")


# --- calibration ----------------------------------------------------------------------------------

def _synthetic(alpha, beta, n=2):
    sizes = [8 * 4 ** k for k in range(12)]
    rows = []
    for op in ("all_reduce", "all_gather"):
        for s in sizes:
            t = collectives.collective_time(op=op, ranks=n, size_bytes=s, alpha_s=alpha,
                                            beta_bytes_per_s=beta)
            rows.append({"op": op, "world_size": n, "size_bytes": s, "time_p50_s": t,
                         "busbw_gb_per_s": collectives.busbw_gb_per_s(op=op, ranks=n,
                                                                      size_bytes=s, time_s=t)})
    return rows


def test_model_check_on_synthetic_measurements_is_exact():
    alpha, beta = 80e-6, 1.5e9
    rows = _synthetic(alpha, beta)
    fitted = model_check(rows, fit=True)
    assert len(fitted) == len(rows)
    assert fitted.error_pct.abs().max() < 1e-6
    a, b = fit_local(rows)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    # pipeline rows whose bubble follows the formula: 0 off (step times need a profile:
    # tests/test_perfmodel_honest.py)
    pipe = [{"schedule": "gpipe", "num_stages": 2, "num_microbatches": m,
             "bubble_measured": bubble_fraction(num_stages=2, num_microbatches=m)} for m in (2, 4, 8)]
    df = model_check(None, pipe, fit=True)
    assert set(df.quantity) == {"bubble_fraction"} and df.error_pct.abs().max() < 1e-9
    with pytest.raises(UsageError, match="no measured rows"):
        model_check([], [], fit=True)


def test_local_entry_is_a_reference_vm_not_this_machine():
    loc = catalog.local_entry()
    assert "reference 2-core VM" in loc["name"] and "not this machine" in loc["name"]
    assert "another machine" in loc["sources"]["*"]
    with pytest.raises(UsageError, match="no all_reduce rows"):
        fit_local([])


# --- the command line (the sbatch scripts: tests/test_slurm.py) ------------------------------------

def test_cli(tmp_path, capsys):
    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--fabric", "100GbE", "IB_NDR"]) == 0
    out = capsys.readouterr().out
    assert "100GbE" in out and "IB_NDR" in out and "GPU-hours" in out
    assert main(["search", "--top", "3", "--rejected"]) == 0
    assert "out of memory" in capsys.readouterr().out
    assert main(["model", "--tp", "16"]) == 2
    assert "gpus_per_node" in capsys.readouterr().err
    assert main(["catalog", "ddp_k80"]) == 0 and "226" in capsys.readouterr().out
    script = tmp_path / "j.sbatch"
    assert main(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "00:10:00", "--partition", "gpu",
                 "--account", "a", "--out", str(script), "--", "labkit", "placement"]) == 0
    assert script.exists() and "SU" in capsys.readouterr().out
    bad = tmp_path / "bad.sbatch"
    assert main(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "00:10:00", "--partition", "gpu",
                 "--account", "a", "--out", str(bad), "--", "labkit", "placement", "--bogus"]) == 2
    assert not bad.exists()
    rows = tmp_path / "coll.json"
    from labkit import results
    results.record(str(rows), _synthetic(1e-4, 1e9), key=("op", "world_size", "size_bytes"))
    assert main(["model-check", "--collectives", str(rows), "--fit"]) == 0
    assert "median |error|" in capsys.readouterr().out
    assert main(["model-check", "--collectives", str(rows)]) == 2
    assert "--profile DIR" in capsys.readouterr().err
    assert not math.isnan(catalog.local_entry()["alpha_s"])


def test_docstring_examples():
    import doctest

    from labkit import slurm
    from labkit.perfmodel import modelcheck, published, topology, verdicts, widgets

    for mod in (model, catalog, modelcheck, slurm, widgets, topology, verdicts, published):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__
