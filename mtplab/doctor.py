"""`mtplab doctor`: what this machine can run."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

from .model.artifact import REQUIRED_OPS


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def report() -> dict:
    """Python, the onnxruntime package and providers, required ops, CuPy/CUDA, and the Jupyter kernel."""
    out: dict = {"python": sys.version.split()[0]}
    runtimes = {d: _version(d) for d in ("onnxruntime", "onnxruntime-gpu")}
    out["onnxruntime_packages"] = {d: v for d, v in runtimes.items() if v}
    if runtimes["onnxruntime"] and runtimes["onnxruntime-gpu"]:
        out["warning"] = "onnxruntime and onnxruntime-gpu are both installed: the CPU one wins; uninstall one"
    try:
        import onnxruntime

        from .model.artifact import available_ops

        out["onnxruntime"] = onnxruntime.__version__
        out["providers"] = onnxruntime.get_available_providers()
        have = available_ops()
        out["ops"] = {op: (op in have) for op in REQUIRED_OPS}
    except ImportError as err:
        out["onnxruntime"] = None
        out["error"] = f"onnxruntime is not importable ({err}): pip install 'mtplab[cpu]' or 'mtplab[gpu]'"
    cupys = {d: _version(d) for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy")}
    out["cupy_packages"] = {d: v for d, v in cupys.items() if v}
    try:
        import cupy

        out["cuda"] = {"runtime": cupy.cuda.runtime.runtimeGetVersion(), "devices": cupy.cuda.runtime.getDeviceCount()}
    except Exception as err:  # noqa: BLE001 - absent CUDA is an answer, not a failure
        out["cuda"] = f"not available ({type(err).__name__})"
    pairing = "none"
    if runtimes["onnxruntime-gpu"]:
        major = int(runtimes["onnxruntime-gpu"].split(".")[1])
        pairing = "CUDA 13 (gpu extra)" if major >= 27 else "CUDA 12 (onnxruntime-gpu 1.26: no GatedDeltaNet)"
    out["gpu_pairing"] = pairing
    from .device import require_cuda

    try:
        require_cuda()
        out["cuda_backend"] = "available (mtplab run --backend cuda; scripts/gpu-check)"
    except ValueError as err:
        out["cuda_backend"] = f"not available: {err}"
    out["kernel_mtplab"] = _kernel_registered()
    return out


def _kernel_registered() -> bool:
    try:
        res = subprocess.run(
            [sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return "mtplab" in json.loads(res.stdout or "{}").get("kernelspecs", {})
    except (OSError, ValueError, subprocess.SubprocessError):
        return False


def format_report(r: dict) -> str:
    lines = [f"python        {r['python']}"]
    lines.append(f"onnxruntime   {r.get('onnxruntime')}  packages: {r['onnxruntime_packages'] or 'none'}")
    if r.get("providers"):
        lines.append(f"providers     {', '.join(r['providers'])}")
    for op, ok in r.get("ops", {}).items():
        lines.append(f"op {op:22} {'yes' if ok else 'MISSING (needs onnxruntime >= ' + REQUIRED_OPS[op] + ')'}")
    lines.append(f"cupy          {r['cupy_packages'] or 'not installed'}; cuda: {r['cuda']}")
    lines.append(f"gpu pairing   {r['gpu_pairing']}")
    lines.append(f"cuda backend  {r['cuda_backend']}")
    lines.append(f"jupyter kernel 'mtplab' registered: {'yes' if r['kernel_mtplab'] else 'no (make setup)'}")
    for key in ("warning", "error"):
        if key in r:
            lines.append(f"{key.upper()}: {r[key]}")
    return "\n".join(lines)
