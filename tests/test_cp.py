"""The context-parallel lab: ring attention simulated in one process against
scaled_dot_product_attention (causal and full, outputs and gradients, float64), the balanced
split's chunks, the bytes and saved-bytes formulas against counts, bad input refused before
launch, and (slow) one real 2-rank gloo launch. No test asserts on speed."""

from __future__ import annotations

import doctest

import pytest

from labkit import cli, cp, results
from labkit.cp import config as cp_config
from labkit.cp import exchanges, formulas, report, verdicts
from labkit.cp.config import CPConfig
from labkit.errors import UsageError
from labkit.launch import LaunchOptions

from .conftest import LAUNCH_TIMEOUT_S

TINY = {"seq_len": 16, "hidden": 8, "num_heads": 2, "batch_size": 2, "steps": 2, "warmup": 1}


@pytest.mark.parametrize("module", [formulas, cp_config, report, verdicts])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("variant", formulas.VARIANTS)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ring_matches_sdpa_in_one_process(variant, world_size):
    """Every rank simulated in one process: output and Q, K, V gradients equal one process's
    attention to 1e-5 relative in float64."""
    torch = pytest.importorskip("torch")
    from labkit.cp.ring import reference, simulate

    g = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(2, 3, 12, 4, generator=g, dtype=torch.float64) for _ in range(4))
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference(*a, variant=variant)
    got = simulate(*b, world_size=world_size, variant=variant)
    want.backward(go)
    got.backward(go)
    for x, y in [(got, want)] + [(s.grad, t.grad) for s, t in zip(b, a)]:
        assert float((x - y).detach().abs().max() / y.detach().abs().max()) <= 1e-5


