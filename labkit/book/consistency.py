"""No computed sentence may contradict the numbers beside it: a check over executed notebooks
(pure: reads notebooks and ``laws.json`` rows, no torch).

What it reads in every text output of every code cell (a notebook's computed sentences are
printed by its lab's verdict functions; this catches the ones that slipped):

* a **verdict line** (:func:`labkit.book.laws.verdict`'s form) whose holds/does-not-hold
  differs from the stored row of the same law, or whose law has no stored row;
* a **direction** ("shrinks", "grows", "falls", "rises", "drops", "increases", "decreases")
  followed by ``(a -> b)`` where b does not move that way (``shrinks (0.07 -> 0.07)``);
* a **tolerance phrase**: "within X%" or "more than X%" (or an absolute "within/more than X")
  followed in the same sentence by a signed number in parentheses on the wrong side of X;
* "mostly negative" / "mostly positive" while most signed percentages it describes have the
  other sign: those listed after it on its own line where it lists them, else the cell's.
"""

from __future__ import annotations

import re
from pathlib import Path

VERDICT = re.compile(
    r"^(?P<law>.+?)(?: \((?:a naive law|a published number|one engine against another)\))?: "
    r"predicted .+?, measured .+? \(error [^)]*\): (?P<verdict>holds|does not hold|fails, as taught)")
DIRECTION = re.compile(
    r"\b(?P<word>shrinks|shrank|grows|grew|falls|fell|rises|rose|drops|dropped|increases|"
    r"decreases|increased|decreased)\b[^()\n]{0,80}?\(\s*(?P<a>[-+]?[0-9.]+(?:e[-+]?\d+)?)"
    r"\s*[a-zA-Z%/]*\s*(?:->|→)\s*(?P<b>[-+]?[0-9.]+(?:e[-+]?\d+)?)")
DOWN = {"shrinks", "shrank", "falls", "fell", "drops", "dropped", "decreases", "decreased"}
TOLERANCE = re.compile(
    r"\b(?P<kind>within|more than|further than|outside)\s+(?:±)?(?P<t>[0-9.]+)\s*(?P<pct>%?)"
    r"(?P<rest>[^.\n]*?)\((?P<v>[-+][0-9.]+)\s*(?P<vpct>%?)\)")
MOSTLY = re.compile(r"mostly (?P<sign>negative|positive)")
SIGNED_PCT = re.compile(r"(?<![\w.])(?P<v>[-+][0-9]+(?:\.[0-9]+)?)%")


def _texts(cell) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append("".join(o.get("text", "")))
        elif "data" in o and "text/plain" in o["data"]:
            out.append("".join(o["data"]["text/plain"]))
    return out


def line_problems(line: str) -> list[str]:
    """The contradictions inside one printed line (direction and tolerance phrases).

    >>> line_problems("the fill/drain bubble shrinks (0.07 -> 0.07)")
    ['"shrinks" but 0.07 -> 0.07']
    >>> line_problems("the bubble shrinks (0.33 -> 0.20)")
    []
    >>> line_problems("1F1B at M = 8 is more than 0.05 from the formula (+0.051)")
    []
    >>> line_problems("the step is within 15% of the model (+21.0%)")
    ['"within 15%" but +21.0%']
    """
    problems = []
    for m in DIRECTION.finditer(line):
        a, b = float(m["a"]), float(m["b"])
        down = m["word"] in DOWN
        if (down and not b < a) or (not down and not b > a):
            problems.append(f'"{m["word"]}" but {m["a"]} -> {m["b"]}')
    for m in TOLERANCE.finditer(line):
        if bool(m["pct"]) != bool(m["vpct"]):
            continue  # a relative tolerance beside an absolute number: not comparable here
        t, v = float(m["t"]), abs(float(m["v"]))
        inside = m["kind"] == "within"
        if (inside and v > t) or (not inside and v <= t):
            problems.append(f'"{m["kind"]} {m["t"]}{m["pct"]}" but {m["v"]}{m["vpct"]}')
    return problems


def cell_problems(texts: list[str], law_rows: dict[str, dict]) -> list[str]:
    """Every contradiction in one cell's outputs, against the notebook's stored law rows.

    >>> rows = {"speedup": {"holds": True}}
    >>> cell_problems(["speedup: predicted 2, measured 1.9 (error +5.3%): does not hold "
    ...                "within 25%."], rows)
    ['verdict "does not hold" but laws.json says it holds: speedup']
    >>> cell_problems(["errors are mostly negative", "| a | +169.0% |", "| b | +12.0% |"], {})
    ['"mostly negative" but 2 of 2 signed percentages are positive']
    >>> cell_problems(["mostly positive (in 2 of 3 rows: +20%, +9%, -10%)", "x (error -45%)",
    ...                "y (error -54%)"], {})  # its own list, not the laws' lines below
    []
    >>> cell_problems(["mostly positive (in 2 of 3 rows: -20%, -9%, +10%)", "x (error +45%)"], {})
    ['"mostly positive" but 2 of 3 signed percentages are negative']
    """
    problems = []
    for text in texts:
        for line in text.splitlines():
            problems += line_problems(line)
            m = VERDICT.match(line.strip())
            if m:
                row = law_rows.get(m["law"])
                if row is None:
                    problems.append(f"verdict without a stored law row: {m['law']}")
                elif (m["verdict"] == "holds") != bool(row["holds"]):
                    problems.append(f'verdict "{m["verdict"]}" but laws.json says it '
                                    f'{"holds" if row["holds"] else "does not hold"}: {m["law"]}')
    joined = "\n".join(texts)
    for m in MOSTLY.finditer(joined):
        end = joined.find("\n", m.end())
        own = SIGNED_PCT.findall(joined[m.end():end if end >= 0 else None])
        signs = [float(v) for v in (own or SIGNED_PCT.findall(joined))]
        pos, neg = sum(v > 0 for v in signs), sum(v < 0 for v in signs)
        if m["sign"] == "negative" and pos > neg:
            problems.append(f'"mostly negative" but {pos} of {len(signs)} signed percentages '
                            "are positive")
        if m["sign"] == "positive" and neg > pos:
            problems.append(f'"mostly positive" but {neg} of {len(signs)} signed percentages '
                            "are negative")
    return problems


def notebook_problems(executed, law_rows) -> list[dict]:
    """Every contradiction in an executed notebook (a path), with its cell number."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    rows = {r["law"]: r for r in law_rows}
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":  # prose that claims an outcome the next cell prints
            following = next((c for c in nb.cells[i + 1:] if c.cell_type == "code"), None)
            texts = _texts(following) if following is not None else []
            for m in MOSTLY.finditer(cell.source):
                for p in cell_problems([m.group(0)] + texts, {}):
                    out.append({"notebook": Path(executed).stem, "cell": i + 1,
                                "problem": "prose: " + p})
            continue
        if cell.cell_type != "code":
            continue
        for p in cell_problems(_texts(cell), rows):
            out.append({"notebook": Path(executed).stem, "cell": i + 1, "problem": p})
    return out


def lab_problems(executed_dir) -> list[dict]:
    """:func:`notebook_problems` of every executed tutorial under ``executed_dir`` (the layout
    ``labkit lab`` writes: ``NN_name.ipynb`` beside ``NN_name/results/laws.json``)."""
    from labkit import results
    from labkit.book.laws import FILE

    executed_dir = Path(executed_dir)
    out = []
    for nb in sorted(executed_dir.glob("*.ipynb")):
        rows = [r for p in sorted((executed_dir / nb.stem).glob(f"**/{FILE}"))
                for r in results.read_rows(p)]
        out += notebook_problems(nb, rows)
    return out
