"""Host side: find the tutorial notebooks, read their ``parameters`` cell, execute one with papermill.

Shared by ``labkit sweep``, ``labkit lab`` and the notebook tests, so the three agree on what a
valid parameters cell is and on how a failing cell is reported::

    notebooks/02_speedup.ipynb: cell 9 (In [6]) raised ValueError: serial fraction must be ...
        > df = labkit.metrics.speedup_table(times)

Parameters cells hold flat annotated literals, one per line, e.g.
``world_sizes: list = [1, 2]  # ranks per launch``; papermill injects a cell after it that
overrides the names it is given.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from labkit.errors import UsageError
from labkit.orphans import kill_marked

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOK_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


def list_notebooks(folder: str | os.PathLike = NOTEBOOK_DIR) -> list[Path]:
    """The tutorials in order: ``NN_slug.ipynb`` sorted by NN (checkpoints and scratch ignored)."""
    return sorted(p for p in Path(folder).glob("*.ipynb") if NOTEBOOK_NAME.match(p.name))


def read_notebook(path: str | os.PathLike):
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such notebook")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as e:  # nbformat raises several unrelated types for a broken file
        raise UsageError(f"{path}: not a readable notebook ({type(e).__name__}: {e})") from None


def parameters_cell(nb, path="notebook") -> tuple[int, str]:
    """(index, source) of the one code cell tagged ``parameters``; none or several is an error."""
    found = [(i, c.source) for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not found:
        raise UsageError(f"{path}: no cell tagged 'parameters' (papermill injects values after "
                         "that cell; tag one code cell 'parameters')")
    if len(found) > 1:
        raise UsageError(f"{path}: {len(found)} cells tagged 'parameters' "
                         f"(cells {', '.join(str(i + 1) for i, _ in found)}); keep exactly one")
    return found[0]


def parameter_problems(source: str) -> list[str]:
    """Why a parameters cell is not 'flat annotated literals' (empty list: it is).

    >>> parameter_problems("n: int = 3  # points\\nname: str = 'a'")
    []
    >>> parameter_problems("n = 3\\nm: int = n + 1")
    ['line 1: `n = 3` has no type annotation', 'line 2: m is not a literal (derived values belong in later cells)']
    >>> parameter_problems("h: int = 64  # h = heads x head size")
    ["line 1: h's line has a second '=' (papermill skips such a line: -p h would be unknown)"]
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"line {e.lineno}: syntax error ({e.msg})"]
    problems = []
    lines = source.splitlines()
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ""
        if isinstance(node, ast.AnnAssign) and lines[node.lineno - 1].count("=") > 1:
            problems.append(f"line {node.lineno}: {ast.unparse(node.target)}'s line has a second '=' "
                            f"(papermill skips such a line: -p {ast.unparse(node.target)} would be unknown)")
            continue
        if isinstance(node, ast.Assign):
            problems.append(f"line {node.lineno}: `{text}` has no type annotation")
        elif not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            problems.append(f"line {node.lineno}: `{text}` is not `name: type = literal`")
        elif node.value is None:
            problems.append(f"line {node.lineno}: {node.target.id} has no value")
        else:
            try:
                ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                problems.append(f"line {node.lineno}: {node.target.id} is not a literal "
                                "(derived values belong in later cells)")
    return problems


def inspect_parameters(path: str | os.PathLike) -> dict[str, dict]:
    """The notebook's parameters: name -> {name, inferred_type_name, default, help}, read from
    the ``parameters`` cell's annotated assignments (papermill's own inspection skips a line it
    cannot parse, such as ``guess: float | None = None``; this one reads every line).

    Refuses a notebook without exactly one ``parameters`` cell, naming it.
    """
    import ast

    nb = read_notebook(path)
    _, source = parameters_cell(nb, path)
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        line = lines[node.lineno - 1]
        comment = line.split("#", 1)[1].strip() if "#" in line[node.end_col_offset:] else ""
        out[node.target.id] = {"name": node.target.id,
                               "inferred_type_name": ast.unparse(node.annotation),
                               "default": ast.unparse(node.value) if node.value else None,
                               "help": comment}
    return out


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
          "list": (list, tuple), "tuple": (tuple, list), "dict": (dict,)}


