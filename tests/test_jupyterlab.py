"""JupyterLab as a student uses it: ``labkit notebook`` (what ``make notebook`` runs) starts
JupyterLab of this environment; headless Chromium opens notebook 02 in it, runs all cells, finds
no error in any cell, then moves the Amdahl slider and sees the numbers and the figure it drives
change (widgets live with a kernel, not saved state). Everything is torn down and checked gone.

The notebook runs from a copy in a temporary folder (so JupyterLab's autosave never writes into
the repository) with its test parameters (tests/notebook_params.json) injected as papermill
would. Every request that leaves 127.0.0.1 is failed on purpose: JupyterLab must work offline.
Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from labkit.book.lab import jupyterlab_command
from labkit.book.notebooks import NOTEBOOK_DIR, REPO_ROOT
from labkit.orphans import kill_marked, processes_of
from tests._browser import ARTIFACTS, CHROMIUM_ARGS, block_offsite, browser_executable

from ._notebook_runs import load_test_params

MARK = "LABKIT_TEST_JUPYTERLAB"  # every process of the server (kernels, their launches) has it
NOTEBOOK = NOTEBOOK_DIR / "02_speedup.ipynb"
# JupyterLab shows an error output (the traceback) as stderr text
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'

# one settings file per plugin: render every cell (no windowing, so the DOM holds all of them),
# and no news prompt over the page
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


# --- helpers, importable for a manual run against another notebook ----------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_notebook(src: Path, folder: Path, parameters: dict) -> Path:
    """A copy of ``src`` in ``folder`` with ``parameters`` injected after its parameters cell."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = load_notebook_node(str(src))  # papermill's reader: the cell metadata it expects
    if parameters:
        nb = parameterize_notebook(nb, parameters)
    nb.metadata.pop("papermill", None)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / src.name
    nbformat.write(nb, out)
    return out


def _request(url: str, token: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status


@contextlib.contextmanager
def jupyterlab(notebook: Path, home: Path):
    """``labkit notebook NOTEBOOK`` on 127.0.0.1 (free port, own token, own Jupyter folders);
    yields (base URL, token). On exit: shut down through the API, then check by the mark in
    their environment that the server, its kernels and whatever they started are gone."""
    token, port, mark = secrets.token_hex(16), free_port(), uuid.uuid4().hex
    env = {**os.environ, "JUPYTER_TOKEN": token, MARK: mark, "PYTHONUNBUFFERED": "1"}
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("IPYTHONDIR", "ipython")):
        env[var] = str(home / sub)
    for name, value in SETTINGS.items():
        path = home / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    log_path = home / "jupyterlab.log"
    cmd = [sys.executable, "-m", "labkit.cli", "notebook", str(notebook), "--no-browser",
           "--ip", "127.0.0.1", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _request(f"{base}/api/status", token)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start ({shlex.join(cmd)}):\n"
                                + log_path.read_text()[-3000:])
                time.sleep(0.3)
        yield base, token
    finally:
        with contextlib.suppress(OSError):
            _request(f"{base}/api/shutdown", token, method="POST")
        try:
            proc.wait(timeout=30)
            clean = True
        except subprocess.TimeoutExpired:
            clean = False
        deadline = time.monotonic() + 10  # kernels exit just after the server
        while processes_of(mark, MARK) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = kill_marked(mark, MARK)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        assert clean and not left, (
            f"JupyterLab left processes running after /api/shutdown: server "
            f"{'exited' if clean else 'still up'}, others {left} (killed)\n"
            + log_path.read_text()[-2000:])


def descendants(pid: int | None = None) -> set[int]:
    """Live (not zombie) processes below ``pid`` (default: this one), through psutil."""
    found = set()
    for child in psutil.Process(pid or os.getpid()).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
    return found


def _prompts(page) -> dict:
    return page.evaluate("""() => ({
        prompts: [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                     .map(e => e.textContent.trim()),
        status: document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status,
        kernel: document.querySelector('.jp-Toolbar-kernelName')?.textContent.trim()})""")


# Waits below use page.wait_for_timeout, not time.sleep: Playwright's sync API runs the route
# handler (which lets 127.0.0.1 through) only while a Playwright call is in progress.

