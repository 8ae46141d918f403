"""Execute each tutorial notebook once per test session (small parameters), shared by
test_notebooks.py and test_site.py: the site test builds its pages from these runs instead of
executing every notebook a second time.

Executed notebooks and their results go to a temporary folder, never into the repository.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

from labkit.book.notebooks import NOTEBOOK_DIR, execute, list_notebooks

PARAMS_FILE = Path(__file__).with_name("notebook_params.json")
NOTEBOOKS = list_notebooks(NOTEBOOK_DIR)
_runs: dict[str, dict] = {}
_workdir: Path | None = None


def load_test_params() -> dict[str, dict]:
    return json.loads(PARAMS_FILE.read_text()) if PARAMS_FILE.exists() else {}


def workdir() -> Path:
    global _workdir
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="labkit-notebook-tests-"))
        atexit.register(shutil.rmtree, _workdir, True)
    return _workdir


def executed_dir() -> Path:
    return workdir() / "executed"


def run(path: Path) -> dict:
    """Execute ``path`` (once per session) with its test parameters; the execute() row."""
    if not _runs:  # one machine profile for every notebook of the session, as labkit lab does
        from labkit.book.lab import measure_profile

        measure_profile(workdir(), progress=False)
    if path.name not in _runs:
        run_dir = executed_dir() / path.stem  # labkit lab's layout: the site gathers the laws
        run_dir.mkdir(parents=True, exist_ok=True)
        # results_dir relative to the run's folder, as labkit lab runs it (no absolute path of
        # this machine on the pages the site tests open)
        params = {**load_test_params().get(path.name, {}), "results_dir": "results"}
        _runs[path.name] = execute(path, executed_dir() / path.name, params, cwd=run_dir,
                                   cell_timeout_s=600)
    return _runs[path.name]
