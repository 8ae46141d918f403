"""The model of a DDP step on this machine, from this run's machine profile (pure: no torch).

A DDP step on N ranks is predicted from what was measured *alone* and what the machine profile
(:mod:`labkit.machine`) measured about running several things at once::

    t_DDP(b) = t_alone(b) x s(N) + t_copy + max(0, t_ar,during - t_window) + t_ar,after

* ``t_alone(b)``: the plain model's step at ``b`` samples, one process alone: timed on rank 0
  in the same rounds as the DDP step, one step after the other parts, as each DDP step runs
  (``alone_step_time_p50_s``; on this machine a small model's step of a series runs up to
  twice as fast, its weights still in the caches); a row without it, the no-DDP run's;
* ``s(N)``: the co-run slowdown, ``profile.compute_slowdown(N)`` (a miniature training step):
  N ranks computing at once each run slower than one alone (shared memory bandwidth, caches,
  turbo);
* ``t_copy``: DDP's copies of the gradients into its buckets and back, at the profile's copy
  bandwidth with every rank copying (:func:`copy_bytes`);
* the all-reduces *in context*: where a rank has a core to spare for the communication (a GPU
  rank; a CPU rank whose threads leave a core free), every bucket but the last is all-reduced
  while backward still runs (``profile.transfer_s(size, busy=True)``) and hides in
  ``t_window`` (:func:`labkit.ddp.formulas.overlap_window`), the last after backward ends
  (``busy=False``). A CPU rank whose one core runs backward runs gloo's all-reduce on that same
  core: the core does both jobs one after the other, each all-reduce costs its time with the
  cores idle, and nothing hides. Each all-reduce is priced at its **transfer** (one that
  waited for nothing), plus the profile's **scheduler wait** (``profile.scheduler_wait_s``,
  about a tick here) where it waited in the row's own median step, counted from rank 0's
  timeline of the buckets (:func:`labkit.ddp.waits.count`): how often a call waits changes from
  second to second, how long a wait lasts is the machine's;
* the same wait for each part of that step outside the all-reduces that waited (rank 0's
  forward, backward, launch and what follows the all-reduces, each against its median over
  the timed steps, and the other ranks' steps against rank 0's: :func:`labkit.ddp.waits.outside`):
  a thread that loses its core to the scheduler loses it wherever it is.

A miss is explained by the measured split (:func:`measured_split`): the ``no_sync`` step on N
ranks (the compute as it ran), the copies as timed, the transfers of the buckets' all-reduces
as timed standalone (the median of the calls that waited for nothing), what the counted waits took of the median
step (in the all-reduces and outside them), and the imbalance of the ranks' step times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from labkit.book.laws import symmetric_error_pct
from labkit.ddp import waits
from labkit.ddp.config import DDP_FLAGS
from labkit.ddp.formulas import (
    BENCHMARK,
    benchmark_key,
    ddp_speedup,
    overlap_window,
    references,
    row_value,
)


def bucket_transfers(bucket_bytes, transfer_s, *, spare_core: bool) -> list[float]:
    """Each bucket's all-reduce transfer, ``transfer_s(size, busy)``: busy (the cores compute
    beside it) for every bucket but the last where a core is spare for it, idle where none is
    (then the all-reduces wait for backward to end) and for the last (backward has ended).

    >>> bucket_transfers([1, 2, 3], lambda b, busy: b * (10 if busy else 1), spare_core=True)
    [10.0, 20.0, 3.0]
    >>> bucket_transfers([1, 2, 3], lambda b, busy: b * (10 if busy else 1), spare_core=False)
    [1.0, 2.0, 3.0]
    """
    sizes = [float(b) for b in bucket_bytes]
    return [float(transfer_s(b, spare_core and i < len(sizes) - 1)) for i, b in enumerate(sizes)]


def step_in_context(*, compute_alone_s: float, slowdown: float, copy_s: float, bucket_bytes,
                    transfer_s: Callable[[float, bool], float], spare_core: bool,
                    waited=(), wait_s: float = 0.0, outside_waits: int = 0) -> dict:
    """The model's terms of one DDP step (seconds) and their sum ``step_s``.

    ``transfer_s(size_bytes, busy)``: one all-reduce's transfer in context (the profile's);
    ``waited``: a flag per bucket, the all-reduces that waited for the scheduler (counted in
    the measured step), each ``wait_s`` more. With a core to spare, every bucket but the last
    is all-reduced while backward runs (``busy``) and hides in the window, transfers first;
    without one, the rank's core does the all-reduces' work and backward's one after the
    other: each costs its time with the cores idle, and nothing hides. ``outside_waits``: the
    waits counted outside the all-reduces (:func:`labkit.ddp.waits.outside`), each ``wait_s``,
    exposed (``outside_waits_s``). 100 ms of compute alone,
    1.2x slower with every rank computing, 8 ms of copies, one bucket (15 ms); then four
    buckets (busy 6 ms, idle 4 ms each), without and with a core to spare, then with two of
    them waiting 3.6 ms:

    >>> ar = lambda size, busy: (6e-3 if busy else 4e-3) if size < 10e6 else 15e-3
    >>> t = step_in_context(compute_alone_s=0.1, slowdown=1.2, copy_s=0.008,
    ...                     bucket_bytes=[16e6], transfer_s=ar, spare_core=False)
    >>> round(t["step_s"], 6), t["window_s"]
    (0.143, 0.0)
    >>> four = dict(compute_alone_s=0.1, slowdown=1.2, copy_s=0.008, bucket_bytes=[4e6] * 4,
    ...             transfer_s=ar)
    >>> round(step_in_context(**four, spare_core=False)["step_s"], 6)
    0.144
    >>> round(step_in_context(**four, spare_core=True)["step_s"], 6)  # 18 ms hidden in 60 ms
    0.132
    >>> t = step_in_context(**four, spare_core=False, waited=[True, False, False, True],
    ...                     wait_s=3.6e-3)
    >>> round(t["step_s"], 6), round(t["exposed_waits_s"], 6)
    (0.1512, 0.0072)
    """
    compute = float(compute_alone_s) * float(slowdown)
    sizes = [float(b) for b in bucket_bytes]
    flags = list(waited) or [False] * len(sizes)
    if len(flags) != len(sizes):
        raise ValueError("one waited flag per bucket")
    moved = bucket_transfers(sizes, transfer_s, spare_core=spare_core)
    waits_each = [float(wait_s) if f else 0.0 for f in flags]
    during_transfer, during_waits = sum(moved[:-1]), sum(waits_each[:-1])
    after = moved[-1] + waits_each[-1]
    window = overlap_window(compute_s=compute, bucket_bytes=sizes) if spare_core else 0.0
    # the window hides the transfers first, then the waits: what is left of each is exposed
    exposed_transfers = max(0.0, during_transfer - window) + moved[-1]
    exposed_waits = max(0.0, during_waits - max(0.0, window - during_transfer)) + waits_each[-1]
    exposed = exposed_transfers + exposed_waits
    outside_s = int(outside_waits) * float(wait_s)
    return {"compute_s": compute, "copies_s": float(copy_s), "outside_waits_s": outside_s,
            "allreduce_during_s": during_transfer + during_waits, "allreduce_after_s": after,
            "transfers_s": sum(moved), "waits_s": sum(waits_each), "window_s": window,
            "exposed_transfers_s": exposed_transfers, "exposed_waits_s": exposed_waits,
            "exposed_allreduce_s": exposed,
            "step_s": compute + float(copy_s) + exposed + outside_s}


def copy_bytes(*, grad_bytes: float, as_view: bool = False) -> float:
    """Bytes DDP's reducer reads and writes per step besides the all-reduce: each gradient
    into its bucket (scaled by 1/N) and back, two passes that each read and write every
    gradient byte; one in-place pass when the gradients are views into the buckets.

    >>> copy_bytes(grad_bytes=16e6), copy_bytes(grad_bytes=16e6, as_view=True)
    (64000000.0, 32000000.0)
    """
    return float(grad_bytes) * (2.0 if as_view else 4.0)


def spare_core(row: dict) -> bool:
    """Whether a rank of ``row``'s launch has a core beyond its compute threads, for gloo's
    all-reduce to run beside backward (always on a GPU: the GPU computes).

    >>> spare_core({"device": "cpu", "cores": 2, "nproc_per_node": 2, "threads_per_rank": 1})
    False
    >>> spare_core({"device": "cpu", "cores": 8, "nproc_per_node": 2, "threads_per_rank": 1})
    True
    """
    if str(row.get("device") or "").startswith("cuda"):
        return True
    cores = row_value(row, "cores")
    per_node = row_value(row, "nproc_per_node") or row_value(row, "world_size")
    threads = row_value(row, "threads_per_rank")
    if not (cores > 0 and per_node > 0 and threads > 0):
        return False
    return cores > per_node * threads


def _alone_key(r: dict) -> tuple:
    """A row's benchmark without DDP's flags: the plain model's step does not depend on them."""
    return tuple(str(r.get(k)) for k in BENCHMARK if k not in DDP_FLAGS)


