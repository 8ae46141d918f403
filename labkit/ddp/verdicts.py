"""The data-parallel training lab's verdicts: the sentences notebook 05 and ``labkit ddp``
print, each computed from the numbers it is given (pure: no torch).

:func:`pays_sentence` whether DDP pays against one process over a batch sweep;
:func:`model_sentence` how well the model of a DDP step held; :func:`threads_sentence` ranks
against one process with every core as a thread; :func:`crossover_sentence` the measured and
predicted crossover of :func:`labkit.ddp.report.crossover`; :func:`agreement_sentence` at which
batches the model says rightly whether DDP pays; :func:`weak_sentence` weak scaling beside the
model and the co-run slowdown; :func:`overlap_sentence` what the buckets hid;
:func:`ab_sentence` the bucket A/B, measured and in the model; :func:`ab_rounds_sentence` the
A/B timed in turn, a difference only beyond its rounds' spread; :func:`timeline_sentence` the
overlap as the timeline measured it; :func:`mfu_sentence` a step's compute rate.
"""

from __future__ import annotations

import math


def pays_sentence(batches, speedups, *, ranks: int = 2) -> str:
    """The verdict of a batch sweep against the no-DDP process, from its numbers.

    >>> pays_sentence([16, 32, 64, 128], [0.8, 0.9, 1.1, 1.3])
    'DDP on 2 ranks pays from batch 45 per rank on: 0.90x at batch 32, 1.10x at batch 64.'
    >>> pays_sentence([16, 32, 64, 128], [0.8, 0.9, 0.95, 0.97])
    'DDP on 2 ranks does not pay at any batch swept: at best 0.97x, at batch 128 per rank.'
    >>> pays_sentence([16, 32], [1.2, 1.5])
    'DDP on 2 ranks pays at every batch swept, from batch 16 per rank on (1.20x there).'
    """
    from labkit.ddp.formulas import crossover_batch

    pairs = sorted(zip((int(b) for b in batches), (float(x) for x in speedups)))
    who = f"DDP on {ranks} ranks"
    if all(x >= 1 for _, x in pairs):
        return (f"{who} pays at every batch swept, from batch {pairs[0][0]} per rank on "
                f"({pairs[0][1]:.2f}x there).")
    if all(x < 1 for _, x in pairs):
        bb, best = max(pairs, key=lambda p: p[1])
        return (f"{who} does not pay at any batch swept: at best {best:.2f}x, at batch {bb} "
                "per rank.")
    if pairs[-1][1] < 1:
        won = ", ".join(f"{b}" for b, x in pairs if x >= 1)
        return (f"{who} does not pay at the largest batch swept ({pairs[-1][1]:.2f}x at "
                f"{pairs[-1][0]} per rank), though it did at batch {won}: noise, or a sweep "
                "to run again.")
    last = max(i for i, (_, x) in enumerate(pairs) if x < 1)
    (b0, s0), (b1, s1) = pairs[last], pairs[last + 1]
    star = crossover_batch([b for b, _ in pairs], [x for _, x in pairs])
    return (f"{who} pays from batch {star:.0f} per rank on: {s0:.2f}x at batch {b0}, "
            f"{s1:.2f}x at batch {b1}.")


def model_sentence(batches, errors_pct, *, tolerance_pct: float = 25.0) -> str:
    """How well the model of the DDP step held over a sweep, from its errors (%).

    >>> model_sentence([16, 64, 1024], [5.0, -12.0, 3.0])
    "The model's speedup errs by at most 12% (batch 64, -12%): within 25% at every batch."
    >>> model_sentence([16, 64, 1024], [31.0, -12.0, 3.0])
    "The model's speedup errs by more than 25% at 1 of 3 batches: batch 16 (+31%)."
    >>> model_sentence([16, 64], [25.3, 2.0])
    "The model's speedup errs by more than 25% at 1 of 2 batches: batch 16 (+25.3%)."
    """
    pairs = [(int(b), float(e)) for b, e in zip(batches, errors_pct)]
    miss = [(b, e) for b, e in pairs if not abs(e) <= tolerance_pct]
    if not miss:
        b, e = max(pairs, key=lambda p: abs(p[1]))
        return (f"The model's speedup errs by at most {abs(e):.0f}% (batch {b}, {e:+.0f}%): "
                f"within {tolerance_pct:g}% at every batch.")
    # one decimal where the whole percent would read as the tolerance itself (25.3% as "25%")
    shown = [(b, f"{e:+.0f}" if round(abs(e)) > tolerance_pct else f"{e:+.1f}") for b, e in miss]
    return (f"The model's speedup errs by more than {tolerance_pct:g}% at {len(miss)} of "
            f"{len(pairs)} batches: " + ", ".join(f"batch {b} ({e}%)" for b, e in shown)
            + ".")


