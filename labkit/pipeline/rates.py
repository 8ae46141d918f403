"""How fast a pipeline stage computes one microbatch, against the microbatch's size, beside the
machine profile's matrix product of as many operations (pure: no torch).

Why the best M is not the largest: more microbatches shrink the bubble, but each is smaller.
One stage's forward + backward of a microbatch of b samples through L_s Linear(h, h) layers
does F = 6·L_s·b·h² floating-point operations (per weight and sample: 2 in the product
forward, 2 for the input's gradient, 2 for the weight's), whatever M is: per sample the work
is the same, so a block that takes longer per sample *runs slower*. Its rate F / t is read off
the rows with two t: t_slot (``slot_time_s``: in the step, beside the other ranks' blocks) and
the blocks that ran alone (``block_times``' alone_s: the fill and the drain). The machine
profile measured an n×n @ n×n product, alone and with every rank at one at once
(:meth:`labkit.machine.profile.Profile.matmul_flop_per_s`, at the sizes it measured, the
nearest outside them); the square product with as many operations as a block's (b×h)(h×h) has
n = (b·h²)^(1/3). Where the profile's product slows down from one n to the next as much as the
block does, the smaller products explain the block's slowdown; what they do not explain is
the rest of a block (tanh, autograd's bookkeeping and copies), the same for any size.

:func:`add_rates` adds the columns, :func:`rate_table` shows them, :func:`rate_sentence` says
what they measured; :func:`labkit.pipeline.plots.rate_vs_microbatch_size` draws them.
"""

from __future__ import annotations

from labkit.pipeline.schedules import stage_layers
from labkit.pipeline.verdicts import series, trend

GIGA = 1e9


def block_flop(*, layers: float, microbatch_size: float, hidden: int) -> float:
    """F = 6·L·b·h²: one forward + backward of ``microbatch_size`` samples through ``layers``
    Linear(h, h) layers (tanh and the bias are left out: b·h operations each, against b·h²).
    Three layers of 1024, a microbatch of 16: 6 · 3 · 16 · 1024² = 302 million.

    >>> block_flop(layers=3, microbatch_size=16, hidden=1024)
    301989888
    """
    return 6 * layers * microbatch_size * hidden ** 2


def square_size(*, microbatch_size: float, hidden: int) -> float:
    """n of the n×n @ n×n product with as many operations as one (b×h)(h×h) product of a
    block: 2n³ = 2·b·h², n = (b·h²)^(1/3). Width 1024: microbatches of 128 and 16 samples
    match n = 512 and 256.

    >>> round(square_size(microbatch_size=128, hidden=1024), 6), round(square_size(microbatch_size=16, hidden=1024), 6)
    (512.0, 256.0)
    """
    return float(microbatch_size * hidden ** 2) ** (1 / 3)


def rank_layers(*, layers: int, num_stages: int, virtual_stages: int = 1) -> list[int]:
    """Layers each rank computes: its stages r, r + P, ... of the P·V
    (:func:`labkit.pipeline.schedules.stage_layers`). Six layers on four ranks: 2, 2, 1, 1.

    >>> rank_layers(layers=6, num_stages=4), rank_layers(layers=8, num_stages=2, virtual_stages=2)
    ([2, 2, 1, 1], [4, 4])
    """
    spans = stage_layers(layers, num_stages * virtual_stages)
    return [sum(len(spans[s]) for s in range(r, num_stages * virtual_stages, num_stages))
            for r in range(num_stages)]


