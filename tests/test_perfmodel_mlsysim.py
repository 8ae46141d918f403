"""This model beside mlsysim 0.3.0. The recorded table is checked always; the live comparison
only where the extra is installed (pip install -e ".[mlsysim]"), else skipped with the reason."""

import importlib.util

import pytest

from labkit.perfmodel import mlsysim_engine

HAVE_MLSYSIM = mlsysim_engine.available()
needs_mlsysim = pytest.mark.skipif(
    not HAVE_MLSYSIM, reason="mlsysim 0.3.0 is not installed (optional extra: pip install -e \".[mlsysim]\")")


def _checks(df):
    same = df[df.same_formula]
    tutorial = df[df.scenario == "pure DP, IB_NDR"].set_index("term")
    return same, tutorial


def test_recorded_table_holds_the_agreements():
    df = mlsysim_engine.side_by_side(live=False)
    assert "recorded with mlsysim 0.3.0" in df.attrs["engine"]
    assert len(df) == 20 * len(mlsysim_engine.TERMS)  # 15 tutorial rows + 5 modifiers
    same, tutorial = _checks(df)
    assert len(same) > 50 and same.diff_pct.abs().max() < 1.0  # where the formulas are the same
    assert abs(tutorial.loc["compute_s", "diff_pct"]) < 1.0
    assert abs(tutorial.loc["dp_comm_s", "diff_pct"]) < 15.0
    assert tutorial.loc["dp_comm_s", "labkit"] == pytest.approx(1.2334, abs=1e-3)  # hierarchical
    assert (df.cause.str.len() > 0).all()
    # every difference above 1 % has a cause that is not "same"
    big = df[(df.diff_pct.abs() > 1) | df.diff_pct.isna()]
    assert not big.same_formula.any()
    # the placement, not the formula, separates TP4 PP2: placed as mlsysim places it, they agree
    placed = df[df.scenario == "TP4 PP2, IB_NDR, placement tp,pp,dp"].set_index("term")
    assert placed.loc["dp_comm_s", "diff_pct"] == pytest.approx(0, abs=0.01)
    meg = df[df.scenario == "TP4 PP2, IB_NDR"].set_index("term")
    assert "placement" in meg.loc["dp_comm_s", "cause"]


def test_without_mlsysim_the_recorded_table_is_used(monkeypatch):
    monkeypatch.setattr(mlsysim_engine, "available", lambda: False)
    df = mlsysim_engine.side_by_side(mlsysim_engine.tutorial_scenarios()[:2])
    assert set(df.scenario) == {"pure DP, 100GbE", "TP8, 100GbE"}
    assert "recorded" in df.attrs["engine"] and "this model now" in df.attrs["engine"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Exception, match="mlsysim is not installed"):
        mlsysim_engine.require()


def test_labkit_side_matches_the_recording():
    """The labkit column is recomputed here (no mlsysim needed) and must equal the recording."""
    rec = mlsysim_engine.recorded().set_index(["scenario", "term"])
    for s in mlsysim_engine.tutorial_scenarios() + mlsysim_engine.modifier_scenarios():
        lab = mlsysim_engine.run_labkit(s)
        for term, _ in mlsysim_engine.TERMS:
            assert lab[term] == pytest.approx(rec.loc[(s.name, term), "labkit"], rel=1e-5, abs=1e-6), (s.name, term)


@needs_mlsysim
def test_live_comparison_matches_the_recording():
    live = mlsysim_engine.side_by_side(live=True).set_index(["scenario", "term"])
    rec = mlsysim_engine.recorded().set_index(["scenario", "term"])
    assert list(live.index) == list(rec.index)
    assert live.mlsysim.to_numpy() == pytest.approx(rec.mlsysim.to_numpy(), rel=1e-5, abs=1e-6)
    same, tutorial = _checks(live.reset_index())
    assert same.diff_pct.abs().max() < 1.0
    assert abs(tutorial.loc["compute_s", "diff_pct"]) < 1.0 and abs(tutorial.loc["dp_comm_s", "diff_pct"]) < 15.0


@needs_mlsysim
def test_cli_compare_mlsysim(capsys):
    from labkit.cli import main

    assert main(["model", "--tp", "8", "--pp", "4", "--microbatches", "32", "--seq-len", "2048",
                 "--precision", "fp16", "--efficiency", "0.5", "--compare", "mlsysim"]) == 0
    out = capsys.readouterr().out
    assert "mlsysim 0.3.0 beside labkit" in out and "dp_comm_s" in out and "cause" in out
