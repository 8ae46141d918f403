"""What ``labkit report`` says about runs, computed from their rows (pure: pandas, no torch).

A :class:`Run` is one machine's rows: a ``labkit lab`` folder, one results file, one point of a
sweep, or a published table of another machine (``data/reference``). From runs this module
makes the report's content as blocks (headings, paragraphs, tables, figures) that
:func:`to_qmd` writes as Quarto Markdown and :func:`to_html` as plain HTML, so the document and
its fallback say the same thing. Every number in it is read or computed from the rows (no
number is typed here); the knee threshold is the caller's stated choice.

Scaling is read from two kinds of rows: a speedup table (``time_s`` per world size, strong
scaling: the same job on N ranks) and DDP rows (a fixed batch per rank, weak scaling: compared
by the time per sample, 1 / samples/s, so speedup = N t_1 / t_N as the lab defines it).
"""

from __future__ import annotations

import html as _html
import math
import re
from dataclasses import dataclass, field

#: the machine facts of the side-by-side table: (label, row field)
FACTS = (("host", "hostname"), ("cores", "cores"), ("device", "device_name"),
         ("backend", "backend"), ("torch", "torch_version"), ("labkit commit", "git_commit"))


@dataclass
class Run:
    """One machine's rows. ``tables``: results file (as named in the report) -> rows;
    ``laws``: the rows of its ``laws.json`` files; ``facts``: machine facts no row carries (a
    published table's, from its YAML); ``reference``: the published table itself."""

    label: str
    kind: str  # "lab run", "results file", "sweep point", "published"
    where: str
    tables: dict = field(default_factory=dict)
    laws: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    parameters: dict | None = None
    reference: object = None  # a DataFrame of data/reference (published runs only)


def fmt(x) -> str:
    """A number as the report prints it: 4 significant digits; n/a for a missing one.

    >>> fmt(0.548245), fmt(171), fmt(None), fmt(float("nan")), fmt(2.0)
    ('0.5482', '171', 'n/a', 'n/a', '2')
    """
    if x is None or isinstance(x, bool):
        return "n/a" if x is None else str(x)
    x = float(x)
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def distinct(rows, name: str) -> list[str]:
    """The values of field ``name`` among ``rows``, as text, sorted (missing and NaN left out)."""
    seen = {str(r[name]) for r in rows if r.get(name) is not None and r.get(name) == r.get(name)}
    return sorted(seen)


def _all_rows(run: Run) -> list[dict]:
    return [r for rows in run.tables.values() for r in rows]


def gpus_used(rows) -> int:
    """The most GPUs one launch of these rows used: the largest world size on CUDA, else 0.

    >>> gpus_used([{"device": "cuda", "world_size": 4}, {"device": "cpu", "world_size": 8}])
    4
    >>> gpus_used([{"device": "cpu", "world_size": 2}])
    0
    """
    sizes = [int(r["world_size"]) for r in rows
             if str(r.get("device") or "").startswith("cuda") and r.get("world_size")]
    return max(sizes, default=0)


def machine_facts(run: Run) -> dict[str, str]:
    """The side-by-side facts of a run: host, cores, GPUs, device, backend, torch version,
    commit and when, from the rows' provenance and launch fields (a published run: its YAML).

    >>> run = Run("here", "results file", "x.json", {"x.json": [
    ...     {"hostname": "vm", "cores": 2, "device": "cpu", "device_name": "cpu: EPYC",
    ...      "backend": "gloo", "torch_version": "2.13.0", "world_size": 2,
    ...      "timestamp": "2026-11-25T06:59:53+00:00"}]})
    >>> f = machine_facts(run)
    >>> f["host"], f["cores"], f["GPUs"], f["backend"], f["measured"]
    ('vm', '2', '0 (CPU ranks)', 'gloo', '2026-11-25')
    """
    if run.kind == "published":
        return dict(run.facts)
    rows = _all_rows(run)
    out = {}
    for label, name in FACTS:
        out[label] = ", ".join(distinct(rows, name)) or "not recorded"
    gpus = gpus_used(rows)
    out["GPUs"] = str(gpus) if gpus else "0 (CPU ranks)"
    days = sorted(t[:10] for t in distinct(rows, "timestamp"))
    out["measured"] = (days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}") \
        if days else "not recorded"
    out["rows"] = str(len(rows))
    return out


