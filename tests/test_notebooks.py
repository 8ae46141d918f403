"""Every tutorial notebook: a valid parameters cell, no function definitions, stored without
outputs, and it runs from top to bottom with papermill (small parameters from
notebook_params.json). Results go to a temporary folder, never into the repository."""

from __future__ import annotations

import ast
import json
import re

import nbformat
import pytest

from labkit.book.notebooks import inspect_parameters, parameter_problems, parameters_cell

from ._notebook_runs import NOTEBOOKS, load_test_params, run

ids = [p.stem for p in NOTEBOOKS]
MAGIC = re.compile(r"^\s*[%!]")


def _code(nb) -> list[tuple[int, str]]:
    # IPython magics and shell escapes are not Python: blank them before parsing
    return [(i, "\n".join("" if MAGIC.match(ln) else ln for ln in c.source.splitlines()))
            for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_name.ipynb found"
    assert [p.name[:2] for p in NOTEBOOKS] == sorted(p.name[:2] for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    _, source = parameters_cell(nb, path)  # exactly one, or UsageError
    assert parameter_problems(source) == [], f"{path.name}: parameters cell is not flat annotated literals"
    declared = inspect_parameters(path)
    assert "results_dir" in declared, f"{path.name}: no results_dir parameter"
    for name, info in declared.items():
        assert info["inferred_type_name"] not in ("None", ""), f"{path.name}: {name} has no annotation"
    unknown = set(load_test_params().get(path.name, {})) - set(declared)
    assert not unknown, f"notebook_params.json names unknown parameters of {path.name}: {unknown}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_function_definitions(path):
    nb = nbformat.read(path, as_version=4)
    for i, source in _code(nb):
        for node in ast.walk(ast.parse(source)):
            assert not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)), (
                f"{path.name} cell {i + 1} defines {type(node).__name__} at line {node.lineno}: "
                "computations belong in labkit")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_math_that_mathjax_can_typeset(path):
    """Markdown that MathJax renders as an error in the browser: an underscore or a backtick
    inside ``\\text{...}`` ("'_' allowed only in math mode"); the browser tests count MathJax
    errors on every page too, this names the cell before anything is rendered."""
    nb = nbformat.read(path, as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type != "markdown":
            continue
        for inner in re.findall(r"\\text\{([^{}]*)\}", c.source):
            assert not re.search(r"[_`]", inner), (
                f"{path.name} cell {i + 1}: \\text{{{inner}}} holds _ or `, which MathJax "
                "cannot typeset; write it outside the formula")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    # from nbformat 4.5 on every cell needs an id; nbformat.read adds a missing one silently
    # (and papermill warns at every run), so the file itself is checked
    raw = json.loads(path.read_text())
    if (raw["nbformat"], raw["nbformat_minor"]) >= (4, 5):
        assert all("id" in c for c in raw["cells"]), f"{path.name}: a cell has no id"
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, f"{path.name} cell {i + 1} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_notebook_executes(path):
    res = run(path)
    assert res["ok"], res["error"]
    executed = nbformat.read(res["output"], as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_figure_can_be_read(path):
    """Every figure the executed notebook shows has alt text computed from its data and no two
    texts drawn over each other (:func:`labkit.figures.text_overlaps`, recorded as it was
    shown)."""
    from ._notebook_runs import executed_dir

    res = run(path)
    assert res["ok"], res["error"]
    nb = nbformat.read(executed_dir() / path.name, as_version=4)
    shown = [o.get("metadata", {}).get("image/png") or {} for c in nb.cells
             if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert all(m.get("alt") for m in shown), f"{path.name}: a figure without computed alt text"
    crowded = [m["overlapping_text"] for m in shown if m.get("overlapping_text")]
    assert not crowded, f"{path.name}: texts drawn over each other: {crowded}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_computed_sentence_contradicts_its_numbers(path):
    """The executed notebook's printed sentences agree with its law rows and its numbers
    (:mod:`labkit.book.consistency`), at the test parameters as at the defaults."""
    from labkit import results
    from labkit.book.consistency import notebook_problems
    from labkit.book.laws import FILE

    from ._notebook_runs import executed_dir

    res = run(path)
    assert res["ok"], res["error"]
    rows = [r for p in sorted((executed_dir() / path.stem).glob(f"**/{FILE}"))
            for r in results.read_rows(p)]
    assert notebook_problems(res["output"], rows) == []


def test_every_law_row_says_its_kind():
    """Every laws.check call in the notebooks and the labs goes through labkit.book.laws, whose
    rows all carry a kind (an unknown kind, a tolerance past the caps, or a published row
    without its source is refused)."""
    from labkit.book import laws

    assert laws.check("x", predicted=1, measured=1)["kind"] == "model"
    for bad in ({"kind": "guess"}, {"tolerance_pct": 45}, {"tolerance_abs": 0.1},
                {"kind": "published"}, {"tolerance_pct": 10, "tolerance_abs": 0.01}):
        with pytest.raises(ValueError):
            laws.check("x", predicted=1, measured=1, **bad)
