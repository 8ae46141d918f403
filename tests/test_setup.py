"""What a fresh clone needs from the machine: ``make setup-browser`` installs Debian's chromium
only as root with apt-get (a normal user is told that the browser tests will be skipped and how
to get a browser), and the browser the tests drive is Playwright's own chromium, else the first
chromium on PATH that runs, else none with the reason.

Stand-ins on a PATH of their own play ``id``, ``apt-get`` and the browsers (each records that it
was called); ``PLAYWRIGHT_BROWSERS_PATH`` points Playwright at an empty folder, or at one that
holds a stand-in of its chromium.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.book.notebooks import REPO_ROOT
from tests._browser import locate_browser


def stand_in(folder: Path, name: str, script: str) -> Path:
    """An executable ``folder/name`` running the sh ``script``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def browser(folder: Path, name: str, *, works: bool = True) -> Path:
    """A stand-in browser that answers ``--version`` (or fails it, as a browser without its
    libraries does)."""
    if works:
        return stand_in(folder, name, 'echo "Chromium 126.0 (stand-in)"')
    return stand_in(folder, name, 'echo "error while loading shared libraries: libnss3.so" >&2\n'
                                  "exit 127")


@pytest.fixture
def no_playwright_browser(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "no-playwright-browsers"))


# --- make setup-browser ------------------------------------------------------------------------

@pytest.mark.parametrize("uid, chromium_on_path", [(1000, False), (0, False), (0, True)])
def test_setup_browser_installs_only_as_root(tmp_path, uid, chromium_on_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on PATH")
    bin_dir, called = tmp_path / "bin", tmp_path / "apt-get-called"
    stand_in(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || echo "uid={uid}"')
    stand_in(bin_dir, "apt-get", f'echo "$@" >> "{called}"')
    if chromium_on_path:
        found = browser(bin_dir, "chromium")
    # PATH: the stand-ins alone (no system chromium); `setup` is taken as done (-o)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path),
           "PLAYWRIGHT_BROWSERS_PATH": str(tmp_path / "no-playwright-browsers")}
    proc = subprocess.run([make, "--no-print-directory", "-o", "setup", "setup-browser",
                           f"PY={sys.executable}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    apt_calls = called.read_text().splitlines() if called.exists() else []
    if chromium_on_path:
        assert not apt_calls, apt_calls
        assert f"the browser tests drive {found} (on PATH)" in out
    elif uid == 0:
        assert apt_calls == ["update -qq", "install -y -qq chromium"], apt_calls
        assert "installing Debian's chromium" in out
    else:
        assert not apt_calls, f"apt-get run without root: {apt_calls}"
        lines = out.strip().splitlines()
        assert len(lines) == 1 and "the browser tests will be skipped" in lines[0], out
        assert "playwright install chromium" in lines[0], out


# --- which browser the tests drive -------------------------------------------------------------

def test_first_working_browser_on_path(tmp_path, no_playwright_browser):
    bin_dir = tmp_path / "bin"
    browser(bin_dir, "chromium", works=False)
    second = browser(bin_dir, "chromium-browser")
    browser(bin_dir, "google-chrome")
    path, what = locate_browser(str(bin_dir))
    assert (path, what) == (str(second), "on PATH")


def test_no_browser_says_why_and_how(tmp_path, no_playwright_browser):
    bin_dir = tmp_path / "bin"
    browser(bin_dir, "google-chrome", works=False)
    path, why = locate_browser(str(bin_dir))
    assert path is None
    assert "Playwright's chromium is not installed" in why
    assert "google-chrome --version failed (error while loading shared libraries" in why
    assert "playwright install chromium" in why
    path, why = locate_browser(str(tmp_path / "empty"))
    assert path is None and "no chromium, chromium-browser or google-chrome on PATH" in why


def test_playwright_chromium_comes_first(tmp_path, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is in the dev extra (make setup)")
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "playwright"))
    with sync_api.sync_playwright() as pw:
        own = Path(pw.chromium.executable_path)  # where `playwright install chromium` puts it
    assert own.is_relative_to(tmp_path / "playwright")
    bin_dir = tmp_path / "bin"
    browser(bin_dir, "chromium")
    browser(own.parent, own.name)
    assert locate_browser(str(bin_dir)) == (str(own), "Playwright's chromium")
    # installed but unable to run (its libraries missing), or not installed: the one on PATH
    browser(own.parent, own.name, works=False)
    assert locate_browser(str(bin_dir)) == (str(bin_dir / "chromium"), "on PATH")
    os.remove(own)
    assert locate_browser(str(bin_dir))[0] == str(bin_dir / "chromium")