def add_prediction_columns(rows: Iterable[dict], *, profile, alone: Iterable[dict] = ()) -> list:
    """DDP rows of more than one rank with the model's terms and prediction beside the measured
    step and speedups. ``profile``: this run's machine profile (:mod:`labkit.machine`; anything
    with its ``compute_slowdown``, ``transfer_s``, ``scheduler_wait_s`` and
    ``copy_bytes_per_s``); ``alone``: more rows to take the no-DDP step from (a run without a
    baseline of its own). Rows without a no-DDP step of the same model and batch are left as
    they are.

    Adds ``model_compute_alone_s`` (the plain step the model starts from: the rounds' alone
    step where the row has it, else the no-DDP step), ``model_compute_s``,
    ``compute_slowdown``, ``model_copies_s``, ``model_comm_s`` (every bucket's all-reduce in
    context: transfers and counted waits),
    ``model_transfers_s``, ``model_scheduler_waits_s``, ``scheduler_wait_s``,
    ``allreduces_counted`` and ``allreduces_waited`` (:func:`labkit.ddp.waits.count`; None
    without a timeline), ``allreduce_waits_measured_s``, ``outside_waits``,
    ``outside_waits_where`` and ``outside_waits_measured_s`` (:func:`labkit.ddp.waits.outside`;
    None without a timeline), ``model_outside_waits_s``, ``model_overlap_window_s``,
    ``model_exposed_comm_s``, ``predicted_step_time_s``, ``predicted_step_error_pct``,
    ``predicted_speedup_vs_no_ddp`` (and its error) and, with a 1-rank DDP row,
    ``predicted_speedup`` (N t_1 / predicted step).

    >>> from types import SimpleNamespace
    >>> prof = SimpleNamespace(compute_slowdown=lambda ranks, n=None: 1.25,
    ...                        copy_bytes_per_s=lambda together=False: 8e9,
    ...                        transfer_s=lambda size, ranks=2, busy=False: 0.016,
    ...                        scheduler_wait_s=3.6e-3)
    >>> rows = [{"variant": "no_ddp", "world_size": 1, "step_time_p50_s": 0.080},
    ...         {"variant": "ddp", "world_size": 2, "step_time_p50_s": 0.125,
    ...          "grad_bytes": 16_000_000}]
    >>> r = add_prediction_columns(rows, profile=prof)[1]
    >>> round(r["predicted_step_time_s"], 3), round(r["predicted_speedup_vs_no_ddp"], 3)
    (0.124, 1.29)

    The same row with the plain step timed in its rounds (90 ms, one step after the other
    parts): the model starts from it; the no-DDP process it is compared with stays at 80 ms.

    >>> rows[1]["alone_step_time_p50_s"] = 0.090
    >>> r = add_prediction_columns(rows, profile=prof)[1]
    >>> round(r["predicted_step_time_s"], 4), round(r["predicted_speedup_vs_no_ddp"], 3)
    (0.1365, 1.172)
    """
    rows = [dict(r) for r in rows]
    base = {_alone_key(r): r for r in [*alone, *rows] if r.get("variant") == "no_ddp"}
    one_rank = references(rows, "ddp", world_size=1)
    for r in rows:
        n = int(r.get("world_size") or 1)
        t0 = row_value(base.get(_alone_key(r), {}), "step_time_p50_s")
        if r.get("variant") != "ddp" or n < 2 or not t0 > 0:
            continue
        nbytes = row_value(r, "grad_bytes")
        buckets = [b for b in (r.get("bucket_bytes") or []) if isinstance(b, (int, float))]
        # the plain step as the rounds timed it beside the DDP step, where the row has it: one
        # step after other work, as each DDP step runs; else the no-DDP run's series
        alone = row_value(r, "alone_step_time_p50_s")
        alone = alone if alone > 0 else t0
        slowdown = float(profile.compute_slowdown(n))
        copy_s = copy_bytes(grad_bytes=nbytes, as_view=bool(r.get("gradient_as_bucket_view"))) \
            / float(profile.copy_bytes_per_s(together=True))
        sizes, spare = buckets or [nbytes], spare_core(r)

        def transfer(size, busy, n=n):
            return float(profile.transfer_s(size, ranks=n, busy=busy))

        wait = float(profile.scheduler_wait_s)
        got = waits.count(r, bucket_transfers(sizes, transfer, spare_core=spare),
                          spare_core=spare)
        more = waits.outside(r)
        terms = step_in_context(
            compute_alone_s=alone, slowdown=slowdown, copy_s=copy_s, bucket_bytes=sizes,
            spare_core=spare, transfer_s=transfer, waited=got["waited"] if got else (),
            wait_s=wait, outside_waits=more["count"] if more else 0)
        step, t = terms["step_s"], row_value(r, "step_time_p50_s")
        pred = ddp_speedup(ranks=n, noddp_step_s=t0, ddp_step_s=step)
        r.update(model_compute_alone_s=alone, model_compute_s=terms["compute_s"],
                 compute_slowdown=slowdown,
                 model_copies_s=copy_s,
                 model_comm_s=terms["allreduce_during_s"] + terms["allreduce_after_s"],
                 model_transfers_s=terms["transfers_s"],
                 model_scheduler_waits_s=terms["waits_s"], scheduler_wait_s=wait,
                 allreduces_counted=got["buckets"] if got else None,
                 allreduces_waited=got["count"] if got else None,
                 allreduce_waits_measured_s=got["excess_s"] if got else None,
                 outside_waits=more["count"] if more else None,
                 outside_waits_where=more["where"] if more else None,
                 outside_waits_measured_s=more["excess_s"] if more else None,
                 model_outside_waits_s=terms["outside_waits_s"],
                 model_overlap_window_s=terms["window_s"],
                 model_exposed_comm_s=terms["exposed_allreduce_s"],
                 predicted_step_time_s=step,
                 predicted_step_error_pct=symmetric_error_pct(step, t),
                 predicted_speedup_vs_no_ddp=pred,
                 predicted_speedup_error_pct=symmetric_error_pct(pred, n * t0 / t))
        t1 = row_value(one_rank.get(benchmark_key(r), {}), "step_time_p50_s")
        if t1 > 0:
            r["predicted_speedup"] = n * t1 / step
    return rows


