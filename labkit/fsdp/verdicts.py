"""The sharded-data-parallel lab's laws and sentences, computed from a run's rows and this
machine's profile (pure: no torch).

The step model (:mod:`labkit.fsdp.model`): a rank's compute measured alone in the launch times
the profile's co-run slowdown at N ranks, plus the variant's collectives, each priced as its
transfer plus, for each one of the row's median step that waited for the scheduler (counted
from its timeline), the profile's scheduler wait; DDP's, run inside its C++ reducer and never
stamped, at the profile's average in context. ``prof`` is a :class:`labkit.machine.Profile` or
:class:`labkit.tp.fakeprofile.FakeProfile`.
"""

from __future__ import annotations

from labkit.book.laws import check
from labkit.fsdp.model import ADAM_TERM, OWN_TERM, context, step_split, wait_note
from labkit.tp import waits
from labkit.tp.verdicts import TOLERANCE_PCT

#: the state and the bytes moved are counts, exact but for Adam's step counters and DDP's few
#: bytes of bookkeeping beside the gradients
COUNT_TOLERANCE_PCT = 1.0
STATE_LAW = {"ddp": "16 Ψ", "zero1": "8 Ψ + 8 Ψ/N", "zero2": "4 Ψ + 12 Ψ/N", "zero3": "16 Ψ/N"}


def _ms(x: float) -> float:
    return float(x) * 1e3


def laws(rows, comm_rows, prof) -> list[dict]:
    """Section 4's laws: per variant the state a rank holds and the bytes it moves (counts),
    then its step time in context (with its measured split). ``rows``: the variants' rows
    (ddp, zero1, fsdp); ``comm_rows``: :func:`labkit.fsdp.report.comm_frame`'s records."""
    out = []
    for r in rows:
        n = int(r["world_size"])
        out.append(check(f"{r['variant']}, N = {n}: state per rank = {STATE_LAW[r['stage']]}",
                         predicted=r["state_bytes_formula"], measured=r["state_bytes_per_rank"],
                         unit="B", tolerance_pct=COUNT_TOLERANCE_PCT))
    for c in comm_rows:
        out.append(check(f"{c['variant']}, N = {int(c['ranks'])}: bytes moved per step, "
                         f"{c['law']}", predicted=c["predicted_MB"] * 1e6,
                         measured=c["measured_MB"] * 1e6, unit="B",
                         tolerance_pct=COUNT_TOLERANCE_PCT))
    for r in rows:
        ctx = context(r, prof)
        n = int(r["world_size"])
        own = f" + {OWN_TERM}" if ctx["own_s"] > 0 else ""
        out.append(check(f"{r['variant']}, N = {n}: step = {_compute_name(ctx)} x slowdown + "
                         f"its collectives (in context){own}", predicted=_ms(ctx["step_s"]),
                         measured=_ms(r["step_time_p50_s"]), unit="ms",
                         tolerance_pct=TOLERANCE_PCT, split=step_split(r, ctx),
                         note=wait_note(ctx) if n > 1 else ""))
    return out


def _compute_name(ctx: dict, *, with_ms: bool = False) -> str:
    """The compute term's name: F/R, with the variant's Adam where the row measured it (and
    its milliseconds, ``with_ms``).

    >>> _compute_name({"optimizer_s": 0.009}), _compute_name({"optimizer_s": 0.0})
    ('(F/R + Adam)', 'F/R')
    >>> _compute_name({"optimizer_s": 0.009}, with_ms=True)
    '(F/R + Adam 9.0)'
    """
    if not ctx["optimizer_s"] > 0:
        return "F/R"
    ms = f" {_ms(ctx['optimizer_s']):.1f}" if with_ms else ""
    return f"(F/R + {ADAM_TERM}{ms})"


def against_ddp_sentence(r) -> str:
    """What a sharded variant holds, moves and takes against DDP in the same launch.

    >>> r = {"variant": "fsdp", "state_bytes_per_rank": 12.6e6, "ddp_state_bytes_per_rank":
    ...      25.3e6, "state_ratio_vs_ddp": 0.498, "comm_ratio_vs_ddp": 1.5,
    ...      "step_ratio_vs_ddp": 1.61}
    >>> against_ddp_sentence(r)
    "fsdp: holds 12.6 MB a rank against DDP's 25.3 MB (50% less), moves 1.50x DDP's bytes, and its step takes 1.61x DDP's time here (longer)"
    >>> against_ddp_sentence({**r, "step_ratio_vs_ddp": 0.9})[-25:]
    "DDP's time here (shorter)"
    """
    s = float(r["state_ratio_vs_ddp"])
    held = f"{abs(1 - s):.0%} {'less' if s < 1 else 'more' if s > 1 else 'the same'}"
    t = float(r["step_ratio_vs_ddp"])
    how = "longer" if t > 1 else "shorter" if t < 1 else "the same"
    return (f"{r['variant']}: holds {r['state_bytes_per_rank'] / 1e6:.1f} MB a rank against DDP's "
            f"{r['ddp_state_bytes_per_rank'] / 1e6:.1f} MB ({held}), moves "
            f"{r['comm_ratio_vs_ddp']:.2f}x DDP's bytes, and its step takes {t:.2f}x DDP's time "
            f"here ({how})")