def threads_sentence(*, batch: int, ranks: int, threads: int, ratio: float) -> str:
    """The verdict of ranks against one process with every core as a thread.

    >>> threads_sentence(batch=1024, ranks=2, threads=2, ratio=0.93)
    'At batch 1024 per rank, 2 one-thread DDP ranks train 0.93x the samples per second of one no-DDP process with 2 threads: the one process wins.'
    >>> threads_sentence(batch=64, ranks=2, threads=2, ratio=1.1).endswith("the ranks win.")
    True
    """
    who = "the ranks win" if ratio > 1 else "the one process wins"
    return (f"At batch {batch} per rank, {ranks} one-thread DDP ranks train {ratio:.2f}x the "
            f"samples per second of one no-DDP process with {threads} threads: {who}.")


def crossover_sentence(c: dict) -> str:
    """Measured and predicted crossover (:func:`crossover`) in one sentence, whatever their
    values (inside the sweep, outside it, never).

    >>> crossover_sentence({"world_size": 2, "measured": 45.3, "predicted": 42.0,
    ...                     "batches": [16, 1024]})
    "Crossover at 2 ranks: measured batch 45 per rank, predicted 42 (from the lines of t_no_DDP and of the model's compute t_alone s, and what DDP adds)."
    >>> crossover_sentence({"world_size": 2, "measured": float("nan"),
    ...                     "predicted": float("inf"), "batches": [16, 1024]})
    "Crossover at 2 ranks: measured not inside the sweep (16 to 1024 per rank), predicted never (from the lines of t_no_DDP and of the model's compute t_alone s, and what DDP adds)."
    >>> crossover_sentence({"world_size": 2, "measured": float("nan"), "predicted": 20.0,
    ...                     "predicted_from": "sweep", "batches": [8, 32]}).split("(from ")[1]
    "the model's speedups along the sweep: a step that did not grow with the batch gives no line to extend)."
    """
    def say(x):
        if x != x:
            return f"not inside the sweep ({min(c['batches'])} to {max(c['batches'])} per rank)"
        if x == math.inf:
            return "never"
        if x == 0:
            return "at any batch"
        return f"{x:.0f}"

    how = ("from the model's speedups along the sweep: a step that did not grow with the "
           "batch gives no line to extend" if c.get("predicted_from") == "sweep"
           else "from the lines of t_no_DDP and of the model's compute t_alone s, and what DDP "
           "adds")
    return (f"Crossover at {c['world_size']} ranks: measured "
            f"{'batch ' if c['measured'] == c['measured'] else ''}{say(c['measured'])}"
            f"{' per rank' if c['measured'] == c['measured'] else ''}, predicted "
            f"{say(c['predicted'])} ({how}).")


def weak_sentence(*, ranks: int, batch: int, measured: float, predicted: float,
                  slowdown: float) -> str:
    """Weak scaling against 1-rank DDP, measured beside the model, and what the co-run slowdown
    alone would leave of the ideal N.

    >>> weak_sentence(ranks=2, batch=128, measured=1.55, predicted=1.6, slowdown=1.2)
    '2 ranks train 1.55x the samples per second of 1-rank DDP at batch 128 per rank (the model: 1.60x, ideal 2); ranks computing at once run 1.20x slower than one alone, which alone leaves 1.67x of 2.'
    >>> weak_sentence(ranks=2, batch=128, measured=1.95, predicted=1.9, slowdown=1.0)
    '2 ranks train 1.95x the samples per second of 1-rank DDP at batch 128 per rank (the model: 1.90x, ideal 2); ranks computing at once run as fast as one alone (1.00x).'
    """
    head = (f"{ranks} ranks train {measured:.2f}x the samples per second of 1-rank DDP at "
            f"batch {batch} per rank (the model: {predicted:.2f}x, ideal {ranks}); ")
    if slowdown <= 1.02:
        return head + f"ranks computing at once run as fast as one alone ({slowdown:.2f}x)."
    return head + (f"ranks computing at once run {slowdown:.2f}x slower than one alone, which "
                   f"alone leaves {ranks / slowdown:.2f}x of {ranks}.")


