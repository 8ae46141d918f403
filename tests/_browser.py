"""What the browser tests share: the browser to drive (:func:`find_browser`), its flags for a
closed network, and a context that refuses every request leaving the site under test.

``python -m tests._browser`` prints the browser the tests will drive (exit 0) or why there is
none (exit 1); ``make setup-browser`` runs it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

from labkit.book.notebooks import REPO_ROOT

ARTIFACTS = REPO_ROOT / "test-artifacts"
#: the system browsers looked for on PATH, in this order, after Playwright's own chromium
SYSTEM_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
HOW_TO_GET_ONE = ("to get one: `.venv/bin/playwright install chromium` as you, or the "
                  "system's chromium package (on Debian `make setup-browser` as root)")
# without the background-networking flags chromium keeps trying hosts this machine cannot reach.
# Chromium refuses to start as root with its sandbox on, so root turns it off; a user keeps it
# where the browser is started directly (test_site). Playwright starts it without its sandbox
# unless told chromium_sandbox=True.
CHROMIUM_ARGS = ["--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
if hasattr(os, "geteuid") and os.geteuid() == 0:
    CHROMIUM_ARGS.insert(0, "--no-sandbox")


def _runs(path: str) -> str | None:
    """None where ``path --version`` works; else what went wrong (a browser installed without
    the libraries it needs, a wrapper for a snap that is not there)."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{path} does not run ({type(e).__name__}: {e})"
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return f"{path} --version failed ({last[0][:200]})"
    return None


def _playwright_chromium() -> tuple[str | None, str]:
    """(path, "") of the chromium Playwright installed for itself, or (None, why not)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "Playwright is not installed (the dev extra: make setup)"
    try:
        with sync_playwright() as pw:
            path = pw.chromium.executable_path
    except Exception as e:  # the driver did not start: say so and look on PATH
        return None, f"Playwright's driver did not start ({type(e).__name__}: {str(e)[:200]})"
    if not os.path.isfile(path):
        return None, "Playwright's chromium is not installed"
    return path, ""


def locate_browser(search_path: str | None = None) -> tuple[str | None, str]:
    """(executable, what it is) of the browser the tests drive, or (None, why there is none).

    Playwright's own chromium where it is installed, else the first of :data:`SYSTEM_BROWSERS`
    on ``search_path`` (default: PATH); each must answer ``--version``. Playwright's build comes
    first because it is the one the installed Playwright is made for."""
    tried = []
    path, why = _playwright_chromium()
    if path:
        broken = _runs(path)
        if broken is None:
            return path, "Playwright's chromium"
        why = f"Playwright's chromium: {broken}"
    tried.append(why)
    on_path = [p for p in (shutil.which(n, path=search_path) for n in SYSTEM_BROWSERS) if p]
    for path in on_path:
        broken = _runs(path)
        if broken is None:
            return path, "on PATH"
        tried.append(broken)
    if not on_path:
        tried.append(f"no {', '.join(SYSTEM_BROWSERS[:-1])} or {SYSTEM_BROWSERS[-1]} on PATH")
    return None, f"no browser for the browser tests: {'; '.join(tried)}; {HOW_TO_GET_ONE}"


@functools.lru_cache(maxsize=1)
def find_browser() -> tuple[str | None, str]:
    """:func:`locate_browser`, looked up once per test session."""
    return locate_browser()


def browser_executable() -> str:
    """The browser to drive; skips the calling test, with the reason, where there is none
    (conftest has already skipped every ``browser`` test then)."""
    import pytest

    path, why = find_browser()
    if path is None:
        pytest.skip(why)
    return path


def block_offsite(ctx, base: str, blocked: list) -> None:
    """Let ``ctx`` load ``base`` and inline data only; abort every other request and append its
    URL to ``blocked`` (the site must work with no network)."""
    def offline(route):
        if route.request.url.startswith((base + "/", "data:", "blob:")):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    ctx.route("**/*", offline)


AXE = REPO_ROOT / "node_modules" / "axe-core" / "axe.min.js"

_FACTS = r"""() => ({
    mathjax_errors: document.querySelectorAll('mjx-merror, .mjx-merror, .MathJax_Error').length,
    no_alt: [...document.querySelectorAll('img')]
        .filter(i => !(i.getAttribute('alt') || '').trim()).map(i => i.src.slice(0, 80)),
    wide: document.documentElement.scrollWidth > window.innerWidth + 1,
    build_paths: (document.body.innerText.match(/(^|[\s'"(])\/(tmp|home|root|work|Users)\/\S+/g)
                  || []).slice(0, 3),
})"""


def page_audit(page, *, contrast: bool = True) -> dict:
    """What a reader meets on the open ``page``: MathJax errors, images without alt text,
    a page wider than the window, absolute paths of the machine that built it, and axe-core's
    serious and critical violations (one line each: rule, help, how many elements, the first
    three). ``contrast=False`` leaves out axe's color-contrast rule, four fifths of its time on
    a long page: for a page whose template and kinds of output another audited page shares."""
    facts = page.evaluate(_FACTS)
    page.add_script_tag(path=str(AXE))
    facts["axe"] = page.evaluate("""async (contrast) => (await axe.run(document, {
            resultTypes: ['violations'],
            rules: {'color-contrast': {enabled: contrast}}})).violations
        .filter(v => v.impact === 'serious' || v.impact === 'critical')
        .map(v => `${v.id} (${v.impact}): ${v.help}; ${v.nodes.length} element(s): ` +
                  v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '))""", contrast)
    return facts


def move_explorers(page) -> list[tuple[str, str, str]]:
    """Move the first control of every page explorer (:mod:`labkit.explorer`) to another value;
    (title, readout before, readout after) for each."""
    out = []
    boxes = page.locator("[data-labkit-explorer]")
    for k in range(boxes.count()):
        box = boxes.nth(k)
        box.scroll_into_view_if_needed()
        page.wait_for_function("el => el.getAttribute('data-ready') === '1'",
                               arg=box.element_handle(), timeout=10_000)
        readout = box.locator(".labkit-readout")
        before = readout.inner_html()
        control = box.locator("[data-axis]").first
        if control.evaluate("el => el.tagName") == "SELECT":
            n = control.locator("option").count()
            now = int(control.input_value())
            control.select_option(str((now + 1) % n))
        else:  # a range input: step it with the keyboard, as a reader would
            control.focus()
            key = "ArrowLeft" if control.input_value() == control.get_attribute("max") \
                else "ArrowRight"
            page.keyboard.press(key)
        out.append((box.get_attribute("data-labkit-explorer"), before, readout.inner_html()))
    return out


if __name__ == "__main__":
    found, what = find_browser()
    print(f"the browser tests drive {found} ({what})" if found else what)
    sys.exit(0 if found else 1)
