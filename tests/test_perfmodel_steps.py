"""The step modifiers (overlap, accumulation, ZeRO, recomputation, MFU/HFU), placement, TP
across nodes, the new catalog entries, published runs, and the model's purity (pure, fast)."""

import dataclasses
import subprocess
import sys

import pytest

from labkit.book import laws
from labkit.errors import UsageError
from labkit.perfmodel import catalog, layouts, model, published, topology
from labkit.perfmodel.model import Cluster, Layout, Workload, memory_per_gpu, predict

H100x32 = Cluster.from_catalog("DGX_H100", 32)


def _work(**kw):
    return Workload(catalog.model_preset("Llama-3-70B"), **kw)


def test_dp_overlap_hides_at_most_the_last_microbatch_backward():
    lay = Layout(8, 8, 4, 32)
    base = predict(_work(), H100x32, lay)
    assert base.dp_comm_s == base.dp_comm_total_s and base.dp_overlap == 0
    half = predict(_work(dp_overlap=0.5), H100x32, lay)
    window = base.compute_s * (2 / 3) / 32  # the backward of one microbatch of 32
    assert half.dp_comm_s == pytest.approx(base.dp_comm_total_s - min(0.5 * base.dp_comm_total_s, window))
    # one microbatch: the whole backward is the window, so the fraction applies as given
    one = Layout(8, 8, 4, 1, "gpipe")
    w = Workload(catalog.model_preset("Llama-3-70B"), global_batch_size=8, dp_overlap=0.85)
    p = predict(w, H100x32, one)
    assert p.dp_comm_s == pytest.approx(0.15 * p.dp_comm_total_s)
    assert p.step_time_s == pytest.approx(p.compute_s + p.bubble_s + p.dp_comm_s + p.tp_comm_s + p.pp_comm_s)
    with pytest.raises(UsageError, match="dp_overlap"):
        _work(dp_overlap=1.5)


def test_gradient_accumulation_keeps_one_all_reduce_per_step():
    # PP = 1, M microbatches: same compute and DP all-reduce, less activation memory
    small = Workload(catalog.model_preset("Llama-3-8B"), global_batch_size=256, seq_len=2048)
    cl = Cluster.from_catalog("DGX_H100", 4)
    p1 = predict(small, cl, Layout(32, 1, 1, 1))
    p8 = predict(small, cl, Layout(32, 1, 1, 8))
    assert p8.compute_s == pytest.approx(p1.compute_s) and p8.dp_comm_total_s == pytest.approx(p1.dp_comm_total_s)
    assert p8.bubble_s == 0 and p8.microbatch_size == 1 and p1.microbatch_size == 8
    assert p8.memory["activations"] == pytest.approx(p1.memory["activations"] / 8)


def test_zero_stages_memory_and_zero3_gathers():
    lay = Layout(8, 8, 4, 32)
    m0 = memory_per_gpu(_work(), lay)
    m = {z: memory_per_gpu(_work(zero_stage=z), lay) for z in (1, 2, 3)}
    assert m[1]["optimizer"] == pytest.approx(m0["optimizer"] / 8) and m[1]["gradients"] == m0["gradients"]
    assert m[2]["gradients"] == pytest.approx(m0["gradients"] / 8) and m[2]["weights"] == m0["weights"]
    assert m[3]["weights"] == pytest.approx(m0["weights"] / 8)
    assert _work(zero1=True).zero_stage == 1
    p0, p1 = predict(_work(), H100x32, lay), predict(_work(zero_stage=1), H100x32, lay)
    assert p1.dp_comm_s == p0.dp_comm_s  # reduce-scatter + all-gather = one all-reduce's bytes
    p3 = predict(_work(zero_stage=3), H100x32, lay)
    grad = 70.6e9 * 2 / 32
    ndr = catalog.fabric("IB_NDR")
    ag = model.link_time(op="all_gather", size_bytes=grad, ranks=8, link=ndr)
    rs = model.link_time(op="reduce_scatter", size_bytes=grad, ranks=8, link=ndr)
    assert p3.dp_comm_total_s == pytest.approx(rs + 2 * 32 * ag)
    with pytest.raises(UsageError, match="zero_stage"):
        _work(zero_stage=4)