def measured_allreduce_s(row: dict, sizes, *, transfers: bool = False) -> float:
    """The all-reduces of ``sizes`` bytes as this run timed them standalone (the rounds' sizes
    and p50 times, or with ``transfers`` their transfers where the row has them: the
    calls that waited for nothing; interpolated in log-log; beyond them, the nearest scaled by
    its size), summed.

    >>> row = {"allreduce_fit_bytes": [1e6, 4e6, 16e6], "allreduce_fit_times_s": [2e-3, 5e-3, 17e-3]}
    >>> round(measured_allreduce_s(row, [16e6]) * 1e3, 3), round(measured_allreduce_s(row, [2e6]) * 1e3, 3)
    (17.0, 3.162)
    >>> round(measured_allreduce_s({**row, "allreduce_fit_transfers_s": [1e-3, 4e-3, 15e-3]},
    ...                            [16e6], transfers=True) * 1e3, 3)
    15.0
    """
    import numpy as np

    key = "allreduce_fit_times_s"
    if transfers and isinstance(row.get("allreduce_fit_transfers_s"), list):
        key = "allreduce_fit_transfers_s"
    xs = np.log(np.asarray(row.get("allreduce_fit_bytes") or [], dtype=float))
    ys = np.log(np.asarray(row.get(key) or [], dtype=float))
    if len(xs) == 0:
        t = row_value(row, "allreduce_time_p50_s")
        g = row_value(row, "grad_bytes")
        return sum(t * float(s) / g for s in sizes) if t > 0 and g > 0 else math.nan
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    out = 0.0
    for s in sizes:
        x = math.log(float(s))
        if x > xs[-1]:
            out += math.exp(ys[-1]) * float(s) / math.exp(xs[-1])
        else:
            out += float(np.exp(np.interp(x, xs, ys)))
    return out


