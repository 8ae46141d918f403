"""The expert-parallel lab: routing, dispatch and combine against a hand-worked example, the
layer on two ranks simulated in one process (two threads, an all-to-all between them) against
one process running every expert, the bytes of every all-to-all against the routing's formula,
bad input refused before launch, and (slow) one real 2-rank gloo launch. No test asserts on
speed."""

from __future__ import annotations

import math
import subprocess
import threading

import pytest
import torch

from labkit import moe, results
from labkit.errors import UsageError
from labkit.launch import LaunchOptions
from labkit.moe import formulas, layer, report, verdicts, waits
from labkit.moe.config import MoEConfig

from ._moe_rows import moe_row
from .conftest import LAUNCH_TIMEOUT_S

TINY = {"num_experts": 4, "top_k": 2, "hidden": 8, "ffn": 16, "tokens": 12, "steps": 3,
        "warmup": 1}


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, message", [
    ({"top_k": 5}, "top_k 5 is more than the 4 experts"),
    ({"capacity_factor": 0}, "capacity_factor must be a positive finite number"),
    ({"capacity_factor": -1.0}, "capacity_factor must be a positive finite number"),
    ({"num_experts": 0}, "num_experts must be an integer >= 1"),
    ({"steps": 2, "warmup": 2}, "no step would be timed"),
])
def test_config_refuses_bad_input(bad, message):
    with pytest.raises(UsageError, match=message):
        MoEConfig(**{**TINY, **bad})


def test_experts_must_divide_among_the_ranks():
    with pytest.raises(UsageError, match="4 experts are not divisible by 3 ranks"):
        MoEConfig(**TINY).check_world_size(3)
    MoEConfig(**TINY).check_world_size(2)


