import os
import sys

import pytest

from tests._browser import find_browser

# Tests that launch ranks share 2 cores with each other and with whatever else runs: keep
# launches few, timeouts generous, and never assert on speed here (benchmarks/ does that).
LAUNCH_TIMEOUT_S = float(os.environ.get("LABKIT_TEST_LAUNCH_TIMEOUT_S", 180))


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA devices")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    # the browser is looked up only where a browser test was collected (it starts Playwright's
    # driver); without one they are skipped with the reason, in CI too (CI runs as root, where
    # `make test` installs Debian's chromium first)
    browser_items = [item for item in items if "browser" in item.keywords]
    if browser_items:
        browser, why = find_browser()
        if browser is None:
            for item in browser_items:
                item.add_marker(pytest.mark.skip(reason=why))


def pytest_report_collectionfinish(config, start_path, items):
    if any("browser" in item.keywords for item in items):
        browser, why = find_browser()
        return f"browser tests: {browser} ({why})" if browser else f"browser tests skipped: {why}"
    return None


@pytest.fixture
def labkit_cmd():
    """The labkit CLI of this interpreter, as an argv prefix."""
    return [sys.executable, "-m", "labkit.cli"]