def imbalance_s(rank_step_times) -> float:
    """How long the slowest rank keeps the others waiting: the median over steps of the slowest
    rank's time less the mean rank's (0 on one rank).

    >>> round(imbalance_s([[0.100, 0.104, 0.098], [0.102, 0.100, 0.100]]), 4)
    0.001
    """
    import numpy as np

    a = np.asarray(rank_step_times, dtype=float)
    if a.ndim != 2 or a.shape[0] < 2 or a.shape[1] == 0:
        return 0.0
    return float(np.median(a.max(axis=0) - a.mean(axis=0)))


#: the split's terms for the buckets' all-reduces: their transfers as timed standalone, what
#: the scheduler waits counted in the median step took beyond them, and what the all-reduces
#: took after backward in that step beyond both (a slower transfer than standalone, no wait)
TRANSFERS_TERM, WAITS_TERM = "all-reduce transfers", "scheduler waits (counted)"
SLOWER_TERM = "all-reduce time in the step beyond transfers and waits"
#: what the parts of the median step outside the all-reduces that waited took beyond their medians
OUTSIDE_TERM = "scheduler waits outside the all-reduces (counted)"
#: the step less the terms timed apart: what none of them holds (a row without the median
#: step's timeline keeps its all-reduces' slower time here), negative where backward hid part
#: of the all-reduces
REST_TERM = "the rest (negative: all-reduce time hidden behind backward)"