def run_all_cells(page, timeout_s: float = 300) -> dict:
    """Run > Run All Cells from the menu; wait until the kernel is idle with no cell queued.

    Run All queues every cell at once (``[*]``); a cell that raises un-queues the rest
    (``[ ]``), so idle with no ``[*]`` and at least one cell run means it is over either way."""
    deadline = time.monotonic() + 90
    while True:  # a kernel, connected and idle, before anything runs
        st = _prompts(page)
        if st["kernel"] and st["kernel"] != "No Kernel" and st["status"] == "idle":
            break
        assert time.monotonic() < deadline, f"the kernel did not start: {st}"
        page.wait_for_timeout(300)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    deadline = time.monotonic() + timeout_s
    while True:
        st = _prompts(page)
        ran = sum(bool(re.fullmatch(r"\[\d+\]:", p)) for p in st["prompts"])
        if st["status"] == "idle" and ran and not any("*" in p for p in st["prompts"]):
            return st
        assert time.monotonic() < deadline, f"cells still running after {timeout_s:.0f} s: {st}"
        page.wait_for_timeout(500)


def save_and_read(page, path: Path):
    """The notebook toolbar's save button; the notebook as JupyterLab wrote it (outputs too)."""
    import nbformat

    before = path.stat().st_mtime_ns
    page.locator('.jp-NotebookPanel-toolbar [data-command="docmanager:save"]').first.click()
    deadline = time.monotonic() + 30
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            page.screenshot(path=str(ARTIFACTS / "jupyterlab-save-failed.png"))
            pytest.fail("JupyterLab did not save the notebook (screenshot: "
                        "test-artifacts/jupyterlab-save-failed.png)")
        page.wait_for_timeout(200)
    page.wait_for_timeout(500)  # written through a temporary file and renamed: let it land
    return nbformat.read(path, as_version=4)


def cell_errors(nb) -> list[str]:
    """Every error output of the saved notebook: cell number, its first line, the exception."""
    return [f"cell {i + 1} ({c.source.splitlines()[0] if c.source else ''}): "
            f"{o.get('ename')}: {o.get('evalue')}"
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def amdahl_explorer(page):
    """The explorer's serial-fraction slider, its readout, the HTML numbers and the figure."""
    slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="serial f"))
    box = slider.locator("xpath=ancestor::*[contains(@class, 'widget-vbox')][1]")
    return {"slider": slider, "handle": slider.locator(".noUi-handle"),
            "readout": slider.locator(".widget-readout"),
            "numbers": box.locator(".widget-html-content"),
            "figure": box.locator(".widget-output img")}


def explorer_state(ex) -> dict:
    return {"readout": ex["readout"].inner_text().strip(),
            "numbers": ex["numbers"].first.inner_text().strip(),
            "figure": ex["figure"].first.get_attribute("src") or ""}


