"""Expert and context parallelism in the layout model: the terms by hand, the 3-D model kept
at CP = EP = 1, the 5-D search, and the comparison with mlsysim 0.3.0's expert parallelism."""

from __future__ import annotations

import dataclasses

import pytest

from labkit.errors import UsageError
from labkit.perfmodel import catalog, ep_cp, layouts, mlsysim_experts, topology
from labkit.perfmodel.model import BYTES, Cluster, Layout, Workload, memory_per_gpu, predict
from labkit.perfmodel.prediction import Prediction


def _mixtral(**kw):
    return Workload(catalog.model_preset("Mixtral-8x7B"), 256, seq_len=2048, **kw)


def test_cp_and_ep_of_one_are_the_3d_model():
    cl = Cluster.from_catalog("DGX_H100", 32)
    for work, lay in ((Workload(catalog.model_preset("Llama-3-70B")), Layout(8, 8, 4, 32)),
                      (_mixtral(zero_stage=3), Layout(32, 8, 1, 4))):
        plain, explicit = predict(work, cl, lay), predict(work, cl, dataclasses.replace(lay, cp=1, ep=1))
        assert plain.row() == explicit.row()
        assert type(plain) is Prediction  # one class for every dimension
        assert plain.ep_comm_s == plain.cp_comm_s == 0.0 and plain.ep_algorithm == "none"
        assert plain.step_time_s == (plain.compute_s + plain.bubble_s + plain.dp_comm_s
                                     + plain.tp_comm_s + plain.pp_comm_s)


def test_one_prediction_class_holds_every_dimension():
    fields = list(Prediction.__dataclass_fields__)
    beyond = ["cp", "ep", "cp_comm_s", "ep_comm_s", "cp_link", "ep_algorithm", "ep_link",
              "ep_all_to_all_bytes"]
    assert fields[-len(beyond):] == beyond  # after the 3-D fields: a row's columns keep their order
    p = predict(_mixtral(), Cluster.from_catalog("DGX_H100", 4), Layout(16, 1, 1, 1, cp=2, ep=8))
    assert type(p) is Prediction and (p.cp, p.ep) == (2, 8)
    assert list(p.row())[list(p.row()).index("hardware_flops") + 1:][:len(beyond)] == beyond


def test_expert_all_to_all_by_hand():
    cl = Cluster.from_catalog("DGX_H100", 4)
    p = predict(_mixtral(), cl, Layout(32, 1, 1, 1, ep=8))
    size = 8 * 2048 * 2 * 4096 * 2  # b = 256 / 32 sequences, k = 2, h = 4096, bf16
    one = 7 / 8 * size / cl.intra.beta_bytes_per_s + 7 * cl.intra.alpha_s  # inside one node
    assert p.ep_all_to_all_bytes == size and p.ep_link == cl.intra.key
    assert p.ep_comm_s == pytest.approx(4 * 32 * one)
    full = predict(_mixtral(recompute="full"), cl, Layout(32, 1, 1, 1, ep=8))
    assert full.ep_comm_s == pytest.approx(6 * 32 * one)  # the recomputed forward's 2 more
    assert p.step_time_s == pytest.approx(p.compute_s + p.dp_comm_s + p.ep_comm_s)
    # an expert group of 16 (DeepSeek-V3's 256 experts) spans two 8-GPU nodes: the placed
    # all-to-all crosses the NICs
    ds = Workload(catalog.model_preset("DeepSeek-V3"), 256, seq_len=2048)
    two_nodes = predict(ds, cl, Layout(32, 1, 1, 1, ep=16))
    assert two_nodes.ep_algorithm == "hierarchical" and "+" in two_nodes.ep_link
    assert two_nodes.ep_comm_s > predict(ds, cl, Layout(32, 1, 1, 1, ep=8)).ep_comm_s