def measured_split(row: dict, *, scale: float = 1.0) -> dict:
    """A measured DDP step taken apart into its measured terms (times ``scale``; 1e3: ms):
    the compute as it ran on N ranks (the ``no_sync`` step), DDP's copies as timed, the
    buckets' all-reduce transfers as timed standalone (the medians of the calls
    that waited for nothing), what the all-reduces that waited for the scheduler in the median
    step took beyond their transfers (where :func:`add_prediction_columns` counted them), what
    the all-reduces of that step took after backward's last gradient beyond both (rank 0's
    timeline, :func:`labkit.ddp.waits.bucket_times`: an all-reduce slower in the step than
    standalone without a wait the count sees), what the parts outside the all-reduces that
    waited took beyond their medians (:func:`labkit.ddp.waits.outside`), and the imbalance
    between the ranks' step times: the model's parts, measured; then the step less their sum (:data:`REST_TERM`:
    negative where backward hid part of the all-reduces, positive where the step held time
    none of them does), so the terms add up to the step.

    >>> row = {"step_time_p50_s": 0.092, "nosync_step_time_p50_s": 0.066,
    ...        "bucket_copy_time_p50_s": 0.008, "grad_bytes": 16e6, "bucket_bytes": [16e6],
    ...        "allreduce_fit_bytes": [16e6], "allreduce_fit_times_s": [0.0176],
    ...        "allreduce_fit_transfers_s": [0.0138], "allreduce_waits_measured_s": 0.0038,
    ...        "rank_step_times_s": [[0.092, 0.093], [0.091, 0.092]]}
    >>> split = measured_split(row, scale=1e3)
    >>> [round(v, 1) for v in split.values()], split[SLOWER_TERM]
    ([66.0, 8.0, 13.8, 3.8, 0.0, 0.0, 0.5, -0.1], 0.0)

    The median step's one all-reduce ran from 74 to 94 ms, backward over at 70: 20 ms paid
    against 13.8 + 3.8, so 2.4 ms more.

    >>> timed = {**row, "step_times_s": [0.1], "timeline_backward_end_s": [0.070],
    ...          "comm_intervals_s": [[[0.074, 0.094]]]}
    >>> round(measured_split(timed, scale=1e3)[SLOWER_TERM], 1)
    2.4
    """
    compute = row_value(row, "nosync_step_time_p50_s")
    copies = row_value(row, "bucket_copy_time_p50_s")
    buckets = [b for b in (row.get("bucket_bytes") or []) if isinstance(b, (int, float))]
    ar = measured_allreduce_s(row, buckets or [row_value(row, "grad_bytes")], transfers=True)
    waited = _measured_or_zero(row, "allreduce_waits_measured_s")
    slower, k = 0.0, waits.median_step(row)
    if k is not None:
        ends = row.get("timeline_backward_end_s")
        end = float(ends[k]) if isinstance(ends, list) and len(ends) > k else None
        paid = sum(waits.bucket_times(row["comm_intervals_s"][k], backward_end_s=end))
        slower = max(0.0, paid - ar - waited)
    wait = imbalance_s(row.get("rank_step_times_s") or [])
    more = _measured_or_zero(row, "outside_waits_measured_s")
    terms = {"compute": compute * scale, "copies": copies * scale, TRANSFERS_TERM: ar * scale,
             WAITS_TERM: waited * scale, SLOWER_TERM: slower * scale, OUTSIDE_TERM: more * scale,
             "imbalance": wait * scale}
    step = row.get("step_time_p50_s")
    if isinstance(step, (int, float)) and step == step:
        terms[REST_TERM] = round(float(step) * scale - sum(terms.values()), 12)
    return terms


