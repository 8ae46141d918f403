"""The sharded-data-parallel lab's step model, in context: a row's step predicted from this
machine's profile and the row's own median step (pure: no torch). The lab's laws and
sentences (:mod:`labkit.fsdp.verdicts`) compare it with the measured step.

The step model: a rank's compute measured alone in the launch (``predicted_compute_s``, F/R:
forward and backward; plus the variant's Adam arithmetic, :func:`optimizer_s`) times the
profile's co-run slowdown at N ranks, plus each collective of the variant
(:func:`labkit.fsdp.formulas.collectives_per_step`) priced by the profile: an all-reduce of S
as its all-reduce of S, an all-gather or a reduce-scatter as the profile timed it on the same
buffer (:func:`labkit.tp.verdicts.op_factor`; a ring's half an all-reduce where it timed
none). Busy where a collective
moves while the cores compute (DDP's all-reduce during backward, in gloo's thread; FSDP's
gathers ahead of the layer that needs them, on a GPU), idle where the rank's thread waits for
it (ZeRO-1's and ZeRO-2's, and FSDP2's on a CPU: :func:`busy`). Each collective is priced as
its **transfer** (a call that waited for nothing) plus, for each one of the row's own median
step that **waited for the scheduler** (counted from its timeline, :mod:`labkit.tp.waits`),
the profile's scheduler wait. DDP's all-reduces run inside its C++ reducer, unstamped: a DDP
row holds no timeline, and its collectives are priced at the profile's average in context
(transfer + its share of waits), which its law's note says. FSDP2's row adds its own work,
measured in the launch with its collectives made local (:func:`own_work_s`). ``prof`` is a
:class:`labkit.machine.Profile` or anything with its ``compute_slowdown``, ``transfer_s``,
``wait_share`` and ``scheduler_wait_s`` (:class:`labkit.tp.fakeprofile.FakeProfile`).
"""

from __future__ import annotations

import math

from labkit.fsdp.formulas import collectives_per_step
from labkit.tp import waits
from labkit.tp.formulas import BYTES_PER_VALUE, param_count
from labkit.tp.timeline import OP_CAT
from labkit.tp.verdicts import WAITS_TERM, call_s, op_factor

#: the optimizer's arithmetic in a step's model (:func:`optimizer_s`)
ADAM_TERM = "Adam"
#: FSDP2's own work in a step's split and in its model (:func:`own_work_s`)
OWN_TERM = "FSDP2's own work (collectives local)"
#: what is left of a step split with FSDP2's own work measured
REST_OWN_TERM = "the rest (waits for the later rank, anything else)"

#: whether each stage's collectives move while the cores compute, where they can (a GPU)
BUSY = {"ddp": True, "zero1": False, "zero2": False, "zero3": True}


def _ms(x: float) -> float:
    return float(x) * 1e3


def busy(row) -> bool:
    """Whether the row's collectives move while the cores compute (the profile's busy sweep):
    :data:`BUSY`, but for FSDP2 on a CPU, where gloo holds the rank's thread through each of
    its collectives (nothing computes while the message moves).

    >>> busy({"stage": "zero3", "device": "cpu"}), busy({"stage": "zero3", "device": "cuda:0"})
    (False, True)
    >>> busy({"stage": "ddp", "device": "cpu"}), busy({"stage": "zero3", "backend": "nccl"})
    (True, True)
    """
    get = row.get if hasattr(row, "get") else (lambda key: None)
    # a row that names no device: NCCL's ranks are GPUs, gloo's here CPUs
    device = get("device") or ("cuda" if get("backend") == "nccl" else "cpu")
    return BUSY[row["stage"]] and not (row["stage"] == "zero3"
                                       and not str(device).startswith("cuda"))