def test_experts_sharded_over_ep_and_their_own_dp_group():
    spec = catalog.model_preset("Mixtral-8x7B")
    experts = ep_cp.expert_params(spec)
    assert experts == pytest.approx(8 * (46.7e9 - 12.9e9) / 6)
    mem1, mem8 = (memory_per_gpu(_mixtral(), Layout(32, 1, 1, 1, ep=e)) for e in (1, 8))
    assert mem1["weights"] == pytest.approx(46.7e9 * 2)
    assert mem8["weights"] == pytest.approx((46.7e9 - experts + experts / 8) * 2)
    assert mem8["activations"] == mem1["activations"]
    # ZeRO-1 shards the expert optimizer states over the DP/EP ranks that hold the same experts
    z1 = memory_per_gpu(_mixtral(zero_stage=1), Layout(32, 1, 1, 1, ep=8))
    assert z1["optimizer"] == pytest.approx(12 * ((46.7e9 - experts) / 32 + experts / 8 / 4))
    cl = Cluster.from_catalog("DGX_H100", 4)
    p = predict(_mixtral(), cl, Layout(32, 1, 1, 1, ep=8))
    lay = Layout(32, 1, 1, 1, ep=8)
    dense = topology.collective(op="all_reduce", size_bytes=(46.7e9 - experts) * 2,
                                shape=lay.shape("dp", 8), intra=cl.intra, inter=cl.inter)
    shard = topology.collective(op="all_reduce", size_bytes=experts / 8 * 2,
                                shape=lay.shape("edp", 8), intra=cl.intra, inter=cl.inter)
    assert lay.shape("edp", 8) == topology.GroupShape(4, 1, 4)  # one per node: EP fills it
    assert p.dp_comm_total_s == pytest.approx(dense.time_s + shard.time_s)


def test_context_parallel_ring_and_activations_by_hand():
    cl = Cluster.from_catalog("DGX_H100", 32)
    work = Workload(catalog.model_preset("Llama-3-70B"))
    base, cp2 = Layout(8, 8, 4, 32), Layout(8, 8, 4, 32, cp=2)
    a1 = memory_per_gpu(work, base)["activations"]
    assert memory_per_gpu(work, cp2)["activations"] == pytest.approx(a1 / 2)
    lay = Layout(4, 8, 4, 32, cp=2)  # 256 GPUs: CP 2 in place of half the DP ranks
    p = predict(work, cl, lay)
    assert lay.shape("cp", 8).ranks_per_node == 1 and p.cp_link == "IB_NDR"  # TP fills a node
    b = 256 // (4 * 32)
    kv = 2 * b * 8192 / 2 * 8192 * 2 / 8
    send = cl.inter.alpha_s + kv / cl.inter.beta_bytes_per_s
    assert p.cp_comm_s == pytest.approx(32 * 3 * 20 * 1 * send)
    # the TP all-reduces carry the rank's s / CP tokens
    tp_one = topology.collective(op="all_reduce", size_bytes=b * 8192 / 2 * 8192 * 2,
                                 shape=lay.shape("tp", 8), intra=cl.intra, inter=cl.inter)
    assert p.tp_comm_s == pytest.approx(32 * 4 * 20 * tp_one.time_s)
    # inside a node: TP 4 leaves room for both CP ranks on the node's NVLink
    assert predict(work, cl, Layout(8, 4, 4, 32, cp=2)).cp_link == "NVLink4"


@pytest.mark.parametrize("layout,msg", [
    (dict(dp=8, tp=8, pp=4, num_microbatches=32, ep=3), "ep 3 must divide dp 8"),
    (dict(dp=8, tp=8, pp=4, num_microbatches=32, cp=0), "cp"),
])
def test_layout_refuses_bad_cp_ep(layout, msg):
    with pytest.raises(UsageError, match=msg):
        Layout(**layout)


def test_predict_refuses_what_cannot_apply():
    cl = Cluster.from_catalog("DGX_H100", 32)
    with pytest.raises(UsageError, match="must divide the 1 expert"):
        predict(Workload(catalog.model_preset("Llama-3-70B")), cl, Layout(8, 8, 4, 32, ep=2))
    with pytest.raises(UsageError, match="not divisible by cp 3"):
        predict(Workload(catalog.model_preset("Llama-3-70B"), seq_len=8192), Cluster.from_catalog(
            "DGX_H100", 24), Layout(2, 8, 4, 32, cp=3))
    with pytest.raises(UsageError, match="x cp 2 = 512"):
        predict(Workload(catalog.model_preset("Llama-3-70B")), cl, Layout(8, 8, 4, 32, cp=2))


