"""The activations a pipeline stage holds: what its schedule implies, the law rows and the
verdict sentence notebook 07 prints (pure: no torch).

A stage keeps a microbatch's saved activations from its forward to its backward (to its weight
gradient, where the schedule splits one off), so how many it holds at once is the schedule's
doing: GPipe runs all M forwards first and holds M microbatches, 1F1B starts backwards after
P − r forwards on rank r and holds at most min(P − r, M). Each microbatch is b/M of the batch,
so GPipe holds the whole batch's activations whatever M is, 1F1B P/M of them: that, not a
smaller bubble, is why 1F1B exists. :func:`peak_activation_formula` is the bytes stage 0
should hold, the worker measures what it does hold (``peak_activation_bytes``,
:class:`labkit.memory.SavedActivations`), :func:`activation_laws` and
:func:`activation_sentence` set them side by side.
"""

from __future__ import annotations

from labkit.config import positive_int
from labkit.pipeline.schedules import simulate, stage_layers
from labkit.pipeline.verdicts import trend
from labkit.results import select_rows

#: how close stage 0's measured peak of saved activations should come to the formula (percent,
#: symmetric): both count the same tensors, so only a tensor the formula leaves out can miss
ACTIVATION_TOLERANCE_PCT = 10.0
MIB = 2 ** 20


def stage_activation_bytes(*, layers: int, microbatch_size: int, hidden: int,
                           first_stage: bool) -> int:
    """The bytes autograd saves for one microbatch on a stage of ``layers`` Linear+tanh blocks:
    each tanh saves its output, each Linear its input (its weight is held anyway), and a
    Linear's input is the tanh output before it (one tensor, counted once), except the stage's
    first Linear's: the stage's input, a received activation, or on the first stage a slice of
    the batch, which the step holds anyway. Each is b/M × hidden float32 numbers:
    (layers + [not the first stage]) × (b/M) × hidden × 4.

    The lab's default model on P = 2 (4 layers a stage, hidden 512, batch 128, M = 8):

    >>> stage_activation_bytes(layers=4, microbatch_size=16, hidden=512, first_stage=True)
    131072
    >>> stage_activation_bytes(layers=4, microbatch_size=16, hidden=512, first_stage=False)
    163840
    """
    tensors = positive_int("layers", layers) + (0 if first_stage else 1)
    return tensors * positive_int("microbatch_size", microbatch_size) * \
        positive_int("hidden", hidden) * 4


def held_peak_bytes(blocks, *, rank: int, stage_bytes: dict) -> int:
    """The most activation bytes ``rank`` holds at once in a step, its blocks replayed in time
    order: a forward of (stage, microbatch) adds ``stage_bytes[stage]``, that microbatch's last
    backward pass on the stage frees them (its W where there is one: the weight gradient needs
    the saved inputs; else its B). ``blocks``: dicts with rank, stage, kind, microbatch,
    start_s (an ideal schedule, :func:`labkit.pipeline.schedules.simulate`, or a measured step).

    GPipe runs every forward before the first backward: stage 0 holds M microbatches. 1F1B
    starts backwards after P − r forwards on rank r: stage 0 holds min(P, M). P = 2, M = 4,
    1 byte a microbatch:

    >>> def on_rank0(order):
    ...     return [dict(rank=0, stage=0, kind=k, microbatch=i, start_s=t)
    ...             for t, (k, i) in enumerate(order)]
    >>> gpipe = [("F", i) for i in range(4)] + [("B", i) for i in range(4)]
    >>> f1b1 = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    >>> [held_peak_bytes(on_rank0(o), rank=0, stage_bytes={0: 1}) for o in (gpipe, f1b1)]
    [4, 2]
    """
    mine = sorted((b for b in blocks if int(b["rank"]) == rank), key=lambda b: b["start_s"])
    has_w = {(int(b["stage"]), int(b["microbatch"])) for b in mine if b["kind"] == "W"}
    held = peak = 0
    for b in mine:
        key = (int(b["stage"]), int(b["microbatch"]))
        if b["kind"] == "F":
            held += stage_bytes[key[0]]
        elif b["kind"] == ("W" if key in has_w else "B"):
            held -= stage_bytes[key[0]]
        peak = max(peak, held)
    return peak


def peak_activation_formula(schedule: str, *, num_stages: int, num_microbatches: int,
                            layers: int, hidden: int, batch: int, virtual_stages: int = 1,
                            rank: int = 0) -> int:
    """The most activation bytes rank ``rank`` holds at once in a step: its blocks in the ideal
    schedule (:func:`labkit.pipeline.schedules.simulate`, torch's order) replayed by
    :func:`held_peak_bytes`, a microbatch of each of its stages
    counted by :func:`stage_activation_bytes` (the layers split as
    :func:`~labkit.pipeline.schedules.stage_layers` splits them, V chunks a rank interleaved).

    The lab's default model (8 layers, hidden 512, batch 128) on P = 2 at M = 8: a microbatch
    saves 4 × 16 × 512 × 4 bytes = 128 KiB on stage 0; GPipe holds 8 of them (1 MiB), 1F1B
    and ZB-H1 P = 2. Interleaved with V = 2 (chunks of 2 layers; rank 0's second chunk, stage
    2, saves its received input too) holds 5 chunk-microbatches: 3 of stage 0, 2 of stage 2,
    3 × 2 + 2 × 3 = 12 tensors of 16 × 512 numbers:

    >>> kw = dict(num_stages=2, num_microbatches=8, layers=8, hidden=512, batch=128)
    >>> [peak_activation_formula(s, **kw) for s in ("gpipe", "1f1b", "zero_bubble")]
    [1048576, 262144, 262144]
    >>> peak_activation_formula("interleaved", virtual_stages=2, **kw) // (16 * 512 * 4)
    12
    """
    v = virtual_stages if schedule == "interleaved" else 1
    blocks = simulate(schedule, num_stages, num_microbatches, virtual_stages=v)
    spans = stage_layers(layers, num_stages * v)
    per_stage = {s: stage_activation_bytes(layers=len(span), microbatch_size=batch //
                                           num_microbatches, hidden=hidden, first_stage=s == 0)
                 for s, span in enumerate(spans)}
    return held_peak_bytes(blocks, rank=rank, stage_bytes=per_stage)


