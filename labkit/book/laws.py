"""How well each law held on this machine: the table every tutorial section ends with.

A tutorial measures something a formula predicts (a speedup, a bubble, a bus bandwidth) and
ends the section with the same small table: law, what kind of law it is, predicted, measured,
error, and whether it held within the stated tolerance. :func:`check` makes one row,
:func:`show` prints a section's rows and upserts them into the notebook's ``laws.json`` (a
labkit results file, keyed by notebook and law); ``labkit lab`` gathers every notebook's file
into one table (:func:`gather`) and counts each kind apart (:func:`counts`).

Every row says what it is, because a miss means something different for each:

- ``model``: this lab's prediction on this machine (a miss is the lab's failure, and its row
  carries the measured split of the miss);
- ``naive``: a textbook law shown to fail, with the measured reason (a miss is the lesson);
- ``published``: another machine's number, with its source;
- ``agreement``: one engine against another (no measurement involved).

Scoring is symmetric: a prediction twice the measurement is as wrong as one half of it. The
error is the larger of the two relative errors, signed + when the prediction is the larger::

    error_pct = 100 · sign(p − m) · (max(p, m) / min(p, m) − 1)      (p, m > 0)

Times and ratios are held to a relative tolerance (at most 25 %), fractions (a bubble, an
efficiency) to an absolute one (at most 0.05): one semantic per quantity, no wide tolerance to
hide a miss. A law whose mechanism was not observed in the run (``mechanism_observed=False``)
does not hold whatever its numbers.

Pure: no torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: a row's fields, in the order tables show them
FIELDS = ("notebook", "law", "kind", "predicted", "measured", "unit", "error_pct", "error_abs",
          "tolerance_pct", "tolerance_abs", "holds", "note", "source", "split", "split_op")
KEY = ("notebook", "law")
FILE = "laws.json"
KINDS = ("model", "naive", "published", "agreement")
#: the widest tolerances any law may have
MAX_TOLERANCE_PCT = 25.0
MAX_TOLERANCE_ABS = 0.05
#: the split of a measurement may differ from it by this much (relative) and still "sum"
SPLIT_SUM_PCT = 25.0
_KIND_WORDS = {"model": "this lab's model", "naive": "a naive law", "published":
               "a published number", "agreement": "one engine against another"}


def symmetric_error_pct(predicted: float, measured: float) -> float:
    """The larger of the two relative errors, in %, signed + when the prediction is larger.

    >>> symmetric_error_pct(2.0, 1.0), symmetric_error_pct(1.0, 2.0)
    (100.0, -100.0)
    >>> round(symmetric_error_pct(1.8, 1.6), 1)
    12.5
    >>> symmetric_error_pct(0.0, 1.0)
    -inf
    """
    p, m = float(predicted), float(measured)
    if p == m:
        return 0.0
    if p == 0 or m == 0 or (p > 0) != (m > 0):  # no ratio: as wrong as can be
        return math.copysign(math.inf, p - m)
    big, small = max(abs(p), abs(m)), min(abs(p), abs(m))
    return math.copysign(100.0 * (big / small - 1.0), abs(p) - abs(m))


def check(law: str, *, predicted: float, measured: float, kind: str = "model", unit: str = "",
          tolerance_pct: float | None = None, tolerance_abs: float | None = None,
          mechanism_observed: bool | None = None, mechanism: str = "", split: dict | None = None,
          split_op: str = "sum", source: str = "", note: str = "") -> dict:
    """One law beside its measurement, scored both ways.

    Give ``tolerance_pct`` (relative, for times and ratios; default 25) or ``tolerance_abs``
    (absolute, for fractions), never both. ``split`` is the measurement taken apart into its
    measured terms (``{"compute": 41.0, "messages": 9.5}``), shown when a ``model`` law misses;
    its terms add up to the measurement, or multiply to it where ``split_op="product"`` (a
    ratio taken apart into measured factors: a speedup = N x 1/slowdown x compute share).
    ``source`` is required for a ``published`` row.

    >>> r = check("speedup at 2 ranks", predicted=1.8, measured=1.6)
    >>> round(r["error_pct"], 1), r["holds"], r["kind"]
    (12.5, True, 'model')
    >>> check("speedup", predicted=1.6, measured=1.8)["holds"]  # the same miss, the other way
    True
    >>> check("bubble", predicted=0.20, measured=0.24, tolerance_abs=0.05)["holds"]
    True
    >>> check("overlap", predicted=1.3, measured=1.3, mechanism_observed=False,
    ...       mechanism="all-reduce during backward")["holds"]
    False
    """
    if kind not in KINDS:
        raise ValueError(f"law kind {kind!r}: one of {', '.join(KINDS)}")
    if tolerance_pct is not None and tolerance_abs is not None:
        raise ValueError(f"{law}: give tolerance_pct or tolerance_abs, not both")
    if tolerance_abs is None and tolerance_pct is None:
        tolerance_pct = MAX_TOLERANCE_PCT
    if tolerance_pct is not None and not 0 <= tolerance_pct <= MAX_TOLERANCE_PCT:
        raise ValueError(f"{law}: tolerance {tolerance_pct:g}% is outside 0..{MAX_TOLERANCE_PCT:g}%")
    if tolerance_abs is not None and not 0 <= tolerance_abs <= MAX_TOLERANCE_ABS:
        raise ValueError(f"{law}: tolerance {tolerance_abs:g} is outside 0..{MAX_TOLERANCE_ABS:g}")
    if split_op not in ("sum", "product"):
        raise ValueError(f"{law}: split_op is 'sum' or 'product', got {split_op!r}")
    if kind == "published" and not source:
        raise ValueError(f"{law}: a published law needs its source")
    predicted, measured = float(predicted), float(measured)
    finite = math.isfinite(predicted) and math.isfinite(measured)
    err = symmetric_error_pct(predicted, measured) if finite else math.inf
    err_abs = predicted - measured if finite else math.inf
    if tolerance_abs is not None:
        within = finite and abs(err_abs) <= tolerance_abs + 1e-12
    else:
        within = math.isfinite(err) and abs(err) <= tolerance_pct + 1e-9
    notes = [note] if note else []
    if mechanism_observed is False:
        notes.append(f"mechanism not observed{': ' + mechanism if mechanism else ''}")
    return {"law": law, "kind": kind, "predicted": predicted, "measured": measured, "unit": unit,
            "error_pct": err if math.isfinite(err) else None,
            "error_abs": err_abs if math.isfinite(err_abs) else None,
            "tolerance_pct": None if tolerance_pct is None else float(tolerance_pct),
            "tolerance_abs": None if tolerance_abs is None else float(tolerance_abs),
            "holds": bool(within and mechanism_observed is not False),
            "note": "; ".join(notes), "source": source,
            "split": {k: float(v) for k, v in split.items()} if split else None,
            "split_op": split_op if split else None}


def given(value) -> bool:
    """A field that holds a number (a row read back into a DataFrame has NaN for None)."""
    return value is not None and value == value


def _tolerance(row: dict) -> str:
    if given(row.get("tolerance_abs")):
        return f"±{row['tolerance_abs']:g}"
    return f"{row.get('tolerance_pct', MAX_TOLERANCE_PCT):g}%"


def _error(row: dict) -> str:
    if given(row.get("tolerance_abs")):
        return f"{row['error_abs']:+.3g}" if given(row.get("error_abs")) else "n/a"
    return f"{row['error_pct']:+.1f}%" if given(row.get("error_pct")) else "n/a"


def split_total(row: dict) -> float:
    """What a row's split adds (or, ``split_op`` "product", multiplies) up to; nan without one.

    >>> split_total({"split": {"N": 2.0, "compute share": 0.4}, "split_op": "product"})
    0.8
    """
    split = row.get("split") or {}
    if not isinstance(split, dict) or not split:
        return math.nan
    if row.get("split_op") == "product":
        return math.prod(split.values())
    return sum(split.values())


def split_sentence(row: dict) -> str:
    """The measured split of a measurement, and whether its terms sum (or multiply) to it.

    >>> split_sentence(check("step", predicted=50, measured=100, unit="ms",
    ...                      split={"compute": 60, "messages": 30, "wait": 12}))
    'measured split: compute 60 + messages 30 + wait 12 = 102 ms (the measurement 100 ms, +2.0%)'
    >>> split_sentence(check("speedup", predicted=1.6, measured=0.8, split_op="product",
    ...                      split={"N": 2, "1 / co-run slowdown": 0.8, "compute share": 0.5}))
    'measured split: N 2 x 1 / co-run slowdown 0.8 x compute share 0.5 = 0.8 (the measurement 0.8, +0.0%)'
    """
    split = row.get("split") or {}
    if not split:
        return ""
    total = split_total(row)
    unit = f" {row['unit']}" if row.get("unit") else ""
    off = symmetric_error_pct(total, row["measured"]) if row["measured"] else math.inf
    parts = (" x " if row.get("split_op") == "product" else " + ").join(
        f"{k} {v:.3g}" for k, v in split.items())
    return (f"measured split: {parts} = {total:.3g}{unit} (the measurement "
            f"{row['measured']:.3g}{unit}, {off:+.1f}%)")


def split_sums(row: dict) -> bool:
    """Whether a row's split adds (or multiplies) up to its measurement within
    :data:`SPLIT_SUM_PCT`."""
    split = row.get("split") or {}
    if not split or not row["measured"]:
        return False
    return abs(symmetric_error_pct(split_total(row), row["measured"])) <= SPLIT_SUM_PCT


def verdict(row: dict) -> str:
    """The sentence a notebook prints under its table, computed from the numbers.

    >>> verdict(check("speedup", predicted=1.8, measured=1.6))
    'speedup: predicted 1.8, measured 1.6 (error +12.5%): holds within 25%.'
    >>> verdict(check("speedup", predicted=1.8, measured=1.0))
    'speedup: predicted 1.8, measured 1 (error +80.0%): does not hold within 25%.'
    >>> verdict(check("s_8 = 8", kind="naive", predicted=8, measured=3.5,
    ...               note="the serial part"))
    's_8 = 8 (a naive law): predicted 8, measured 3.5 (error +129%): fails, as taught (the serial part).'
    """
    unit = f" {row['unit']}" if row.get("unit") else ""
    kind = row.get("kind", "model")
    label = "" if kind == "model" else f" ({_KIND_WORDS[kind]})"
    err = _error(row)
    if not given(row.get("tolerance_abs")) and given(row.get("error_pct")) \
            and abs(row["error_pct"]) >= 100:
        err = f"{row['error_pct']:+.0f}%"
    head = (f"{row['law']}{label}: predicted {row['predicted']:.3g}{unit}, measured "
            f"{row['measured']:.3g}{unit} (error {err}): ")
    note = row.get("note") if isinstance(row.get("note"), str) else ""
    if kind == "naive" and not row["holds"]:
        why = f" ({note})" if note else ""
        return head + f"fails, as taught{why}."
    text = head + f"{'holds' if row['holds'] else 'does not hold'} within {_tolerance(row)}."
    if note and not row["holds"] and (kind == "published" or "mechanism not observed" in note):
        text += f" ({note})"
    if kind == "model" and not row["holds"] and isinstance(row.get("split"), dict):
        text += " " + split_sentence(row) + "."
    return text


def show(rows, *, notebook: str, results_dir: str | os.PathLike | None = None):
    """Print a section's law table and store its rows in ``results_dir/laws.json``; the
    table as a DataFrame (what a notebook cell displays)."""
    import pandas as pd

    from labkit import results

    rows = [{"notebook": notebook, **r} for r in rows]
    for r in rows:
        print(verdict(r))
    if results_dir is not None:
        results.store_rows(Path(results_dir) / FILE, rows, KEY)
    df = pd.DataFrame(rows)
    return df[[c for c in FIELDS if c in df and c not in ("split", "split_op")]]


def gather(folder: str | os.PathLike):
    """Every ``laws.json`` below ``folder`` (one per executed tutorial) as one DataFrame,
    ordered by notebook."""
    import pandas as pd

    from labkit import results

    rows = []
    for path in sorted(Path(folder).glob(f"*/**/{FILE}")):
        rows += results.read_rows(path)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=list(FIELDS))
    if "kind" not in df:
        df["kind"] = "model"
    return df.sort_values("notebook", kind="stable")[[c for c in FIELDS if c in df]]


def counts(df) -> list[dict]:
    """Per kind: how many laws, how many held (empty kinds left out).

    >>> import pandas as pd
    >>> rows = [check("a", predicted=1, measured=1), check("b", predicted=2, measured=1),
    ...         check("c", kind="naive", predicted=8, measured=3)]
    >>> counts(pd.DataFrame(rows))
    [{'kind': 'model', 'laws': 2, 'held': 1}, {'kind': 'naive', 'laws': 1, 'held': 0}]
    """
    out = []
    for kind in KINDS:
        part = df[df["kind"].fillna("model") == kind] if "kind" in df else (
            df if kind == "model" else df.iloc[0:0])
        if len(part):
            out.append({"kind": kind, "laws": int(len(part)), "held": int(part["holds"].sum())})
    return out


def counts_sentence(df) -> str:
    """One line for a terminal or a page: each kind counted apart.

    >>> import pandas as pd
    >>> rows = [check("a", predicted=1, measured=1), check("c", kind="naive", predicted=8,
    ...                                                     measured=3)]
    >>> counts_sentence(pd.DataFrame(rows))
    "1 of 1 of this lab's model laws held; 1 naive law(s) shown (0 held)"
    """
    words = {"model": "of this lab's model laws held", "naive": "naive law(s) shown",
             "published": "published number(s) compared", "agreement":
             "engine agreement(s) checked"}
    parts = []
    for c in counts(df):
        if c["kind"] == "model":
            parts.append(f"{c['held']} of {c['laws']} {words['model']}")
        else:
            parts.append(f"{c['laws']} {words[c['kind']]} ({c['held']} held)")
    return "; ".join(parts) if parts else "no laws"


def _cells(r: dict) -> tuple:
    unit = f" {r['unit']}" if r.get("unit") else ""
    return (r["notebook"], r["law"], r.get("kind") or "model", f"{r['predicted']:.3g}{unit}",
            f"{r['measured']:.3g}{unit}", _error(r),
            f"{'yes' if r['holds'] else 'no'} ({_tolerance(r)})")


_HEAD = ("tutorial", "law", "kind", "predicted", "measured", "error", "holds")


def markdown(df) -> str:
    """The gathered table as Markdown, for the site's front page.

    >>> import pandas as pd
    >>> print(markdown(pd.DataFrame([{"notebook": "03_solve", **check("s", predicted=2,
    ...                                                                 measured=2)}])))
    | tutorial | law | kind | predicted | measured | error | holds |
    |---|---|---|---|---|---|---|
    | 03_solve | s | model | 2 | 2 | +0.0% | yes (25%) |
    """
    lines = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    for r in df.to_dict("records"):
        lines.append("| " + " | ".join(_cells(r)) + " |")
    return "\n".join(lines)


def html(df) -> str:
    """The gathered table as HTML, counts per kind first, for the preview's front page
    (empty: "")."""
    import html as _html

    if df.empty:
        return ""
    summary = "".join(f"<tr><td>{c['kind']}</td><td>{_html.escape(_KIND_WORDS[c['kind']])}"
                      f"</td><td>{c['held']} of {c['laws']}</td></tr>" for c in counts(df))
    cells = ["<tr>" + "".join(f"<td>{_html.escape(str(v))}</td>" for v in _cells(r)) + "</tr>"
             for r in df.to_dict("records")]
    head = "".join(f"<th>{h}</th>" for h in _HEAD)
    return ('<h2>How well each law held on this machine</h2>\n<table class="law-counts">'
            "<tr><th>kind</th><th>what it is</th><th>held</th></tr>" + summary + "</table>\n"
            f'<table class="laws"><tr>{head}</tr>\n' + "\n".join(cells) + "</table>")


def counts_markdown(df) -> str:
    """The counts per kind as a Markdown table (a ``naive`` row that fails is a lesson).

    >>> import pandas as pd
    >>> print(counts_markdown(pd.DataFrame([check("a", predicted=1, measured=1)])))
    | kind | what it is | held |
    |---|---|---|
    | model | this lab's model | 1 of 1 |
    """
    lines = ["| kind | what it is | held |", "|---|---|---|"]
    lines += [f"| {c['kind']} | {_KIND_WORDS[c['kind']]} | {c['held']} of {c['laws']} |"
              for c in counts(df)]
    return "\n".join(lines)
