"""The greedy choice made inside the graph: every target and head graph mtplab runs outputs its argmax tokens and how
many of its input's drafts they agree with, so a greedy step reads k + 1 integers and a count, not logits.

Appended to the graph as onnxruntime loads it (mtplab.runtime.sessions), never written to the user's folder:
- TOKENS [B, M] int64: ArgMax over the logits' last axis (the first of equal maxima, as NumPy's argmax; fp16 and
  bf16 logits are cast to fp32 first, which changes no order).
- ACCEPTED [B] int64: the leading run of ids[:, 1:] equal to TOKENS[:, :-1], the drafts a verify of
  [token, drafts...] keeps under greedy-match: ArgMin over (draft == target as 0/1, padded with a 0), the first miss.
  At M = 1 it is 0. A row whose own drafts are fewer than the verify's keeps min(ACCEPTED, its own).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

TOKENS = "mtplab.greedy_tokens"
ACCEPTED = "mtplab.accepted"
_P = "mtplab.greedy."  # the appended nodes' own names


def append_greedy_outputs(model: onnx.ModelProto, ids: str, logits: str) -> None:
    """Append TOKENS and ACCEPTED to `model`'s graph (in place), computed from its `ids` input and `logits` output."""
    elem = next((o.type.tensor_type.elem_type for o in model.graph.output if o.name == logits), TensorProto.FLOAT)
    scores = logits
    nodes = []
    if elem != TensorProto.FLOAT:
        scores = _P + "logits_f32"
        nodes.append(helper.make_node("Cast", [logits], [scores], to=TensorProto.FLOAT))

    def const(name: str, values: list[int]) -> str:
        nodes.append(helper.make_node("Constant", [], [_P + name],
                                      value=helper.make_tensor(_P + name, TensorProto.INT64, [len(values)], values)))
        return _P + name

    zero, one, last, end = const("0", [0]), const("1", [1]), const("-1", [-1]), const("end", [1 << 62])
    after = const("pads", [0, 0, 0, 1])  # one more entry at the end of the last axis

    def n(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    tokens = n("ArgMax", [scores], TOKENS, axis=-1, keepdims=0)
    drafts = n("Slice", [ids, one, end, last], _P + "drafts")  # ids[:, 1:]
    before = n("Slice", [tokens, zero, last, last], _P + "before")  # tokens[:, :-1]
    kept = n("Cast", [n("Equal", [drafts, before], _P + "equal")], _P + "kept", to=TensorProto.FLOAT)
    padded = n("Pad", [kept, after], _P + "padded", mode="constant")  # a 0 after the last draft: all kept reads M - 1
    n("ArgMin", [padded], ACCEPTED, axis=-1, keepdims=0)
    model.graph.node.extend(nodes)
    model.graph.output.extend([helper.make_tensor_value_info(TOKENS, TensorProto.INT64, ["batch", "tokens"]),
                               helper.make_tensor_value_info(ACCEPTED, TensorProto.INT64, ["batch"])])


def greedy_model(path: str | Path, ids: str, logits: str) -> bytes:
    """The graph at `path` with the greedy outputs appended, serialized for onnxruntime (its external data stays in
    its folder: the session reads it from there)."""
    model = onnx.load(str(path), load_external_data=False)
    append_greedy_outputs(model, ids, logits)
    return model.SerializeToString()