def agreement_sentence(batches, predicted, measured, *, tie: float = 0.05) -> str:
    """Whether the model says rightly at which batches DDP pays (speedup above 1), batch by
    batch (a measured speedup within ``tie`` of 1 agrees with either answer).

    >>> agreement_sentence([16, 32, 64], [0.9, 1.2, 1.6], [0.8, 1.1, 1.5])
    'The model says rightly whether DDP pays at 3 of 3 batches.'
    >>> agreement_sentence([16, 32, 64], [1.1, 1.2, 1.6], [0.8, 1.1, 1.5])
    'The model says rightly whether DDP pays at 2 of 3 batches; wrong at batch 16 (predicted 1.10x, measured 0.80x): choosing DDP there by the model gives 20% less throughput than the one process.'
    >>> agreement_sentence([16, 32, 64], [1.1, 1.2, 1.6], [0.8, 0.9, 1.5])
    'The model says rightly whether DDP pays at 1 of 3 batches; wrong at batch 16 (predicted 1.10x, measured 0.80x), batch 32 (predicted 1.20x, measured 0.90x); at the worst of them, batch 16, choosing DDP by the model gives 20% less throughput than the one process.'
    >>> agreement_sentence([16, 32], [0.9, 1.2], [1.3, 1.1])
    'The model says rightly whether DDP pays at 1 of 2 batches; wrong at batch 16 (predicted 0.90x, measured 1.30x): choosing the one process there by the model gives 23% less throughput than DDP.'
    """
    from labkit.ddp.predict import choice_cost

    rows = [(int(b), float(p), float(m)) for b, p, m in zip(batches, predicted, measured)]
    wrong = [(b, p, m) for b, p, m in rows if not (abs(m - 1) <= tie or (p > 1) == (m > 1))]
    head = (f"The model says rightly whether DDP pays at {len(rows) - len(wrong)} of "
            f"{len(rows)} batches")
    if not wrong:
        return head + "."
    worst, at = choice_cost([p for _, p, _ in rows], [m for _, _, m in rows])
    cost = ""
    if at is not None:
        b, p, m = rows[at]
        picked, other = ("DDP", "the one process") if p > 1 else ("the one process", "DDP")
        lead = (": choosing {} there" if len(wrong) == 1
                else f"; at the worst of them, batch {b}, choosing {{}}").format(picked)
        cost = (f"{lead} by the model gives {1 - worst:.0%} less throughput than {other}"
                if (b, p, m) in wrong else "")
    return head + "; wrong at " + ", ".join(
        f"batch {b} (predicted {p:.2f}x, measured {m:.2f}x)" for b, p, m in wrong) + cost + "."


def choice_note(cross: dict) -> str:
    """The note of the choice law (:func:`labkit.ddp.report.crossover`'s ``choice``): where
    the model's choice cost most, measured.

    >>> choice_note({"choice": 0.945, "choice_batch": 32, "batches": [16, 32, 128],
    ...              "predicted_speedups": [0.75, 1.04, 1.44],
    ...              "measured_speedups": [0.59, 0.945, 1.44]})
    'at batch 32 the model chose DDP (predicted 1.04x the one process), which measured 0.945x: the better choice was the one process'
    >>> choice_note({"choice": 1.0, "choice_batch": None, "batches": [16, 128],
    ...              "predicted_speedups": [0.75, 1.44], "measured_speedups": [0.59, 1.44]})
    'the model chose the better of DDP and the one process at every swept batch (16, 128)'
    """
    if cross["choice_batch"] is None:
        return ("the model chose the better of DDP and the one process at every swept batch ("
                + ", ".join(str(int(b)) for b in cross["batches"]) + ")")
    i = list(cross["batches"]).index(cross["choice_batch"])
    p, m = cross["predicted_speedups"][i], cross["measured_speedups"][i]
    picked, better = ("DDP", "the one process") if p > 1 else ("the one process", "DDP")
    return (f"at batch {int(cross['choice_batch'])} the model chose {picked} (predicted "
            f"{p:.3g}x the one process), which measured {m:.3g}x: the better choice was {better}")


