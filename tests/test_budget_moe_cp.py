"""Notebook 10's budget: every value its parameters cell documents either runs within the
notebook's share of the lab's time by the estimate (labkit.moe.budget, labkit.cp.budget) or is
refused before anything launches, in one line giving the estimate, the budget and what to
change; the estimate grows with the work it counts. All pure: nothing launches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.cp import budget as cp_budget
from labkit.cp.config import CPConfig
from labkit.errors import UsageError
from labkit.moe import budget
from labkit.moe.config import MoEConfig

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "10_experts_and_long_sequences.ipynb"

#: the best matrix-product rate one rank reached alone in this 2-core machine's profile
RATE, CORES = 48e9, 2


class Machine:
    """A machine profile as the check reads it: its cores and its matrix products alone."""

    cores = CORES
    rows = ({"measurement": "matmul", "context": "alone", "flop_per_s": RATE},
            {"measurement": "matmul", "context": "alone", "flop_per_s": RATE / 2})


def _cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def _parameters() -> dict:
    cell = next(c for c in _cells() if "parameters" in c.get("metadata", {}).get("tags", []))
    ns: dict = {}
    exec("".join(cell["source"]), ns)  # annotated literals only
    return {k: v for k, v in ns.items() if not k.startswith("__")}


def _configs(**over) -> tuple[MoEConfig, CPConfig, dict]:
    """The notebook's two configs and ranks, built as its setup cell builds them."""
    p = {**_parameters(), **over}
    moe = MoEConfig(num_experts=p["moe_experts"], top_k=p["moe_top_k"], hidden=p["moe_hidden"],
                    tokens=p["moe_tokens"], capacity_factor=p["moe_capacity_factor"])
    cp = CPConfig(seq_len=p["cp_seq_len"], hidden=p["cp_hidden"], num_heads=p["cp_heads"])
    cp.check_world_size(p["cp_ranks"])  # as the launch would, before the estimate
    moe.check_world_size(p["moe_ranks"])
    return moe, cp, {"moe_ranks": p["moe_ranks"], "cp_ranks": p["cp_ranks"],
                     "budget_s": p["budget_s"]}


def _estimate(**over) -> dict:
    moe, cp, p = _configs(**over)
    return budget.notebook_seconds(moe, cp, moe_ranks=p["moe_ranks"], cp_ranks=p["cp_ranks"],
                                   flop_per_s=RATE, cores=CORES)


def _check(**over) -> float:
    moe, cp, p = _configs(**over)
    return budget.check(moe, cp, moe_ranks=p["moe_ranks"], cp_ranks=p["cp_ranks"],
                        machine=Machine(), budget_s=p["budget_s"])


def test_the_comments_document_these_values():
    """The values below are those the parameters cell's comments name: a changed comment
    changes this test."""
    cell = next(c for c in _cells() if "parameters" in c.get("metadata", {}).get("tags", []))
    text = "".join(cell["source"])
    for said in ("experts E: 4, 8 or 16", "experts each token goes to: 1 to E",
                 "64 to 512 run within budget_s; 2048 is refused before launch",
                 "tokens per rank: 64 to 2048 run within budget_s; 8192 is refused before launch",
                 "(> 0: 0.5 drops many, 2.0 none)", "EP launch: 1, 2 (one per core) or 4",
                 "64 to 1024 run within budget_s; 2048 is refused before launch",
                 "(heads x head size): 32 to 256", "attention heads: 1 to 8",
                 "CP launch: 1, 2 (one per core) or 4", "budget_s: float = 36.0",
                 "trace: bool = True"):
        assert said in text, said


WITHIN = ([{}]
          + [{"moe_experts": e} for e in (4, 8, 16)]
          + [{"moe_top_k": k} for k in (1, 2, 3, 4)]
          + [{"moe_experts": e, "moe_top_k": e} for e in (8, 16)]
          + [{"moe_hidden": h} for h in (64, 128, 256, 512)]
          + [{"moe_tokens": t} for t in (64, 128, 256, 512, 1024, 2048)]
          + [{"moe_capacity_factor": c} for c in (0.5, 1.25, 2.0)]
          + [{"moe_ranks": n} for n in (1, 2, 4)]
          + [{"cp_seq_len": s} for s in (64, 128, 256, 512, 1024)]
          + [{"cp_seq_len": 1024, "cp_ranks": n} for n in (1, 4)]
          + [{"cp_hidden": h} for h in (32, 64, 128, 256)]
          + [{"cp_heads": n} for n in (1, 2, 4, 8)]
          + [{"cp_ranks": n} for n in (1, 2, 4)]
          + [{"trace": False}])