def _measured_or_zero(row, key: str) -> float:
    """What the waits counted in ``key`` took (s); 0 where none were counted (None, NaN)."""
    v = row_value(row, key)
    return 0.0 if math.isnan(v) else v


def measured_overlap(row: dict) -> float:
    """The share of the buckets' all-reduces (as timed standalone) that the DDP step hid:
    ``1 - (t_DDP - compute - copies - imbalance - waits outside them) / all-reduces``, in
    [0, 1] (the waits outside: ``outside_waits_measured_s``, where counted).

    >>> row = {"step_time_p50_s": 0.080, "nosync_step_time_p50_s": 0.066,
    ...        "bucket_copy_time_p50_s": 0.008, "bucket_bytes": [4e6] * 4,
    ...        "allreduce_fit_bytes": [4e6], "allreduce_fit_times_s": [0.005]}
    >>> round(measured_overlap(row), 2)
    0.7
    """
    buckets = [b for b in (row.get("bucket_bytes") or []) if isinstance(b, (int, float))]
    ar = measured_allreduce_s(row, buckets or [row_value(row, "grad_bytes")])
    exposed = (row_value(row, "step_time_p50_s") - row_value(row, "nosync_step_time_p50_s")
               - row_value(row, "bucket_copy_time_p50_s")
               - imbalance_s(row.get("rank_step_times_s") or [])
               - _measured_or_zero(row, "outside_waits_measured_s"))
    if not (ar > 0 and math.isfinite(exposed)):
        return math.nan
    return min(1.0, max(0.0, 1.0 - exposed / ar))


def choice_cost(predicted, measured) -> tuple[float, int | None]:
    """What choosing DDP or not by the model costs: at each swept batch, the measured
    throughput of the model's choice (DDP where it predicts a speedup above 1, the one process
    elsewhere) over the better of the two as measured; (the worst batch's ratio, its index),
    or (1.0, None) where the model chose the better at every batch. A crossover divides small
    differences: near it either choice costs little, and this is what the wrong side costs.

    >>> choice_cost([0.9, 1.04, 1.6], [0.8, 0.945, 1.5])
    (0.945, 1)
    >>> choice_cost([0.9, 1.2, 1.6], [0.8, 1.1, 1.5])
    (1.0, None)
    >>> choice_cost([0.8, 1.2], [1.25, 1.3])  # the one process where DDP ran 1.25x: 1 / 1.25
    (0.8, 0)
    """
    pairs = [(float(p), float(m)) for p, m in zip(predicted, measured)]
    if not pairs:
        return math.nan, None
    worst, at = 1.0, None
    for i, (p, m) in enumerate(pairs):
        ratio = (m if p > 1.0 else 1.0) / max(m, 1.0)
        if ratio < worst:
            worst, at = ratio, i
    return worst, at
