"""The 3-D model's laws, honestly: this machine's profile in every prediction here, symmetric
scoring, each law's kind, the computed sentences (flipped with their numbers), and the live
check's and the appendix engine's budget refusals (pure, fast)."""

import math

import pandas as pd
import pytest

from labkit.book import laws
from labkit.collectives import formulas as collectives
from labkit.errors import UsageError
from labkit.machine.profile import Profile
from labkit.perfmodel import catalog, mlsysim_engine, model, modelcheck, published, verdicts
from labkit.pipeline.formulas import bubble_fraction

from ._pipeline_timelines import compute_rows

ALPHA, BETA, RATE, CO_RUN = 2e-4, 1e9, 30e9, 1.3


def _profile(alpha=ALPHA, beta=BETA, rate=RATE, co_run=CO_RUN, cores=2):
    """A machine profile built from synthetic rows that follow known laws (the real class)."""
    rows = compute_rows(rate=rate, co_run=co_run, cores=cores)
    for s in (8, 512, 32768, 1 << 21):
        for c, f in (("idle", 1.0), ("busy", 1.5)):
            rows.append({"measurement": "allreduce", "context": c, "size_bytes": s,
                         "time_p50_s": f * collectives.allreduce_time(
                             size_bytes=s, ranks=2, alpha_s=alpha, beta_bytes_per_s=beta)})
            rows.append({"measurement": "message", "context": c, "size_bytes": s,
                         "time_p50_s": f * (alpha / 2 + s / beta)})
    return Profile.from_rows(rows, source="synthetic")


def _pipe_row(m, prof, *, share_other=0.05):
    row = dict(schedule="gpipe", layers=8, hidden=512, batch=128, num_stages=2, num_microbatches=m)
    t = modelcheck.profile_terms(prof, row)
    step = t["step"]
    fill = t["bubble"] / step  # the step model's share: (P-1)/M T_stage over its whole step
    assert fill < bubble_fraction(num_stages=2, num_microbatches=m)  # the transfers lengthen it
    return {**row, "step_time_s": step, "bubble_fill_drain": fill, "bubble_measured": fill,
            "idle_other": share_other, "compute_share": 1 - fill - share_other}


# --- the model carries the profile ---------------------------------------------------------------

def test_pipeline_step_carries_the_co_run_slowdown_and_busy_messages():
    row = dict(layers=8, hidden=512, batch=128, num_stages=2, num_microbatches=2)
    alone = modelcheck.pipeline_terms(row, compute_flop_per_s=RATE)
    slowed = modelcheck.pipeline_terms(row, compute_flop_per_s=RATE, compute_slowdown=CO_RUN)
    assert slowed["compute"] == pytest.approx(alone["compute"] * CO_RUN)
    assert slowed["bubble"] == pytest.approx(slowed["compute"] * (2 - 1) / 2)
    prof = _profile()
    t = modelcheck.profile_terms(prof, row)
    assert t["compute"] == pytest.approx(6 * 4 * 512 ** 2 * 128 / RATE * CO_RUN, rel=1e-9)
    msg = modelcheck.message_bytes(row)  # 64 x 512 x 4 B
    assert msg == 131072
    assert t["transfers"] == pytest.approx(
        2 * 2 * prof.transfer_s(msg, measurement="message", busy=True))
    assert t["transfers"] > 2 * 2 * prof.transfer_s(msg, measurement="message")  # busy, not idle
    assert t["scheduler waits"] == 0.0  # this profile's calls never waited
    assert t["step"] == pytest.approx(t["compute"] + t["bubble"] + t["transfers"])
    with pytest.raises(UsageError):
        modelcheck.pipeline_terms(row, compute_flop_per_s=0)


