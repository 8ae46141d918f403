"""How well each law held on this machine: the table every tutorial section ends with.

A tutorial measures something a formula predicts (a speedup, a bubble, a bus bandwidth) and
ends the section with the same small table: law, predicted, measured, error, and whether it held
within the stated tolerance. :func:`check` makes one row, :func:`show` prints a section's rows
and upserts them into the notebook's ``laws.json`` (a labkit results file, keyed by notebook and
law); ``labkit lab`` gathers every notebook's file into one table (:func:`gather`) for the
site's front page.

Pure: no torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: a row's fields: which tutorial and law, the two numbers, their unit, the relative error,
#: the tolerance it was held to and the verdict
FIELDS = ("notebook", "law", "predicted", "measured", "unit", "error_pct", "tolerance_pct", "holds")
KEY = ("notebook", "law")
FILE = "laws.json"


def check(law: str, *, predicted: float, measured: float, unit: str = "",
          tolerance_pct: float = 25.0, note: str = "") -> dict:
    """One law beside its measurement: error = 100 (predicted − measured) / measured.

    >>> r = check("speedup at 2 ranks", predicted=1.8, measured=1.6, tolerance_pct=25)
    >>> round(r["error_pct"], 1), r["holds"]
    (12.5, True)
    >>> check("bubble", predicted=0.2, measured=0.4, tolerance_pct=25)["holds"]
    False
    """
    predicted, measured = float(predicted), float(measured)
    err = 100.0 * (predicted - measured) / abs(measured) if measured else math.inf
    finite = math.isfinite(err) and math.isfinite(predicted) and math.isfinite(measured)
    return {"law": law, "predicted": predicted, "measured": measured, "unit": unit,
            "error_pct": err if finite else None, "tolerance_pct": float(tolerance_pct),
            "holds": bool(finite and abs(err) <= tolerance_pct), "note": note}


def verdict(row: dict) -> str:
    """The sentence a notebook prints under its table, computed from the numbers.

    >>> verdict(check("speedup", predicted=1.8, measured=1.6))
    'speedup: predicted 1.8, measured 1.6 (error +12.5%): holds within 25%.'
    >>> verdict(check("speedup", predicted=1.8, measured=1.0))
    'speedup: predicted 1.8, measured 1 (error +80.0%): does not hold within 25%.'
    """
    err = "n/a" if row["error_pct"] is None else f"{row['error_pct']:+.1f}%"
    unit = f" {row['unit']}" if row["unit"] else ""
    return (f"{row['law']}: predicted {row['predicted']:.3g}{unit}, measured "
            f"{row['measured']:.3g}{unit} (error {err}): "
            f"{'holds' if row['holds'] else 'does not hold'} within {row['tolerance_pct']:g}%.")


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
    return df[[c for c in FIELDS if c in df]]


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
    return df.sort_values("notebook", kind="stable")[[c for c in FIELDS if c in df]]


def markdown(df) -> str:
    """The gathered table as Markdown, for the site's front page.

    >>> import pandas as pd
    >>> print(markdown(pd.DataFrame([{"notebook": "03_solve", **check("s", predicted=2,
    ...                                                                 measured=2)}])))
    | tutorial | law | predicted | measured | error | holds |
    |---|---|---|---|---|---|
    | 03_solve | s | 2 | 2 | +0.0% | yes (±25%) |
    """
    lines = ["| tutorial | law | predicted | measured | error | holds |", "|---|---|---|---|---|---|"]
    for r in df.to_dict("records"):
        err = "n/a" if r.get("error_pct") is None or r["error_pct"] != r["error_pct"] \
            else f"{r['error_pct']:+.1f}%"
        unit = f" {r['unit']}" if r.get("unit") else ""
        lines.append(f"| {r['notebook']} | {r['law']} | {r['predicted']:.3g}{unit} | "
                     f"{r['measured']:.3g}{unit} | {err} | "
                     f"{'yes' if r['holds'] else 'no'} (±{r['tolerance_pct']:g}%) |")
    return "\n".join(lines)


def html(df) -> str:
    """The gathered table as an HTML table, for the preview's front page (empty: "")."""
    import html as _html

    if df.empty:
        return ""
    cells = []
    for r in df.to_dict("records"):
        err = "n/a" if r.get("error_pct") is None or r["error_pct"] != r["error_pct"] \
            else f"{r['error_pct']:+.1f}%"
        unit = f" {r['unit']}" if r.get("unit") else ""
        cells.append("<tr>" + "".join(f"<td>{_html.escape(str(v))}</td>" for v in (
            r["notebook"], r["law"], f"{r['predicted']:.3g}{unit}", f"{r['measured']:.3g}{unit}",
            err, f"{'yes' if r['holds'] else 'no'} (±{r['tolerance_pct']:g}%)")) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("tutorial", "law", "predicted", "measured", "error",
                                            "holds"))
    return (f'<h2>How well each law held on this machine</h2>\n<table class="laws">'
            f"<tr>{head}</tr>\n" + "\n".join(cells) + "</table>")
