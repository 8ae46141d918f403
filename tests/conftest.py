import os
import shutil
import sys

import pytest

# Tests that launch ranks share 2 cores with each other and with whatever else runs: keep
# launches few, timeouts generous, and never assert on speed here (benchmarks/ does that).
LAUNCH_TIMEOUT_S = float(os.environ.get("LABKIT_TEST_LAUNCH_TIMEOUT_S", 180))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA devices")
    skip_browser = pytest.mark.skip(reason="needs Debian's chromium (make setup-browser)")
    has_browser = shutil.which("chromium") is not None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "browser" in item.keywords and not has_browser and not os.environ.get("CI"):
            item.add_marker(skip_browser)


@pytest.fixture
def labkit_cmd():
    """The labkit CLI of this interpreter, as an argv prefix."""
    return [sys.executable, "-m", "labkit.cli"]
