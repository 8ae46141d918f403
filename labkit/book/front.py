"""The front page's account of a run, in one screen: the laws counted by kind, each of this
lab's models that missed with its one-line measured reason and a link to its tutorial, and the
full table folded below (Quarto Markdown for the site, HTML for the preview). Computed from the
law rows the executed notebooks stored (:func:`labkit.book.laws.gather`)."""

from __future__ import annotations

import html as _html

from labkit.book import laws


def _reason(r: dict) -> str:
    """A miss in one line: the prediction, the measurement, and what the measurement was made
    of (its split) or the row's note."""
    unit = f" {r['unit']}" if r.get("unit") else ""
    line = (f"predicted {r['predicted']:.3g}{unit}, measured {r['measured']:.3g}{unit} "
            f"(error {laws._error(r)})")
    if isinstance(r.get("split"), dict) and r["split"]:
        return f"{line}; {laws.split_sentence(r)}"
    note = r.get("note") if isinstance(r.get("note"), str) else ""
    return f"{line}; {note}" if note else line


def misses(df) -> list[dict]:
    """This lab's model laws that did not hold: notebook, law, one-line reason.

    >>> import pandas as pd
    >>> rows = [{"notebook": "07_pipeline", **laws.check("step", predicted=50, measured=80,
    ...          unit="ms", split={"compute": 60, "bubble": 20})},
    ...         {"notebook": "02_speedup", **laws.check("s_2", predicted=1.8, measured=1.7)}]
    >>> misses(pd.DataFrame(rows))[0]["reason"]
    'predicted 50 ms, measured 80 ms (error -60.0%); measured split: compute 60 + bubble 20 = 80 ms (the measurement 80 ms, +0.0%)'
    """
    if df.empty:
        return []
    kind = df["kind"].fillna("model") if "kind" in df else "model"
    bad = df[(kind == "model") & (~df["holds"].astype(bool))]
    return [{"notebook": r["notebook"], "law": r["law"], "reason": _reason(r)}
            for r in bad.to_dict("records")]


def _held_line(df) -> str:
    c = next((c for c in laws.counts(df) if c["kind"] == "model"), None)
    if c is None:
        return "This run checked none of the lab's own models."
    if c["held"] == c["laws"]:
        return f"All {c['laws']} of this lab's model laws held on this machine."
    return (f"{c['held']} of {c['laws']} of this lab's model laws held on this machine; the "
            f"{c['laws'] - c['held']} that missed, each with what its measurement was made of:")


def _plain(text: str) -> str:
    """``text`` as Markdown shows it as written (a law named "N*" is not emphasis).

    >>> print(_plain("speedup at N*: S* = 2 [x]"))
    speedup at N\\*: S\\* = 2 \\[x\\]
    """
    for ch in "\\`*_[]<>":
        text = text.replace(ch, "\\" + ch)
    return text


def _table(df) -> str:
    """The full law table as Markdown whose cells read as written (law names hold * and _)."""
    from labkit.book.reportdoc import md_table, parse_md_table

    return md_table(*parse_md_table(laws.markdown(df)))


def drift_markdown(moved) -> list[str]:
    """How far the machine moved during the run (:func:`labkit.book.drift.of_run`'s answer; None:
    nothing) as the front page's lines: a sentence and its table, folded."""
    if moved is None:
        return []
    from labkit.book import drift

    rows, minutes = moved
    return [_plain(drift.sentence(rows, minutes=minutes)), "",
            "<details><summary>The machine profile at the run's start and its end</summary>",
            "", drift.markdown(rows), "", "</details>", ""]


def quarto_markdown(df, moved=None) -> str:
    """The section for the Quarto front page ('' without rows); ``moved``: the run's drift
    (:func:`labkit.book.drift.of_run`), said after the law counts."""
    if df.empty:
        return ""
    out = (["## What this run measured", "", laws.counts_markdown(df), ""]
           + drift_markdown(moved) + [_held_line(df), ""])
    for m in misses(df):
        out.append(f"- [{m['notebook']}](notebooks/{m['notebook']}.ipynb): "
                   f"**{_plain(m['law'])}**: {_plain(m['reason'])}")
    out += ["", f"<details><summary>Every law of this run ({len(df)} rows)</summary>", "",
            _table(df), "", "</details>", ""]
    return "\n".join(out)


def preview_html(df, moved=None) -> str:
    """The same section for the preview's front page ('' without rows)."""
    if df.empty:
        return ""
    table = laws.html(df)
    counts, _, full = table.partition('<table class="laws">')
    counts = counts.replace("How well each law held on this machine", "What this run measured")
    items = "".join(f'<li><a href="{_html.escape(m["notebook"])}.html">'
                    f'{_html.escape(m["notebook"])}</a>: <b>{_html.escape(m["law"])}</b>: '
                    f"{_html.escape(m['reason'])}</li>" for m in misses(df))
    if moved is not None:
        from labkit.book import drift

        counts += f"<p>{_html.escape(drift.sentence(moved[0], minutes=moved[1]))}</p>"
    return (f"{counts}<p>{_html.escape(_held_line(df))}</p><ul class=\"misses\">{items}</ul>"
            f"<details><summary>Every law of this run ({len(df)} rows)</summary>"
            f'<div class="labkit-table" style="overflow-x:auto"><table class="laws">{full}'
            "</div></details>")
