"""labkit sweep over a tiny notebook: one folder per point, literal values, bad input refused
before anything runs, and a failing point reported while the others still run."""

from __future__ import annotations

import json

import nbformat
import pytest

from labkit.book.sweep import parse_grid, parse_value, split_top_level
from labkit.cli import main
from labkit.errors import UsageError

PARAMS = """\
n: int = 1  # a count
x: float = 0.5  # a number
tag: str = "a"  # a label
sizes: list = [1]  # a list
fail: bool = False  # raise in the last cell
results_dir: str = "results"  # where the point writes
"""


@pytest.fixture
def tiny(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# tiny"),
        params,
        nbformat.v4.new_code_cell(
            "import json, os\nos.makedirs(results_dir, exist_ok=True)\n"
            "with open(os.path.join(results_dir, 'out.json'), 'w') as fh:\n"
            "    json.dump({'n': n, 'x': x, 'tag': tag, 'sizes': sizes, 'cwd': os.getcwd()}, fh)"),
        nbformat.v4.new_code_cell("if fail:\n    raise ValueError(f'asked to fail at n={n}')"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_literals_and_splitting():
    assert split_top_level("[1, 2],[3],'a,b'") == ["[1, 2]", "[3]", "'a,b'"]
    assert parse_value("n", " 3 ") == 3
    assert parse_value("s", "gloo", "str") == "gloo"
    assert parse_grid(["sizes=[1, 2],[1, 2, 4]", "x=0.1,1e-3"]) == {
        "sizes": [[1, 2], [1, 2, 4]], "x": [0.1, 1e-3]}
    for bad in ("__import__('os').system('true')", "1+1", "open", "[1, n]"):
        with pytest.raises(UsageError, match="not a Python literal"):
            parse_value("n", bad)
    with pytest.raises(UsageError):
        parse_grid(["n=1", "n=2"])
    with pytest.raises(UsageError):
        parse_grid(["n="])


@pytest.mark.parametrize("args, message", [
    (["--grid", "m=1,2"], "unknown parameter(s) m"),
    (["--grid", "n=1.5"], "declared int"),
    (["--grid", "n=__import__('os')"], "not a Python literal"),
    (["--grid", "x=fast"], "not a Python literal"),
    (["-p", "results_dir", "'/tmp'"], "results_dir is set by the sweep"),
    (["--grid", "n=1", "-p", "n", "2"], "both as fixed"),
])
def test_bad_input_refused_before_running(tiny, tmp_path, capsys, args, message):
    out = tmp_path / "sweep"
    assert main(["sweep", str(tiny), *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "tiny.ipynb" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_notebook_without_parameters_cell(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("n = 1")]
    path = tmp_path / "plain.ipynb"
    nbformat.write(nb, path)
    assert main(["sweep", str(path), "--grid", "n=2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "plain.ipynb" in err and "no cell tagged 'parameters'" in err


def test_out_must_be_new(tiny, tmp_path, capsys):
    out = tmp_path / "used"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["sweep", str(tiny), "--grid", "n=1", "--out", str(out)]) == 2
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_grid_runs_every_point_and_reports_failures(tiny, tmp_path, capsys, monkeypatch):
    import labkit.book.lab

    profiled = []  # the tiny notebook reads no machine profile: the sweep's one is not measured
    monkeypatch.setattr(labkit.book.lab, "measure_profile",
                        lambda out, progress=True: profiled.append(out) or {"ok": True})
    params_file = tmp_path / "fixed.yaml"
    params_file.write_text("x: 0.25\ntag: from-file\n")
    out = tmp_path / "sweep"
    # a list-valued axis of one value (several list values: test_literals_and_splitting)
    rc = main(["sweep", str(tiny), "--grid", "n=1,2", "--grid", "fail=False,True",
               "--grid", "sizes=[1, 2]", "-f", str(params_file), "-p", "tag", "cli",
               "--out", str(out), "--no-progress"])
    assert rc == 1
    captured = capsys.readouterr()
    summary = json.loads((out / "sweep.json").read_text())["points"]
    assert len(summary) == 4
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == 4
    for row in summary:
        folder = out / row["folder"].rsplit("/", 1)[-1]
        params = json.loads((folder / "parameters.json").read_text())
        assert params == row["parameters"] and params["results_dir"] == str(folder)
        assert (folder / "tiny.ipynb").exists()
        got = json.loads((folder / "out.json").read_text())  # cell 3 ran at every point
        assert got["x"] == 0.25 and got["tag"] == "cli" and got["cwd"] == str(folder)
        assert got["n"] == params["n"] and got["sizes"] == params["sizes"]
        assert (row["status"] == "failed") == params["fail"]
        if params["fail"]:
            assert "tiny.ipynb: cell 4" in row["error"] and "ValueError" in row["error"]
            assert f"asked to fail at n={params['n']}" in row["error"]
    assert profiled == [out.resolve()]  # one profile for the sweep, in its folder
    assert "2 of 4 point(s) ran" in captured.out
    assert captured.out.count("FAILED") == 2


def test_a_run_writes_its_notebook_at_its_start_and_end_only(tiny, tmp_path, monkeypatch):
    """papermill's own engine writes the whole output notebook at every code cell's start and
    end; labkit's writes it twice whatever the cells, and a failing cell's run still ends with
    the cells before it (completed, their outputs) and its traceback on disk."""
    import papermill.engines
    import papermill.iorw

    from labkit.book import notebooks

    writes = []
    real = papermill.iorw.write_ipynb
    monkeypatch.setattr(papermill.engines, "write_ipynb",  # the engine's writes
                        lambda nb, path, *a, **k: writes.append(path) or real(nb, path, *a, **k))
    out = tmp_path / "out.ipynb"
    res = notebooks.execute(tiny, out, {"fail": True, "results_dir": str(tmp_path / "r")},
                            cwd=tmp_path)
    assert not res["ok"] and "ValueError" in res["error"]
    assert len([p for p in writes if str(p) == str(out)]) == 2  # papermill's engine: 12
    # papermill puts its error banner above a failed run's cells
    cells = [c for c in nbformat.read(out, as_version=4).cells
             if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
    assert (tmp_path / "r" / "out.json").exists()
    assert cells[3].metadata.papermill["status"] == "completed"
    assert [o["ename"] for o in cells[4].outputs] == ["ValueError"]