def _at(df, num_microbatches):
    """The rows measured (with a formula) at ``num_microbatches``, the largest M when None."""
    from labkit.errors import UsageError

    rows = df[df.peak_activation_bytes.notna() & df.peak_activation_bytes_formula.notna()]
    if rows.empty:
        raise UsageError("no row has a measured peak of saved activations and its formula")
    m = int(rows.num_microbatches.max()) if num_microbatches is None else num_microbatches
    return select_rows(rows, num_microbatches=m), m


def activation_laws(df, num_microbatches: int | None = None,
                    tolerance_pct: float = ACTIVATION_TOLERANCE_PCT) -> list[dict]:
    """At one M (the largest measured when not given): per schedule and P, stage 0's measured
    peak of saved activations against :func:`peak_activation_formula`; and where GPipe and
    1F1B were both measured, GPipe's peak over 1F1B's against M/P (M microbatches held against
    P). Kind ``model``, in MiB."""
    from labkit.book import laws

    part, m = _at(df, num_microbatches)
    out = [laws.check(f"peak activations of stage 0, {r.schedule} P={r.num_stages} M={m}",
                      predicted=r.peak_activation_bytes_formula / MIB,
                      measured=r.peak_activation_bytes / MIB, kind="model", unit="MiB",
                      tolerance_pct=tolerance_pct,
                      note="saved for backward, without weights and batch")
           for r in part.itertuples()]
    for p, g in part.groupby("num_stages", sort=False):
        peaks = {r.schedule: r.peak_activation_bytes for r in g.itertuples()}
        if "gpipe" in peaks and "1f1b" in peaks:
            out.append(laws.check(f"peak activations GPipe over 1F1B, P={p} M={m}",
                                  predicted=m / p, measured=peaks["gpipe"] / peaks["1f1b"],
                                  kind="model", tolerance_pct=tolerance_pct,
                                  note="M microbatches held against P"))
    return out


def _error(check: dict) -> str:
    """A law row's signed error as the sentences print it ("n/a" where there is no ratio)."""
    return "n/a" if check["error_pct"] is None else f"{check['error_pct']:+.1f}%"


def activation_sentence(df, num_microbatches: int | None = None,
                        tolerance_pct: float = ACTIVATION_TOLERANCE_PCT) -> str:
    """Whether stage 0 held what its schedule implies at one M (judged as
    :func:`activation_laws` judges: the same rows), how GPipe's peak compares with 1F1B's, and
    how each moved from the smallest M measured to that M.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"schedule": ["gpipe", "gpipe", "1f1b", "1f1b"], "num_stages": 2,
    ...                    "num_microbatches": [2, 8, 2, 8],
    ...                    "peak_activation_bytes": [2 * MIB, 2 * MIB, 2 * MIB, MIB // 2],
    ...                    "peak_activation_bytes_formula": [2 * MIB, 2 * MIB, 2 * MIB, MIB // 2]})
    >>> print(activation_sentence(df))
    At M = 8, stage 0 held gpipe 2 MiB, 1f1b 0.5 MiB of saved activations: each within 10% of what its schedule implies (largest error +0.0%). GPipe held 4.00x 1F1B's (M/P = 4): within 10% (+0.0%). GPipe's peak from M = 2 to 8: stays at 2 (2 -> 2 MiB). 1F1B's peak from M = 2 to 8: falls (2 -> 0.5 MiB).
    """
    checks = activation_laws(df, num_microbatches, tolerance_pct)
    part, m = _at(df, num_microbatches)
    held = ", ".join(f"{r.schedule} {r.peak_activation_bytes / MIB:.3g} MiB"
                     for r in part.itertuples())
    each = list(zip(part.itertuples(), checks))
    misses = [f"{r.schedule} more than {tolerance_pct:g}% from what its schedule implies "
              f"({_error(c)})" for r, c in each if not c["holds"]]
    worst = max((c for _, c in each),
                key=lambda c: float("inf") if c["error_pct"] is None else abs(c["error_pct"]))
    text = [f"At M = {m}, stage 0 held {held} of saved activations: " + (
        "; ".join(misses) if misses else
        f"each within {tolerance_pct:g}% of what its schedule implies "
        f"(largest error {_error(worst)})") + "."]
    for c in checks[len(each):]:
        verdict = "within" if c["holds"] else "more than"
        text.append(f"GPipe held {c['measured']:.2f}x 1F1B's (M/P = {c['predicted']:g}): "
                    f"{verdict} {tolerance_pct:g}% ({_error(c)}).")
    for s, name in (("gpipe", "GPipe's"), ("1f1b", "1F1B's")):
        rows = select_rows(df, schedule=s).dropna(subset=["peak_activation_bytes"])
        rows = rows[rows.num_microbatches <= m].sort_values("num_microbatches", kind="stable")
        if rows.num_microbatches.nunique() > 1 and rows.num_microbatches.iloc[-1] == m:
            first, last = rows.iloc[0], rows.iloc[-1]
            text.append(f"{name} peak from M = {first.num_microbatches} to {m}: " + trend(
                first.peak_activation_bytes / MIB, last.peak_activation_bytes / MIB, ".3g",
                unit=" MiB") + ".")
    return " ".join(text)
