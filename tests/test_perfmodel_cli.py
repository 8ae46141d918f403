"""``labkit model`` / ``search`` / ``catalog`` / ``model-check``: the header, marked OOM rows,
one-line errors naming flags (exit 2), the same --fabric form, the measured DP overlap (pure,
fast)."""

import shutil

import pytest

from labkit.cli import main
from labkit.perfmodel import catalog


def _err(capsys, argv) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_model_without_layout_marks_out_of_memory(capsys):
    assert main(["model"]) == 0
    out = capsys.readouterr().out
    assert "pure data parallelism" in out and "OUT OF MEMORY" in out
    assert "GPU-hours" not in out  # no cost for a layout that cannot run
    assert "hierarchical" in out


def test_header_shows_every_assumption(capsys):
    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--seq-len", "4096",
                 "--precision", "fp16", "--efficiency", "0.5", "--dp-overlap", "0.3", "--zero", "2",
                 "--recompute", "selective"]) == 0
    out = capsys.readouterr().out
    for text in ("seq_len 4096", "precision fp16", "efficiency 0.5", "DP overlap with backward 0.3",
                 "ZeRO 2", "recomputation selective", "schedule 1f1b", "placement: tp,dp,pp",
                 "IB_NDR between nodes", "fits", "GPU-hours"):
        assert text in out, text


@pytest.mark.parametrize("argv,flag", [
    (["model", "--model", "Llama-9"], "--model: unknown model 'Llama-9'; known: DeepSeek-V3"),
    (["model", "--node", "DGX_Z"], "--node: unknown node 'DGX_Z'; known: DGX1_V100"),
    (["model", "--fabric", "carrier-pigeon"], "inter-node fabrics: 100GbE, IB_EDR_DGX1, IB_HDR, IB_NDR, RoCE_400G, local"),
    (["model", "--fabric", "NVLink4"], "--fabric: fabric 'NVLink4' links GPUs inside a node"),
    (["search", "--fabric", "IB_NDR", "NVLink5"], "--fabric: fabric 'NVLink5'"),
    (["model", "--dp", "8", "--tp", "8", "--pp", "2"], "--dp 8 x --tp 8 x --pp 2 = 128, but 32 x DGX_H100 has 256 GPUs"),
    (["model", "--tp", "3"], "--tp 3 x --pp 1 = 3 does not divide"),
    (["model", "--tp", "16"], "--tp 16 spans nodes"),
    (["model", "--tp", "8", "--microbatches", "3"], "--global-batch-size 256 is not divisible by DP 32 x --microbatches 3"),
    (["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--schedule", "interleaved"],
     "--schedule interleaved needs --virtual-stages V with V >= 2"),
    (["model", "--tp", "8", "--pp", "4", "--virtual-stages", "2"], "--virtual-stages 2 needs --schedule interleaved"),
    (["model", "--tp", "8", "--pp", "3", "--dp", "1", "--nodes", "3"], "--pp 3 x --virtual-stages 1: the 80 layers"),
    (["model", "--placement", "tp,dp"], "--placement:"),
    (["model", "--precision", "fp4"], "--precision 'fp4'"),
    (["model", "--tp", "8", "--accelerator", "K80", "--precision", "bf16"], "--precision"),
])
def test_bad_input_is_one_line_naming_the_flag(capsys, argv, flag):
    err = _err(capsys, argv)
    assert flag in err, err
    assert "global_batch_size" not in err and "num_microbatches" not in err


def test_tp_across_nodes_only_with_the_flag(capsys):
    assert "gpus_per_node" in _err(capsys, ["model", "--tp", "16"])
    assert main(["model", "--tp", "16", "--tp-across-nodes"]) == 0
    out = capsys.readouterr().out
    assert "TP hierarchical (NVLink4+IB_NDR)" in out


