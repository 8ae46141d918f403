"""Host side: run one notebook over a parameter grid with papermill (``labkit sweep``).

::

    labkit sweep notebooks/02_speedup.ipynb --grid serial_fraction=0.05,0.2 \\
        --grid "live_world_sizes=[1, 2],[1, 2, 4]" -p repeat 5 --out sweeps/amdahl

runs every combination (the Cartesian product, in the order given) and writes one folder per
point under ``--out``: the executed notebook, ``parameters.json`` and whatever the notebook
writes to ``results_dir`` (set to that folder). ``sweep.json`` lists every point with its status.

Values are Python literals read with :func:`ast.literal_eval` (never ``eval``): ``3``, ``0.5``,
``'gloo'``, ``[1, 2]``, ``True``. A bare word is accepted as a string only for a parameter the
notebook annotates ``str`` (``--grid backend=gloo,nccl``). Everything is checked against the
notebook's parameters cell before the first point runs; a failing point is reported (notebook,
cell, exception) and the other points still run.
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.book.notebooks import check_values, execute, inspect_parameters, write_json
from labkit.errors import UsageError

_BARE_WORD = re.compile(r"^[A-Za-z_][\w.\-/]*$")


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and quotes.

    >>> split_top_level("[1, 2],[1, 2, 4]")
    ['[1, 2]', '[1, 2, 4]']
    >>> split_top_level("'a,b',3")
    ["'a,b'", '3']
    """
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_value(name: str, text: str, declared_type: str | None = None):
    """A literal; a bare word only for a ``str`` parameter.

    >>> parse_value("n", "3"), parse_value("xs", "[1, 2]"), parse_value("b", "gloo", "str")
    (3, [1, 2], 'gloo')
    """
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if declared_type == "str" and _BARE_WORD.match(text):
            return text
        hint = f" (quote strings: {name}=\"'{text}'\")" if _BARE_WORD.match(text) else ""
        raise UsageError(f"value {text!r} for {name} is not a Python literal{hint}") from None


def parse_grid(specs: list[str], declared: dict[str, dict] | None = None) -> dict[str, list]:
    """``["n=1,2", "mode='a','b'"]`` -> ``{"n": [1, 2], "mode": ["a", "b"]}``."""
    declared = declared or {}
    grid: dict[str, list] = {}
    for spec in specs:
        name, sep, rhs = spec.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not rhs.strip():
            raise UsageError(f"--grid {spec!r} is not NAME=VALUE[,VALUE...]")
        if name in grid:
            raise UsageError(f"--grid {name} given twice; list all its values in one --grid")
        texts = split_top_level(rhs)
        if any(t == "" for t in texts):
            raise UsageError(f"--grid {spec!r} has an empty value")
        kind = declared.get(name, {}).get("inferred_type_name")
        values = [parse_value(name, t, kind) for t in texts]
        grid[name] = values
    return grid


