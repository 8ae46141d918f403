"""The package's shape: shared machinery flat and small, one package per lab with the same rooms,
three sides kept apart, notebooks reaching each lab through its package."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.launch import WORKERS

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "labkit"

#: the flat modules every lab shares (pure, argparse-only, host machinery, rank machinery)
SHARED = {"__init__", "cli", "cliargs", "tables", "errors", "config", "results", "metrics",
          "figures", "launch", "launchspec", "agent", "procs", "devices", "orphans", "diagnose",
          "slurm", "runtime", "timing", "harness", "audit", "__main__", "explorer", "memory",
          "trace"}

#: each lab package and the rooms it must have (a lab may have more modules)
LABS = {
    "solve": {"config", "formulas", "worker", "run", "report", "verdicts", "plots", "cli"},
    "ddp": {"config", "formulas", "worker", "run", "report", "verdicts", "plots", "cli"},
    "collectives": {"config", "formulas", "worker", "run", "report", "plots", "cli"},
    "pipeline": {"config", "formulas", "worker", "run", "report", "verdicts", "plots", "cli"},
    "speedup": {"config", "worker", "run", "report", "plots", "cli"},
    "tp": {"config", "formulas", "worker", "run", "report", "plots", "cli"},
    "fsdp": {"config", "formulas", "worker", "run", "report", "plots", "cli", "widgets"},
    "checks": {"config", "run", "report", "cli"},
    "perfmodel": {"model", "catalog", "plots", "cli"},
    "book": {"notebooks", "sweep", "lab", "site", "cli"},
    "machine": {"config", "formulas", "worker", "run", "report", "plots", "cli"},
    "moe": {"config", "formulas", "worker", "run", "report", "verdicts", "plots", "cli"},
    "cp": {"config", "formulas", "worker", "run", "report", "verdicts", "plots", "cli"},
}

#: the lab each tutorial belongs to (it may use its own lab's modules directly)
NOTEBOOK_LAB = {"01": "checks", "02": "speedup", "03": "solve", "04": "solve", "05": "ddp",
                "06": "collectives", "07": "pipeline", "08": "perfmodel", "09": None,
                "10": None, "90": "perfmodel"}

#: modules that hold pure code: no torch at import time
PURE_ROOMS = {"config", "formulas", "report", "verdicts"}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path, path.relative_to(PKG).with_suffix("").parts


def test_every_module_is_shared_or_inside_its_lab():
    stray = []
    for path, parts in _modules():
        if len(parts) == 1:
            if parts[0] not in SHARED:
                stray.append(str(path.relative_to(ROOT)))
        elif parts[0] not in LABS or len(parts) > 2:
            stray.append(str(path.relative_to(ROOT)))
    assert not stray, f"modules outside the layout (a lab module belongs in its package): {stray}"


@pytest.mark.parametrize("lab", sorted(LABS))
def test_each_lab_has_its_rooms_and_says_what_it_is(lab):
    folder = PKG / lab
    have = {p.stem for p in folder.glob("*.py")}
    assert LABS[lab] <= have, f"labkit/{lab} lacks {sorted(LABS[lab] - have)}"
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    assert doc and len(doc.splitlines()) >= 3, f"labkit/{lab}/__init__.py must say what it is"


def test_workers_live_in_their_lab_and_never_launch():
    for name, module in WORKERS.items():
        parts = module.split(".")
        assert parts[0] == "labkit" and parts[1] in LABS, (name, module)
        path = PKG.joinpath(*parts[1:]).with_suffix(".py")
        assert path.exists(), module
        imported = {n for node in ast.walk(ast.parse(path.read_text()))
                    for n in _import_names(node)}
        assert not {"labkit.launch", "subprocess", "labkit.book"} & imported, \
            f"{module}: rank code never launches"
        assert "torchrun" in (ast.get_docstring(ast.parse(path.read_text())) or ""), \
            f"{module}: its docstring gives the torchrun command"


def test_names_say_which_side_they_run_on():
    """A worker's entry is ``on_rank``; ``run`` is the host side's (``labkit.<lab>.run.run``)."""
    for module in WORKERS.values():
        path = PKG.joinpath(*module.split(".")[1:]).with_suffix(".py")
        top = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert "on_rank" in top and "run" not in top, module


def _import_names(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def test_pure_rooms_import_no_torch():
    mods = [f"labkit.{lab}.{room}" for lab, rooms in LABS.items()
            for room in rooms & PURE_ROOMS] + [f"labkit.{lab}" for lab in LABS]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n"
            "    importlib.import_module(m)\n"
            "    assert 'torch' not in sys.modules, m\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _notebook_imports(path: Path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        try:
            tree = ast.parse(src)
        except SyntaxError:  # a magic line: the other cells still count
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
                yield node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("labkit"):
                        yield a.name, []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_reach_other_labs_only_through_their_package(path):
    own = NOTEBOOK_LAB.get(path.name[:2])
    problems = []
    for module, names in _notebook_imports(path):
        parts = module.split(".")
        private = [n for n in names if n.startswith("_")]
        if private:
            problems.append(f"{module}: private {private}")
        if len(parts) >= 3 and parts[1] in LABS and parts[1] not in (own, "book"):
            problems.append(f"{module}: another lab's internals (use `from labkit import {parts[1]}`)")
    assert not problems, problems


def test_docstring_examples_are_collected():
    """The suite runs every ``>>>`` example of the package (``--doctest-modules`` over labkit)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in cfg["addopts"] and "labkit" in cfg["testpaths"]
    with_examples = [p for p, _ in _modules() if ">>>" in p.read_text()]
    assert len(with_examples) >= 20