def step_sentence(r, prof) -> str:
    """A variant's step, split as measured, beside the model's parts: the compute, the
    collectives' transfers and the scheduler waits it counted in the median step (or, without
    a timeline, the collectives at their average in context).

    >>> from labkit.tp.verdicts import FakeProfile
    >>> r = {"variant": "ddp", "stage": "ddp", "world_size": 2, "hidden": 64, "num_layers": 2,
    ...      "predicted_compute_s": 0.06, "step_time_p50_s": 0.0755, "compute_time_p50_s": 0.0645,
    ...      "collectives_time_alone_s": 0.003}
    >>> step_sentence(r, FakeProfile())
    "ddp: step 75.5 ms = the plain model 64.5 + its collectives (timed alone) 3.0 + the rest (the wrapper's work, waits) 8.0; the model: F/R alone x 1.25 = 75.0 + its collectives at the profile's average in context 1.2"
    >>> tl = [{"rank": k, "name": n, "cat": c, "start_s": 0.01 * i, "end_s": 0.01 * i + d}
    ...       for k in (0, 1) for i, (n, c, d) in enumerate([("RS all layers", "reduce-scatter",
    ...                                                      6e-3), ("AG all layers", "all-gather", 1e-3)])]
    >>> print(step_sentence({**r, "variant": "zero1", "stage": "zero1", "timeline_s": tl},
    ...                     FakeProfile(allreduce_s=1e-3)).split("; ")[1])
    the model: F/R alone x 1.25 = 75.0 + its collectives' transfers 3.0 + 1 scheduler wait counted in the median step 3.6
    """
    ctx = context(r, prof)
    parts = " + ".join(f"{k} {v:.1f}" for k, v in step_split(r, ctx).items())
    got = ctx["waits"]
    comm = (f"its collectives' transfers {_ms(ctx['transfers_s']):.1f} + {got['count']} scheduler "
            f"wait{'s' if got['count'] != 1 else ''} counted in the median step "
            f"{_ms(ctx['waits_s']):.1f}" if got else
            f"its collectives at the profile's average in context {_ms(ctx['comm_s']):.1f}")
    own = f" + {OWN_TERM} {_ms(ctx['own_s']):.1f}" if ctx["own_s"] > 0 else ""
    return (f"{r['variant']}: step {_ms(r['step_time_p50_s']):.1f} ms = {parts}; the model: "
            f"{_compute_name(ctx, with_ms=True)} alone x {ctx['slowdown']:.2f} = "
            f"{_ms(ctx['compute_s']):.1f} + {comm}{own}")


def waits_sentence(r, prof) -> str:
    """How many of a variant's collectives waited for the scheduler in its median step, and
    why (:func:`labkit.tp.waits.sentence`), named by the variant."""
    ctx = context(r, prof)
    return f"{r['variant']}: " + waits.sentence(ctx["waits"], wait_s=ctx["scheduler_wait_s"],
                                                step=r.get("timeline_step"))


def fits_sentence(name: str, *, gpus: int, ddp_bytes: float, fsdp_bytes: float,
                  gpu_gb: float) -> str:
    """Whether DDP's and FSDP's state fits one GPU.

    >>> fits_sentence("Llama-3-8B", gpus=8, ddp_bytes=128e9, fsdp_bytes=16e9, gpu_gb=80)
    'Llama-3-8B on 8 H100s: DDP holds 128 GB a GPU (does not fit in 80 GB), FSDP 16 GB (fits)'
    """
    def fits(b):
        return "fits" if b / 1e9 < gpu_gb else "does not fit"

    return (f"{name} on {gpus} H100s: DDP holds {ddp_bytes / 1e9:.0f} GB a GPU ({fits(ddp_bytes)} "
            f"in {gpu_gb:g} GB), FSDP {fsdp_bytes / 1e9:.0f} GB ({fits(fsdp_bytes)})")