def machines_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of the machines side by side: one column per run, one row per fact."""
    facts = [machine_facts(r) for r in runs]
    order = list(dict.fromkeys([k for f in facts for k in f]))
    head = ["", *[r.label for r in runs]]
    rows = [["kind", *[r.kind for r in runs]]]
    rows += [[k, *[f.get(k, "not recorded") for f in facts]] for k in order]
    rows.append(["from", *[r.where for r in runs]])
    return head, rows


# -- scaling: speedup, efficiency and cost per resource ---------------------------------------

def _resource(rows) -> tuple[str, int, int]:
    """(the resource a rank is, cores per rank, GPUs per rank) of a series' rows."""
    if gpus_used(rows):
        return "GPU", 0, 1
    threads = [int(r["threads_per_rank"]) for r in rows if r.get("threads_per_rank")]
    return "core", max(threads, default=1), 0


def _times(rows, time_of) -> dict[int, float]:
    out = {}
    for r in sorted(rows, key=lambda r: int(r["world_size"])):
        t = time_of(r)
        if t is not None and t == t and t > 0:
            out[int(r["world_size"])] = float(t)  # the last row of an N wins, as an upsert would
    return out


def series_of_rows(name: str, rows: list[dict]) -> list[dict]:
    """The scaling series in one results file's rows: a speedup table, or DDP's series (one per
    model and batch per rank). Each: name, scaling, time column, resource, times {N: s}.

    >>> rows = [{"world_size": n, "time_s": t, "speedup": 1.0, "efficiency": 1.0}
    ...         for n, t in ((1, 4.0), (2, 2.5))]
    >>> s = series_of_rows("speedup_live.json", rows)[0]
    >>> s["times"], s["resource"], s["scaling"]
    ({1: 4.0, 2: 2.5}, 'core', 'strong')
    """
    cols = {k for r in rows for k in r}
    out = []
    if {"variant", "samples_per_s", "batch_size", "world_size"} <= cols:
        ddp = [r for r in rows if r.get("variant") == "ddp" and r.get("samples_per_s")]
        groups = sorted({(str(r.get("model") or ""), int(r["batch_size"])) for r in ddp})
        for model, batch in groups:
            part = [r for r in ddp if str(r.get("model") or "") == model
                    and int(r["batch_size"]) == batch]
            res, cores, gpus = _resource(part)
            label = f"DDP{' ' + model if model else ''}, batch {batch} per rank"
            out.append({"file": name, "name": label, "scaling": "weak",
                        "time": "time per sample (1 / samples/s)",
                        "resource": res, "cores_per_rank": cores, "gpus_per_rank": gpus,
                        "times": _times(part, lambda r: 1.0 / float(r["samples_per_s"]))})
    elif {"world_size", "time_s", "speedup", "efficiency"} <= cols:
        res, cores, gpus = _resource(rows)
        out.append({"file": name, "name": "the same job on N ranks", "scaling": "strong",
                    "time": "time of the job (time_s)", "resource": res, "cores_per_rank": cores,
                    "gpus_per_rank": gpus, "times": _times(rows, lambda r: r.get("time_s"))})
    return out


def series_of_reference(name: str, df) -> list[dict]:
    """The scaling series of a published table: ``time_s`` per world size (strong scaling on
    N GPUs), or per-GPU step times with the batch per GPU fixed (weak; one series per model,
    the DDP rows)."""
    cols = set(df.columns)
    rows = df.to_dict("records")
    base = {"file": f"{name}.yaml", "resource": "GPU", "cores_per_rank": 0, "gpus_per_rank": 1}
    if {"world_size", "time_s"} <= cols:
        return [{**base, "name": "the same job on N GPUs", "scaling": "strong",
                 "time": "time of the job (time_s)", "times": _times(rows, lambda r: r["time_s"])}]
    if {"world_size", "step_time_p50_s", "batch_size"} <= cols:
        out = []
        for model in dict.fromkeys(r.get("model", "") for r in rows):
            part = [r for r in rows if r.get("model", "") == model and r.get("ddp", True)]
            out.append({**base, "name": f"DDP {model}, batch "
                        f"{int(part[0]['batch_size'])} per GPU", "scaling": "weak",
                        "time": "time per sample (p50 step / (batch x N))",
                        "times": _times(part, lambda r: r["step_time_p50_s"]
                                        / (r["batch_size"] * r["world_size"]))})
        return out
    return []