def test_balanced_split_worked_example():
    """S = 16 on 4 ranks: 8 chunks of 2 tokens, rank r holds r and 7 - r, and every rank
    computes the same 2P + 1 blocks where the contiguous causal split gives rank r r + 1."""
    assert [formulas.chunks_of(r, 4, "causal_balanced") for r in range(4)] == \
        [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert formulas.token_ranges(1, 4, 16, "causal_balanced") == [(2, 4), (12, 14)]
    assert [formulas.blocks_per_rank(r, 4, "causal_balanced") for r in range(4)] == [9] * 4
    assert [formulas.blocks_per_rank(r, 4, "causal") for r in range(4)] == [1, 2, 3, 4]
    # every causal (query, key) chunk pair computed exactly once over all ranks and steps
    pairs = set()
    for r in range(4):
        for t in range(4):
            mine = formulas.chunks_of(r, 4, "causal_balanced")
            theirs = formulas.chunks_of(formulas.kv_source(r, t, 4), 4, "causal_balanced")
            pairs |= {(mine[i], theirs[j]) for i, j, _ in
                      formulas.work_items(r, t, 4, "causal_balanced")}
    assert pairs == {(a, b) for a in range(8) for b in range(a + 1)}


def test_bytes_formula_against_counts(monkeypatch):
    """The counted sends of a ring (the sends wrapped; the op itself stubbed: no process
    group) equal (P-1) x 2 b (S/P) h x 4 B = 2 (P-1)/P of K's bytes."""
    torch = pytest.importorskip("torch")
    from labkit.cp import comm
    from labkit.cp.comm import Ring

    monkeypatch.setattr(comm.dist, "P2POp", lambda *args: args)

    b, s, h, p = 2, 16, 8, 4
    ring = Ring(0, p)
    block = torch.zeros(b, 2, s // p, h // 2)
    for _ in range(p - 1):
        for t in (block, block):
            ring._send(t, ring.next, "forward")
    want = formulas.ring_bytes_per_rank(batch_size=b, seq_len=s, hidden=h, world_size=p)
    assert ring.bytes["forward"] == want == 2 * (p - 1) / p * b * s * h * 4
    assert ring.sends["forward"] == formulas.ring_sends_per_rank(p)


@pytest.mark.parametrize("variant", formulas.VARIANTS)
def test_saved_bytes_formula_against_the_meter(variant):
    """What autograd saves on each simulated rank equals the formula to the byte."""
    torch = pytest.importorskip("torch")
    from labkit.cp.ring import LocalRing, local_chunks, ring_attention
    from labkit.memory import SavedActivations

    b, heads, s, d = 2, 3, 24, 4
    q, k, v = (torch.randn(b, heads, s, d) for _ in range(3))
    for p in (1, 2, 3):
        for r in range(p):
            leaves = [local_chunks(t, r, p, variant).requires_grad_() for t in (q, k, v)]
            ring = LocalRing(k, v, rank=r, world_size=p, variant=variant)
            with SavedActivations(exclude=leaves) as meter:
                out = ring_attention(*leaves, rank=r, world_size=p, variant=variant,
                                     exchange=ring)  # held: the graph keeps what it saved
            assert meter.live_bytes == formulas.saved_bytes_per_rank(
                batch_size=b, seq_len=s, hidden=heads * d, num_heads=heads, world_size=p,
                variant=variant, rank=r)
            del out


@pytest.mark.parametrize("bad, message", [
    ({"hidden": 30, "num_heads": 4}, "not divisible by num_heads"),
    ({"variants": ("ring",)}, "unknown variant"),
    ({"seq_len": 0}, "seq_len"),
    ({"steps": 2, "warmup": 2}, "warmup"),
])
def test_config_refuses_bad_input(bad, message):
    with pytest.raises(UsageError, match=message):
        CPConfig(**{**TINY, **bad})


def test_check_world_size():
    with pytest.raises(UsageError, match="not divisible by 2 x 3 = 6 chunks"):
        CPConfig(**{**TINY, "variants": ("causal_balanced",)}).check_world_size(3)
    with pytest.raises(UsageError, match="not divisible by 3 ranks"):
        CPConfig(**TINY).check_world_size(3)
    CPConfig(**{**TINY, "seq_len": 12, "variants": ("full",)}).check_world_size(3)
    CPConfig(**TINY).check_world_size(4)


@pytest.mark.parametrize("args", [["--nproc", "3"], ["--hidden", "30"], ["--variant", "ring"]])
def test_cli_bad_input_exits_2_and_writes_nothing(args, tmp_path, capsys):
    assert cli.main(["cp", "--json", str(tmp_path / "r.json"), "--seq-len", "16", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit cp: error:") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_checks_before_launching():
    with pytest.raises(UsageError, match="CPConfig"):
        cp.run(TINY)
    with pytest.raises(UsageError, match="not divisible"):
        cp.run(CPConfig(**TINY), launch=LaunchOptions(nprocs=(3,)))


def test_each_round_of_turns_starts_at_the_next_function():
    # the first call after a barrier ran about 10 % slower: no function may take that place
    # every round (one rank, no process group: no barrier)
    from types import SimpleNamespace

    import torch

    from labkit.cp.worker import _rounds

    order = []
    rt = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    got = _rounds(rt, 3, [lambda i=i: order.append(i) for i in range(2)])
    assert order == [0, 1, 1, 0, 0, 1]
    assert [len(x) for x in got] == [3, 3] and all(t >= 0 for x in got for t in x)


def test_laws_are_exact_counts_and_a_model_with_its_split():
    row = {"variant": "causal", "world_size": 2, "ring_bytes_formula": 100,
           "ring_bytes_forward_measured": 100, "ring_bytes_backward_measured": 100,
           "saved_bytes_formula": 50, "saved_bytes_measured": 50,
           "saved_bytes_one_rank_measured": 80, "blocks_per_rank": [1, 2],
           "compute_alone_per_rank_s": [0.001, 0.002], "compute_alone_s": 0.002,
           "kv_block_bytes": 64, "step_time_p50_s": 0.01, "compute_time_p50_s": 0.004,
           "message_time_s": 0.001}
    rows = verdicts.laws(row, verdicts.FakeProfile(slowdown=1.0, message_s=1e-4))
    assert [r["holds"] for r in rows[:4]] == [True] * 4
    step = rows[-1]
    assert step["kind"] == "model" and not step["holds"]  # 2.2 ms predicted, 10 ms measured
    assert sum(step["split"].values()) == pytest.approx(10.0)


# ---------------------------------------------------------------- one real launch (gloo)

@pytest.mark.slow
def test_two_ranks_match_one_process_and_count_the_formulas(tmp_path):
    store = tmp_path / "cp.json"
    df = cp.run(CPConfig(**TINY), launch=LaunchOptions(nprocs=(2,), timeout_s=LAUNCH_TIMEOUT_S,
                                                       progress=False), store=str(store))
    assert sorted(df.variant) == sorted(formulas.VARIANTS)
    for _, r in df.iterrows():
        assert r.matches_single_process and r.max_rel_error <= 1e-5
        assert r.ring_bytes_forward_measured == r.ring_bytes_backward_measured == \
            r.ring_bytes_formula == 1 * 2 * 2 * 8 * 8 * 4  # (P-1) x 2 b (S/P) h x 4 B
        assert r.ring_sends_forward_measured == r.ring_sends_backward_measured == 2
        assert r.saved_bytes_per_rank_measured == [
            formulas.saved_bytes_per_rank(batch_size=2, seq_len=16, hidden=8, num_heads=2,
                                          world_size=2, variant=r.variant, rank=k)
            for k in (0, 1)]
        assert r.saved_bytes_one_rank_measured == r.saved_bytes_one_rank_formula
        assert r.step_time_p50_s > 0 and r.message_time_s > 0
        assert len(r.compute_alone_per_rank_s) == 2
        # every share timed on one core, positive, in rank order
        assert len(r.share_alone_s) == 2 and min(r.share_alone_s) > 0
        # one block of each kind the variant computes, timed alone; the kinds per rank
        kinds = [formulas.block_kinds(k, 2, r.variant) for k in (0, 1)]
        assert r.block_kinds_per_rank == kinds
        assert set(r.block_time_alone_s) == {k for x in kinds for k, n in x.items() if n}
        assert all(t > 0 for t in r.block_time_alone_s.values())
        # the pass's two exchanges read off its timeline, each what it cost a rank
        assert [(x["direction"], x["ring_step"]) for x in
                exchanges.exchange_times(r.timeline_s, 2)] == [("forward", 0), ("backward", 0)]
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    assert len(results.read_rows(store)) == 3
    assert list(report.summary_frame(df).matches) == [True] * 3
