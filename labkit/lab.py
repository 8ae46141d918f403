"""Host side: the whole lab (``labkit lab``): every tutorial with its defaults, then the site.

Each notebook ``notebooks/NN_name.ipynb`` runs with papermill in ``_executed/NN_name/`` (its
working directory, so its ``results_dir`` lands there) and is saved executed as
``_executed/NN_name.ipynb``, the input of ``labkit site``. A failing notebook does not stop the
others; the site still builds (the failed page shows papermill's error banner) and the command
exits 1. ``_executed/lab.json`` records what ran and how long it took.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from .errors import UsageError
from .notebooks import NOTEBOOK_DIR, execute, list_notebooks, write_json

RUN_MARKER = ".labkit-run"


def select(only=None, folder=NOTEBOOK_DIR) -> list[Path]:
    """All tutorials, or those whose number or name starts with one of ``only`` (``02``, ``04_ddp``)."""
    notebooks = list_notebooks(folder)
    if not notebooks:
        raise UsageError(f"{folder}: no notebooks NN_name.ipynb")
    if not only:
        return notebooks
    chosen = [p for p in notebooks if any(p.name.startswith(o) for o in only)]
    missing = [o for o in only if not any(p.name.startswith(o) for p in notebooks)]
    if missing:
        raise UsageError(f"no notebook matches {', '.join(missing)} "
                         f"(have: {', '.join(p.stem for p in notebooks)})")
    return chosen


def run_lab(notebooks: list[Path], out_dir, *, progress: bool = True,
            cell_timeout_s: float | None = None) -> list[dict]:
    """Execute ``notebooks`` in order with their defaults into ``out_dir``; rows per notebook."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    bar = tqdm(notebooks, desc="lab", unit="notebook", disable=not progress, file=sys.stderr)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        workdir = out_dir / nb.stem
        if (workdir / RUN_MARKER).exists():  # our own previous run: start clean
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / RUN_MARKER).write_text("working folder of labkit lab; replaced on each run\n")
        res = execute(nb, out_dir / nb.name, None, cwd=workdir, cell_timeout_s=cell_timeout_s)
        rows.append({"notebook": nb.name, "ok": res["ok"], "elapsed_s": round(res["elapsed_s"], 2),
                     "error": res["error"]})
        bar.write(f"{nb.name}: {'ok' if res['ok'] else 'FAILED'} in {res['elapsed_s']:.1f} s",
                  file=sys.stderr)
        if not res["ok"]:
            bar.write(f"  {res['error']}", file=sys.stderr)
        write_json(out_dir / "lab.json", {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                          "notebooks": rows})
    return rows