def check_notebook_in_jupyterlab(notebook: Path, tmp_path: Path, parameters: dict) -> dict:
    """Open ``notebook`` in JupyterLab, run it, move the Amdahl slider; what was seen."""
    import nbformat
    from playwright.sync_api import sync_playwright

    work = prepare_notebook(notebook, tmp_path / "work", parameters)
    n_code = sum(c.cell_type == "code" for c in nbformat.read(work, as_version=4).cells)
    ARTIFACTS.mkdir(exist_ok=True)
    seen: dict = {"blocked": [], "page_errors": []}
    before = descendants()
    t0 = time.monotonic()
    with jupyterlab(work, tmp_path / "jupyter") as (base, token), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_executable(), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            block_offsite(ctx, base, seen["blocked"])
            page = ctx.new_page()
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            # what `labkit notebook NOTEBOOK` opens: the server's default page is the notebook
            page.goto(f"{base}/?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            seen["url"] = page.url
            seen["status"] = run_all_cells(page)
            seen["ran_s"] = time.monotonic() - t0
            saved = save_and_read(page, work)
            seen["errors"] = cell_errors(saved)
            seen["executed"] = sum(c.cell_type == "code" and c.execution_count is not None
                                   for c in saved.cells)
            seen["code_cells"] = n_code
            # what the page shows for them: the traceback text of each stderr output
            shown = page.locator(STDERR_OUTPUT, has_text=re.compile(r"Traceback|Error"))
            seen["shown_errors"] = [shown.nth(i).inner_text()[-1500:] for i in range(shown.count())]
            if seen["errors"] or seen["shown_errors"]:
                page.screenshot(path=str(ARTIFACTS / f"jupyterlab-{notebook.stem}-error.png"))
                return seen
            ex = amdahl_explorer(page)
            ex["slider"].scroll_into_view_if_needed()
            seen["before"] = explorer_state(ex)
            page.screenshot(path=str(ARTIFACTS / f"jupyterlab-{notebook.stem}-before.png"))
            # drag the handle a third of the track to the right, as a student would
            track = ex["slider"].locator(".noUi-base").bounding_box()
            handle = ex["handle"].bounding_box()
            x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(x + track["width"] / 3, y, steps=8)
            page.mouse.up()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                seen["after"] = explorer_state(ex)
                if all(seen["after"][k] != seen["before"][k] for k in seen["before"]):
                    break
                page.wait_for_timeout(250)
            page.screenshot(path=str(ARTIFACTS / f"jupyterlab-{notebook.stem}-after.png"))
        finally:
            browser.close()
    seen["total_s"] = time.monotonic() - t0
    # Playwright's driver and Chromium are gone too (JupyterLab was checked on its way out)
    deadline = time.monotonic() + 10
    while (left := descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the test: {sorted(left)}"
    return seen


# --- the test -------------------------------------------------------------------------------

def test_labkit_notebook_passes_allow_root_only_to_root(monkeypatch):
    import labkit.book.lab as lab

    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    user = jupyterlab_command()
    assert "--allow-root" not in user
    assert user[1:3] == ["-m", "jupyterlab"] and f"--ServerApp.root_dir={REPO_ROOT}" in user
    assert user[-1] == "--LabApp.default_url=/lab/tree/notebooks"  # opens on the tutorials
    monkeypatch.setattr(lab.os, "geteuid", lambda: 0)
    assert "--allow-root" in jupyterlab_command()
    one = jupyterlab_command(NOTEBOOK, port=9999, ip="127.0.0.1", open_browser=False)
    assert one[-1] == "--LabApp.default_url=/lab/tree/notebooks/02_speedup.ipynb"
    assert {"--ServerApp.port=9999", "--ServerApp.ip=127.0.0.1", "--no-browser"} <= set(one)


def test_what_a_student_session_writes_is_ignored():
    """Run from notebooks/, a tutorial writes results/ next to itself; JupyterLab writes
    checkpoints (and, with a language server, scratch files): git ignores all of them."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["notebooks/results/speedup_live.json", "notebooks/results/speedup_live.png",
             "notebooks/.ipynb_checkpoints/02_speedup-checkpoint.ipynb",
             "notebooks/.virtual_documents/02_speedup.ipynb", "sweeps/amdahl/point.json"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert sorted(proc.stdout.split()) == sorted(paths), proc.stdout + proc.stderr


def test_labkit_notebook_bad_input(capsys, tmp_path):
    from labkit.cli import main

    assert main(["notebook", str(tmp_path / "missing.ipynb"), "--print-command"]) == 2
    assert "no such notebook or folder" in capsys.readouterr().err
    (tmp_path / "x.txt").write_text("")
    assert main(["notebook", str(tmp_path / "x.txt"), "--print-command"]) == 2
    assert "not a notebook" in capsys.readouterr().err
    assert main(["notebook", "--print-command"]) == 0
    assert "-m jupyterlab" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.browser
def test_notebook_02_in_jupyterlab(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the notebooks extra (make setup)")
    pytest.importorskip("playwright", reason="Playwright is in the dev extra (make setup)")
    params = load_test_params().get(NOTEBOOK.name, {})
    seen = check_notebook_in_jupyterlab(NOTEBOOK, tmp_path, params)
    # the kernel ran in the notebook's folder: results/ next to it, as in notebooks/results/
    assert (tmp_path / "work" / "results").is_dir() or seen["errors"]
    assert seen["url"].endswith(f"/lab/tree/{NOTEBOOK.name}"), seen["url"]
    assert not seen["errors"], "a cell raised in JupyterLab:\n" + "\n".join(seen["errors"])
    assert not seen["shown_errors"], "\n---\n".join(seen["shown_errors"])
    assert seen["executed"] == seen["code_cells"], seen  # every cell ran, in the saved notebook
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in seen["status"]["prompts"]), seen["status"]
    before, after = seen["before"], seen["after"]
    assert re.fullmatch(r"0\.\d{3}", before["readout"]), before
    assert float(after["readout"]) > float(before["readout"]), (before, after)
    assert after["numbers"] != before["numbers"], "the Amdahl numbers did not follow the slider"
    assert after["figure"].startswith("data:image/png") and after["figure"] != before["figure"], \
        "the Amdahl figure did not follow the slider"
    assert not seen["page_errors"], seen["page_errors"]