def plural(n: int, noun: str) -> str:
    """``n`` and the noun, plural past one.

    >>> plural(1, "GPU"), plural(6, "GPU"), plural(2, "core")
    ('1 GPU', '6 GPUs', '2 cores')
    """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def recommendation(table, summary: dict, resource: str) -> str:
    """The request a series' numbers justify and why: the knee (the largest N whose efficiency
    is at least the threshold, :func:`labkit.metrics.knee`) and what the next N costs.

    >>> from labkit.metrics import speedup_table
    >>> times = dict(zip(range(1, 11), [171, 108, 79, 64, 57, 52, 51, 49, 49, 49]))
    >>> print(recommendation(*speedup_table(times, threshold=0.5), "GPU"))
    ... # doctest: +NORMALIZE_WHITESPACE
    Don't request more than 6 GPUs: efficiency E = s/N is 0.5481 at N = 6 and 0.479 at
    N = 7, below the threshold 0.5; 7 GPUs cost 2.088x the GPU-time of one for a speedup of
    3.353. The fastest is N = 8 (speedup 3.49), at efficiency 0.4362: only a deadline pays for
    it.
    """
    k, thr = int(summary["knee_world_size"]), summary["knee_threshold"]
    by_n = table.set_index("world_size")
    e_k = by_n.loc[k, "efficiency"]
    after = by_n[by_n.index > k]
    if not len(after):
        return (f"Efficiency stays at or above the threshold {fmt(thr)} up to the largest N "
                f"measured: requesting {plural(k, resource)} is justified (E = {fmt(e_k)}, "
                f"speedup {fmt(by_n.loc[k, 'speedup'])}); measure more to find where it drops.")
    n2 = int(after.index[0])
    nxt = after.iloc[0]
    text = (f"Don't request more than {plural(k, resource)}: efficiency E = s/N is {fmt(e_k)} "
            f"at N = {k} and {fmt(nxt['efficiency'])} at N = {n2}, below the threshold "
            f"{fmt(thr)}; {plural(n2, resource)} cost {fmt(nxt['relative_su'])}x the "
            f"{resource}-time of one for a speedup of {fmt(nxt['speedup'])}.")
    fastest = int(summary["fastest_world_size"])
    if fastest > k:
        text += (f" The fastest is N = {fastest} (speedup {fmt(by_n.loc[fastest, 'speedup'])}),"
                 f" at efficiency {fmt(by_n.loc[fastest, 'efficiency'])}: only a deadline "
                 "pays for it.")
    return text


SCALING_HEAD = ("N", "time", "speedup s", "efficiency E = s/N", "cost N/s", "SU")


def scaling_rows(table, scaling: str) -> list[list[str]]:
    """The cells of a series' table; service units only for strong scaling (a whole job)."""
    return [[str(int(r["world_size"])), fmt(r["time_s"]), fmt(r["speedup"]),
             fmt(r["efficiency"]), fmt(r["relative_su"]),
             fmt(r["su"]) if scaling == "strong" else "n/a"]
            for r in table.to_dict("records")]


# -- blocks and their two renderings ------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#+!|$@^~])")


