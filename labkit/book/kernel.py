"""The Jupyter kernel labkit runs notebooks with: ``labkit-python3``.

It is the ordinary ipykernel of this Python, started with ``--IPKernelApp.log_level=ERROR``.
Why: when papermill (through jupyter_client) starts a kernel on localhost, ipykernel >= 7 logs
"Kernel is running over TCP without encryption" to stderr for every notebook; in a sweep of
fifty points that warning buries the one line that matters. Nothing else changes.

The spec lives in this environment (``sys.prefix/share/jupyter/kernels``), is written on first
use, and is rewritten if it points at another Python (a moved or rebuilt virtual environment).
``labkit notebook`` registers it before it starts JupyterLab, where it is the kernel of new
notebooks ("Python 3 (labkit)").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "labkit-python3"


def kernel_spec() -> dict:
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.log_level=ERROR"],
        "display_name": "Python 3 (labkit)",
        "language": "python",
        "metadata": {"debugger": True},
    }


def spec_path(prefix: str | None = None) -> Path:
    return Path(prefix or sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json"


def ensure_kernel(prefix: str | None = None) -> str:
    """Install the ``labkit-python3`` kernelspec if it is missing or stale; return its name."""
    path = spec_path(prefix)
    spec = kernel_spec()
    try:
        if json.loads(path.read_text()) == spec:
            return KERNEL_NAME
    except (OSError, json.JSONDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # write-then-rename: a notebook run starting at the same moment never reads half a spec
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernel.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, indent=1)
    os.replace(tmp, path)
    return KERNEL_NAME
