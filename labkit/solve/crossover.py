"""When do more ranks pay? The crossover of a strong sweep over sizes (pure: pandas only).

One rank's CG iteration costs t1 = c + k N: k seconds per DOF (the memory traffic), and c a
fixed cost per iteration (a dozen torch calls, the Python loop) that no rank count divides.
P ranks split the k N part, but ranks streaming memory at once share the memory system: each
rank's share runs s times slower than it would alone. s depends on the size: it is read off
the machine profile's copies at each rank's share of the iteration's footprint
(:func:`labkit.solve.memory.co_run_reading`; copies that fit the shared cache side by side
barely slow each other). P ranks also pay a larger fixed cost c_P: c plus one
halo exchange and one (fused) all-reduce per iteration (t_msg) plus what else a rank of many
does per iteration (the split SpMV's second call, packing the halo, ranks waiting for each
other). t_P = c_P + s k N / P, and more ranks pay once k N (1 - s/P) > c_P - c. The naive model
takes c_P = c + t_msg and s = 1; the full one reads c_P off the smallest size, where k N / P is
small, and carries s.

:func:`crossover` the table and summary (with the sentences of :mod:`labkit.solve.verdicts`),
:func:`crossover_laws` its laws, :func:`print_crossover` what ``labkit solve`` prints.
"""

from __future__ import annotations

import math

from labkit.errors import UsageError
from labkit.results import select_rows
from labkit.solve import memory, verdicts
from labkit.solve.report import passed


