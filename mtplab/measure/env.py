"""The environment a result was measured in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from mtplab.base.memory import huge_pages, meminfo_gib
from mtplab.base.paths import CHECKOUT


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def memory_gib() -> float | None:
    """Physical memory of this machine in GiB (None where /proc/meminfo is missing)."""
    total = meminfo_gib("MemTotal")
    return None if total is None else round(total, 1)


def git_revision(root: Path = CHECKOUT) -> str | None:
    """The checkout's commit, with "+modified" where the package's or the notebooks' tracked files differ from it
    (what ran is then not that commit); None outside a git checkout."""

    def git(*args: str):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)

    try:
        out = git("rev-parse", "--short", "HEAD")
        if out.returncode != 0 or not out.stdout.strip():
            return None
        changed = git("diff", "--quiet", "HEAD", "--", "mtplab", "notebooks").returncode == 1
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+modified" if changed else "")


def environment(backend: str = "cpu", threads: int = 0) -> dict:
    """Versions (mtplab, onnxruntime, onnxruntime-genai, numpy, Python), provider, device, machine, threads, the pages
    the process's memory lies on (mtplab.base.memory.huge_pages), git revision.

    threads: the run's RunConfig.threads; recorded as the intra-op threads its sessions used.
    """
    import onnxruntime

    from mtplab.base.threads import thread_pool, threads_used

    device = _cpu_name()
    if backend == "cuda":
        try:
            import cupy

            device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        except Exception:  # noqa: BLE001 - report what we can
            device = "cuda (unknown)"
    return {
        "mtplab": package_version("mtplab"),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_genai": package_version("onnxruntime-genai"),
        "numpy": package_version("numpy"),
        "provider": "CUDAExecutionProvider" if backend == "cuda" else "CPUExecutionProvider",
        "device": device,
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib(),
        "hostname": platform.node(),
        "threads": threads_used(threads),
        "thread_pool": thread_pool(),
        "huge_pages": huge_pages(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_revision": git_revision(),
    }
