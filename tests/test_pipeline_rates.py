"""Pipeline lab, compute rate against microbatch size: a block's FLOPs by hand, the rates read
off the rows' block times, the profile's product of as many operations (clamped to the sizes
it measured), every column declared, a sentence that follows its numbers, the figure readable
(pure, fast: synthetic rows and profiles)."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit import results
from labkit.book.consistency import line_problems
from labkit.figures import text_overlaps
from labkit.pipeline import formulas, plots, rates, report, schedules


class Profile:
    """A machine profile's matrix products: alone at ``rate(n)``, together 0.8 of it, measured
    at n = 64, 256, 512 (the nearest outside them, as labkit.machine.Profile reads them)."""

    def __init__(self, rate=lambda n: 1e9 * n ** 0.5):
        self.rate = rate
        self.rows = tuple({"measurement": "matmul", "context": c, "n": n}
                          for n in (64, 256, 512) for c in ("alone", "together"))

    def matmul_flop_per_s(self, n, *, together=False):
        n = min(max(n, 64), 512)
        return self.rate(n) * (0.8 if together else 1.0)


def _row(m, *, slot_s, forward_s, backward_s, layers=6, hidden=1024, batch=128, p=2):
    """A gpipe row as the worker makes it, from the ideal schedule's blocks."""
    blocks = schedules.simulate("gpipe", p, m, forward_s=forward_s, backward_s=backward_s)
    return {"schedule": "gpipe", "num_stages": p, "num_microbatches": m, "virtual_stages": 1,
            "layers": layers, "hidden": hidden, "batch": batch, "microbatch_size": batch // m,
            "slot_time_s": slot_s, "step_time_s": max(b["end_s"] for b in blocks),
            "block_times": formulas.block_times([blocks])}


def _rows(hidden=1024):
    # per sample the block takes twice as long at 16 samples as at 128: 0.125 -> 0.25 ms
    return [_row(m, slot_s=s, forward_s=s / 3, backward_s=2 * s / 3, hidden=hidden)
            for m, s in ((1, 0.016), (2, 0.009), (8, 0.004))]


def _sweep(profile=None):
    return rates.add_rates(pd.DataFrame(_rows()), profile or Profile())


def test_block_flop_and_the_square_of_as_many_operations():
    f = rates.block_flop(layers=3, microbatch_size=16, hidden=1024)
    assert f == 6 * 3 * 16 * 1024 ** 2
    n = rates.square_size(microbatch_size=16, hidden=1024)
    assert 2 * n ** 3 == pytest.approx(2 * 16 * 1024 ** 2)  # one forward product's operations
    assert rates.rank_layers(layers=7, num_stages=2) == [4, 3]
    assert sum(rates.rank_layers(layers=8, num_stages=2, virtual_stages=2)) == 8


def test_rates_from_the_rows_block_times_and_shapes():
    df = _sweep()
    assert results.undeclared(df.to_dict("records"), report.COLUMNS) == []
    for r in df.itertuples():
        flop = 6 * (6 / 2) * r.microbatch_size * 1024 ** 2
        assert r.block_flop == flop
        assert r.block_flop_per_s == pytest.approx(flop / r.slot_time_s)
        assert r.block_samples_per_s == pytest.approx(r.microbatch_size / r.slot_time_s)
        # the ideal schedule's fill and drain run every kind alone on both ranks: F + B = t_slot
        assert r.block_alone_flop_per_s == pytest.approx(flop / r.slot_time_s)
        n = (r.microbatch_size * 1024 ** 2) ** (1 / 3)
        assert r.matmul_n == pytest.approx(n)
        assert r.matmul_n_read == min(max(n, 64), 512)
        assert r.matmul_flop_per_s == pytest.approx(1e9 * r.matmul_n_read ** 0.5)
        assert r.matmul_together_flop_per_s == pytest.approx(0.8 * r.matmul_flop_per_s)


def test_alone_rate_needs_every_kind_alone_on_a_rank():
    row = _row(4, slot_s=0.01, forward_s=0.004, backward_s=0.006)
    for t in row["block_times"]:
        t["alone_s"] = None
    assert rates.alone_flop_per_s(row) is None
    row["block_times"][0]["alone_s"] = 0.004  # one kind of one rank: still not a whole block
    assert rates.alone_flop_per_s(row) is None


@pytest.mark.parametrize("rate,share", [
    (lambda n: 1e9 * n ** 0.5, "accounts for 1.41x of the 2.00x alone; the rest of a block, 1.41x"),
    (lambda n: 1e10 + 0 * n, "not slower at the smaller size: none of the 2.00x"),
    (lambda n: 1e5 * n ** 3, "accounts for all of the 2.00x alone (the product slows 8.00x)"),
])
def test_sentence_follows_its_numbers(rate, share):
    df = _sweep(Profile(rate))
    text = rates.rate_sentence(df, "gpipe")
    assert text.startswith("gpipe, P = 2, from microbatches of 128 to 16 samples (M = 1 to 8)")
    assert "in the step falls (" in text and "2.00x the time per sample" in text
    assert share in text, text
    assert line_problems(text) == []
    big, small = df.iloc[0], df.iloc[-1]
    assert f"{big.block_flop_per_s / 1e9:.1f} -> {small.block_flop_per_s / 1e9:.1f}" in text


def test_sentence_when_the_profile_size_is_clamped_or_nothing_ran_alone():
    rows = _rows(hidden=64)  # n = (b h^2)^(1/3): 81 at 128 samples, 40 (read at 64) at 16
    for t in rows[-1]["block_times"]:
        t["alone_s"] = None
    df = rates.add_rates(pd.DataFrame(rows), Profile())
    assert pd.isna(df.block_alone_flop_per_s.iloc[-1])
    text = rates.rate_sentence(df, "gpipe")
    assert "(n = 81 to 40, read at 81 and 64, the nearest sizes the profile measured)" in text
    assert "No rank ran every kind of block alone at both sizes" in text
    assert line_problems(text) == []


def test_figure_is_readable():
    fig = plots.rate_vs_microbatch_size(_sweep())
    assert text_overlaps(fig) == []
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert labels[:2] == ["profile's product, alone", "profile's product, ranks together"]
    assert "gpipe P=2 in the step" in labels and "gpipe P=2 alone" in labels