def crossover(df, *, message_s: float, ranks: int = 2, method: str = "cg",
              partitioner: str | None = None, slowdown: float = 1.0, profile=None):
    """Strong scaling at several sizes against the model of
    :func:`labkit.solve.formulas.predicted_speedup`: one row per size (``dof_global``,
    ``t1_per_iteration_s`` and ``t1_source``: ``inline`` when rank 0 timed it alone beside the
    P-rank solves, ``launch`` when it comes from the 1-rank row, ``tp_per_iteration_s``,
    ``speedup`` of the solve,
    ``speedup_per_iteration``, ``naive_speedup`` (messages only), ``predicted_speedup``,
    ``error_pct``, ``calibration``: True for the smallest size, which the model's c_P is read
    from, so its prediction is not a test; ``model_tp_per_iteration_s``, the model's P-rank
    iteration; ``split_us``, the measured one in its terms, :func:`verdicts.iteration_split_us`),
    ``slowdown``, the s the full model carries at that size,
    and a summary dict: ``slowdown`` (s at the largest size), ``reading`` (its
    :func:`~labkit.solve.memory.co_run_reading`; None without a profile),
    ``measured_slowdown`` (at the largest size, P x compute_P / compute_1 of rank 0 alone: the
    inline baseline's; None without one),
    ``seconds_per_dof_iteration``
    and ``fixed_s`` (k and c of the fit t1 = c + k N,
    :func:`~labkit.solve.formulas.fit_iteration_time`), ``message_s`` (t_msg, given),
    ``fixed_p_s`` (c_P at the smallest size, :func:`~labkit.solve.formulas.fixed_cost_at`),
    ``other_s`` (c_P − c − t_msg: what P ranks add besides the messages),
    ``naive_crossover_dof`` (c_P = c + t_msg) and ``predicted_crossover_dof``
    (:func:`~labkit.solve.formulas.crossover_dof`), ``measured_crossover_dof``
    (:func:`~labkit.solve.formulas.measured_crossover`, None when no size of the sweep loses or
    none wins), ``speedup_at_predicted_crossover`` and ``speedup_at_naive_crossover`` (the
    measured speedup at each model's N*, :func:`speedup_at`: 1 where the
    model is right; None where N* lies outside the sweep).

    s: with a machine ``profile``, read at each size N off its copies at the size of each
    rank's share (:func:`~labkit.solve.memory.co_run_reading`: the rows' footprint per DOF
    times N over P ranks), also between the sizes, where N* lies; without one, the constant
    ``slowdown``.

    A sweep of one size has no crossover: UsageError.
    """
    import pandas as pd

    from labkit.metrics import model_error_pct
    from labkit.solve.formulas import (
        crossover_dof,
        fit_iteration_time,
        fixed_cost_at,
        measured_crossover,
        predicted_speedup,
    )

    sel = select_rows(passed(df), mode="strong", method=method, partitioner=partitioner)
    one = select_rows(sel, world_size=1).set_index("dof_requested")
    many = select_rows(sel, world_size=ranks).set_index("dof_requested")

    def t1_of(size):
        """t1 per iteration: rank 0's solve alone beside the P-rank ones (inline) when the row
        has it, else the 1-rank launch's row; None when neither exists."""
        inline = many.loc[[size]].iloc[0].get("baseline_time_per_iteration_s")
        if inline is not None and inline == inline:  # not NaN
            return float(inline), "inline"
        if size in one.index:
            return float(one.loc[[size]].iloc[0]["time_per_iteration_s"]), "launch"
        return None

    t1s = {n: t1_of(n) for n in many.index.unique()}
    sizes = sorted(n for n, t in t1s.items() if t is not None)
    if len(sizes) < 2:
        raise UsageError(f"a crossover needs strong rows at 1 and {ranks} ranks for at least two "
                         f"sizes (--total-dof N1 N2 ...); have {len(sizes)}")
    c, k = fit_iteration_time([float(many.loc[[n]].iloc[0]["dof_global"]) for n in sizes],
                              [t1s[n][0] for n in sizes])
    s_at = _slowdown_at(many, profile=profile, ranks=ranks, slowdown=slowdown)
    smallest = many.loc[[sizes[0]]].iloc[0]
    c_p = fixed_cost_at(seconds_per_iteration=float(smallest["time_per_iteration_s"]),
                        dof=float(smallest["dof_global"]), ranks=ranks, seconds_per_dof_iteration=k,
                        slowdown=s_at(float(smallest["dof_global"])))
    rows = []
    for size in sizes:
        b = many.loc[[size]].iloc[0]
        (t1, source), tp = t1s[size], float(b["time_per_iteration_s"])
        compute1 = b.get("baseline_compute_time_s")  # rank 0 alone: SpMV and vector time
        its1 = b.get("baseline_iterations")
        s = s_at(float(b["dof_global"]))
        pred = predicted_speedup(seconds_per_iteration_1=t1, ranks=ranks, fixed_s=c, fixed_p_s=c_p,
                                 slowdown=s)
        meas = t1 / tp
        rows.append({"dof_global": int(b["dof_global"]), "t1_per_iteration_s": t1,
                     "t1_source": source, "tp_per_iteration_s": tp, "speedup": float(b["speedup"]),
                     "speedup_per_iteration": meas,
                     "naive_speedup": predicted_speedup(seconds_per_iteration_1=t1, ranks=ranks,
                                                        fixed_s=c, fixed_p_s=c + message_s),
                     "predicted_speedup": pred, "slowdown": s,
                     "error_pct": model_error_pct(model_s=pred, measured_s=meas),
                     "calibration": size == sizes[0],
                     "model_tp_per_iteration_s": t1 / pred, **verdicts.iteration_parts(b),
                     "split_us": verdicts.iteration_split_us(b),
                     "compute1_per_iteration_s": float(compute1) / max(float(its1), 1.0)
                     if compute1 is not None and compute1 == compute1 else float("nan")})
    table = pd.DataFrame(rows)
    # each rank's share of the compute beside the others over the same share alone (inline)
    table["measured_slowdown"] = ranks * table["compute_s"] / table["compute1_per_iteration_s"]
    # where the model's t_P and the measured one part: each part of the P-rank iteration
    # against the model's, which holds the smallest size's waits and rest and lets only the
    # divided compute grow: compute_model = t_P,model - waits(smallest) - rest(smallest)
    first = table.iloc[0]
    table["excess_waits_s"] = table["waits_s"] - first["waits_s"]
    table["excess_rest_s"] = table["rest_s"] - first["rest_s"]
    table["excess_compute_s"] = table["compute_s"] - (
        table["model_tp_per_iteration_s"] - first["waits_s"] - first["rest_s"])
    naive = crossover_dof(seconds_per_dof_iteration=k, ranks=ranks, added_s=message_s)
    full = crossover_dof(seconds_per_dof_iteration=k, ranks=ranks, added_s=c_p - c,
                         slowdown=s_at if profile is not None else slowdown)
    sizes_, speedups = table["dof_global"], table["speedup_per_iteration"]
    summary = {"seconds_per_dof_iteration": k, "fixed_s": c, "message_s": message_s,
               "fixed_p_s": c_p, "other_s": c_p - c - message_s, "ranks": ranks,
               "slowdown": float(table["slowdown"].iloc[-1]),
               "reading": (s_at.reading(float(sizes_.iloc[-1])) if profile is not None
                           else None),
               "naive_crossover_dof": naive,
               "measured_slowdown": _finite_or_none(table["measured_slowdown"].iloc[-1]),
               "predicted_crossover_dof": full,
               "measured_crossover_dof": measured_crossover(sizes_, speedups),
               "speedup_at_naive_crossover": speedup_at(sizes_, speedups, naive),
               "speedup_at_predicted_crossover": speedup_at(sizes_, speedups, full)}
    return table, summary