def check_values(path, declared: dict[str, dict], values: dict, where: str = "") -> None:
    """Refuse names the notebook does not declare, and values of another type than annotated."""
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise UsageError(f"{path}: unknown parameter(s) {', '.join(unknown)}{where}; "
                         f"the parameters cell declares: {', '.join(declared) or 'nothing'}")
    for name, value in values.items():
        declared_type = declared[name].get("inferred_type_name", "")
        optional = declared_type.replace(" ", "").endswith("|None")
        ok = _TYPES.get(declared_type.split("|")[0].strip())
        if ok is None or (optional and value is None):
            continue
        # bool is an int subclass: refuse True for an int parameter, and 1 for a bool one
        if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
            raise UsageError(f"{path}: parameter {name} is declared "
                             f"{declared[name]['inferred_type_name']}, got {value!r}{where}")


def _first_line(source: str) -> str:
    lines = [ln for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return lines[0].strip()[:100] if lines else ""


def describe_failure(path, exc, injected_after: int | None) -> str:
    """One readable paragraph for a failed run: notebook, cell (as numbered in the source
    notebook, 1-based), the exception, and the failing cell's first line."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        index = exc.cell_index  # in the executed notebook, which has the injected cell
        if injected_after is not None and index > injected_after:
            index -= 1
        count = f" (In [{exc.exec_count}])" if exc.exec_count else ""
        evalue = str(exc.evalue).strip().splitlines()
        msg = f"{path}: cell {index + 1}{count} raised {exc.ename}: {evalue[0] if evalue else ''}"
        line = _first_line(exc.source or "")
        return msg + (f"\n    > {line}" if line else "")
    text = str(exc).strip().splitlines()
    return f"{path}: {type(exc).__name__}: {text[0] if text else ''}"


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 to ``path`` for the duration: the kernel inherits it when it
    starts, so what it prints lands in a log beside the executed notebook, not on the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    if path.exists() and path.stat().st_size == 0:
        path.unlink()


#: environment variable marking every process of one notebook run (see :func:`execute`)
RUN_MARK = "LABKIT_NOTEBOOK_RUN"


#: the papermill engine :func:`execute` runs (:func:`engine`)
ENGINE = "labkit"


@functools.cache
def engine() -> str:
    """Register (once) and name papermill's nbclient engine that writes the output notebook
    only at the run's start and end (and so after a failing cell: papermill's last write is in a
    ``finally``). papermill's own writes the whole notebook at every code cell's start and end:
    about 6 s of the lab here, 25 ms a write once a notebook holds its figures."""
    from papermill.engines import NBClientEngine, papermill_engines

    class FewerWrites(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
            save, nb_man.save = nb_man.save, lambda **_: None
            try:
                return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)
            finally:
                nb_man.save = save  # the run's last write follows (notebook_complete)

    papermill_engines.register(ENGINE, FewerWrites)
    return ENGINE


def execute(path, output, parameters: dict | None = None, *, cwd=None,
            cell_timeout_s: float | None = None) -> dict:
    """Run a notebook with papermill; never raises for a failing cell.

    Returns ``{"notebook", "output", "ok", "elapsed_s", "error"}``; on failure papermill still
    writes ``output`` (the cells up to the failing one, with its traceback) for inspection.
    """
    import papermill

    from labkit.book.kernel import ensure_kernel

    path = Path(path)
    nb = read_notebook(path)
    index, _ = parameters_cell(nb, path)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    error = None
    # the kernel and every launch it starts inherit this mark: whatever a dead or timed-out
    # kernel left running is ended before the next run (its ranks would skew those timings)
    mark = uuid.uuid4().hex
    saved = os.environ.get(RUN_MARK)
    os.environ[RUN_MARK] = mark
    kernel_log = Path(output).with_name(Path(output).stem + ".kernel.log")
    try:
        with _stderr_to(kernel_log):  # the kernel's own messages (a timed-out cell's ZMQ noise)
            papermill.execute_notebook(
                str(path), str(output), parameters=dict(parameters or {}),
                kernel_name=ensure_kernel(), language="python", progress_bar=False,
                log_output=False, cwd=str(cwd) if cwd else None,
                execution_timeout=cell_timeout_s, engine_name=engine())
    except Exception as e:  # a failing cell, a dead kernel, a timeout: report, do not raise
        error = describe_failure(path, e, index if parameters else None)
    finally:
        if saved is None:
            os.environ.pop(RUN_MARK, None)
        else:
            os.environ[RUN_MARK] = saved
        kill_marked(mark, RUN_MARK)
    if error and kernel_log.exists():
        error += f" (the kernel's messages: {kernel_log})"
    return {"notebook": str(path), "output": str(output), "ok": error is None,
            "elapsed_s": time.perf_counter() - t0, "error": error}


def write_json(path, data) -> None:
    """Atomic JSON write (a reader never sees half a summary)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