def extra_comm_sentence(*, ddp_s: float, fsdp_s: float, compute_s: float, tokens: int) -> str:
    """What FSDP's extra collectives add to a step, against its compute.

    >>> extra_comm_sentence(ddp_s=0.062, fsdp_s=0.094, compute_s=0.997, tokens=8192)
    'communication per step: DDP 62 ms, FSDP 94 ms (+32 ms, 1.52x), against 997 ms of compute for 8192 tokens a GPU: FSDP adds 3% of a step if none of it overlaps'
    """
    return (f"communication per step: DDP {_ms(ddp_s):.0f} ms, FSDP {_ms(fsdp_s):.0f} ms "
            f"({_ms(fsdp_s - ddp_s):+.0f} ms, {fsdp_s / ddp_s:.2f}x), against "
            f"{_ms(compute_s):.0f} ms of compute for {tokens} tokens a GPU: FSDP adds "
            f"{(fsdp_s - ddp_s) / compute_s:.0%} of a step if none of it overlaps")


def strategies_sentence(name: str, *, fits: list, gpus: int, gpu_gb: float,
                        micro_batch: int, seq_len: int) -> str:
    """Which of DP and ZeRO-1/2/3 fit a model on the GPUs.

    >>> strategies_sentence("Llama-3-70B", fits=[], gpus=8, gpu_gb=80, micro_batch=1,
    ...                     seq_len=4096)
    'Llama-3-70B on 8 GPUs of 80 GB, micro-batch 1 of 4096 tokens: fits with none of DP and ZeRO-1/2/3 alone: add TP (or PP)'
    """
    head = (f"{name} on {gpus} GPUs of {gpu_gb:g} GB, micro-batch {micro_batch} of {seq_len} "
            "tokens: ")
    return head + (f"fits with {', '.join(fits)}" if fits
                   else "fits with none of DP and ZeRO-1/2/3 alone: add TP (or PP)")


# ---------------------------------------------------------------- memory over a step

#: memory laws: counts of what a rank holds, exact but for Adam's step counters
MEMORY_TOLERANCE_PCT = 10.0
_KINDS = (("params", "weights"), ("gradients", "gradients"), ("optimizer", "Adam states"),
          ("buffers", "buffers"), ("activations", "activations"))


def _mb(x) -> float:
    return float(x) / 1e6


def peak_split(row) -> dict:
    """The counted peak of ``row``'s step by kind (MB); the terms add up to the peak.

    >>> peak_split({"peak_params_bytes": 6e6, "peak_gradients_bytes": 3e6,
    ...             "peak_optimizer_bytes": 6e6, "peak_buffers_bytes": 3e6,
    ...             "peak_activations_bytes": 2e6})
    {'weights': 6.0, 'gradients': 3.0, 'Adam states': 6.0, 'buffers': 3.0, 'activations': 2.0}
    """
    return {name: _mb(row[f"peak_{k}_bytes"]) for k, name in _KINDS}


def memory_laws(rows) -> list[dict]:
    """The memory laws of the sharded variants' rows: ZeRO-2's gradients held (4Ψ/N), and
    FSDP's peak over a step with and without resharding after forward, against FSDP2's
    schedule (:func:`labkit.fsdp.formulas.step_memory`, ``model``) and against the textbook's
    one-unit transient (``naive``: a miss says what FSDP2 holds besides)."""
    from labkit.fsdp.formulas import naive_fsdp_peak_bytes

    out = []
    for r in rows:
        n = int(r["world_size"])
        if r["stage"] == "zero2":
            out.append(check(f"zero2, N = {n}: gradients per rank = 4 Ψ / N",
                             predicted=_mb(r["grad_bytes_formula"]),
                             measured=_mb(r["grad_bytes_per_rank"]), unit="MB",
                             tolerance_pct=MEMORY_TOLERANCE_PCT))
        if r["stage"] != "zero3":
            continue
        mine = "resharded" if r["reshard_after_forward"] else "kept"
        for how, words in (("resharded", "resharding after forward"),
                           ("kept", "keeping the gathered weights to backward")):
            split = peak_split(r) if how == mine else None
            out.append(check(f"fsdp, N = {n}, {words}: peak = shards + activations + FSDP2's "
                             "transient (its schedule)",
                             predicted=_mb(r[f"peak_{how}_bytes_formula"]),
                             measured=_mb(r[f"peak_{how}_bytes_per_rank"]), unit="MB",
                             tolerance_pct=MEMORY_TOLERANCE_PCT, split=split))
            naive = naive_fsdp_peak_bytes(params=r["num_params"], layers=int(r["num_layers"]),
                                          dp=n, activation_bytes=r["activation_bytes_formula"],
                                          reshard_after_forward=how == "resharded")
            unit = "one unit's" if how == "resharded" else "all units'"
            out.append(check(f"fsdp, N = {n}, {words}: peak = shards + activations + {unit} "
                             "weights (the textbook)", kind="naive", predicted=_mb(naive),
                             measured=_mb(r[f"peak_{how}_bytes_per_rank"]), unit="MB",
                             tolerance_pct=MEMORY_TOLERANCE_PCT, split=split))
    return out


