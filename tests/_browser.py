"""What the Playwright browser tests share: Debian's chromium, its flags for a closed network,
and a context that refuses every request leaving the site under test."""

from __future__ import annotations

from labkit.book.notebooks import REPO_ROOT

ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# without the background-networking flags chromium keeps trying hosts this machine cannot reach
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


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
