"""The tensor-parallel lab's laws and sentences about what a rank saves for backward, with and
without sequence parallelism, beside the lab's exact count and Korthikanti et al.'s formulas
(pure: no torch). The other laws of the lab are in :mod:`labkit.tp.verdicts`.

:func:`korthikanti_terms` takes the paper's count apart step by step into this model's terms
(no dropout masks, no s x s softmax with flash attention, 4 bytes a value) and what it leaves
out (the LayerNorms' statistics, the log-sum-exp, the loss); :func:`sp_laws` checks the
sequence-parallel variant's collectives and its saved bytes, the latter also against the
formula the layout model of :mod:`labkit.perfmodel` uses (34 s b h / t a layer).
"""

from __future__ import annotations

from labkit.book.laws import check


def _ms(x: float) -> float:
    return float(x) * 1e3


def activation_law(row) -> dict:
    """The bytes a hand-written version saves for backward on one rank against the lab's exact
    count (:func:`labkit.tp.formulas.saved_activation_bytes`, with sequence parallelism for
    ``sp``), tolerance 10 %."""
    law = ("(L (16 s b h + 4 b s + a b s) + 2 s b h) / P values" if row["variant"] == "sp" else
           "L (s b h (4 + 12/P) + 4 b s + a b s / P) + 2 s b h values")
    return check(f"{row['variant']}, P = {int(row['world_size'])}: saved activations per rank "
                 f"= {law}",
                 predicted=float(row["activation_bytes_formula"]) / 1e6,
                 measured=float(row["activation_bytes_measured"]) / 1e6, unit="MB",
                 tolerance_pct=10.0)


def activation_sentence(row) -> str:
    """How much of a rank's saved activations TP splits, from the row and the lab's count.

    >>> activation_sentence({"variant": "naive", "world_size": 2, "batch_size": 8,
    ...     "seq_len": 32, "hidden": 256, "num_heads": 8, "num_layers": 2,
    ...     "activation_bytes_measured": 5783552.0})
    "naive on 2 ranks: 5.78 MB saved for backward per rank (one rank alone: 8.94 MB); 2.63 MB of it (45%) is kept whole on every rank: the LayerNorms' inputs and outputs and statistics, and the loss, which sequence parallelism would split too"
    """
    from labkit.tp.formulas import saved_activation_bytes

    p = int(row["world_size"])
    kw = {k: int(row[k]) for k in ("batch_size", "seq_len", "hidden", "num_heads",
                                   "num_layers")}
    one, mine = saved_activation_bytes(**kw), saved_activation_bytes(**kw, world_size=p)
    split = (one - mine) * p / (p - 1) if p > 1 else one
    whole = one - split
    m = float(row["activation_bytes_measured"])
    return (f"{row['variant']} on {p} ranks: {m / 1e6:.2f} MB saved for backward per rank (one "
            f"rank alone: {one / 1e6:.2f} MB); {whole / 1e6:.2f} MB of it ({whole / m:.0%}) is "
            "kept whole on every rank: the LayerNorms' inputs and outputs and statistics, and "
            "the loss, which sequence parallelism would split too")


# ---------------------------------------------------------------- sequence parallelism

def sp_laws(row) -> list[dict]:
    """The sequence-parallel row's exact laws: the parameters a rank holds, and at P > 1 its
    all-gathers (6 L), reduce-scatters (4 L) and all-reduce (1) counted, and every byte they
    carried (:func:`labkit.tp.formulas.sp_collectives`), tolerance 0; then its saved
    activations against the lab's count (:func:`activation_law`) and against the formula the
    layout model of :mod:`labkit.perfmodel` uses, 34 s b h / t a layer, in this model's terms
    (a published law, 10 %: the paper leaves out a few terms, :func:`korthikanti_terms`)."""
    p = int(row["world_size"])
    pre = f"TP + SP by hand, P = {p}"
    out = [check(f"{pre}: parameters per rank = L ((12 h^2 + 7 h)/P + 6 h)",
                 predicted=row["params_per_rank_formula"], measured=row["params_per_rank"],
                 tolerance_pct=0)]
    if p > 1:
        for op, what, law in (("allgather", "all-gathers", "6 L"),
                              ("reduce_scatter", "reduce-scatters", "4 L"),
                              ("allreduce", "all-reduces", "1")):
            out.append(check(f"{pre}: {what} per step = {law}",
                             predicted=row[f"{op}_calls_formula"],
                             measured=row[f"{op}_calls_measured"], tolerance_pct=0))
        out.append(check(f"{pre}: bytes of its collectives per step = (10 L b s h + 6 h L) x 4 B",
                         predicted=row["comm_bytes_formula"], measured=row["comm_bytes_measured"],
                         unit="B", tolerance_pct=0))
    out.append(activation_law(row))
    out.append(check(f"{pre}: saved activations per rank = the layout model's 34 s b h / t a "
                     "layer (Korthikanti et al., with sequence parallelism) in this model's "
                     "terms, 64 s b h / t bytes", kind="published", source=KORTHIKANTI,
                     predicted=float(row["activation_korthikanti_sp_fp32_bytes"]) / 1e6,
                     measured=float(row["activation_bytes_measured"]) / 1e6, unit="MB",
                     tolerance_pct=10.0,
                     note="the paper leaves out the LayerNorms' statistics, the log-sum-exp "
                          "and the loss"))
    return out