def load_params_file(path) -> dict:
    """A YAML (or JSON) mapping of parameter -> value."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read parameters file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"{path}: must be a mapping of parameter name -> value")
    return data


@dataclass(frozen=True)
class Point:
    index: int
    folder: Path
    parameters: dict  # everything injected, results_dir included

    @property
    def label(self) -> str:
        return self.folder.name


def _slug(value) -> str:
    text = re.sub(r"[^A-Za-z0-9.\-]+", "_", str(value)).strip("_")
    return text[:24] or "x"


def plan(notebook, grid_specs=(), fixed_specs=(), params_file=None, out=None) -> list[Point]:
    """Validate everything and return the points; nothing is written. Bad input -> UsageError."""
    notebook = Path(notebook)
    declared = inspect_parameters(notebook)
    fixed = load_params_file(params_file) if params_file else {}
    where = f" (in {params_file})"
    check_values(notebook, declared, fixed, where)
    cli_fixed = {}
    try:
        for name, text in fixed_specs:
            if name in cli_fixed:
                raise UsageError(f"-p {name} given twice")
            kind = declared.get(name, {}).get("inferred_type_name")
            cli_fixed[name] = parse_value(name, text, kind)
        grid = parse_grid(list(grid_specs), declared)
    except UsageError as e:
        raise UsageError(f"{notebook}: {e}") from None
    check_values(notebook, declared, cli_fixed, " (in -p)")
    fixed.update(cli_fixed)  # -p wins over the file
    for name, values in grid.items():
        for v in values:
            check_values(notebook, declared, {name: v}, " (in --grid)")
    both = sorted(set(grid) & set(fixed))
    if both:
        raise UsageError(f"{notebook}: {', '.join(both)} given both as fixed (-p/-f) and in --grid")
    if "results_dir" in grid or "results_dir" in fixed:
        raise UsageError(f"{notebook}: results_dir is set by the sweep (each point's folder); "
                         "do not pass it")
    if out is None:
        raise UsageError("--out DIR is required")
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder (a sweep never "
                         "overwrites one; pick a new folder)")
    names = list(grid)
    points = []
    for i, combo in enumerate(itertools.product(*(grid[n] for n in names))):
        varied = dict(zip(names, combo))
        label = f"{i:03d}" + "".join(f"_{n}={_slug(v)}" for n, v in varied.items())
        folder = out / label[:120]
        params = {**fixed, **varied}
        if "results_dir" in declared:
            params["results_dir"] = str(folder)
        points.append(Point(i, folder, params))
    return points


def run_sweep(notebook, points: list[Point], out, *, progress: bool = True,
              cell_timeout_s: float | None = None) -> list[dict]:
    """Execute every point (a failure does not stop the others); write ``sweep.json``."""
    from tqdm.auto import tqdm

    from labkit.book.lab import measure_profile

    notebook, out = Path(notebook), Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # every point predicts from one profile of this machine, measured once for the sweep
    profile_row = measure_profile(out, progress=progress)
    if not profile_row["ok"]:
        print(f"machine profile not measured ({profile_row['error']}); each point measures "
              "its own", file=sys.stderr)
    rows = []
    bar = tqdm(points, desc=notebook.stem, unit="point", disable=not progress, file=sys.stderr)
    for p in bar:
        bar.set_postfix_str(p.label[:40])
        p.folder.mkdir(parents=True)
        write_json(p.folder / "parameters.json", p.parameters)
        res = execute(notebook, p.folder / notebook.name, p.parameters, cwd=p.folder,
                      cell_timeout_s=cell_timeout_s)
        row = {"point": p.index, "folder": str(p.folder), "status": "ok" if res["ok"] else "failed",
               "elapsed_s": round(res["elapsed_s"], 3), "error": res["error"],
               "parameters": p.parameters}
        rows.append(row)
        if not res["ok"]:
            bar.write(f"point {p.label} FAILED: {res['error']}", file=sys.stderr)
        write_json(out / "sweep.json", {"notebook": str(notebook), "points": rows})
    return rows


def _point_laws(folder):
    import pandas as pd

    from labkit import results
    from labkit.book import laws

    rows = [row for path in sorted(Path(folder).glob(f"**/{laws.FILE}"))
            for row in results.read_rows(path)]
    return pd.DataFrame(rows)


def summary(rows: list[dict]) -> str:
    """What ran, and each point's laws counted by kind (its ``laws.json`` files)."""
    from labkit.book import laws

    failed = [r for r in rows if r["status"] != "ok"]
    lines = [f"{len(rows) - len(failed)} of {len(rows)} point(s) ran, "
             f"{sum(r['elapsed_s'] for r in rows):.1f} s in all"]
    for r in rows:
        table = _point_laws(r["folder"])
        if len(table):
            lines.append(f"point {Path(r['folder']).name} ({r['elapsed_s']:.0f} s): "
                         f"{laws.counts_sentence(table)}")
    for r in failed:
        lines.append(f"FAILED {Path(r['folder']).name}: {r['error']}")
    return "\n".join(lines)
