"""`mtplab doctor`: what this machine can run."""

from __future__ import annotations

import json
import subprocess
import sys

from mtplab.base.memory import huge_pages_summary
from mtplab.measure.env import package_version
from mtplab.model.artifact import REQUIRED_OPS


def report() -> dict:
    """Python, the onnxruntime package and providers, required ops, CuPy/CUDA, and the Jupyter kernel."""
    out: dict = {"python": sys.version.split()[0]}
    runtimes = {d: package_version(d) for d in ("onnxruntime", "onnxruntime-gpu")}
    out["onnxruntime_packages"] = {d: v for d, v in runtimes.items() if v}
    if runtimes["onnxruntime"] and runtimes["onnxruntime-gpu"]:
        out["warning"] = "onnxruntime and onnxruntime-gpu are both installed: the CPU one wins; uninstall one"
    try:
        import onnxruntime

        from mtplab.model.artifact import available_ops

        out["onnxruntime"] = onnxruntime.__version__
        out["providers"] = onnxruntime.get_available_providers()
        have = available_ops()
        out["ops"] = {op: (op in have) for op in REQUIRED_OPS}
        out["graph_form"] = _form()
    except ImportError as err:
        out["onnxruntime"] = None
        out["error"] = f"onnxruntime is not importable ({err}): pip install 'mtplab[cpu]' or 'mtplab[gpu]'"
    cupys = {d: package_version(d) for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy")}
    out["cupy_packages"] = {d: v for d, v in cupys.items() if v}
    try:
        import cupy

        out["cuda"] = {"runtime": cupy.cuda.runtime.runtimeGetVersion(), "devices": cupy.cuda.runtime.getDeviceCount()}
    except Exception as err:  # noqa: BLE001 - absent CUDA is an answer, not a failure
        out["cuda"] = f"not available ({type(err).__name__})"
    out["gpu_pairing"] = "none"
    if runtimes["onnxruntime-gpu"] and out.get("onnxruntime"):
        from onnxruntime.capi import build_and_package_info

        out["gpu_pairing"] = pairing(
            runtimes["onnxruntime-gpu"],
            getattr(build_and_package_info, "cuda_version", None),
            out["ops"]["GatedDeltaNet"],
            out["cupy_packages"],
        )
    from mtplab.runtime.device import require_cuda

    try:
        require_cuda()
        out["cuda_backend"] = "available (mtplab run --backend cuda; scripts/gpu-check)"
    except ValueError as err:
        out["cuda_backend"] = "not available: " + str(err).replace(" (mtplab doctor says what is installed)", "")
    out["kernel_mtplab"] = _kernel_registered()
    out["huge_pages"] = huge_pages_summary()
    return out


def _form() -> dict:
    """The graph form this onnxruntime gets, why, and whether its CPU EP runs GatedDeltaNet."""
    from mtplab.model.forms import choose_form, cpu_runs_gated_delta_net

    form, why = choose_form()
    return {"name": form.name, "why": why, "cpu_gated_delta_net": cpu_runs_gated_delta_net()}


def pairing(ort_gpu: str, cuda_version: str | None, has_gdn: bool, cupy_packages: dict) -> str:
    """What the installed onnxruntime-gpu was built for (its own build info, not a guess from the version),
    whether it can run the built-in model, and whether the CuPy package matches its CUDA major version."""
    line = f"onnxruntime-gpu {ort_gpu} built for CUDA {cuda_version or 'unknown'}"
    problems = [] if has_gdn else ["it has no GatedDeltaNet (the CUDA 12 builds end at 1.26): the model cannot run"]
    cuda_major = (cuda_version or "").split(".")[0]
    cupys = [d for d in cupy_packages if d.startswith("cupy-cuda")]
    if cuda_major and cupys and f"cupy-cuda{cuda_major}x" not in cupys:
        problems.append(f"CuPy package {cupys} does not match CUDA {cuda_major} (want cupy-cuda{cuda_major}x)")
    if not cupys:
        problems.append("no cupy-cuda* package")
    return line + ("; " + "; ".join(problems) if problems else f" with cupy-cuda{cuda_major}x: OK")


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
    if "graph_form" in r:
        f = r["graph_form"]
        cpu = "runs" if f["cpu_gated_delta_net"] else "has no kernel for (CPU backend needs onnxruntime >= 1.32)"
        lines.append(f"graph form    {f['name']} ({f['why']}); the CPU EP {cpu} GatedDeltaNet")
    lines.append(f"cupy          {r['cupy_packages'] or 'not installed'}; cuda: {r['cuda']}")
    lines.append(f"gpu pairing   {r['gpu_pairing']}")
    lines.append(f"cuda backend  {r['cuda_backend']}")
    lines.append(f"jupyter kernel 'mtplab' registered: {'yes' if r['kernel_mtplab'] else 'no (make setup)'}")
    lines.append(f"huge pages    {r['huge_pages']}")
    for key in ("warning", "error"):
        if key in r:
            lines.append(f"{key.upper()}: {r[key]}")
    return "\n".join(lines)