def checkpoint_laws(row) -> list[dict]:
    """Activation checkpointing on the plain model (any row of the launch carries it): the
    bytes saved for backward without and with it (counts), and the step with it against the
    plain step plus one forward in three of forward + backward
    (:func:`labkit.fsdp.formulas.checkpoint_step_ratio`), split as measured on a miss."""
    from labkit.fsdp.formulas import checkpoint_step_ratio

    plain, ckpt = _ms(row["compute_time_p50_s"]), _ms(row["checkpoint_compute_time_p50_s"])
    fwd = _ms(row["forward_time_p50_s"])
    return [
        check("saved activations, no checkpointing: L (16 s b h + 4 b s + a b s) + 2 s b h "
              "values", predicted=_mb(row["activation_bytes_formula"]),
              measured=_mb(row["activation_bytes_measured"]), unit="MB",
              tolerance_pct=MEMORY_TOLERANCE_PCT),
        check("saved activations, checkpointing: (L + 2) s b h values",
              predicted=_mb(row["checkpoint_activation_bytes_formula"]),
              measured=_mb(row["checkpoint_activation_bytes_measured"]), unit="MB",
              tolerance_pct=MEMORY_TOLERANCE_PCT),
        check("step with checkpointing = plain step x 4/3 (one more forward)",
              predicted=plain * checkpoint_step_ratio(), measured=ckpt, unit="ms",
              tolerance_pct=TOLERANCE_PCT,
              split={"the plain step": plain, "a forward (timed alone)": fwd,
                     "the rest": ckpt - plain - fwd}),
    ]


def checkpoint_sentence(row) -> str:
    """What checkpointing saved and cost on the plain model, from the row's numbers.

    >>> checkpoint_sentence({"activation_bytes_measured": 4.46e6,
    ...     "checkpoint_activation_bytes_measured": 0.52e6, "compute_time_p50_s": 0.092,
    ...     "checkpoint_compute_time_p50_s": 0.128, "forward_time_p50_s": 0.034})
    'activation checkpointing keeps 0.52 MB instead of 4.46 MB (8.6x less) and makes the step 1.39x longer (92.0 -> 128.0 ms; a forward alone takes 34.0 ms, 37% of the plain step, against the 1/3 of the formula)'
    """
    plain, ckpt = _ms(row["compute_time_p50_s"]), _ms(row["checkpoint_compute_time_p50_s"])
    fwd = _ms(row["forward_time_p50_s"])
    a, c = row["activation_bytes_measured"], row["checkpoint_activation_bytes_measured"]
    return (f"activation checkpointing keeps {_mb(c):.2f} MB instead of {_mb(a):.2f} MB "
            f"({a / c:.1f}x less) and makes the step {ckpt / plain:.2f}x longer ({plain:.1f} -> "
            f"{ckpt:.1f} ms; a forward alone takes {fwd:.1f} ms, {fwd / plain:.0%} of the plain "
            "step, against the 1/3 of the formula)")


def peak_sentence(r) -> str:
    """Where a variant's step holds the most, and what.

    >>> peak_sentence({"variant": "fsdp", "peak_bytes_per_rank": 21.06e6,
    ...     "peak_bytes_formula": 21.06e6, "peak_at": "layer 1 backward exit",
    ...     "peak_params_bytes": 6.32e6, "peak_gradients_bytes": 3.16e6,
    ...     "peak_optimizer_bytes": 6.32e6, "peak_buffers_bytes": 3.16e6,
    ...     "peak_activations_bytes": 2.1e6})
    'fsdp: peak 21.06 MB (formula 21.06) at layer 1 backward exit: weights 6.32 + gradients 3.16 + Adam states 6.32 + buffers 3.16 + activations 2.10 MB'
    """
    parts = " + ".join(f"{k} {v:.2f}" for k, v in peak_split(r).items())
    return (f"{r['variant']}: peak {_mb(r['peak_bytes_per_rank']):.2f} MB (formula "
            f"{_mb(r['peak_bytes_formula']):.2f}) at {r['peak_at']}: {parts} MB")


