"""The all-reduces that waited for the scheduler: counted in a DDP step, and the standalone
all-reduce's calls against the profile's transfer (pure: no torch).

An all-reduce moves at its transfer's pace, or it also waits for the scheduler to give one of
gloo's threads a core (about a scheduler tick on this machine; a CPU rank whose one core runs
backward leaves gloo's thread waiting for it). How often that happens changes from second to
second, so the step model (:mod:`labkit.ddp.predict`) prices each bucket's all-reduce at the
profile's transfer and adds the profile's wait for each all-reduce that **waited in the row's
own median step**, counted from rank 0's timeline of the buckets' launches and completions
(:class:`labkit.ddp.train.CommTimeline`): :func:`count`, each bucket from the latest of its
launch and the completion before it (on a rank with no core to spare, from backward's last
gradient at the earliest: before it the core was computing backward, and an all-reduce
waiting for it then is the one job after the other that the model prices already). A thread
that loses its core loses it wherever it is: :func:`outside` counts the same waits in the
parts of that step outside the all-reduces. A law about one all-reduce over
several calls compares transfers instead, the profile's against the calls' transfer (the median
of those that waited for nothing), with how often the calls waited beside it:
:func:`allreduce_law`.
"""

from __future__ import annotations

import math

from labkit.book.laws import check
from labkit.machine.formulas import (
    WAIT_THRESHOLD_S,
    counted_waits,
    median,
    median_index,
    percentile,
    transfer_split,
    waits,
)


def median_step(row) -> int | None:
    """Which timed step is the median one (the lower of an even count) by the slowest rank's
    times (``step_times_s``), where the row holds as many timelines (``comm_intervals_s``);
    None otherwise.

    >>> median_step({"step_times_s": [0.05, 0.04, 0.09, 0.06], "comm_intervals_s": [[]] * 4})
    0
    """
    times, steps = row.get("step_times_s"), row.get("comm_intervals_s")
    if not isinstance(times, list) or not isinstance(steps, list) or not times \
            or len(times) != len(steps):
        return None
    return median_index(times)


def bucket_times(spans, *, backward_end_s: float | None = None) -> list[float]:
    """Each bucket's all-reduce in one step (``spans``: ``[launched, completed]`` by bucket)
    as the time the step paid for it alone: from the latest of its launch, the completion
    before it (gloo works through the buckets in flight: an all-reduce held up behind another
    is that one's time, and one scheduler wait delays every bucket in flight at once) and, on
    a rank with no core to spare (``backward_end_s`` given), backward's last gradient (before
    it the core computed backward: an all-reduce waiting for it then is the one job after the
    other that the model prices already), to its completion; 0 where nothing was left.

    Backward over at 15 ms; bucket 0 completed at 12 ms, bucket 1 at 20 ms, bucket 2 at 21 ms:

    >>> [round(t * 1e3, 3) for t in bucket_times([[0.005, 0.012], [0.008, 0.020],
    ...                                            [0.010, 0.021]], backward_end_s=0.015)]
    [0.0, 5.0, 1.0]
    """
    lo = -math.inf if backward_end_s is None else float(backward_end_s)
    out = [0.0] * len(spans)
    before = -math.inf
    for i in sorted(range(len(spans)), key=lambda i: float(spans[i][1])):
        a, b = (float(x) for x in spans[i])
        out[i] = max(0.0, b - max(a, lo, before))
        before = max(before, b)
    return out