def alone_flop_per_s(row) -> float | None:
    """One stage's forward + backward (+ W) of one microbatch with no other rank computing
    (FLOP/s): over the ranks whose every kind of block ran alone at least once (``block_times``'
    alone_s), their FLOPs over their alone blocks' seconds; None where no rank's did.

    >>> row = {"layers": 6, "num_stages": 2, "virtual_stages": 1, "microbatch_size": 16,
    ...        "hidden": 1024, "block_times": [
    ...            {"rank": 0, "kind": "F", "alone_s": 0.002}, {"rank": 0, "kind": "B", "alone_s": 0.004},
    ...            {"rank": 1, "kind": "F", "alone_s": None}, {"rank": 1, "kind": "B", "alone_s": 0.004}]}
    >>> round(alone_flop_per_s(row) / 1e9, 1)  # rank 0 alone: 302 MFLOP in 6 ms
    50.3
    """
    per_rank: dict[int, list] = {}
    for t in row["block_times"] or []:
        per_rank.setdefault(int(t["rank"]), []).append(t["alone_s"])
    lays = rank_layers(layers=int(row["layers"]), num_stages=int(row["num_stages"]),
                       virtual_stages=int(row["virtual_stages"]))
    flop = seconds = 0.0
    for rank, times in per_rank.items():
        if times and all(t is not None for t in times):
            flop += block_flop(layers=lays[rank], microbatch_size=row["microbatch_size"],
                               hidden=int(row["hidden"]))
            seconds += sum(times)
    return flop / seconds if seconds > 0 else None


def profiled_size(n: float, machine) -> float:
    """The n at which the profile's rate is read for ``n``: n itself inside the sizes it
    measured (``machine.rows``' alone matrix products), else the nearest of them (a rate is
    not extrapolated: :meth:`labkit.machine.profile.Profile.matmul_flop_per_s`).

    >>> class Machine:
    ...     rows = [{"measurement": "matmul", "context": "alone", "n": k} for k in (64, 256, 512)]
    >>> profiled_size(46.5, Machine()), profiled_size(300.0, Machine())
    (64, 300.0)
    """
    sizes = sorted(r["n"] for r in machine.rows
                   if r.get("measurement") == "matmul" and r.get("context") == "alone")
    return min(max(n, sizes[0]), sizes[-1])


def add_rates(df, machine):
    """``df`` with each row's compute rate (FLOP/s of one stage's block, in the step and alone;
    samples per second in the step) and the profile's matrix-product rate, alone and with
    every rank at once, at the n of as many operations (``machine``: a
    :class:`labkit.machine.Profile`, or anything with its ``rows`` and
    ``matmul_flop_per_s``)."""
    out = df.copy()
    records = df.to_dict("records")
    flop = [block_flop(layers=r["layers"] / r["num_stages"], microbatch_size=r["microbatch_size"],
                       hidden=int(r["hidden"])) for r in records]
    n = [square_size(microbatch_size=r["microbatch_size"], hidden=int(r["hidden"]))
         for r in records]
    return out.assign(
        block_flop=flop,
        block_flop_per_s=[f / r["slot_time_s"] for f, r in zip(flop, records)],
        block_alone_flop_per_s=[alone_flop_per_s(r) for r in records],
        block_samples_per_s=[r["microbatch_size"] / r["slot_time_s"] for r in records],
        matmul_n=n, matmul_n_read=[profiled_size(x, machine) for x in n],
        matmul_flop_per_s=[float(machine.matmul_flop_per_s(x)) for x in n],
        matmul_together_flop_per_s=[float(machine.matmul_flop_per_s(x, together=True)) for x in n])


def rate_table(df):
    """The rates :func:`add_rates` added, in GFLOP/s, one line per (schedule, P, M)."""
    shown = df.assign(**{c.replace("flop_per_s", "gflop_per_s"): df[c].astype(float) / GIGA
                         for c in ("block_flop_per_s", "block_alone_flop_per_s",
                                   "matmul_flop_per_s", "matmul_together_flop_per_s")})
    return shown[["schedule", "num_stages", "num_microbatches", "microbatch_size",
                  "block_samples_per_s", "block_gflop_per_s", "block_alone_gflop_per_s",
                  "matmul_n", "matmul_n_read", "matmul_gflop_per_s",
                  "matmul_together_gflop_per_s"]]