def md_escape(text: str) -> str:
    """Plain text as Markdown that Pandoc reads back as the same text (no emphasis, math,
    citation or table cell boundary by accident).

    >>> md_escape("a_b | $x @y")
    'a\\\\_b \\\\| \\\\$x \\\\@y'
    """
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def md_table(head, rows) -> str:
    lines = ["| " + " | ".join(md_escape(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return weighted("\n".join(lines))


def weighted(table: str) -> str:
    """A pipe table whose separator gives each column a width by its longest cell (capped),
    which Pandoc follows for a wide table (in the PDF a law's name gets room, a number less).

    >>> print(weighted("| a | bbbbbb |\\n|---|---|\\n| 1 | 2 |"))
    | a | bbbbbb |
    |---|--------|
    | 1 | 2 |
    """
    head, rows = parse_md_table(table)
    cells = [[head[i], *(r[i] for r in rows if i < len(r))] for i in range(len(head))]
    # room for the longest cell (capped: a long one wraps), never less than its longest word:
    # a word cannot wrap, and in a narrower column the PDF draws it over its neighbour
    widths = [max(3, min(max(map(len, col)), 30), *(len(w) + 2 for c in col for w in c.split()))
              for col in cells]
    lines = table.strip().splitlines()
    lines[1] = "|" + "|".join("-" * w for w in widths) + "|"
    return "\n".join(lines)


def parse_md_table(text: str) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of a pipe table (the laws tables of :mod:`labkit.book.laws`).

    >>> parse_md_table("| a | b |\\n|---|---|\\n| 1 | x \\\\| y |")
    (['a', 'b'], [['1', 'x | y']])
    """
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln)[1:-1]]
             for ln in lines]
    body = [c for c in cells[1:] if not all(set(x) <= set("-: ") for x in c)]
    return cells[0], body


def to_qmd(blocks: list[tuple], *, title: str, pdf: bool) -> str:
    """The blocks as a Quarto document: self-contained HTML and, with ``pdf``, typst."""
    # minimal: no Bootstrap theme to compile (13 s of HTML render against 5 s here), the plain HTML's
    # own style instead
    style = "".join(f"          {line}\n" for line in f"<style>{_STYLE}</style>".splitlines())
    fmt_yaml = ("format:\n  html:\n    embed-resources: true\n    minimal: true\n"
                "    html-math-method: plain\n    toc: true\n"
                "    include-in-header:\n      - text: |\n" + style)
    if pdf:
        fmt_yaml += "  typst:\n    toc: true\n    papersize: a4\n    margin:\n      x: 1.6cm\n"
    head = f'---\ntitle: "{title.replace(chr(34), chr(39))}"\n{fmt_yaml}---\n'
    out = [head]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + md_escape(b[2]))
        elif kind == "p":
            out.append(md_escape(b[1]))
        elif kind == "table":
            out.append(md_table(b[1], b[2]))
        elif kind == "md_table":
            out.append(weighted(b[1]))
        elif kind == "figure":
            _, src, alt, caption = b
            out.append(f'![{md_escape(caption)}]({src}){{fig-alt="{_attr(alt)}" width="100%"}}')
    return "\n\n".join(out) + "\n"


def _attr(text: str) -> str:
    return str(text).replace("\\", "/").replace('"', "'")


_STYLE = """body { font: 15px/1.5 system-ui, sans-serif; max-width: 60em; margin: 2em auto;
 padding: 0 1em; } table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: left; }
figure img { max-width: 100%; } figcaption { color: #444; font-size: 13px; }"""


def _html_table(head, rows) -> str:
    e = _html.escape
    return ("<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in head) + "</tr>\n"
            + "\n".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>"
                        for row in rows) + "</table>")


def to_html(blocks: list[tuple], *, title: str) -> str:
    """The blocks as one plain HTML page (no script, no style sheet from elsewhere)."""
    e = _html.escape
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append(f"<h{b[1] + 1}>{e(b[2])}</h{b[1] + 1}>")
        elif kind == "p":
            out.append(f"<p>{e(b[1])}</p>")
        elif kind == "table":
            out.append(_html_table(b[1], b[2]))
        elif kind == "md_table":
            out.append(_html_table(*parse_md_table(b[1])))
        elif kind == "figure":
            _, src, alt, caption = b
            out.append(f'<figure><img src="{e(src)}" alt="{e(alt)}">'
                       f"<figcaption>{e(caption)}</figcaption></figure>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}'
            f"</title>\n<style>{_STYLE}</style></head><body>\n<h1>{e(title)}</h1>\n"
            + "\n".join(out) + "\n</body></html>\n")