def count(row, transfers, *, spare_core: bool = True) -> dict | None:
    """Which buckets' all-reduces waited for the scheduler in the row's median step (rank 0's
    timeline): the time the step paid for each (:func:`bucket_times`) against its transfer
    (``transfers[i]``, the profile's; :func:`labkit.machine.formulas.counted_waits`):
    ``step`` (its index), ``buckets``, ``count``, ``waited`` (a flag per bucket),
    ``excess_s`` (what those took beyond their transfers, summed). None without a timeline of
    as many buckets.

    The median step's two buckets took 3 ms and 7.4 ms, transfers of 2.5 ms each: the second
    waited, 4.9 ms beyond its transfer.

    >>> row = {"step_times_s": [0.05, 0.04, 0.06],
    ...        "comm_intervals_s": [[[0.0, 0.003], [0.01, 0.0174]]] * 3}
    >>> got = count(row, [2.5e-3, 2.5e-3])
    >>> got["count"], got["waited"], round(got["excess_s"] * 1e3, 1)
    (1, [False, True], 4.9)

    Four buckets of 2.4 ms launched during backward on a rank whose one core runs it,
    backward over at 12 ms: they complete at 13, 14, 18.5 and 19 ms, the third a tick late.

    >>> row = {"step_times_s": [0.02], "timeline_backward_end_s": [0.012],
    ...        "comm_intervals_s": [[[0.005, 0.013], [0.007, 0.014], [0.010, 0.0185],
    ...                              [0.011, 0.019]]]}
    >>> count(row, [2.4e-3] * 4, spare_core=False)["waited"]
    [False, False, True, False]
    """
    k = median_step(row)
    if k is None:
        return None
    spans = row["comm_intervals_s"][k]
    if len(spans) != len(transfers) or not spans:
        return None
    ends = row.get("timeline_backward_end_s")
    backward_end = None
    if not spare_core and isinstance(ends, list) and len(ends) > k:
        backward_end = float(ends[k])
    durations = bucket_times(spans, backward_end_s=backward_end)
    predicted = [float(t) for t in transfers]
    got = counted_waits(durations, predicted)
    return {"step": k, "buckets": len(spans), "count": got["count"], "waited": got["flags"],
            "excess_s": sum(got["excess_s"])}


#: the parts of rank 0's step outside its all-reduces, in the order they run
OUTSIDE_PARTS = ("forward", "backward", "launch", "after the all-reduces")


