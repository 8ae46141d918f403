"""Each TP rank's compute rate measured beside the machine profile's matrix products at the
sizes of its products: whether a rank's share of a layer ran in its share of the whole's time
(pure: no torch). Notebook 09's section 3 prints them."""

from __future__ import annotations


def rate_rows(one, row, prof) -> list[dict]:
    """Each TP rank's compute rate measured (one rank's FLOPs per step over its median step
    with f and g off) beside the profile's matrix-product rate at the sizes of its products
    (:func:`labkit.tp.formulas.products_rate`: alone for the 1-rank run and for the launch's
    share of a layer timed alone, with every rank at it at once for the ranks of a
    ``world_size`` launch). ``one``: the 1-rank row; ``row``: a row at P > 1."""
    from labkit.tp.formulas import flops_per_rank, layer_products, products_rate

    kw = {k: int(row[k]) for k in ("batch_size", "seq_len", "hidden", "num_heads")}
    p, L = int(row["world_size"]), int(row["num_layers"])
    flops = {n: flops_per_rank(**{k: v for k, v in kw.items() if k != "num_heads"},
                               num_layers=L, world_size=n) for n in (1, p)}

    def profile(n, together):
        return products_rate(layer_products(**kw, world_size=n),
                             lambda cube: prof.matmul_flop_per_s(cube, together=together))

    cases = [("1 rank: the whole model, f and g off, alone", 1, False,
              flops[1] / float(one["compute_time_p50_s"]))]
    cases += [(f"rank {r} of {p}: its share, f and g off, {p} ranks at once", p, True,
               flops[p] / float(t)) for r, t in enumerate(row["compute_time_rank_p50_s"])]
    cases.append((f"a rank of {p}: its share of one layer, alone (the launch's rate)", p, False,
                  float(row["compute_flop_per_s"])))
    out = []
    for what, n, together, rate in cases:
        prod = profile(n, together)
        out.append({"what": what, "ranks": n, "together": together, "matrix_n": prod["n"],
                    "measured_flop_per_s": rate, "profile_flop_per_s": prod["flop_per_s"],
                    "measured_over_profile": rate / prod["flop_per_s"]})
    return out


def rate_sentence(one, row, prof) -> str:
    """Whether a rank's share of the matrix products ran in less than its share of the time,
    measured (:func:`rate_rows`: each rank's FLOPs over its median step with f and g off),
    against what the profile's matrix products at those sizes say.

    >>> one = {"world_size": 1, "batch_size": 8, "seq_len": 32, "hidden": 256, "num_heads": 8,
    ...        "num_layers": 2, "compute_time_p50_s": 0.09, "compute_flop_per_s": 3e10}
    >>> two = {**one, "world_size": 2, "compute_time_rank_p50_s": [0.04, 0.042],
    ...        "compute_flop_per_s": 3.2e10}
    >>> from labkit.tp.verdicts import FakeProfile
    >>> print(rate_sentence(one, two, FakeProfile()))
    a rank's half of the products (n = 278 against 350 for the whole) ran at 30.8 and 29.4 GFLOP/s, the whole model on one rank at 27.4 GFLOP/s: the slower rank took 0.47 of the whole's time, below 1/2 (its rate 1.07x the whole's); the profile's products at these sizes, 2 ranks at once against one alone, predict 0.65 of the time (their rate 0.77x): the layer's other work runs the products at 0.84x and 1.17x of the profile's rate.
    """
    rows = rate_rows(one, row, prof)
    p = int(row["world_size"])
    whole, ranks = rows[0], rows[1:1 + p]
    slow = min(ranks, key=lambda r: r["measured_flop_per_s"])
    ratio = whole["measured_flop_per_s"] / slow["measured_flop_per_s"] / p
    model = whole["profile_flop_per_s"] / slow["profile_flop_per_s"] / p
    rates = " and ".join(f"{r['measured_flop_per_s'] / 1e9:.1f}" for r in ranks)
    where = "below" if ratio < 1 / p else "above" if ratio > 1 / p else "exactly"
    share = "half" if p == 2 else f"1/{p}"
    return (f"a rank's {share} of the products (n = {slow['matrix_n']:.0f} against "
            f"{whole['matrix_n']:.0f} for the whole) ran at {rates} GFLOP/s, the whole model on "
            f"one rank at {whole['measured_flop_per_s'] / 1e9:.1f} GFLOP/s: the slower rank took "
            f"{ratio:.2f} of the whole's time, {where} 1/{p} (its rate "
            f"{slow['measured_flop_per_s'] / whole['measured_flop_per_s']:.2f}x the whole's); "
            f"the profile's products at these sizes, {p} ranks at once against one alone, "
            f"predict {model:.2f} of the time (their rate "
            f"{slow['profile_flop_per_s'] / whole['profile_flop_per_s']:.2f}x): the layer's "
            f"other work runs the products at {whole['measured_over_profile']:.2f}x and "
            f"{slow['measured_over_profile']:.2f}x of the profile's rate.")