def overlap_sentence(*, buckets: int, overlap: float, window_ms: float,
                     threshold: float = 0.05) -> str:
    """What the buckets' all-reduces hid behind backward, measured, beside what the model let
    them hide (its window; 0 where no core is spare for them).

    >>> overlap_sentence(buckets=4, overlap=0.0, window_ms=0.0)
    '4 buckets: the step hid 0% of their all-reduces behind backward (overlap observed: no); the model gave them no window (no core to spare for them), so it expected none.'
    >>> overlap_sentence(buckets=4, overlap=0.6, window_ms=30.0)
    '4 buckets: the step hid 60% of their all-reduces behind backward (overlap observed: yes); the model gave them a window of 30.0 ms, so it expected some.'
    """
    many = f"{buckets} bucket{'s' if buckets != 1 else ''}"
    if overlap != overlap:  # NaN: no standalone all-reduce to compare with
        return (f"{many}: what the step hid of their all-reduces could not be "
                "measured (no standalone all-reduce timed).")
    seen = "yes" if overlap > threshold else "no"
    model = ("the model gave them no window (no core to spare for them), so it expected none"
             if window_ms <= 0 else
             f"the model gave them a window of {window_ms:.1f} ms, so it expected some")
    return (f"{many}: the step hid {overlap:.0%} of their all-reduces behind "
            f"backward (overlap observed: {seen}); {model}.")


def ab_sentence(*, delta_pct: float, model_delta_pct: float) -> str:
    """Run B against run A at p50 (positive: B faster), measured and in the model.

    >>> ab_sentence(delta_pct=-8.0, model_delta_pct=-6.0)
    'B against A at p50: -8% (slower); the model: -6% (slower): the model says which way.'
    >>> ab_sentence(delta_pct=-8.0, model_delta_pct=12.0)
    'B against A at p50: -8% (slower); the model: +12% (faster): the model says the wrong way.'
    """
    def way(d):
        return "faster" if d > 0 else "slower"

    right = "which way" if way(delta_pct) == way(model_delta_pct) else "the wrong way"
    return (f"B against A at p50: {delta_pct:+.0f}% ({way(delta_pct)}); the model: "
            f"{model_delta_pct:+.0f}% ({way(model_delta_pct)}): the model says {right}.")


def ab_rounds_sentence(r: dict, *, cap_a: float, cap_b: float, model_delta_pct: float) -> str:
    """The interleaved bucket A/B (:func:`labkit.ddp.abtest.ab_rounds`) beside the model: a
    difference is reported only where the rounds' spread (p25 to p75) lies on one side of 0.

    >>> r = {"rounds": 4, "median_pct": -8.0, "p25_pct": -11.0, "p75_pct": -5.0, "differs": True}
    >>> ab_rounds_sentence(r, cap_a=25, cap_b=1, model_delta_pct=-6.0)
    'B (1 MB buckets) against A (25 MB), timed in turn over 4 rounds: B is 8% slower (median; rounds p25 to p75: -11% to -5%); the model: -6%, the same way.'
    >>> r = {"rounds": 4, "median_pct": 1.0, "p25_pct": -3.0, "p75_pct": 4.0, "differs": False}
    >>> ab_rounds_sentence(r, cap_a=25, cap_b=1, model_delta_pct=-6.0)
    "B (1 MB buckets) against A (25 MB), timed in turn over 4 rounds: no difference beyond the rounds' spread (median +1%; p25 to p75: -3% to +4%); the model: -6%, outside that spread."
    """
    head = (f"B ({cap_b:g} MB buckets) against A ({cap_a:g} MB), timed in turn over "
            f"{r['rounds']} rounds: ")
    spread = f"{r['p25_pct']:+.0f}% to {r['p75_pct']:+.0f}%"
    if r["differs"]:
        way = "faster" if r["median_pct"] > 0 else "slower"
        same = "the same way" if (model_delta_pct > 0) == (r["median_pct"] > 0) else \
            "the other way"
        if abs(model_delta_pct) < 0.5:
            same = "no change"
        return (head + f"B is {abs(r['median_pct']):.0f}% {way} (median; rounds p25 to p75: "
                f"{spread}); the model: {model_delta_pct:+.0f}%, {same}.")
    inside = "inside" if r["p25_pct"] <= model_delta_pct <= r["p75_pct"] else "outside"
    return (head + f"no difference beyond the rounds' spread (median {r['median_pct']:+.0f}%; "
            f"p25 to p75: {spread}); the model: {model_delta_pct:+.0f}%, {inside} that spread.")