def test_search_covers_five_dimensions_and_keeps_the_3d_default():
    cl = Cluster.from_catalog("DGX_H100", 4)
    three = layouts.search(_mixtral(), cl)
    assert set(three.cp) == {1} and set(three.ep) == {1}
    five = layouts.search(_mixtral(), cl, cp_sizes=(1, 2, 4), ep_sizes=(1, 2, 4, 8, 16))
    assert set(five.cp) == {1, 2, 4} and set(five.ep) == {1, 2, 4, 8}  # 16 > Mixtral's 8 experts
    ok = five[five.fits]
    assert list(ok.samples_per_s) == sorted(ok.samples_per_s, reverse=True)
    assert (five.dp * five.tp * five.pp * five.cp == 32).all() and (five.dp % five.ep == 0).all()
    dense = layouts.search(Workload(catalog.model_preset("Llama-3-8B"), 256, seq_len=2048), cl,
                           ep_sizes=(1, 2, 4))
    assert set(dense.ep) == {1}
    # sharding the experts is what lets Mixtral's states fit one GPU without TP or PP
    row = five[(five.tp == 1) & (five.pp == 1) & (five.cp == 1)].set_index("ep")
    assert not row.loc[1, "fits"] and row.loc[8, "memory_weights_gb"] < row.loc[1, "memory_weights_gb"]


def test_block_shapes_follow_megatron_order():
    # TP 2, CP 2, EP 2, DP 4 on 8-GPU nodes: the DP·CP block starts 2 ranks apart
    shape = lambda d: Layout(4, 2, 1, cp=2, ep=2).shape(d, 8)  # noqa: E731
    assert shape("cp") == topology.GroupShape(2, 2, 1)
    assert shape("ep") == topology.GroupShape(2, 2, 1)
    assert shape("edp") == topology.GroupShape(4, 2, 2)
    assert shape("dp") == topology.GroupShape(8, 4, 2)


def test_mlsysim_experts_recorded_agree_where_the_formula_is_the_same():
    side = mlsysim_experts.side_by_side(live=False)
    assert set(side.scenario) == {s.name for s in mlsysim_experts.expert_scenarios()}
    same = side[side.same_formula]
    assert set(same.term) == {"compute_s", "all_to_all_s"}
    assert (same.diff_pct.abs() < 1).all()
    ep = side[side.term == "ep_comm_s"]
    assert (ep.labkit != ep.mlsysim).all()
    for name in side.scenario.unique():
        text = mlsysim_experts.differences(side, name)
        assert "in both engines (the same formula)" in text and "NVLink4" in text
    moved = side.copy()
    moved.loc[moved.term == "all_to_all_s", "labkit"] *= 2
    assert "in both engines" not in mlsysim_experts.differences(moved, side.scenario.iloc[0])
    with pytest.raises(UsageError):
        mlsysim_experts.differences(side, "no such scenario")


def test_mlsysim_all_to_all_message_is_its_replicas_local_batch():
    s = mlsysim_experts.expert_scenarios()[0]
    lab = mlsysim_experts.run_labkit(s)
    # mlsysim: DP = 256 / 8 = 32 replicas of 8 sequences; here each rank holds one sequence
    assert lab["all_to_all_mb"] * 8 == pytest.approx(
        8 * 2048 * 4096 * BYTES["fp16"] * 2 / 1e6)
    assert lab["all_to_alls"] == 4 * 32


@pytest.mark.slow
def test_mlsysim_experts_live_matches_the_recorded_table():
    pytest.importorskip("mlsysim")
    if not mlsysim_experts.mlsysim_engine.available():
        pytest.skip("mlsysim 0.3.0 not installed")
    live = mlsysim_experts.side_by_side(live=True)
    rec = mlsysim_experts.side_by_side(live=False)
    assert list(live.term) == list(rec.term)
    assert live.mlsysim.to_numpy() == pytest.approx(rec.mlsysim.to_numpy(), rel=1e-6)