def test_cli_refuses_before_launch(labkit_cmd):
    p = subprocess.run([*labkit_cmd, "moe", "--num-experts", "3", "--nproc", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith(
        "3 experts are not divisible by 2 ranks: each rank holds E/P whole experts")


# -- the hand-worked example -------------------------------------------------------------------
#: four tokens of h = 2 and a router whose logits are (x0, x1, -x0, -x1): no ties anywhere
X = torch.tensor([[2.0, 1.0], [1.0, 3.0], [-2.0, 1.0], [-1.0, -3.0]], dtype=torch.float64)
ROUTER = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_routing_by_hand():
    """Logits (2, 1, -2, -1), (1, 3, -1, -3), (-2, 1, 2, -1), (-1, -3, 1, 3): the top two are
    experts 0,1 / 1,0 / 2,1 / 3,2; renormalised, two gates with logits a > b are
    sigmoid(a - b) and 1 - sigmoid(a - b). The capacity ceil(1.0 x 4 x 2 / 4) = 2 lets
    expert 1 take tokens 0 and 1 and drops its third pair, token 2's."""
    cap = formulas.capacity(tokens=4, top_k=2, num_experts=4, capacity_factor=1.0)
    assert cap == 2
    gates, r = layer.route(X @ ROUTER.T, top_k=2, capacity=cap, renormalize=True)
    want = [[_sigmoid(1), 1 - _sigmoid(1)], [_sigmoid(2), 1 - _sigmoid(2)],
            [_sigmoid(1), 1 - _sigmoid(1)], [_sigmoid(2), 1 - _sigmoid(2)]]
    assert torch.allclose(gates, torch.tensor(want, dtype=torch.float64))
    # dispatch order: by expert, then token
    assert r.expert.tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert r.token.tolist() == [0, 1, 0, 1, 2, 3, 3]
    assert r.routed.tolist() == [2, 3, 2, 1] and r.kept.tolist() == [2, 2, 2, 1]
    assert r.dropped == 1
    # without renormalising, the gates are the softmax probabilities themselves
    raw, _ = layer.route(X @ ROUTER.T, top_k=2, capacity=cap, renormalize=False)
    z = sum(math.exp(v) for v in (2, 1, -2, -1))
    assert math.isclose(float(raw[0, 0]), math.exp(2) / z)
    # on 2 ranks (experts 0, 1 on rank 0; 2, 3 on rank 1) this rank keeps 4 rows, sends 3
    assert formulas.rows_between([r.kept.tolist(), [0, 0, 0, 0]], world_size=2)[0] == [4, 3]
    assert formulas.alltoall_bytes([r.kept.tolist(), [0, 0, 0, 0]], rank=0, hidden=2,
                                   bytes_per_value=8) == {"dispatch": 48, "combine": 0}


def test_dispatch_and_combine_by_hand():
    """The layer on one rank: each token's output is the sum of its kept experts' outputs
    times their gates; token 2 lost expert 1, so it gets expert 2's alone."""
    w = layer.init_weights(num_experts=4, hidden=2, ffn=3, seed=0)
    w["router"] = ROUTER.clone()
    lay = layer.ExpertLayer(w, rank=0, world_size=1, top_k=2, capacity=2, renormalize=True,
                            device="cpu", dtype=torch.float64)
    out = lay.step(X.clone(), torch.zeros_like(X))

    def expert(e, t):
        return layer.expert_mlp(X[t], w["w1"][e], w["b1"][e], w["w2"][e], w["b2"][e])

    s1, s2 = _sigmoid(1), _sigmoid(2)
    want = torch.stack([s1 * expert(0, 0) + (1 - s1) * expert(1, 0),
                        s2 * expert(1, 1) + (1 - s2) * expert(0, 1),
                        s1 * expert(2, 2),
                        s2 * expert(3, 3) + (1 - s2) * expert(2, 3)])
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)


# -- two ranks in one process ------------------------------------------------------------------
class ThreadWorld:
    """An all-to-all among ``world_size`` threads of this process, counting the bytes that
    leave each rank per call, as the worker's wrapped collective does."""

    def __init__(self, world_size: int):
        self.n = world_size
        self.barrier = threading.Barrier(world_size)
        self.posts: list = [None] * world_size
        self.sent = [[] for _ in range(world_size)]

    def _swap(self, rank: int, chunks):
        self.posts[rank] = chunks
        self.barrier.wait()
        got = [self.posts[s][rank] for s in range(self.n)]
        self.barrier.wait()  # nobody posts again before every rank has read
        return got

    def comm(self, rank: int) -> dict:
        def exchange(x, send, recv, tag):
            chunks = x.split(send)
            self.sent[rank].append(sum(c.numel() * c.element_size()
                                       for d, c in enumerate(chunks) if d != rank))
            got = self._swap(rank, chunks)
            assert [g.shape[0] for g in got] == recv
            return torch.cat(got)

        def counts(c):
            return torch.stack(self._swap(rank, list(c)))

        return {"exchange": exchange, "exchange_counts": counts}


def _two_ranks(cfg: MoEConfig, weights, x_all, grad_all, cap):
    world = ThreadWorld(2)
    layers, outs, errors = {}, {}, []

    def run(rank):
        try:
            lay = layer.ExpertLayer(weights, rank=rank, world_size=2, top_k=cfg.top_k,
                                    capacity=cap, renormalize=cfg.renormalize, device="cpu",
                                    dtype=torch.float64, **world.comm(rank))
            x = x_all[rank].clone().requires_grad_(True)
            outs[rank] = (lay.step(x, grad_all[rank]), x)
            layers[rank] = lay
        except Exception as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return world, layers, outs


@pytest.mark.parametrize("extra", [{}, {"capacity_factor": 0.5, "renormalize": False}])
def test_two_ranks_match_one_process_and_count_their_bytes(extra):
    """Float64, two ranks of E/P = 2 experts: outputs, input gradients, the router gradient
    (summed over the ranks) and every expert's gradient equal the dense one-process layer to
    1e-5 relative; every all-to-all of every rank sent the bytes the routing's formula says."""
    cfg = MoEConfig(**{**TINY, **extra})
    cap = formulas.capacity(tokens=cfg.tokens, top_k=cfg.top_k, num_experts=cfg.num_experts,
                            capacity_factor=cfg.capacity_factor)
    w = layer.init_weights(num_experts=4, hidden=cfg.hidden, ffn=cfg.expert_width, seed=3)
    g = torch.Generator().manual_seed(4)
    x_all = torch.randn(2, cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)
    grad_all = torch.randn(2, cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)
    ref = layer.reference(w, x_all, grad_all, top_k=cfg.top_k, capacity=cap,
                          renormalize=cfg.renormalize)
    world, layers, outs = _two_ranks(cfg, w, x_all, grad_all, cap)

    def close(got, want):
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) <= 1e-5 * scale

    for rank in range(2):
        out, x = outs[rank]
        close(out, ref["out"][rank])
        close(x.grad, ref["x_grad"][rank])
        for k in ("w1", "b1", "w2", "b2"):
            close(layers[rank].params[k].grad, ref["grads"][k][2 * rank:2 * rank + 2])
    close(layers[0].params["router"].grad + layers[1].params["router"].grad,
          ref["grads"]["router"])
    kept = [layers[r].last.kept.tolist() for r in range(2)]
    if extra:
        assert sum(layers[r].last.dropped for r in range(2)) > 0  # the capacity did bite
    for rank in range(2):
        b = formulas.alltoall_bytes(kept, rank=rank, hidden=cfg.hidden, bytes_per_value=8)
        assert world.sent[rank] == [b["dispatch"], b["combine"], b["dispatch"], b["combine"]]
        assert b["dispatch"] > 0
    assert sum(map(sum, world.sent)) == sum(
        formulas.step_bytes(kept, rank=r, hidden=cfg.hidden, bytes_per_value=8)
        for r in range(2))


