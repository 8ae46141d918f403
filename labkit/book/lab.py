"""Host side: the whole lab (``labkit lab``): every tutorial with its defaults, then the site.

Each notebook ``notebooks/NN_name.ipynb`` runs with papermill in ``_executed/NN_name/`` (its
working directory, so its ``results_dir`` lands there) and is saved executed as
``_executed/NN_name.ipynb``, the input of ``labkit site``. A failing notebook does not stop the
others; the site still builds (the failed page shows papermill's error banner) and the command
exits 1. ``_executed/lab.json`` records what ran and how long it took. Before the first
notebook the run measures this machine's profile (:mod:`labkit.machine`) into
``_executed/machine_profile.json`` and points every notebook at it (``$LABKIT_MACHINE_PROFILE``),
so all of them predict from the same numbers, taken minutes before. After the last notebook it
measures the profile again (``_executed/machine_profile_end.json``): how far the machine itself
moved while the laws were judged (:mod:`labkit.book.drift`, on the front page and in the report).

The same tutorials by hand (``labkit notebook``, ``make notebook``): :func:`jupyterlab_command`
is JupyterLab of this environment on the tutorials, with the ``labkit-python3`` kernel
registered. Run from the notebook's folder, a notebook writes its results to
``notebooks/results/`` (git-ignored), as under ``labkit lab``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import quote

from labkit.book.kernel import KERNEL_NAME
from labkit.book.notebooks import NOTEBOOK_DIR, REPO_ROOT, execute, list_notebooks, write_json
from labkit.errors import UsageError

RUN_MARKER = ".labkit-run"


def select(only=None, folder=NOTEBOOK_DIR) -> list[Path]:
    """All tutorials, or those whose number or name starts with one of ``only`` (``02``, ``05_ddp``)."""
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
            cell_timeout_s: float | None = None, profile_again: bool = True) -> list[dict]:
    """Execute ``notebooks`` in order with their defaults into ``out_dir``; rows per notebook.
    ``profile_again``: measure the machine's profile once more after the last notebook, into
    :data:`labkit.book.drift.END_FILE`: how far the machine moved while the models' laws were
    judged against the first (:mod:`labkit.book.drift`)."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from labkit.book.drift import END_FILE

    (out_dir / END_FILE).unlink(missing_ok=True)  # a last run's: not this run's end
    rows = [measure_profile(out_dir, progress=progress)]
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
        _record(out_dir, rows)
    if profile_again:
        rows.append(measure_profile(out_dir, progress=progress, file=END_FILE, export=False))
        _record(out_dir, rows)
    return rows


def _record(out_dir: Path, rows: list[dict]) -> None:
    """``lab.json``: what ran so far, rewritten after each step (a killed run keeps its rows)."""
    write_json(out_dir / "lab.json", {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                      "notebooks": rows})


def measure_profile(out_dir: Path, *, progress: bool = True, file: str | None = None,
                    export: bool = True) -> dict:
    """This run's machine profile, measured afresh into ``out_dir/file`` (default
    :data:`labkit.machine.FILE`) and, with ``export``, named in the environment the notebooks'
    kernels inherit; its row of ``lab.json``. A failed measurement leaves each notebook to
    measure its own (:func:`labkit.machine.profile`)."""
    from labkit import machine
    from labkit.errors import LabkitError
    from labkit.launch import LaunchOptions
    from labkit.machine.config import MachineConfig
    from labkit.machine.run import run

    path = out_dir / (file or machine.FILE)
    label = "machine profile" if export else "machine profile, again"
    path.unlink(missing_ok=True)
    if export:
        os.environ.pop(machine.ENV, None)
    t0 = time.perf_counter()
    try:
        run(MachineConfig(), launch=LaunchOptions(nprocs=(2,), progress=False), store=path)
    except LabkitError as e:
        return {"notebook": label, "ok": False,
                "elapsed_s": round(time.perf_counter() - t0, 2), "error": str(e)}
    if export:
        os.environ[machine.ENV] = str(path.resolve())
    elapsed = time.perf_counter() - t0
    if progress:
        print(f"{label}: measured in {elapsed:.1f} s into {path}", file=sys.stderr)
    return {"notebook": label, "ok": True, "elapsed_s": round(elapsed, 2), "error": None}


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def jupyterlab_command(target=None, *, port: int | None = None, ip: str | None = None,
                       open_browser: bool = True) -> list[str]:
    """The command that opens ``target`` (a notebook or a folder; default: the tutorials) in
    JupyterLab of this Python.

    Inside the repository the server's root is the repository (a terminal in JupyterLab starts
    there, so the README's commands work as written) and the page opens on ``target``; outside
    it, the root is ``target``'s folder. JupyterLab refuses to start as root unless told
    ``--allow-root``; it is added only for root (containers, CI), never for a normal user.

    >>> cmd = jupyterlab_command()
    >>> cmd[1:3], cmd[-1]
    (['-m', 'jupyterlab'], '--LabApp.default_url=/lab/tree/notebooks')
    """
    target = Path(target or NOTEBOOK_DIR).resolve()
    if not target.exists():
        raise UsageError(f"{target}: no such notebook or folder")
    if target.is_file() and target.suffix != ".ipynb":
        raise UsageError(f"{target}: not a notebook (.ipynb) or a folder")
    root = REPO_ROOT if target.is_relative_to(REPO_ROOT) else (
        target if target.is_dir() else target.parent)
    # new notebooks start on the lab's kernel; the tutorials keep the one they name (python3,
    # which JupyterLab of this environment also runs with this Python)
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
           f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}"]
    if port is not None:
        cmd += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if ip is not None:
        cmd.append(f"--ServerApp.ip={ip}")
    if not open_browser:
        cmd.append("--no-browser")
    if running_as_root():
        cmd.append("--allow-root")
    rel = target.relative_to(root).as_posix()
    if rel != ".":
        cmd.append(f"--LabApp.default_url=/lab/tree/{quote(rel)}")
    return cmd
