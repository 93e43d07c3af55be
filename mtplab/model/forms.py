"""Graph forms: the shape of the ONNX graphs each ONNX Runtime release accepts.

The built-in model's math is one; how its graphs say it depends on the op schemas of the
onnxruntime in use (read from onnxruntime 1.30.0, 1.31.1 and 1.32.0):

- GatedDeltaNet `gate_activation`: 1.32 names the gate "softplus" ("qwen" stays as an alias);
  1.30/1.31 know only "none" and "qwen" (the same -exp(a_log) * softplus(decay + dt_bias)).
- GatedDeltaNet `decay`/`beta`: 1.32 reads them in the activation dtype; 1.30/1.31 read float32
  only, so the fp16 build casts them to float32 first (exact: every fp16 value is a float32).
- GroupQueryAttention input 16 `query_seqlens`: 1.32 only. Without it an M>1 forward after a
  past is GroupQueryAttention's subsequent-prompt path: batch 1, `seqlens_k` = past + M - 1,
  `total_sequence_length` the constant KV capacity (a host input a CUDA graph bakes).

A form is chosen from the installed runtime's schemas (not its version number), recorded in the
manifest's config and in the model cache key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mtplab.base.threads import session_options


@dataclass(frozen=True)
class GraphForm:
    """How the graphs use the version-dependent parts of GatedDeltaNet and GroupQueryAttention."""

    name: str
    gate_activation: str  # GatedDeltaNet gate_activation for -exp(a_log) * softplus(decay + dt_bias)
    float32_gates: bool  # decay and beta cast to float32 before GatedDeltaNet (fp16 build)
    query_seqlens: bool  # GroupQueryAttention takes query_seqlens (input 16)
    since: str  # first onnxruntime release whose schemas accept it

    def needs(self) -> list[str]:
        """The schema features this form relies on (names used by schema_features)."""
        return [
            f
            for f, used in (
                ("gqa_query_seqlens", self.query_seqlens),
                ("gdn_softplus", self.gate_activation == "softplus"),
                ("gdn_fp16_gates", not self.float32_gates),
            )
            if used
        ]


# Newest first: a runtime gets the first form whose needs its schemas meet.
FORMS: dict[str, GraphForm] = {
    "ort-1.32": GraphForm("ort-1.32", "softplus", False, True, "1.32"),
    "ort-1.30": GraphForm("ort-1.30", "qwen", True, False, "1.30"),
}
# feature -> (what it says when present, when absent)
FEATURE_TEXT = {
    "gqa_query_seqlens": ("GroupQueryAttention has query_seqlens", "GroupQueryAttention has no query_seqlens"),
    "gdn_softplus": ("GatedDeltaNet gate 'softplus'", "GatedDeltaNet gates only 'none'/'qwen'"),
    "gdn_fp16_gates": ("GatedDeltaNet takes float16 decay/beta", "GatedDeltaNet decay/beta float32 only"),
}


@functools.cache
def schema_features() -> dict[str, bool]:
    """What the installed onnxruntime's com.microsoft schemas accept, per FEATURE_TEXT key (read once)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    schemas = {s.name: s for s in C.get_all_operator_schema() if s.domain == "com.microsoft"}
    gqa, gdn = schemas.get("GroupQueryAttention"), schemas.get("GatedDeltaNet")
    feats = dict.fromkeys(FEATURE_TEXT, False)
    if gqa is not None:
        feats["gqa_query_seqlens"] = any(i.name == "query_seqlens" for i in gqa.inputs)
    if gdn is not None:
        gate = gdn.attributes.get("gate_activation")
        feats["gdn_softplus"] = gate is not None and "'softplus'" in gate.description
        decay = next(i for i in gdn.inputs if i.name == "decay")
        allowed = next((c.allowed_type_strs for c in gdn.type_constraints if c.type_param_str == decay.typeStr), [])
        feats["gdn_fp16_gates"] = "tensor(float16)" in allowed
    return feats


def choose_form(features: dict[str, bool] | None = None) -> tuple[GraphForm, str]:
    """The form this onnxruntime gets, and why."""
    features = dict(schema_features()) if features is None else features
    for form in FORMS.values():
        if all(features[f] for f in form.needs()):
            return form, "; ".join(FEATURE_TEXT[f][0 if ok else 1] for f, ok in features.items())
    raise RuntimeError(f"no graph form fits this onnxruntime's schemas: {features}")


def resolve(name: str | None) -> GraphForm:
    """The named form, or the installed runtime's when name is None."""
    if name is None:
        return choose_form()[0]
    if name not in FORMS:
        raise ValueError(f"graph form {name!r}: allowed forms are {sorted(FORMS)}")
    return FORMS[name]


def check_runtime(form: GraphForm) -> None:
    """Raise RuntimeError naming what is missing unless the installed onnxruntime accepts the form."""
    import onnxruntime

    features = schema_features()
    missing = [FEATURE_TEXT[f][1] for f in form.needs() if not features[f]]
    if missing:
        fits = choose_form(features)[0].name
        raise RuntimeError(
            f"graph form {form.name} needs onnxruntime >= {form.since} (installed {onnxruntime.__version__}: "
            f"{'; '.join(missing)}); build with graph_form={fits!r}, or leave it unset for the installed runtime's form"
        )


def cpu_runs_gated_delta_net() -> bool:
    """Whether the installed onnxruntime's CPU EP has a GatedDeltaNet kernel (1.30/1.31 ship it for CUDA only)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT

    def value(name: str, shape: list[int]):
        return helper.make_tensor_value_info(name, f, shape)

    node = helper.make_node("GatedDeltaNet", ["q", "k", "v", "", "g", "b", "s"], ["o", "s_out"], domain="com.microsoft")
    ins = [value(n, [1, 1, 1, 2]) for n in "qkv"] + [value("g", [1, 1, 1]), value("b", [1, 1, 1])]
    graph = helper.make_graph(
        [node], "probe", ins + [value("s", [1, 1, 2, 2])], [value("o", None), value("s_out", None)]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    try:
        ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - no kernel is the answer
        return False
    return True