def comm_parts(row, prof) -> dict:
    """The variant's collectives, one after the other, priced by the profile: ``transfers_s``
    (each one's transfer where the row's timeline counts the waits, else each one's average in
    context), ``waits`` (:func:`labkit.tp.waits.count` of the row's timeline, against each
    operation's transfer; None without one), ``scheduler_wait_s`` (one wait, the profile's),
    ``waits_s`` (the counted waits priced so), ``comm_s`` (the two) and ``calls``.

    >>> from labkit.tp.fakeprofile import FakeProfile
    >>> row = {"stage": "zero3", "world_size": 2, "hidden": 64, "num_layers": 2}
    >>> c = comm_parts(row, FakeProfile(allreduce_s=1e-3))
    >>> c["calls"], round(c["comm_s"] * 1e3, 1), c["waits"]
    (6, 8.0, None)

    With the median step's timeline, one all-gather 5 ms long: one wait (3.6 ms) counted.

    >>> tl = [{"rank": r, "name": n, "cat": cat, "start_s": 0.01 * i,
    ...        "end_s": 0.01 * i + (5e-3 if i == 1 else 1e-3 if cat == "all-gather" else 2e-3)}
    ...       for r in (0, 1) for i, (n, cat) in enumerate(
    ...           [("AG L0 (fwd)", "all-gather"), ("AG L1 (fwd)", "all-gather"),
    ...            ("AG L1 (bwd)", "all-gather"), ("RS L1", "reduce-scatter"),
    ...            ("AG L0 (bwd)", "all-gather"), ("RS L0", "reduce-scatter")])]
    >>> c = comm_parts({**row, "timeline_s": tl}, FakeProfile(allreduce_s=1e-3))
    >>> c["waits"]["count"], c["waits"]["waited"], round(c["comm_s"] * 1e3, 1)
    (1, ['AG L1 (fwd)'], 11.6)
    """
    n = int(row["world_size"])
    tl = waits.timeline(row) if n > 1 else None
    out = {"transfers_s": 0.0, "waits": None, "scheduler_wait_s": 0.0, "waits_s": 0.0,
           "comm_s": 0.0, "calls": 0}
    if n == 1:
        return out
    unit = param_count(hidden=int(row["hidden"]), num_layers=1) * BYTES_PER_VALUE
    coll = collectives_per_step(stage=row["stage"], unit_bytes=[unit] * int(row["num_layers"]),
                                reshard_after_forward=bool(row.get("reshard_after_forward",
                                                                   True)))
    kw = dict(ranks=n, busy=busy(row), counted=tl is not None)
    priced = [call_s(prof, s, factor=op_factor(prof, op, s, ranks=n, busy=kw["busy"]), **kw)
              for op, s in coll]
    out.update(transfers_s=sum(priced), comm_s=sum(priced), calls=len(coll))
    if tl is not None:
        # each operation's transfer: its buffer in the formula's list (every unit here has the
        # same bytes, so one size an operation)
        each = {OP_CAT[op]: t for (op, _), t in zip(coll, priced)}
        got = waits.count(tl, transfers=each)
        wait = float(prof.scheduler_wait_s)
        out.update(waits=got, scheduler_wait_s=wait, waits_s=got["count"] * wait if got else 0.0)
        out["comm_s"] += out["waits_s"]
    return out


def comm_in_context(row, prof) -> float:
    """Seconds of the variant's collectives, one after the other, each priced by the profile
    (:func:`comm_parts`).

    FSDP on 2 layers: 4 all-gathers and 2 reduce-scatters, timed by the profile at 1 and 2
    all-reduces of 1 ms; on a GPU they move beside the compute (busy, twice as long); a
    profile that timed neither prices them as a ring's, half an all-reduce:

    >>> from labkit.tp.fakeprofile import FakeProfile
    >>> row = {"stage": "zero3", "world_size": 2, "hidden": 64, "num_layers": 2}
    >>> round(comm_in_context(row, FakeProfile(allreduce_s=1e-3, busy_factor=2)) * 1e3, 1)
    8.0
    >>> round(comm_in_context({**row, "device": "cuda:0"}, FakeProfile(allreduce_s=1e-3,
    ...                                                                busy_factor=2)) * 1e3, 1)
    16.0
    >>> round(comm_in_context({**row, "device": "cuda:0"}, FakeProfile(
    ...     allreduce_s=1e-3, busy_factor=2, ops={})) * 1e3, 1)
    6.0
    """
    return comm_parts(row, prof)["comm_s"]


def _measured_s(row, key: str) -> float:
    """``row[key]`` in seconds; NaN where the row holds none (None, NaN or no such field)."""
    t = row.get(key)
    return math.nan if t is None else float(t)


def optimizer_s(row) -> float:
    """The variant's Adam arithmetic in a step (s), one rank alone, measured in the launch
    (``optimizer_time_s``): what F/R, forward and backward, leaves out of the plain model's
    step. 0 where the row holds none (a row written before rows kept it).

    >>> optimizer_s({"optimizer_time_s": 0.0095}), optimizer_s({})
    (0.0095, 0.0)
    """
    t = _measured_s(row, "optimizer_time_s")
    return t if math.isfinite(t) else 0.0


def own_work_s(row) -> float:
    """FSDP2's own work in a step (s), measured in the launch: its step with the collectives
    replaced by local copies less the plain model's step, both with every rank at once
    (:mod:`labkit.fsdp.local`): the copies into and out of its flat buffers, its hooks, what
    Adam on DTensors costs beyond the plain model's Adam. 0 where the row holds no such step
    (DDP, the hand-written ZeRO, 1 rank).

    >>> round(own_work_s({"local_step_time_p50_s": 0.070, "compute_time_p50_s": 0.044}), 6)
    0.026
    >>> own_work_s({"stage": "ddp", "compute_time_p50_s": 0.044})
    0.0
    """
    local = _measured_s(row, "local_step_time_p50_s")
    if not math.isfinite(local):
        return 0.0
    return max(0.0, local - float(row["compute_time_p50_s"]))