def speedup_at_split(dofs, speedups, dof: float) -> dict | None:
    """The measured speedup at the size ``dof``, interpolated linearly in log(DOF) between the
    two sizes of the sweep around it, taken apart into those two sizes' speedups, each weighted
    by how close ``dof`` lies to it (the law's split; :func:`speedup_at` is their sum). None
    outside the sweep: no measurement to judge there.

    0.6 at 10k, 1.2 at 40k: at 20k, half way in log, 0.3 + 0.6 = 0.9.

    >>> speedup_at_split([10_000, 40_000, 160_000], [0.6, 1.2, 1.7], 20_000)
    {'0.5 x the speedup at 10,000 DOF': 0.3, '0.5 x the speedup at 40,000 DOF': 0.6}
    >>> speedup_at_split([10_000, 40_000], [0.6, 1.2], 80_000) is None
    True
    """
    pts = sorted(zip(dofs, speedups))
    if not (math.isfinite(dof) and pts[0][0] <= dof <= pts[-1][0]):
        return None
    (n0, s0), (n1, s1) = next(((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= dof <= b[0]),
                              (pts[0], pts[0]))
    if n1 == n0:
        return {f"the speedup at {n0:,.0f} DOF": float(s0)}
    f = (math.log(dof) - math.log(n0)) / (math.log(n1) - math.log(n0))
    return {f"{1 - f:.2g} x the speedup at {n0:,.0f} DOF": round((1 - f) * s0, 12),
            f"{f:.2g} x the speedup at {n1:,.0f} DOF": round(f * s1, 12)}


def speedup_at(dofs, speedups, dof: float) -> float | None:
    """:func:`speedup_at_split` summed: the measured speedup at the size ``dof``.

    >>> round(speedup_at([10_000, 40_000, 160_000], [0.6, 1.2, 1.7], 20_000), 3)
    0.9
    """
    parts = speedup_at_split(dofs, speedups, dof)
    return None if parts is None else float(sum(parts.values()))


def _finite_or_none(v) -> float | None:
    return float(v) if v is not None and v == v and abs(v) != float("inf") else None


def crossover_laws(table, summary) -> list[dict]:
    """The crossover's laws, as keyword arguments of :func:`labkit.book.laws.check`: the
    P-rank iteration at each size the model predicts (a time, with its measured split), the
    measured speedup at the full model's N* (1 where N* is right: what a user who follows the
    prediction gets) and at the naive model's (messages only, no co-run slowdown: shown to
    fail, with the measured reason). A crossover outside the sweep is a mechanism not observed.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"dof_global": [2_000, 50_000], "calibration": [True, False],
    ...                   "model_tp_per_iteration_s": [150e-6, 300e-6],
    ...                   "tp_per_iteration_s": [150e-6, 330e-6], "split_us": [None, None],
    ...                   "speedup_per_iteration": [0.6, 1.09]})
    >>> s = {"ranks": 2, "predicted_crossover_dof": 20_000.0, "naive_crossover_dof": 5_000.0,
    ...      "speedup_at_predicted_crossover": 0.95, "speedup_at_naive_crossover": 0.5,
    ...      "other_s": 60e-6, "slowdown": 1.3}
    >>> [(law["law"], law["kind"], round(law["measured"], 2)) for law in crossover_laws(t, s)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [("2 ranks' iteration at 50,000 DOF", 'model', 330.0),
     ('speedup at the predicted crossover N*', 'model', 0.95),
     ('speedup at the naive crossover N*', 'naive', 0.5)]

    The speedup at N* is read between the two measured sizes around it, its split:

    >>> {k: round(v, 3) for k, v in crossover_laws(t, s)[1]["split"].items()}
    {'0.28 x the speedup at 2,000 DOF': 0.171, '0.72 x the speedup at 50,000 DOF': 0.78}
    """
    p = int(summary["ranks"])
    out = []
    for r in table.itertuples():
        if r.calibration:
            continue
        split = r.split_us if isinstance(r.split_us, dict) else None
        out.append({"law": f"{p} ranks' iteration at {r.dof_global:,.0f} DOF", "kind": "model",
                    "predicted": r.model_tp_per_iteration_s * 1e6,
                    "measured": r.tp_per_iteration_s * 1e6, "unit": "us", "tolerance_pct": 25,
                    "split": split})
    sizes, speedups = list(table["dof_global"]), list(table["speedup_per_iteration"])
    why = f"{p} ranks pay {summary['other_s'] * 1e6:.0f} us per iteration besides the messages"
    if summary.get("measured_slowdown") is not None:
        why += (f", and at the largest size each computed its share "
                f"{summary['measured_slowdown']:.2f}x slower beside the other{'s' if p > 2 else ''}"
                " than alone")
    for key, kind, label in (("predicted", "model", "predicted"), ("naive", "naive", "naive")):
        n_star = summary[f"{key}_crossover_dof"]
        measured = summary[f"speedup_at_{key}_crossover"]
        observed = measured is not None
        at = f"N* = {n_star:,.0f} DOF" if n_star != float("inf") else "N* = never"
        out.append({"law": f"speedup at the {label} crossover N*", "kind": kind,
                    "predicted": 1.0, "measured": measured if observed else float("nan"),
                    "split": speedup_at_split(sizes, speedups, n_star) if observed else None,
                    "tolerance_pct": 25, "mechanism_observed": observed if not observed else None,
                    "mechanism": "a crossover within the sizes the sweep measured",
                    "note": f"{at}; {why}" if kind == "naive" else at})
    return out


class _ProfileSlowdown:
    """s at N off the machine profile (:func:`~labkit.solve.memory.co_run_reading`): the
    sweep's footprint per DOF times N."""

    def __init__(self, profile, *, footprint_per_dof: float, ranks: int):
        self.profile, self.footprint_per_dof, self.ranks = profile, footprint_per_dof, ranks

    def reading(self, dof: float) -> dict:
        return memory.co_run_reading(self.profile, footprint_bytes=self.footprint_per_dof * dof,
                                     ranks=self.ranks)

    def __call__(self, dof: float) -> float:
        return self.reading(dof)["slowdown"]


def _slowdown_at(many, *, profile, ranks: int, slowdown: float):
    """s as a function of the size N: off the profile, or the constant ``slowdown``."""
    if profile is None:
        return lambda dof: slowdown
    if "bytes_per_iteration" not in many:
        raise UsageError("the co-run slowdown off the machine profile needs the rows' "
                         "bytes_per_iteration")
    per_dof = (many.apply(memory.footprint_of, axis=1).astype(float)
               / many["dof_global"].astype(float)).median()
    return _ProfileSlowdown(profile, footprint_per_dof=float(per_dof), ranks=ranks)


def print_crossover(df, file=None) -> None:
    """The crossover of a strong sweep over several sizes, printed the way ``labkit solve``
    ends: the model's terms, each size's measured and predicted speedup, and the sentence. For
    t_msg (the naive model's messages) the command has no transport check of its own, so it
    takes the exposed halo and all-reduce waits of the P-rank solve at the smallest size.
    Prints nothing when the rows hold no such sweep (one size, or no t1: neither 1-rank rows
    nor inline baselines)."""
    from labkit.tables import print_frame

    strong = select_rows(passed(df), mode="strong")
    if strong.empty or strong["dof_requested"].nunique() < 2:
        return
    for ranks in sorted(set(strong["world_size"]) - {1}):
        for (method, partitioner), _ in strong.groupby(["method", "partitioner"]):
            many = select_rows(strong, world_size=ranks, method=method, partitioner=partitioner)
            if many["dof_requested"].nunique() < 2:
                continue
            small = many.sort_values("dof_global").iloc[0]
            message_s = float((small["halo_time_s"] + small["allreduce_time_s"])
                              / small["iterations"])
            try:
                table, summary = crossover(df, message_s=message_s, ranks=ranks, method=method,
                                           partitioner=partitioner)
            except UsageError:
                continue
            print(f"\nCROSSOVER, {ranks} ranks, {method}, {partitioner}: t1 = c + k N with "
                  f"c = {summary['fixed_s'] * 1e6:.1f} us, k = "
                  f"{summary['seconds_per_dof_iteration'] * 1e9:.2f} ns/DOF; c_{ranks} = "
                  f"{summary['fixed_p_s'] * 1e6:.1f} us (smallest size; exposed messages there "
                  f"{message_s * 1e6:.1f} us)", file=file)
            print_frame(table.assign(dof_global=table["dof_global"].astype(int)),
                        ["dof_global", "t1_source", "speedup_per_iteration", "predicted_speedup",
                         "naive_speedup", "error_pct", "calibration"], file=file)
            print(verdicts.crossover_sentence(summary, table), file=file)