def reshard_sentence(r) -> str:
    """FSDP's peak with and without resharding after forward, from the row's counts.

    >>> reshard_sentence({"peak_resharded_bytes_per_rank": 21.06e6,
    ...                   "peak_kept_bytes_per_rank": 21.06e6, "num_layers": 2})
    'fsdp: peak 21.06 MB resharding after forward, 21.06 MB keeping the weights to backward: the same with 2 layers'
    >>> reshard_sentence({"peak_resharded_bytes_per_rank": 21.3e6,
    ...                   "peak_kept_bytes_per_rank": 24.5e6, "num_layers": 4})[-43:]
    'keeping the weights costs 3.20 MB more here'
    """
    a, b = _mb(r["peak_resharded_bytes_per_rank"]), _mb(r["peak_kept_bytes_per_rank"])
    head = (f"fsdp: peak {a:.2f} MB resharding after forward, {b:.2f} MB keeping the weights to "
            "backward: ")
    if abs(a - b) < 0.005:
        return head + f"the same with {int(r['num_layers'])} layers"
    return head + f"keeping the weights costs {b - a:.2f} MB {'more' if b > a else 'less'} here"


def timeline_sentence(row) -> str:
    """What a recorded step (``timeline_s``, :mod:`labkit.fsdp.trace`) shows, rank by rank:
    the time in collectives and in compute and how much of it ran at once, the backward
    all-gathers issued while the layer above still ran its backward (prefetched), and the
    reduce-scatters issued before backward was over.

    >>> row = {"variant": "fsdp", "world_size": 1, "timeline_step": 2,
    ...        "timeline_step_time_s": 0.01, "timeline_s": [
    ...     dict(rank=0, name="B L1", cat="backward", start_s=0.000, end_s=0.004),
    ...     dict(rank=0, name="AG L0 (bwd)", cat="all-gather", start_s=0.002, end_s=0.003),
    ...     dict(rank=0, name="B L0", cat="backward", start_s=0.004, end_s=0.006),
    ...     dict(rank=0, name="RS L1", cat="reduce-scatter", start_s=0.005, end_s=0.007)]}
    >>> print(timeline_sentence(row))
    fsdp, timed step 2 (10.0 ms): rank 0 spent 3.0 ms in 2 collectives and 6.0 ms computing, 2.0 ms (67% of the collectives) at once; 1 of 1 backward all-gathers were issued while the layer above still ran its backward (prefetched), 1 of 1 reduce-scatters before backward was over.
    """
    from labkit.fsdp.trace import OP_CAT, overlap

    slices = row["timeline_s"]
    parts = []
    for rank, (comm, work, both) in overlap(slices).items():
        mine = [s for s in slices if int(s["rank"]) == rank]
        n = sum(1 for s in mine if s["cat"] in OP_CAT.values())
        ends = {}
        for s in mine:
            if s["cat"] == "backward":
                ends[s["name"]] = max(ends.get(s["name"], 0.0), s["end_s"])
        gathers = [s for s in mine if s["name"].startswith("AG L") and s["name"].endswith("(bwd)")]
        gathers = [s for s in gathers if f"B L{int(s['name'][4:].split()[0]) + 1}" in ends]
        ahead = sum(1 for s in gathers
                    if s["start_s"] < ends[f"B L{int(s['name'][4:].split()[0]) + 1}"])
        last = max(ends.values(), default=None)
        scatters = [s for s in mine if s["cat"] == "reduce-scatter"]
        early = sum(1 for s in scatters if last is not None and s["start_s"] < last)
        at_once = (f"{_ms(both):.1f} ms ({both / comm:.0%} of the collectives) at once"
                   if both > 0 else "none of it at once")
        text = (f"rank {rank} spent {_ms(comm):.1f} ms in {n} collectives and {_ms(work):.1f} ms "
                f"computing, {at_once}")
        if gathers:
            text += (f"; {ahead} of {len(gathers)} backward all-gathers were issued while the "
                     "layer above still ran its backward (prefetched)")
        if scatters:
            text += (f", {early} of {len(scatters)} reduce-scatters before backward was over"
                     if gathers else f"; {early} of {len(scatters)} reduce-scatters before "
                     "backward was over")
        parts.append(text)
    return (f"{row['variant']}, timed step {int(row['timeline_step'])} "
            f"({_ms(row['timeline_step_time_s']):.1f} ms): " + "; ".join(parts) + ".")