def context(row, prof) -> dict:
    """``slowdown``, ``optimizer_s`` (:func:`optimizer_s`), ``compute_s`` ((F/R + Adam) x
    slowdown), ``comm_s``, ``own_s`` (:func:`own_work_s`), ``step_s`` (the three) of one row,
    in context, with :func:`comm_parts`' ``transfers_s``, ``waits``, ``scheduler_wait_s`` and
    ``waits_s``.

    >>> from labkit.tp.fakeprofile import FakeProfile
    >>> row = {"stage": "ddp", "world_size": 2, "hidden": 64, "num_layers": 2,
    ...        "predicted_compute_s": 0.06}
    >>> ctx = context(row, FakeProfile())
    >>> ctx["slowdown"], [round(ctx[k] * 1e3, 1) for k in ("compute_s", "comm_s", "step_s")]
    (1.25, [75.0, 1.2, 76.2])
    >>> fsdp = {**row, "stage": "zero3", "compute_time_p50_s": 0.07,
    ...         "local_step_time_p50_s": 0.09}
    >>> [round(context(fsdp, FakeProfile())[k] * 1e3, 1) for k in ("own_s", "step_s")]
    [20.0, 101.4]

    Adam's 8 ms alone, slowed as the compute is:

    >>> round(context({**row, "optimizer_time_s": 0.008}, FakeProfile())["compute_s"] * 1e3, 1)
    85.0
    """
    n = int(row["world_size"])
    slow = prof.compute_slowdown(n) if n > 1 else 1.0
    adam = optimizer_s(row)
    compute = (float(row["predicted_compute_s"]) + adam) * slow
    comm = comm_parts(row, prof)
    own = own_work_s(row)
    return {**{k: comm[k] for k in ("transfers_s", "waits", "scheduler_wait_s", "waits_s")},
            "slowdown": slow, "optimizer_s": adam, "compute_s": compute,
            "comm_s": comm["comm_s"], "own_s": own, "step_s": compute + comm["comm_s"] + own}


def step_split(row, ctx: dict | None = None) -> dict:
    """The measured step (ms, p50): the plain model's step on the same batch, the variant's
    collectives timed alone (when measured), what the scheduler waits counted by the model's
    ``ctx`` (:func:`context`) took of the median step (beyond their transfers, measured;
    :data:`labkit.tp.verdicts.WAITS_TERM`) and the rest (the wrapper's own work, the waits
    for the later rank); the terms add up to the step.

    >>> step_split({"step_time_p50_s": 0.217, "compute_time_p50_s": 0.103,
    ...             "collectives_time_alone_s": 0.02})
    {'the plain model': 103.0, 'its collectives (timed alone)': 20.0, "the rest (the wrapper's work, waits)": 94.0}
    >>> step_split({"step_time_p50_s": 0.217, "compute_time_p50_s": 0.103,
    ...             "collectives_time_alone_s": 0.02},
    ...            {"waits": {"count": 2, "excess_s": [0.003, 0.004]}})["scheduler waits (counted)"]
    7.0

    FSDP2's row also holds its own work, measured (:func:`own_work_s`):

    >>> step_split({"step_time_p50_s": 0.217, "compute_time_p50_s": 0.103,
    ...             "collectives_time_alone_s": 0.02, "local_step_time_p50_s": 0.133})
    {'the plain model': 103.0, 'its collectives (timed alone)': 20.0, "FSDP2's own work (collectives local)": 30.0, 'the rest (waits for the later rank, anything else)': 64.0}
    """
    compute = _ms(row["compute_time_p50_s"])
    alone = float(row.get("collectives_time_alone_s", math.nan))
    out = {"the plain model": compute}
    if math.isfinite(alone):
        out["its collectives (timed alone)"] = _ms(alone)
    own = own_work_s(row)
    if own > 0:
        out[OWN_TERM] = _ms(own)
    rest = _ms(row["step_time_p50_s"]) - sum(out.values())
    got = (ctx or {}).get("waits")
    if got and got["count"]:
        part = min(_ms(sum(got["excess_s"])), max(rest, 0.0))  # within what is left
        out[WAITS_TERM] = part
        rest -= part
    out[REST_OWN_TERM if OWN_TERM in out else "the rest (the wrapper's work, waits)"] = rest
    return {k: round(v, 6) for k, v in out.items()}


def wait_note(ctx: dict) -> str:
    """What the model counted and priced for a row's collectives (:func:`context`).

    >>> print(wait_note({"waits": None, "transfers_s": 1.2e-3}))
    the row holds no timeline of its collectives (DDP's all-reduces run in its C++ reducer, unstamped): each priced at the profile's average in context, transfer + its share of scheduler waits (1.20 ms in all)
    """
    return waits.note(ctx["waits"], wait_s=ctx.get("scheduler_wait_s", 0.0),
                      transfers="the profile's",
                      fallback="the row holds no timeline of its collectives (DDP's all-reduces "
                               "run in its C++ reducer, unstamped): each priced at the profile's "
                               "average in context, transfer + its share of scheduler waits "
                               f"({_ms(ctx['transfers_s']):.2f} ms in all)")