def test_recomputation_memory_flops_mfu_and_hfu():
    lay = Layout(8, 8, 4, 32)
    none, full = predict(_work(), H100x32, lay), predict(_work(recompute="full"), H100x32, lay)
    assert full.hardware_flops == pytest.approx(none.hardware_flops * 4 / 3)
    assert full.compute_s == pytest.approx(none.compute_s * 4 / 3)
    assert full.tp_comm_s == pytest.approx(none.tp_comm_s * 6 / 4)  # the recomputed forward's 2
    assert full.memory["activations"] == pytest.approx(none.memory["activations"] * 2 / 34)
    assert none.mfu == pytest.approx(none.hfu)
    assert full.hfu == pytest.approx(full.mfu * 4 / 3)
    n, peak = 256, 989.4e12
    assert full.mfu == pytest.approx(6 * 70.6e9 * 256 * 8192 / (full.step_time_s * n * peak))
    sel = predict(_work(recompute="selective"), H100x32, lay)
    extra = 4 * 256 * 8192 ** 2 * 8192 * 80
    assert sel.hardware_flops == pytest.approx(none.model_flops + extra)
    assert sel.memory["activations"] == none.memory["activations"]  # flash attention: same 34 sbh
    no_flash = memory_per_gpu(_work(flash_attention=False), lay)
    assert no_flash["activations"] > none.memory["activations"]
    assert memory_per_gpu(_work(flash_attention=False, recompute="selective"), lay)["activations"] == \
        pytest.approx(none.memory["activations"])
    with pytest.raises(UsageError, match="recompute"):
        _work(recompute="some")


def test_placement_decides_dp_ranks_per_node():
    w = _work(seq_len=2048)
    meg = predict(w, H100x32, Layout(32, 4, 2, 8))
    ml = predict(w, H100x32, Layout(32, 4, 2, 8, placement="tp,pp,dp"))
    assert (meg.dp_ranks_per_node, meg.dp_nodes, meg.dp_algorithm) == (2, 16, "hierarchical")
    assert (ml.dp_ranks_per_node, ml.dp_nodes, ml.dp_algorithm) == (1, 32, "ring")
    assert meg.dp_comm_s < 0.6 * ml.dp_comm_s
    assert meg.placement == "tp,dp,pp" and ml.placement == "tp,pp,dp"
    # pure DP: hierarchical, 8 per node
    pure = predict(w, H100x32, Layout(256, 1, 1, 1))
    assert pure.dp_algorithm == "hierarchical" and pure.dp_comm_s == pytest.approx(1.2334, abs=1e-3)
    assert pure.dp_link == "NVLink4+IB_NDR"


def test_tp_across_nodes_needs_the_flag_and_pays_the_inter_node_link():
    w = _work(seq_len=2048)
    with pytest.raises(UsageError, match="gpus_per_node"):
        predict(w, H100x32, Layout(16, 16, 1, 1))
    p = predict(w, H100x32, Layout(16, 16, 1, 1, tp_across_nodes=True))
    inside = predict(w, H100x32, Layout(32, 8, 1, 1))
    assert "IB_NDR" in p.tp_link and p.tp_algorithm == "hierarchical"
    assert p.tp_comm_s > 2 * inside.tp_comm_s
    with pytest.raises(UsageError, match="spans nodes"):
        Layout(2, 8, 16, placement="dp,tp,pp").check(H100x32)


def test_interleaved_messages_say_the_right_thing():
    with pytest.raises(UsageError, match="needs virtual_stages V with V >= 2"):
        Layout(8, 8, 4, 32, "interleaved")
    with pytest.raises(UsageError, match="needs schedule interleaved"):
        Layout(8, 8, 4, 32, "1f1b", 2)
    p = predict(_work(), H100x32, Layout(8, 8, 4, 32, "interleaved", 2))
    assert p.bubble_fraction == pytest.approx(3 / (2 * 32 + 3))
    assert p.pp_comm_s == pytest.approx(2 * predict(_work(), H100x32, Layout(8, 8, 4, 32)).pp_comm_s)