def timeline_sentence(row, *, standalone_s: float | None = None) -> str:
    """What rank 0's timeline measured of a DDP row's overlap (medians over its timed steps):
    how long the all-reduces were in flight, how much of it inside backward and after it;
    with the ``no_sync`` backward and the all-reduces' standalone time, what the step paid for
    them against what they cost alone (:func:`labkit.ddp.overlap.hidden_for_free_s`).

    >>> row = {"comm_intervals_s": [[[0, 1]] * 4], "comm_total_s": 0.044, "comm_hidden_s": 0.025,
    ...        "comm_exposed_s": 0.018, "comm_hidden_share": 0.57, "backward_s": 0.032,
    ...        "nosync_backward_s": 0.030}
    >>> timeline_sentence(row, standalone_s=0.016)
    "4 buckets' all-reduces were in flight 44.0 ms per step: 25.0 ms (57%) while backward still computed, 18.0 ms after its last gradient. Backward took 32.0 ms with the all-reduces beside it, 30.0 ms without (no_sync): the step paid 18.0 + 2.0 = 20.0 ms for all-reduces that take 16.0 ms alone, so 0.0 ms of them (0%) hid."
    """
    from labkit.ddp.overlap import hidden_for_free_s

    ms = 1e3
    buckets = len((row.get("comm_intervals_s") or [[]])[0])
    total, hidden = float(row["comm_total_s"]), float(row["comm_hidden_s"])
    exposed = float(row["comm_exposed_s"])
    who = "1 bucket's all-reduce was" if buckets == 1 else f"{buckets} buckets' all-reduces were"
    text = (f"{who} in flight {total * ms:.1f} ms per step: {hidden * ms:.1f} ms "
            f"({row['comm_hidden_share']:.0%}) while backward still computed, "
            f"{exposed * ms:.1f} ms after its last gradient.")
    nosync = row.get("nosync_backward_s")
    if nosync is None or nosync != nosync or not (standalone_s or 0) > 0:
        return text
    back = float(row["backward_s"])
    stretch = max(0.0, back - float(nosync))
    free = hidden_for_free_s(exposed_s=exposed, backward_s=back, nosync_backward_s=float(nosync),
                             standalone_s=standalone_s)
    them = "the all-reduce" if buckets == 1 else "the all-reduces"
    return text + (f" Backward took {back * ms:.1f} ms with {them} beside it, {nosync * ms:.1f} ms "
                   f"without (no_sync): the step paid {exposed * ms:.1f} + {stretch * ms:.1f} = "
                   f"{(exposed + stretch) * ms:.1f} ms for all-reduces that take "
                   f"{standalone_s * ms:.1f} ms alone, so {free * ms:.1f} ms of them "
                   f"({free / standalone_s:.0%}) hid.")


def mfu_sentence(*, batch: int, ranks: int, flop_per_s: float, peak_flop_per_s: float,
                 mfu: float) -> str:
    """A DDP step's compute rate against one rank's measured peak.

    >>> mfu_sentence(batch=128, ranks=2, flop_per_s=9.1e9, peak_flop_per_s=41.5e9, mfu=0.219)
    'At batch 128, each of 2 DDP ranks runs the model at 9.1 GFLOP/s: 22% of the best matrix product one rank reached in the machine profile (41.5 GFLOP/s).'
    """
    return (f"At batch {batch}, each of {ranks} DDP ranks runs the model at "
            f"{flop_per_s / 1e9:.1f} GFLOP/s: {mfu:.0%} of the best matrix product one rank "
            f"reached in the machine profile ({peak_flop_per_s / 1e9:.1f} GFLOP/s).")
