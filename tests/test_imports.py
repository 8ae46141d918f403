"""The import graph of labkit: no circles, and a shared floor that imports no lab.

Every import counts, the ones inside functions too: a lazy import that closes a circle still
makes two modules one design (neither can be read, tested or moved without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "labkit"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """labkit module -> the labkit modules it imports (anywhere in its body)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # ``from pkg import mod`` reaches the module, not the package's __init__
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                # the deepest labkit module the name reaches
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t != "labkit":
                    graph[name].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    circles = _cycles(import_graph())
    assert not circles, "import circles (each group imports itself back): " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_the_shared_floor_imports_no_lab():
    graph = import_graph()
    floor = {m for m in graph if m.count(".") == 1 and (PKG / f"{m.split('.')[1]}.py").exists()}
    labs = {m.split(".")[1] for m in graph if m.count(".") >= 1
            and (PKG / m.split(".")[1]).is_dir()}
    bad = sorted(f"{m} imports {t}" for m in floor for t in graph[m]
                 if t.count(".") >= 1 and t.split(".")[1] in labs)
    assert not bad, bad


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "labkit.errors" in graph["labkit.config"] or any("labkit.errors" in v
                                                            for v in graph.values())
    assert len(graph) > 80