@pytest.mark.parametrize("over", WITHIN, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
                         or "defaults")
def test_documented_values_run_within_the_budget(over):
    est = _estimate(**over)
    assert est["total"] > budget.NOTEBOOK_S + budget.LAUNCH_S + cp_budget.LAUNCH_S
    assert _check(**over) == pytest.approx(est["total"]) and est["total"] <= 36.0


@pytest.mark.parametrize("over, lab, fix", [
    ({"moe_hidden": 2048}, "moe", "lower moe_tokens (256), moe_hidden (2048)"),
    ({"moe_tokens": 8192}, "moe", "lower moe_tokens (8192), moe_hidden (256)"),
    ({"cp_seq_len": 2048}, "cp", "lower cp_seq_len (2048) or cp_hidden (64)"),
])
def test_documented_values_over_the_budget_are_refused_before_launch(over, lab, fix):
    est = _estimate(**over)
    assert est[lab] > est["cp" if lab == "moe" else "moe"]  # the launch the message names
    with pytest.raises(UsageError) as e:
        _check(**over)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"these parameters would run about {est['total']:.0f} s here "
                           f"(the MoE launch {est['moe']:.0f} s, the CP launch "
                           f"{est['cp']:.0f} s, the notebook {budget.NOTEBOOK_S:.0f} s), over "
                           "this notebook's budget of 36 s: ")
    assert fix in text and text.endswith("or raise budget_s")
    assert est["total"] > 1.3 * 32.0  # well over: not a value the machine's noise decides


def test_more_ranks_than_cores_say_so_when_refused():
    moe, cp, _ = _configs(moe_tokens=2048)
    with pytest.raises(UsageError, match=r"run at most 2 ranks \(one per core\), or raise"):
        budget.check(moe, cp, moe_ranks=4, cp_ranks=2, machine=Machine(), budget_s=36.0)


def test_the_estimate_grows_with_the_work_and_shrinks_with_the_rate():
    base = _estimate()["total"]
    assert _estimate(moe_tokens=512)["total"] > base and _estimate(moe_hidden=512)["total"] > base
    assert _estimate(moe_experts=8, moe_top_k=8)["total"] > base
    assert _estimate(cp_seq_len=1024)["total"] > base and _estimate(cp_hidden=256)["total"] > base
    moe, cp, _ = _configs()
    assert budget.launch_seconds(moe, 2, flop_per_s=2 * RATE, cores=2) < \
        budget.launch_seconds(moe, 2, flop_per_s=RATE, cores=2)
    assert cp_budget.launch_seconds(cp, 4, flop_per_s=RATE, cores=2) > \
        cp_budget.launch_seconds(cp, 4, flop_per_s=RATE, cores=4)
    assert budget.launch_seconds(moe, 4, flop_per_s=RATE, cores=2) > \
        budget.launch_seconds(moe, 4, flop_per_s=RATE, cores=4)
    # a score block past the caches costs more per score than one within them
    small = cp_budget.score_seconds(cp, 64, flop_per_s=RATE)
    assert cp_budget.score_seconds(cp, 2048, flop_per_s=RATE) == pytest.approx(
        cp_budget.SPILL_CAP * small)


def test_the_check_comes_before_any_launch_in_the_notebook():
    """The setup cell estimates both launches; the first launch is in a later cell."""
    code = ["".join(c["source"]) for c in _cells() if c["cell_type"] == "code"]
    checked = next(i for i, src in enumerate(code) if "moe.budget.check(" in src)
    launches = [i for i, src in enumerate(code) if "moe.run(" in src or "cp.run(" in src]
    assert launches and checked < min(launches)
    assert "budget_s=budget_s" in code[checked] and "machine=prof" in code[checked]