def test_one_rank_matches_one_process():
    cfg = MoEConfig(**TINY)
    cap = formulas.capacity(tokens=cfg.tokens, top_k=2, num_experts=4, capacity_factor=1.0)
    w = layer.init_weights(num_experts=4, hidden=cfg.hidden, ffn=cfg.expert_width, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)
    go = torch.randn(1, cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)
    ref = layer.reference(w, x, go, top_k=2, capacity=cap, renormalize=True)
    lay = layer.ExpertLayer(w, rank=0, world_size=1, top_k=2, capacity=cap, renormalize=True,
                            device="cpu", dtype=torch.float64)
    xr = x[0].clone().requires_grad_(True)
    out = lay.step(xr, go[0])
    assert torch.allclose(out, ref["out"][0], rtol=1e-5, atol=0)
    assert torch.allclose(xr.grad, ref["x_grad"][0], rtol=1e-5, atol=1e-12)
    for k, grad in ref["grads"].items():
        assert torch.allclose(lay.params[k].grad, grad, rtol=1e-5, atol=1e-12), k


# -- laws and sentences from a row -------------------------------------------------------------
def _row(**over) -> dict:
    return moe_row(**{"step_time_p50_s": 0.02, "routing_time_s": 0.001, "dispatch_time_s": 0.001,
                      "experts_time_s": 0.017, "combine_time_s": 0.001, **over})


def test_derived_fields_count_the_drops_and_the_bytes():
    row = _row()
    assert row["tokens_dropped"] == 10 + 22
    assert row["expert_load_kept"] == [270, 230, 180, 312]
    assert row["rank_load_rows"] == [500, 492]
    assert row["a2a_bytes_measured"] == row["a2a_bytes_formula"] > 0
    assert results.undeclared([row], report.COLUMNS) == []