def _outside_parts(row, j: int) -> dict | None:
    """Rank 0's step ``j`` outside its all-reduces (seconds): forward (to backward's start),
    backward (to its last gradient), the launch (what lay after backward's last gradient with
    no all-reduce in flight before the last one completed: DDP's last bucket copies and
    launches) and what came after the last all-reduce (the copies back and the optimizer).
    None where the row's timeline lacks the step.

    Backward from 1 to 5 ms; one bucket done during it (at 4 ms), one launched 0.2 ms after
    it and done at 6.5 ms; the step ends at 7.5 ms:

    >>> row = {"timeline_backward_start_s": [0.001], "timeline_backward_end_s": [0.005],
    ...        "timeline_step_end_s": [0.0075],
    ...        "comm_intervals_s": [[[0.003, 0.004], [0.0052, 0.0065]]]}
    >>> {k: round(v * 1e3, 2) for k, v in _outside_parts(row, 0).items()}
    {'forward': 1.0, 'backward': 4.0, 'launch': 0.2, 'after the all-reduces': 1.0}
    """
    try:
        start = float(row["timeline_backward_start_s"][j])
        end = float(row["timeline_backward_end_s"][j])
        stop = float(row["timeline_step_end_s"][j])
        spans = [(float(a), float(b)) for a, b in row["comm_intervals_s"][j]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    # after backward the step paid each all-reduce (bucket_times) or waited for a launch
    last = max([end] + [b for _, b in spans])
    gap = max(0.0, last - end - sum(bucket_times(spans, backward_end_s=end)))
    return dict(zip(OUTSIDE_PARTS, (start, end - start, gap, stop - last)))


def _others_behind(ranks, steps: int) -> list[float] | None:
    """Per timed step, the slowest other rank's step less rank 0's, from ``ranks`` (one list
    of step times a rank, rank 0 first); None unless every rank holds ``steps`` numbers.

    >>> _others_behind([[0.010, 0.011], [0.012, 0.010]], 2)
    [0.002, -0.001]
    >>> _others_behind([[0.010, 0.011], [0.012]], 2), _others_behind(float("nan"), 2)
    (None, None)
    """
    if not isinstance(ranks, list) or len(ranks) < 2:
        return None
    try:
        table = [[float(t) for t in r] for r in ranks]
    except (TypeError, ValueError):
        return None
    if any(len(r) != steps for r in table) or any(t != t for r in table for t in r):
        return None
    return [round(max(r[j] for r in table[1:]) - table[0][j], 12) for j in range(steps)]


def outside(row, *, threshold_s: float = WAIT_THRESHOLD_S) -> dict | None:
    """The scheduler waits of the row's median step outside its all-reduces: each part of
    rank 0's step (:data:`OUTSIDE_PARTS`; backward only where no all-reduce was launched during
    it) against that part's median over the timed steps, and
    the slowest other rank's step beyond rank 0's (a wait on another rank once the all-reduces
    were done, which rank 0's timeline cannot see); a part waited when it took longer than its
    median by the counting margin (:func:`labkit.machine.formulas.counted_waits`).
    The other ranks' part is the slowest other rank's step less rank 0's, against its median
    over the timed steps: a rank that is always slower is imbalance, not a wait. ``count``,
    ``where`` (the parts that waited), ``excess_s`` (what they took beyond their medians,
    summed). None without a timeline of every timed step; one timed step is its own median
    and never waited.

    Five steps whose launches took 4.6, 0, 0, 0.2 and 5.0 ms, the first the median step (rank
    0's thread lost its core between backward's last gradient and the all-reduce):

    >>> step = lambda launch: [[0.005 + launch, 0.0065 + launch]]
    >>> row = {"step_times_s": [0.011, 0.008, 0.012, 0.009, 0.013],
    ...        "timeline_backward_start_s": [0.001] * 5, "timeline_backward_end_s": [0.005] * 5,
    ...        "timeline_step_end_s": [0.0075 + x for x in (4.6e-3, 0, 0, 0.2e-3, 5e-3)],
    ...        "comm_intervals_s": [step(x) for x in (4.6e-3, 0, 0, 0.2e-3, 5e-3)]}
    >>> got = outside(row)
    >>> got["count"], got["where"], round(got["excess_s"] * 1e3, 1)
    (1, ['rank 0: launch'], 4.4)
    """
    k = median_step(row)
    if k is None:
        return None
    parts = [_outside_parts(row, j) for j in range(len(row["step_times_s"]))]
    if any(p is None for p in parts):
        return None
    # backward beside all-reduces launched during it shares its rank with them: its length is
    # not its own then, and those all-reduces are priced already
    shared = any(float(a) < float(end) for spans, end in
                 zip(row["comm_intervals_s"], row["timeline_backward_end_s"]) for a, _ in spans)
    chosen = [n for n in OUTSIDE_PARTS if not (shared and n == "backward")]
    durations = [parts[k][name] for name in chosen]
    medians = [median([p[name] for p in parts]) for name in chosen]
    names = [f"rank 0: {name}" for name in chosen]
    behind = _others_behind(row.get("rank_step_times_s"), len(parts))
    if behind:
        durations.append(behind[k])
        medians.append(median(behind))
        names.append("another rank after the all-reduces")
    got = counted_waits(durations, medians, threshold_s=threshold_s)
    return {"count": got["count"], "excess_s": sum(got["excess_s"]),
            "where": [n for n, waited in zip(names, got["flags"]) if waited]}


def step_note(row) -> str:
    """What the step model counted and priced for a row's all-reduces, in one sentence (the
    columns :func:`labkit.ddp.predict.add_prediction_columns` adds).

    >>> step_note({"allreduces_counted": 4, "allreduces_waited": 3, "scheduler_wait_s": 3.6e-3})
    "3 of 4 all-reduces waited for the scheduler in the median step (counted from rank 0's timeline), priced at the profile's 3.6 ms each; transfers from the profile"
    >>> step_note({"allreduces_counted": 1, "allreduces_waited": 0, "scheduler_wait_s": 3.6e-3,
    ...            "outside_waits": 1, "outside_waits_where": ["rank 0: launch"]})
    "0 of 1 all-reduce waited for the scheduler in the median step (counted from rank 0's timeline), priced at the profile's 3.6 ms each, and 1 part of it outside them (rank 0: launch) at the same price; transfers from the profile"
    >>> step_note({"allreduces_counted": None, "scheduler_wait_s": 3.6e-3})
    "no all-reduce's wait was counted (the row holds no timeline of its buckets): transfers from the profile only"
    """
    n = row.get("allreduces_counted")
    if n is None or n != n:
        return ("no all-reduce's wait was counted (the row holds no timeline of its buckets): "
                "transfers from the profile only")
    more = _how_many(row.get("outside_waits"))
    outside_words = ""
    if more:
        outside_words = (f", and {more} part{'s' if more != 1 else ''} of it outside them "
                         f"({', '.join(row.get('outside_waits_where') or [])}) at the same price")
    return (f"{int(row['allreduces_waited'])} of {int(n)} all-reduce{'s' if n != 1 else ''} "
            "waited for the scheduler in the median step (counted from rank 0's timeline), "
            f"priced at the profile's {row['scheduler_wait_s'] * 1e3:.1f} ms each"
            f"{outside_words}; transfers from the profile")


def waits_sentence(row) -> str:
    """How many of a DDP row's all-reduces waited for the scheduler in its median step, why,
    and what that adds to the model and took of the measured step; or that none waited.

    >>> row = {"world_size": 2, "bucket_bytes": [4e6] * 4, "allreduces_counted": 4,
    ...        "allreduces_waited": 3, "scheduler_wait_s": 3.6e-3,
    ...        "model_scheduler_waits_s": 10.8e-3, "allreduce_waits_measured_s": 14.1e-3}
    >>> print(waits_sentence(row))
    3 of the median step's 4 all-reduces waited for the scheduler (counted from rank 0's timeline: longer than their transfer + max(1.5 ms, transfer / 4)): gloo's thread needs a core, and a rank's one core was busy with backward or another program, so it waited for the scheduler's next turn (the profile's 3.6 ms a wait). The model adds 10.8 ms for them; they took 14.1 ms beyond their transfers.
    >>> print(waits_sentence({**row, "allreduces_waited": 0}))
    none of the median step's 4 all-reduces waited for the scheduler (each completed within its transfer + max(1.5 ms, transfer / 4), counted from rank 0's timeline): the model prices their transfers only.
    """
    from labkit.machine.formulas import WAIT_RULE

    n = row.get("allreduces_counted")
    rule = WAIT_RULE
    if n is None or n != n:
        return ("the row holds no timeline of its buckets' all-reduces, so no wait for the "
                "scheduler was counted: the model prices their transfers only.")
    n, k = int(n), int(row["allreduces_waited"])
    many = f"{n} all-reduce{'s' if n != 1 else ''}"
    if not k:
        return (f"none of the median step's {many} waited for the scheduler (each completed "
                f"within its {rule}, counted from rank 0's timeline): the model prices their "
                "transfers only." + _outside_sentence(row))
    them = "it" if k == 1 else "them"
    return (f"{k} of the median step's {many} waited for the scheduler (counted from rank 0's "
            f"timeline: longer than their {rule}): gloo's thread needs a core, and a rank's one "
            "core was busy with backward or another program, so it waited for the scheduler's "
            "next turn (the profile's "
            f"{row['scheduler_wait_s'] * 1e3:.1f} ms a wait). The model adds "
            f"{row['model_scheduler_waits_s'] * 1e3:.1f} ms for {them}; "
            f"{'it' if k == 1 else 'they'} took {row['allreduce_waits_measured_s'] * 1e3:.1f} ms "
            f"beyond {'its transfer' if k == 1 else 'their transfers'}." + _outside_sentence(row))


def _how_many(value) -> int:
    """A count from a row (an int, a float of a DataFrame, None or NaN where none was made)."""
    try:
        return int(value) if value == value else 0
    except (TypeError, ValueError):
        return 0


def _outside_sentence(row) -> str:
    """' Outside the all-reduces, ...' where parts of the median step outside them waited
    (:func:`outside`); '' otherwise.

    >>> print(_outside_sentence({"outside_waits": 1, "outside_waits_where": ["rank 0: launch"],
    ...                          "model_outside_waits_s": 4.2e-3,
    ...                          "outside_waits_measured_s": 4.4e-3}).strip())
    Outside the all-reduces, 1 part of the median step waited too (rank 0: launch; longer than its median over the timed steps, or another rank's step than rank 0's, by max(1.5 ms, median / 4)): the model adds 4.2 ms for it; it took 4.4 ms beyond its median.
    """
    k = _how_many(row.get("outside_waits"))
    if not k:
        return ""
    one = k == 1
    return (f" Outside the all-reduces, {k} part{'' if one else 's'} of the median step waited "
            f"too ({', '.join(row.get('outside_waits_where') or [])}; longer than "
            f"{'its' if one else 'their'} median over the timed steps, or another rank's step "
            f"than rank 0's, by max({WAIT_THRESHOLD_S * 1e3:g} ms, median / 4)): the model "
            "adds "
            f"{row['model_outside_waits_s'] * 1e3:.1f} ms for {'it' if one else 'them'}; "
            f"{'it' if one else 'they'} took {row['outside_waits_measured_s'] * 1e3:.1f} ms "
            f"beyond {'its median' if one else 'their medians'}.")


def allreduce_law(row, prof, *, ranks: int) -> dict:
    """The law on the standalone all-reduce of all the gradient bytes, timed over several
    calls (``allreduce_times_s``, the slowest rank's): the profile's transfer at that size and
    rank count with the cores idle against the calls' transfer (the median of those that waited
    for nothing); the note says how often the calls waited and what they took on average
    (transfer + share x wait). ``prof``: anything with :meth:`labkit.machine.Profile.transfer_s`.

    >>> class Prof:
    ...     def transfer_s(self, size, *, ranks=None, busy=False): return 8e-3
    >>> row = {"grad_bytes": 16.8e6, "allreduce_times_s": [8.1e-3, 8.3e-3, 12.1e-3, 8.2e-3]}
    >>> law = allreduce_law(row, Prof(), ranks=2)
    >>> law["holds"], round(law["measured"], 2)
    (True, 8.2)
    >>> print(law["note"])
    calls' transfer 8.20 ms, p50 8.25 ms, mean 9.17 ms; 1 of 4 calls (25%) waited for the scheduler, 3.9 ms beyond the transfer (median): transfer + share x wait = 8.20 + 0.25 x 3.9 = 9.18 ms
    """
    times = [float(t) for t in row.get("allreduce_times_s") or []]
    if not times:  # only the p50 stored: no transfer to compare
        times = [float(row["allreduce_time_p50_s"])]
    w = waits(times)
    k = len(w["wait_excess_s"])
    wait = median(w["wait_excess_s"]) if k else 0.0
    predicted = float(prof.transfer_s(float(row["grad_bytes"]), ranks=ranks))
    ms = 1e3
    mean = math.fsum(times) / len(times)
    note = (f"calls' transfer {w['transfer_s'] * ms:.2f} ms, p50 "
            f"{percentile(times, 50) * ms:.2f} ms, mean {mean * ms:.2f} ms; {k} of {len(times)} "
            f"calls ({w['wait_share']:.0%}) waited for the scheduler"
            + (f", {wait * ms:.1f} ms beyond the transfer (median): transfer + share x wait = "
               f"{w['transfer_s'] * ms:.2f} + {w['wait_share']:.2f} x {wait * ms:.1f} = "
               f"{(w['transfer_s'] + w['wait_share'] * wait) * ms:.2f} ms" if k else ""))
    return check(f"all-reduce of the {float(row['grad_bytes']) / 1e6:.1f} MB of gradients, "
                 f"{ranks} ranks: transfer (machine profile, cores idle) = the calls' transfer",
                 predicted=predicted * ms, measured=w["transfer_s"] * ms, unit="ms", note=note,
                 split=transfer_split(times))