def rate_sentence(df, schedule: str, num_stages: int | None = None) -> str:
    """From the largest microbatch of one schedule's rows to the smallest: how one stage's
    block rate moved in the step and alone, how the profile's product of as many operations
    moved, and how much of the block's slowdown alone the products' size accounts for (the
    ratio of the two ratios is the rest). Every change worded by its printed numbers.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": "gpipe", "num_stages": 2, "num_microbatches": [1, 8],
    ...                    "microbatch_size": [128, 16], "block_flop_per_s": [88e9, 36e9],
    ...                    "block_alone_flop_per_s": [88e9, 46e9], "matmul_n": [512.0, 256.0],
    ...                    "matmul_n_read": [512.0, 256.0], "matmul_flop_per_s": [96e9, 58e9]})
    >>> print(rate_sentence(df, "gpipe"))
    gpipe, P = 2, from microbatches of 128 to 16 samples (M = 1 to 8): one stage's forward + backward in the step falls (88.0 -> 36.0 GFLOP/s: 2.44x the time per sample), alone (the fill and drain) falls (88.0 -> 46.0 GFLOP/s: 1.91x); the profile's matrix product of as many operations (n = 512 to 256) falls (96.0 -> 58.0 GFLOP/s: 1.66x the time per operation). The products' size accounts for 1.66x of the 1.91x alone; the rest of a block, 1.16x.
    """
    part = series(df, schedule, num_stages)
    p = int(part.num_stages.iloc[0])
    big, small = part.iloc[0], part.iloc[-1]
    head = f"{schedule}, P = {p}"
    if len(part) == 1:
        return (f"{head}: one microbatch size only ({big.microbatch_size} samples), its block at "
                f"{big.block_flop_per_s / GIGA:.1f} GFLOP/s in the step, the profile's product "
                f"of as many operations at {big.matmul_flop_per_s / GIGA:.1f}.")

    def moved(a, b):  # "falls (a -> b GFLOP/s: r" : the caller closes it with its factor
        return (trend(a / GIGA, b / GIGA, ".1f", unit=" GFLOP/s").removesuffix(")")
                + f": {a / b:.2f}x")

    text = (f"{head}, from microbatches of {big.microbatch_size} to {small.microbatch_size} "
            f"samples (M = {big.num_microbatches} to {small.num_microbatches}): one stage's "
            f"forward + backward in the step {moved(big.block_flop_per_s, small.block_flop_per_s)}"
            " the time per sample)")
    alone = [big.block_alone_flop_per_s, small.block_alone_flop_per_s]
    have_alone = all(a is not None and a == a for a in alone)  # NaN where none ran alone
    if have_alone:
        text += f", alone (the fill and drain) {moved(*alone)})"
    prod = big.matmul_flop_per_s / small.matmul_flop_per_s
    sizes = f"n = {big.matmul_n:.0f} to {small.matmul_n:.0f}"
    if (big.matmul_n_read, small.matmul_n_read) != (big.matmul_n, small.matmul_n):
        sizes += (f", read at {big.matmul_n_read:.0f} and {small.matmul_n_read:.0f}, the nearest "
                  "sizes the profile measured")
    text += (f"; the profile's matrix product of as many operations ({sizes}) "
             f"{moved(big.matmul_flop_per_s, small.matmul_flop_per_s)} the time per operation).")
    if not have_alone:
        return text + " No rank ran every kind of block alone at both sizes: no share to give."
    ratio = alone[0] / alone[1]
    if ratio <= 1:
        return text + " Alone, the block takes no longer per sample at the smaller size."
    if prod <= 1:
        return text + (f" The profile's product is not slower at the smaller size: none of the "
                       f"{ratio:.2f}x alone comes from the products' size.")
    if prod >= ratio:
        return text + (f" The products' size accounts for all of the {ratio:.2f}x alone (the "
                       f"product slows {prod:.2f}x).")
    return text + (f" The products' size accounts for {prod:.2f}x of the {ratio:.2f}x alone; "
                   f"the rest of a block, {ratio / prod:.2f}x.")