def test_laws_hold_on_exact_counts_and_fail_on_a_miscount():
    prof = verdicts.FakeProfile()
    ok = verdicts.laws(_row(), prof)
    assert [law["holds"] for law in ok[:2]] == [True, True]
    assert ok[-1]["kind"] == "model" and set(ok[-1]["split"]) == set(formulas.PHASES)
    wrong = _row(a2a_bytes_by_call_measured=[[1, 0, 0, 0], [0, 0, 0, 0]])
    assert not verdicts.laws(wrong, prof)[1]["holds"]
    assert len(verdicts.laws(_row(world_size=1, kept_by_rank=[[160, 100, 90, 152]],
                                  routed_by_rank=[[160, 100, 90, 152]],
                                  a2a_bytes_by_call_formula=[[]],
                                  a2a_bytes_by_call_measured=[[]]), prof)) == 1
    slower = verdicts.context(_row(), verdicts.FakeProfile(slowdown=2.0))
    assert slower["experts"] > verdicts.context(_row(), prof)["experts"]
    # the phases' local work timed alone: the routing is that x the slowdown, the dispatch
    # and the combine add theirs to the transfers
    plain = verdicts.context(_row(), prof)
    timed = verdicts.context(_row(routing_local_alone_s=1e-3, dispatch_local_alone_s=2e-4,
                                  experts_local_alone_s=9e-3, combine_local_alone_s=1.1e-3), prof)
    assert timed["routing"] == pytest.approx(1e-3 * prof.slowdown)
    assert timed["combine"] - plain["combine"] == pytest.approx(1.1e-3 * prof.slowdown)
    # the experts: their time alone, scaled to the busiest rank's rows in the step
    kept = _row()["kept_by_rank"]
    own = max(sum(r) for r in kept)
    busiest = max(sum(kept[s][e] for s in range(2) for e in es) for es in ((0, 1), (2, 3)))
    assert timed["experts"] == pytest.approx(9e-3 * busiest / own * prof.slowdown)
    assert timed["expert_flops_s"] == plain["experts"]  # the profile's rate, kept beside it
    assert "local work alone" in verdicts.laws(_row(routing_local_alone_s=1e-3), prof)[-1]["note"]
    assert "dropped 32 of them" in verdicts.load_sentence(_row())


def test_figures_draw_a_row():
    import pandas as pd

    row = _row()
    fig = moe.plots.expert_load(row)
    assert len(fig.axes[0].patches) >= 4 + 2  # a bar per expert, the dropped parts on top
    fig = moe.plots.step_phases(pd.DataFrame([row]), verdicts.FakeProfile())
    assert len(fig.axes[0].patches) == 2 * len(formulas.PHASES)


# -- one real launch ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_rank_launch(tmp_path):
    """Two gloo ranks: the layer matches one process, every all-to-all's bytes counted on the
    collective equal the routing's formula, every field is declared, the rows are stored."""
    path = tmp_path / "moe.json"
    cfg = MoEConfig(num_experts=4, top_k=2, hidden=16, tokens=16, capacity_factor=1.0,
                    steps=3, warmup=1)
    df = moe.run(cfg, launch=LaunchOptions(nprocs=(2,), progress=False,
                                           timeout_s=LAUNCH_TIMEOUT_S), store=path)
    row = report.one(df, world_size=2)
    assert row["matches_single_process"] and row["max_rel_error"] <= 1e-5
    assert row["a2a_tags"] == ["dispatch", "combine", "combine_grad", "dispatch_grad"]
    assert row["a2a_bytes_by_call_measured"] == row["a2a_bytes_by_call_formula"]
    assert row["count_exchange_calls"] == 1 and row["a2a_bytes_measured"] > 0
    assert sum(row["expert_load_routed"]) == 2 * 16 * 2
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert len(results.read_rows(path)) == 1
    laws = verdicts.laws(row, verdicts.FakeProfile())
    assert laws[0]["holds"] and laws[1]["holds"]
    assert sum(laws[-1]["split"].values()) > 0
    assert all(row[f"{ph}_local_alone_s"] > 0 for ph in ("routing", "experts", "combine"))
    # every all-to-all of the median step stamped on every rank, inside its phase's span
    for rank in (0, 1):
        calls = sorted((c for c in row["a2a_timeline_s"] if c["rank"] == rank),
                       key=lambda c: c["call"])
        assert [c["tag"] for c in calls] == ["counts", "dispatch", "combine", "combine_grad",
                                             "dispatch_grad"]
        spans = [s for s in row["timeline_s"] if s["rank"] == rank]
        for c in calls:
            assert c["start_s"] <= c["end_s"]
            assert any(s["phase"] == waits.PHASE_OF[c["tag"]]
                       and s["start_s"] <= c["start_s"] and c["end_s"] <= s["end_s"]
                       for s in spans), c
    assert verdicts.context(row, verdicts.FakeProfile())["waits"]["calls"] == 5
