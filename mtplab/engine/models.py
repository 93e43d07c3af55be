"""Which model a run decodes: a preset's build, or a folder (builder output, an mtplab artifact), and the weights
a session of the user's own graph shares."""

from __future__ import annotations

import functools

from mtplab.model import PRESETS, build_model, preset_config


@functools.cache
def cpu_kernel_present() -> bool:
    """Whether this onnxruntime's CPU EP runs GatedDeltaNet (probed once per process)."""
    from mtplab.model.forms import cpu_runs_gated_delta_net

    return cpu_runs_gated_delta_net()


def model_for(run):
    """The model a run (its model, backend and int4 fields) runs: a preset's build (fp16 on CUDA: GroupQueryAttention there is fp16/bf16
    only), or the folder `run.model` names (builder output, or an mtplab artifact)."""
    spec = run.model
    if spec not in PRESETS:
        from mtplab.model.folders import open_model

        return open_model(spec)
    if run.backend == "cpu" and not cpu_kernel_present():
        import onnxruntime

        raise ValueError(
            f"onnxruntime {onnxruntime.__version__} has no CPU GatedDeltaNet kernel, which the built-in model needs "
            "(the 1.30 and 1.31 CPU wheels hold its schema only): install onnxruntime>=1.32, or run --backend cuda "
            "with onnxruntime-gpu"
        )
    return build_model(preset_config(spec, run.int4, dtype="fp16" if run.backend == "cuda" else "fp32"))



def own_weights(shared: dict | None, own) -> dict | None:
    """The shared weights the user's own graph takes: the copy's, less the constants the copy added."""
    if shared is None or own is None:
        return shared
    from mtplab.model.surgery import ADDED

    return {name: value for name, value in shared.items() if not name.startswith(ADDED)}