def test_new_catalog_entries_with_sources():
    assert catalog.model_preset("Llama-3-405B").num_layers == 126
    moe = catalog.model_preset("Mixtral-8x7B")
    assert moe.is_moe and moe.flop_params == 12.9e9 and moe.params == 46.7e9 and moe.experts_per_token == 2
    assert catalog.model_preset("DeepSeek-V3").active_params == 37e9
    assert catalog.accelerator("B200").peak("bf16") == 2.25e15
    assert catalog.accelerator("MI300X").peak("bf16") == pytest.approx(1307.4e12)
    assert catalog.node("DGX_B200").intra_fabric == "NVLink5"
    assert catalog.node("MI300X_8").accelerator == "MI300X"
    for name in ("accelerators", "fabrics", "nodes", "models"):
        for key, e in catalog.load_catalog(name).items():
            assert e.sources, (name, key)
    assert catalog.fabric_keys("inter") == ["100GbE", "IB_EDR_DGX1", "IB_HDR", "IB_NDR", "RoCE_400G", "local"]
    with pytest.raises(UsageError, match="inter-node fabrics: 100GbE") as e:
        catalog.fabric("carrier-pigeon", scope="inter")
    assert "NVLink" not in str(e.value)
    with pytest.raises(UsageError, match="inside a node, not nodes"):
        Cluster.from_catalog("DGX_H100", 2, inter_fabric="NVLink4")
    # a mixture of experts computes with its active parameters and stores all of them
    w = Workload(moe, global_batch_size=64, seq_len=4096)
    assert w.flops == pytest.approx(6 * 12.9e9 * 64 * 4096)
    mem = memory_per_gpu(w, Layout(8, 8, 1, 1))
    assert mem["weights"] == pytest.approx(46.7e9 * 2 / 8)
    assert any("expert parallelism not modelled" in line
               for line in model.assumptions(w, Cluster.from_catalog("DGX_H100", 8)))


def test_published_runs_beside_the_model():
    raw = published.load()
    assert {r["key"] for r in raw["runs"]} == {"megatron_gpt_1t", "llama3_405b_8k_gpus", "llama3_405b_16k_gpus",
                                               "nccl_allreduce_8xh100_10gb", "nccl_allreduce_8xh100_58mb"}
    df = published.table().set_index("run")
    assert df.loc["megatron_gpt_1t", "measured"] == 0.52 and df.loc["megatron_gpt_1t", "quantity"] == "hfu"
    assert df.loc["llama3_405b_8k_gpus", "measured"] == 0.43 and df.loc["llama3_405b_16k_gpus", "measured"] == 0.41
    for run, r in df.iterrows():
        assert r.source and r.url.startswith("https://") and r.missed, run
        assert r.error_pct == pytest.approx(laws.symmetric_error_pct(r.predicted, r.measured))
    assert df.loc["megatron_gpt_1t"].holds
    # the efficiency is an input: the implied one recovers the measurement
    eff = df.attrs["efficiency"]
    for run in ("megatron_gpt_1t", "llama3_405b_8k_gpus"):
        again = published.table(efficiency=df.loc[run, "implied_efficiency"]).set_index("run")
        assert again.loc[run, "predicted"] == pytest.approx(df.loc[run, "measured"], rel=0.05), (run, eff)


def test_published_file_is_validated(tmp_path):
    import shutil

    import yaml

    d = tmp_path / "data"
    shutil.copytree(catalog.data_dir(), d)
    raw = yaml.safe_load((d / "published_runs.yaml").read_text())
    del raw["runs"][0]["source"]
    (d / "published_runs.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match="lacks source"):
        published.load(d)


def test_search_1024_gpus_is_quick_and_consistent():
    import time

    cl = Cluster.from_catalog("DGX_H100", 128)
    t = time.perf_counter()
    df = layouts.search(_work(), cl)
    took = time.perf_counter() - t
    assert len(df) == 66 and took < 5.0  # the CLI answers in under 2 s (benchmarks/perfmodel_bench.py)
    ok = df[df.fits]
    assert list(ok.samples_per_s) == sorted(ok.samples_per_s, reverse=True)
    meg = layouts.search(_work(), cl, placement="tp,pp,dp")
    assert len(meg) == 66


def test_model_is_pure():
    code = ("import sys, labkit.perfmodel, labkit.perfmodel.cli, labkit.perfmodel.topology; "
            "from labkit.perfmodel import catalog, layouts, model; "
            "layouts.search(model.Workload(catalog.model_preset('Llama-3-70B')), "
            "model.Cluster.from_catalog('DGX_H100', 32)); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'mlsysim')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_older_mlsysim_bubble_is_labelled_as_such():
    assert "before 0.3.0" in model.mlsysim_bubble_time.__doc__
    assert "0.3.0" in model.__doc__ and "2026-09-15" in model.__doc__
    spec = dataclasses.replace(catalog.model_preset("Llama-3-405B"), num_layers=128)
    assert spec.num_layers == 128 and topology.MEGATRON == "tp,dp,pp"