def test_model_check_with_the_profile_is_exact_on_rows_that_follow_it():
    prof = _profile()
    coll = [{"op": "all_reduce", "world_size": 2, "size_bytes": s,
             "time_p50_s": prof.allreduce_s(s, ranks=2)} for s in (512, 32768, 1 << 21)]
    pipe = [_pipe_row(m, prof) for m in (2, 4)]
    df = modelcheck.model_check(coll, pipe, profile=prof)
    assert set(df.quantity) == {"time_s", "bubble_fraction", "step_time_s"}
    assert df.error_pct.abs().max() < 1e-6
    # alpha-beta with the profile's fit beside the in-context time
    assert df[df.quantity == "time_s"].alpha_beta_s.tolist() == pytest.approx(
        [collectives.allreduce_time(size_bytes=s, ranks=2, alpha_s=prof.alpha_s,
                                    beta_bytes_per_s=prof.beta_bytes_per_s)
         for s in (512, 32768, 1 << 21)])
    rows = modelcheck.check_laws(df)
    model = [r for r in rows if r["kind"] == "model"]
    assert len(model) == 5 and all(r["holds"] for r in model)
    # the formula beside each bubble, as the naive law
    assert [r["law"].split(",")[0] for r in rows if r["kind"] == "naive"] == [
        "pipeline bubble fraction = (P-1)/(P-1+M)"] * 2
    with pytest.raises(UsageError, match="profile"):
        modelcheck.model_check(coll, pipe)


def test_fit_needs_no_profile_and_recovers_alpha_beta():
    coll = [{"op": op, "world_size": 2, "size_bytes": s,
             "time_p50_s": collectives.collective_time(op=op, ranks=2, size_bytes=s,
                                                       alpha_s=ALPHA, beta_bytes_per_s=BETA)}
            for op in ("all_reduce", "all_gather") for s in (8, 4096, 1 << 20, 1 << 24)]
    df = modelcheck.model_check(coll, fit=True)
    assert df.error_pct.abs().max() < 1e-6
    a, b = modelcheck.fit_local(coll)
    assert a == pytest.approx(ALPHA, rel=1e-6) and b == pytest.approx(BETA, rel=1e-6)
    with pytest.raises(UsageError, match="no measured rows"):
        modelcheck.model_check([], [], fit=True)


def test_step_miss_prints_a_split_that_sums_to_the_measurement():
    prof = _profile()
    row = _pipe_row(2, prof, share_other=0.3)
    row["step_time_s"] *= 1.6  # slower than the model: a miss
    law = [r for r in modelcheck.check_laws(modelcheck.model_check(None, [row], profile=prof))
           if "pipeline step time" in r["law"]][0]
    assert not law["holds"] and law["kind"] == "model"
    assert laws.split_sums(law)
    assert sum(law["split"].values()) == pytest.approx(row["step_time_s"] * 1e3)  # in ms
    assert law["unit"] == "ms"
    assert "measured split: compute" in laws.verdict(law)


def test_law_tolerances_one_semantic_per_quantity():
    prof = _profile()
    df = modelcheck.model_check(
        [{"op": "all_reduce", "world_size": 2, "size_bytes": 1 << 20, "time_p50_s": 3e-3,
          "time_p10_s": 2e-3, "time_p90_s": 5e-3}], [_pipe_row(4, prof)], profile=prof)
    rows = modelcheck.check_laws(df)
    assert rows[0]["note"].startswith("transfers compared: the profile's ")
    assert "against the calls' p10 2 ms; the calls' p50 3 ms, p90 5 ms" in rows[0]["note"]
    assert rows[0]["measured"] == pytest.approx(2.0)  # ms: the calls' transfer, not their median
    assert rows[0]["unit"] == "ms"
    for r in rows:
        if "bubble" in r["law"]:  # a fraction: absolute
            assert r["tolerance_abs"] == 0.05 and r["tolerance_pct"] is None
        else:  # a time: relative, symmetric
            assert r["tolerance_pct"] == 25.0 and r["tolerance_abs"] is None
            assert r["error_pct"] == pytest.approx(laws.symmetric_error_pct(r["predicted"],
                                                                            r["measured"]))


# --- kinds: published and agreement -----------------------------------------------------------------