def test_search_and_model_take_the_same_fabric_form(capsys):
    assert main(["search", "--fabric", "100GbE", "IB_NDR", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "(256 GPUs, 100GbE)" in out and "(256 GPUs, IB_NDR)" in out
    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--fabric", "IB_HDR"]) == 0
    assert "IB_HDR" in capsys.readouterr().out


def test_search_json_and_placement(tmp_path, capsys):
    path = tmp_path / "s.json"
    assert main(["search", "--nodes", "4", "--model", "Llama-3-8B", "--placement", "tp,pp,dp",
                 "--json", str(path)]) == 0
    from labkit import results

    rows = results.read_rows(path)
    assert rows and {r["fabric"] for r in rows} == {"IB_NDR"}
    assert "placement: tp,pp,dp" in capsys.readouterr().out


def test_catalog_published(capsys):
    assert main(["catalog", "published"]) == 0
    out = capsys.readouterr().out
    assert "megatron_gpt_1t" in out and "missed:" in out and "arXiv 2104.04473" in out


def test_measured_dp_overlap(tmp_path, capsys, monkeypatch):
    d = tmp_path / "data"
    shutil.copytree(catalog.data_dir(), d)
    raw = (d / "local.yaml").read_text()
    cut = raw[:raw.index("  dp_overlap_fraction")] + raw[raw.index("  sources:"):] \
        if "dp_overlap_fraction" in raw else raw
    (d / "local.yaml").write_text(cut)
    monkeypatch.setenv("LABKIT_DATA", str(d))
    err = _err(capsys, ["model", "--tp", "8", "--dp-overlap", "measured"])
    assert "reference VM" in err and "labkit ddp" in err and "model-check --ddp" in err
    from labkit import results

    ddp = tmp_path / "ddp.json"
    results.record(str(ddp), [{"model": "mlp", "world_size": 2, "ddp": True, "overlap_fraction": 0.25}],
                   key=("model", "world_size"))
    assert main(["model-check", "--ddp", str(ddp)]) == 0
    assert "0.250" in capsys.readouterr().out
    assert (d / "local.yaml").read_text() == cut  # the reference VM's entry is never rewritten
    monkeypatch.delenv("LABKIT_DATA")
    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--dp-overlap", "measured"]) == 0
    assert "measured by the DDP lab on the reference 2-core VM" in capsys.readouterr().out
    assert "--collectives" in _err(capsys, ["model-check"])


def test_compare_needs_mlsysim_or_says_how(capsys, monkeypatch):
    from labkit.perfmodel import mlsysim_engine

    monkeypatch.setattr(mlsysim_engine.importlib.util, "find_spec", lambda name: None)
    err = _err(capsys, ["model", "--tp", "8", "--compare", "mlsysim"])
    assert "mlsysim is not installed" in err and ".[mlsysim]" in err


def test_model_takes_cp_and_ep(tmp_path, capsys):
    path = tmp_path / "m.json"
    assert main(["model", "--model", "Mixtral-8x7B", "--nodes", "4", "--seq-len", "2048",
                 "--tp", "2", "--pp", "4", "--microbatches", "64", "--cp", "2", "--ep", "2",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# layout: DP 2 x TP 2 x PP 4 x CP 2, EP 2 (expert groups of 2 DP ranks)" in out
    assert "EP 2: experts sharded over TP·PP·EP" in out and "at ep 1" not in out
    assert "ep_comm_s" in out and "cp_comm_s" in out and "CP K/V ring (" in out
    from labkit import results
    from labkit.perfmodel.model import Cluster, Layout, Workload, predict

    (row,) = results.read_rows(path)
    want = predict(Workload(catalog.model_preset("Mixtral-8x7B"), seq_len=2048),
                   Cluster.from_catalog("DGX_H100", 4), Layout(2, 2, 4, 64, cp=2, ep=2))
    assert (row["dp"], row["cp"], row["ep"]) == (2, 2, 2)
    assert want.ep_comm_s > 0 and row["ep_comm_s"] == pytest.approx(want.ep_comm_s)
    assert want.cp_comm_s > 0 and row["cp_comm_s"] == pytest.approx(want.cp_comm_s)
    assert row["step_time_s"] == pytest.approx(want.step_time_s)


def test_cp_and_ep_of_one_print_the_3d_table(capsys):
    argv = ["model", "--tp", "8", "--pp", "4", "--microbatches", "32"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--cp", "1", "--ep", "1"]) == 0
    assert capsys.readouterr().out == plain
    assert " cp " not in plain and "ep_comm_s" not in plain


def test_dp_default_counts_cp(capsys):
    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "8", "--cp", "4"]) == 0
    assert "# layout: DP 2 x TP 8 x PP 4 x CP 4," in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["model", "--tp", "8", "--ep", "3"], "--ep 3 must divide --dp 32"),
    (["model", "--tp", "8", "--ep", "2"], "--ep 2 must divide the 1 expert(s) of Llama-3-70B"),
    (["model", "--tp", "8", "--pp", "4", "--cp", "3"], "--tp 8 x --pp 4 x --cp 3 = 96 does not divide"),
    (["model", "--dp", "8", "--tp", "8", "--pp", "4", "--cp", "2"], "--dp 8 x --tp 8 x --pp 4 x --cp 2 = 512"),
    (["model", "--nodes", "3", "--dp", "1", "--tp", "8", "--cp", "3"], "--seq-len 8192 is not divisible by --cp 3"),
    (["model", "--tp", "8", "--cp", "2", "--compare", "mlsysim"], "--compare mlsysim prices DP x TP x PP"),
])
def test_bad_cp_ep_is_one_line_naming_the_flag(capsys, argv, msg):
    err = _err(capsys, argv)
    assert msg in err, err
    assert not any(f" {w} " in err for w in ("cp", "ep", "dp", "seq_len")), err


@pytest.mark.parametrize("value", ["0", "-2", "two"])
@pytest.mark.parametrize("cmd,flag", [("model", "--cp"), ("model", "--ep"), ("search", "--cp"),
                                      ("search", "--ep")])
def test_cp_ep_must_be_positive_integers(capsys, cmd, flag, value):
    with pytest.raises(SystemExit) as e:
        main([cmd, flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument {flag}" in err, err


def test_search_takes_cp_and_ep_sizes(tmp_path, capsys):
    path = tmp_path / "s.json"
    assert main(["search", "--model", "Mixtral-8x7B", "--nodes", "4", "--seq-len", "2048",
                 "--microbatches", "8", "64", "--cp", "1", "2", "--ep", "1", "2", "4", "8",
                 "--top", "3", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "EP 1, 2, 4, 8: experts sharded" in out
    head = next(ln for ln in out.splitlines() if ln.startswith("rank"))
    assert head.split()[:6] == ["rank", "dp", "tp", "pp", "cp", "ep"]
    from labkit import results
    from labkit.perfmodel import layouts
    from labkit.perfmodel.model import Cluster, Workload

    rows = results.read_rows(path)
    want = layouts.search(Workload(catalog.model_preset("Mixtral-8x7B"), seq_len=2048),
                          Cluster.from_catalog("DGX_H100", 4), (8, 64), cp_sizes=(1, 2),
                          ep_sizes=(1, 2, 4, 8))
    assert len(rows) == len(want)  # every (dp, tp, pp, cp, ep) kept: none overwrites another
    assert {(r["cp"], r["ep"]) for r in rows} == set(zip(want.cp, want.ep))
    best = min((r for r in rows if r["fits"]), key=lambda r: r["rank"])
    assert (best["dp"], best["tp"], best["pp"], best["cp"], best["ep"]) == tuple(
        int(want.iloc[0][c]) for c in ("dp", "tp", "pp", "cp", "ep"))