#: where the activation formulas of :func:`labkit.tp.formulas.korthikanti_activation_bytes`
#: come from
KORTHIKANTI = ("Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer "
               "Models (arXiv:2205.05198): activations per layer s b h (10 + 24/t + 5 a s/(h t)) "
               "with tensor parallelism, s b h (34 + 5 a s/h) / t with sequence parallelism")


def korthikanti_terms(row) -> dict:
    """Korthikanti et al.'s count for a row (with sequence parallelism for ``sp``) taken apart
    in bytes: ``published`` (16-bit values, 1-byte dropout masks, the s x s softmax kept),
    what this model lacks (``masks``: it has no dropout; ``softmax``: flash attention keeps no
    s x s term), what fp32 adds (``fp32``: 4 bytes a value, not 2), ``lab_terms`` (the three
    applied: the paper's count in this model's terms) and ``extra`` (the lab's exact count
    less that: what the paper leaves out).

    >>> t = korthikanti_terms({"variant": "sp", "world_size": 2, "batch_size": 8, "seq_len": 32,
    ...                        "hidden": 256, "num_heads": 8, "num_layers": 2,
    ...                        "activation_bytes_formula": 4468736.0})
    >>> {k: round(v / 1e6, 4) for k, v in t.items()}
    {'published': 2.5559, 'masks': 0.1966, 'softmax': 0.2621, 'fp32': 2.0972, 'lab_terms': 4.1943, 'extra': 0.2744}
    """
    from labkit.tp.formulas import BYTES_PER_VALUE, korthikanti_activation_bytes

    kw = {k: int(row[k]) for k in ("batch_size", "seq_len", "hidden", "num_heads",
                                   "num_layers")}
    kw.update(tp=int(row["world_size"]), sequence_parallel=row["variant"] == "sp")

    def k(values=2, masks=1, flash=False):
        return korthikanti_activation_bytes(**kw, bytes_per_value=values, mask_bytes=masks,
                                            flash=flash)

    lab = k(BYTES_PER_VALUE, 0, True)
    # one step after the other: no masks, then no s x s values, then 4 bytes a value
    return {"published": k(), "masks": k() - k(masks=0),
            "softmax": k(masks=0) - k(masks=0, flash=True),
            "fp32": lab - k(masks=0, flash=True), "lab_terms": lab,
            "extra": float(row["activation_bytes_formula"]) - lab}


def korthikanti_sentence(row) -> str:
    """A row's measured saved activations against Korthikanti et al.'s formula (without or
    with sequence parallelism, as the row ran), the published count turned into this model's
    terms step by step (:func:`korthikanti_terms`), each step's bytes said.

    >>> print(korthikanti_sentence({"variant": "sp", "world_size": 2, "batch_size": 8,
    ...     "seq_len": 32, "hidden": 256, "num_heads": 8, "num_layers": 2,
    ...     "activation_bytes_formula": 4468736.0, "activation_bytes_measured": 4468736.0}))
    sp on 2 ranks, 4.47 MB saved for backward per rank (the lab's count 4.47 MB, +0.0%): Korthikanti et al. with sequence parallelism, s b h 34/t bytes a layer in 16-bit with dropout plus 5 a s/h s b h/t of s x s softmax, count 2.56 MB; this model has no dropout (0.20 MB of masks less), uses flash attention (0.26 MB of s x s softmax less) and computes in fp32 (2.10 MB more): 4.19 MB in its terms (6.1% below the measured); the rest, 0.27 MB, is what the paper leaves out: the LayerNorms' statistics, the attention's log-sum-exp and the loss.
    """
    t = korthikanti_terms(row)
    m = float(row["activation_bytes_measured"])
    count = float(row["activation_bytes_formula"])
    sp = row["variant"] == "sp"
    law = ("with sequence parallelism, s b h 34/t bytes a layer" if sp else
           "without sequence parallelism, s b h (10 + 24/t) bytes a layer")
    soft = "5 a s/h s b h/t" if sp else "5 a s/(h t) s b h"
    d = 100 * (t["lab_terms"] - m) / m
    return (f"{row['variant']} on {int(row['world_size'])} ranks, {m / 1e6:.2f} MB saved for "
            f"backward per rank (the lab's count {count / 1e6:.2f} MB, "
            f"{100 * (count - m) / m:+.1f}%): Korthikanti et al. {law} in 16-bit with dropout "
            f"plus {soft} of s x s softmax, count {t['published'] / 1e6:.2f} MB; this model has "
            f"no dropout ({t['masks'] / 1e6:.2f} MB of masks less), uses flash attention "
            f"({t['softmax'] / 1e6:.2f} MB of s x s softmax less) and computes in fp32 "
            f"({t['fp32'] / 1e6:.2f} MB more): {t['lab_terms'] / 1e6:.2f} MB in its terms "
            f"({abs(d):.1f}% {'below' if d < 0 else 'above'} the measured); the rest, "
            f"{t['extra'] / 1e6:.2f} MB, is what the paper leaves out: the LayerNorms' "
            "statistics, the attention's log-sum-exp and the loss.")