def test_published_rows_are_published_laws_with_their_source():
    df = published.table()
    for r in df.to_dict("records"):
        law = published.law(r)
        assert law["kind"] == "published" and law["source"] == r["source"]
        assert law["holds"] == r["holds"]
        if r["quantity"] in ("mfu", "hfu"):  # fractions of the peak: absolute
            assert law["tolerance_abs"] == 0.05 and law["tolerance_pct"] is None
        else:
            assert law["tolerance_pct"] == 25.0 and law["tolerance_abs"] is None
        assert r["error_pct"] == pytest.approx(laws.symmetric_error_pct(r["predicted"],
                                                                        r["measured"]))
    miss = df.set_index("run").loc["nccl_allreduce_8xh100_58mb"]
    law = published.law(miss, "busbw at 58.7 MB")
    assert not law["holds"] and "latency" in law["note"]  # another machine, the known reason


def test_published_file_refuses_a_wrong_tolerance(tmp_path):
    import shutil

    import yaml

    d = tmp_path / "data"
    shutil.copytree(catalog.data_dir(), d)
    raw = yaml.safe_load((d / "published_runs.yaml").read_text())
    raw["runs"][0]["tolerance_pct"] = 25  # an MFU/HFU run held to a relative tolerance
    (d / "published_runs.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match="tolerance_abs"):
        published.load(d)
    raw["runs"][0].pop("tolerance_pct")
    raw["runs"][0]["tolerance_abs"] = 0.2  # above the cap: laws.check refuses it
    (d / "published_runs.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="outside"):
        published.table(d)


def test_agreement_rows_are_counted_apart():
    side = mlsysim_engine.side_by_side(live=False)
    law = mlsysim_engine.agreement_law(side, scenario="TP8 PP4, IB_NDR", term="bubble_s",
                                       law="bubble", tolerance_pct=1.0)
    assert law["kind"] == "agreement" and law["holds"] and law["note"].startswith("same")
    counts = laws.counts(pd.DataFrame([law, laws.check("m", predicted=1, measured=1)]))
    assert {c["kind"] for c in counts} == {"agreement", "model"}
    with pytest.raises(UsageError, match="no term"):
        mlsysim_engine.agreement_law(side, scenario="nowhere", term="bubble_s", law="x",
                                     tolerance_pct=1.0)


def test_recorded_engine_recomputes_this_model_and_live_is_refused_over_budget():
    side = mlsysim_engine.side_by_side(live=False)
    lab = mlsysim_engine.run_labkit(mlsysim_engine.tutorial_scenarios()[0])
    first = side[side.scenario == mlsysim_engine.tutorial_scenarios()[0].name].set_index("term")
    assert first.loc["compute_s", "labkit"] == pytest.approx(lab["compute_s"])
    assert mlsysim_engine.check_engine("recorded", budget_s=8) is False
    with pytest.raises(UsageError, match=r"about 10 s .* over this notebook's 8 s budget"):
        mlsysim_engine.check_engine("live", budget_s=8)
    with pytest.raises(UsageError, match="'recorded' or 'live'"):
        mlsysim_engine.check_engine("auto", budget_s=8)
    assert mlsysim_engine.live_estimate_s(20) == pytest.approx(9.0 + 20 * 0.06)


# --- the live check's budget, at each documented value -----------------------------------------------

@pytest.mark.parametrize("max_bytes", ["64K", "1M", "4M"])
@pytest.mark.parametrize("microbatches", [[1], [2, 4], [8]])
def test_documented_live_values_fit_the_budget_at_two_ranks(max_bytes, microbatches):
    est = modelcheck.check_live(world_size=2, max_bytes=collectives.parse_size(max_bytes),
                                microbatches=microbatches, cores=2, budget_s=11.0)
    assert 0 < est <= 11.0


def test_oversubscribed_live_check_is_refused_with_its_estimate():
    est = modelcheck.live_estimate_s(world_size=4, max_bytes=1 << 20, microbatches=[2, 4], cores=2)
    assert est > 2 * modelcheck.live_estimate_s(world_size=2, max_bytes=1 << 20,
                                                microbatches=[2, 4], cores=2)
    with pytest.raises(UsageError, match=rf"about {est:.0f} s here, over its 11 s budget"):
        modelcheck.check_live(world_size=4, max_bytes=1 << 20, microbatches=[2, 4], cores=2,
                              budget_s=11.0)


@pytest.mark.parametrize("name,pp,m", [("Llama-3-8B", 4, 32), ("Llama-3-70B", 4, 32),
                                       ("GPT-3-175B", 4, 32), ("Mixtral-8x7B", 4, 32),
                                       ("Megatron-GPT-1T", 4, 32), ("Llama-3-405B", 2, 16),
                                       ("DeepSeek-V3", 1, 8)])
def test_documented_models_price_the_example_layout(name, pp, m):
    """The models notebook 08's parameters cell names, with the pp (and M) it names for them."""
    work = model.Workload(catalog.model_preset(name), 256, efficiency=0.4)
    for node in ("DGX_H100", "DGX_A100"):
        cl = model.Cluster.from_catalog(node, 32)
        p = model.predict(work, cl, model.Layout(cl.world_size // (8 * pp), 8, pp, m))
        assert p.step_time_s > 0 and math.isfinite(p.mfu)


# --- computed sentences flip with their numbers ----------------------------------------------------

def test_error_signs_flip():
    assert "mostly negative" in verdicts.error_signs([-20, -50, 169])
    assert "mostly positive" in verdicts.error_signs([20, 50, -169])
    assert "shorter" in verdicts.error_signs([-1, -2]) and "longer" in verdicts.error_signs([1, 2])
    assert "as often" in verdicts.error_signs([1, -1])
    assert "+169%" in verdicts.error_signs([-20, -50, 169])  # every row beside the sentence
    assert verdicts.error_signs([float("nan")]) == "no time rows to compare"


def test_load_agreement_and_old_bubble_sentences_flip():
    assert "shares the cores" in verdicts.load_sentence(1.5, 2)
    assert "mostly free" in verdicts.load_sentence(0.5, 2)
    assert "agree within 1%" in verdicts.agreement("x", 0.9, 1.0)
    assert "differ by more than 1%" in verdicts.agreement("x", -1.1, 1.0)
    assert "longer than" in verdicts.old_bubble(old_step_s=3, step_s=1)
    assert "as long as" in verdicts.old_bubble(old_step_s=1, step_s=3)


def test_largest_same_formula_gap_is_the_largest_symmetric_gap():
    side = mlsysim_engine.side_by_side(live=False)
    worst = mlsysim_engine.largest_same_formula_gap(side)
    same = side[side.same_formula & (side.mlsysim != 0)]
    gaps = [abs(laws.symmetric_error_pct(a, b)) for a, b in zip(same.labkit, same.mlsysim)]
    assert abs(worst.gap_pct) == pytest.approx(max(gaps)) and worst.same_formula
    with pytest.raises(UsageError, match="no nonzero term"):
        mlsysim_engine.largest_same_formula_gap(side[~side.same_formula])


def test_model_check_command_reads_the_runs_profile(tmp_path, capsys, monkeypatch):
    from labkit import machine, results
    from labkit.cli import main

    monkeypatch.delenv(machine.ENV, raising=False)
    prof = _profile()
    results.upsert(tmp_path / machine.FILE, list(prof.rows))
    coll = tmp_path / "coll.json"
    results.record(coll, [{"op": "all_reduce", "world_size": 2, "size_bytes": s,
                           "time_p50_s": prof.allreduce_s(s)} for s in (512, 1 << 20)],
                   key=("op", "world_size", "size_bytes"))
    assert main(["model-check", "--collectives", str(coll), "--profile", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "median |error| %: collectives 0.0" in out
    assert main(["model-check", "--collectives", str(coll), "--profile", str(tmp_path),
                 "--fit"]) == 2
    assert "not both" in capsys.readouterr().err
