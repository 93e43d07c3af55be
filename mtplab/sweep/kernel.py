"""The Jupyter kernel `mtplab` that papermill runs notebooks on, pinned to this interpreter.

`make` registers the kernel in the virtual environment for people using JupyterLab. Sweeps and
reports do not rely on that registration: a kernelspec of the same name elsewhere (an older
user-level one, another checkout's) could start a different Python. ensure_kernel() writes a
kernelspec whose argv is sys.executable into a private folder and puts it first on JUPYTER_PATH,
which child processes inherit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from mtplab.base.paths import cache_root

NAME = "mtplab"


def ensure_kernel() -> str:
    """Make kernel `mtplab` resolve to this interpreter for this process and its children; returns its name."""
    key = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    root = cache_root() / f"jupyter-{key}"
    spec = root / "kernels" / NAME / "kernel.json"
    body = {
        # The kernel's own log only repeats transport warnings and the interrupt papermill sends at
        # shutdown; errors in a notebook reach the sweep through papermill, not through this log.
        "argv": [
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--IPKernelApp.log_level=CRITICAL",
        ],
        "display_name": "mtplab",
        "language": "python",
        "metadata": {"debugger": False},
    }
    if not spec.exists() or json.loads(spec.read_text()) != body:
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps(body, indent=1))
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if str(root) not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root), *paths])
    return NAME