def sp_sentence(naive, sp) -> str:
    """What sequence parallelism changed against the teaching version at the same P: the bytes
    saved for backward per rank (beside the lab's count for one rank over P) and the bytes its
    collectives carried and sent, both measured.

    >>> naive = {"world_size": 2, "batch_size": 8, "seq_len": 32, "hidden": 256,
    ...          "num_heads": 8, "num_layers": 2, "activation_bytes_measured": 5783552.0,
    ...          "comm_bytes_measured": 2097152, "step_time_p50_s": 0.08}
    >>> print(sp_sentence(naive, {"activation_bytes_measured": 4468736.0,
    ...                           "comm_bytes_measured": 5255168, "step_time_p50_s": 0.09}))
    sequence parallelism on 2 ranks: 4.47 MB saved for backward per rank against 5.78 MB without it (0.77x), one rank's 8.94 MB (the lab's count) over 2 = 4.47 MB: the 2.63 MB TP keeps whole on every rank is split too; its collectives carried 5.26 MB of buffers against 2.10 MB of all-reduces, but a ring sends (P-1)/P of an all-gather's or a reduce-scatter's buffer per rank and twice that of an all-reduce's: 2.63 MB against 2.10 MB sent per rank (1.25x: the LayerNorms' outputs gathered again in backward); the step 90.0 ms against 80.0 ms.
    """
    from labkit.tp.formulas import saved_activation_bytes

    p = int(naive["world_size"])
    kw = {k: int(naive[k]) for k in ("batch_size", "seq_len", "hidden", "num_heads",
                                     "num_layers")}
    one, tp = saved_activation_bytes(**kw), saved_activation_bytes(**kw, world_size=p)
    whole = (p * tp - one) / (p - 1)  # kept whole on every rank: tp = whole + (one - whole)/P
    a, b = float(sp["activation_bytes_measured"]), float(naive["activation_bytes_measured"])
    s_bytes, n_bytes = float(sp["comm_bytes_measured"]), float(naive["comm_bytes_measured"])
    # (P-1)/P of each buffer per rank for an all-gather or reduce-scatter, twice that for an
    # all-reduce (sp's small all-reduce of gradients counted as a gather: 0.2 % of its bytes)
    k = (p - 1) / p
    sent_sp, sent_tp = k * s_bytes, 2 * k * n_bytes
    return (f"sequence parallelism on {p} ranks: {a / 1e6:.2f} MB saved for backward per rank "
            f"against {b / 1e6:.2f} MB without it ({a / b:.2f}x), one rank's "
            f"{one / 1e6:.2f} MB (the lab's count) over {p} = {one / p / 1e6:.2f} MB: the "
            f"{whole / 1e6:.2f} MB TP keeps whole on every rank is split too; its collectives "
            f"carried {s_bytes / 1e6:.2f} MB of buffers against {n_bytes / 1e6:.2f} MB of "
            "all-reduces, but a ring sends (P-1)/P of an all-gather's or a reduce-scatter's "
            "buffer per rank and twice that of an all-reduce's: "
            f"{sent_sp / 1e6:.2f} MB against {sent_tp / 1e6:.2f} MB sent per rank "
            f"({sent_sp / sent_tp:.2f}x: the LayerNorms' outputs gathered again in backward); "
            f"the step {_ms(sp['step_time_p50_s']):.1f} ms against "
            f"{_ms(naive['step_time_p50_s']):.1f} ms.")
