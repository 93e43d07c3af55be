"""The greedy choice made inside the graph: every target and head graph mtplab runs outputs its argmax tokens and how
many of its input's drafts they agree with, so a greedy step reads k + 1 integers and a count, not logits.

Appended to the graph as onnxruntime loads it (mtplab.runtime.sessions), never written to the user's folder:
- TOKENS [B, M] int64: ArgMax over the logits' last axis (the first of equal maxima, as NumPy's argmax; fp16 and
  bf16 logits are cast to fp32 first, which changes no order).
- ACCEPTED [B] int64: the leading run of ids[:, 1:] equal to TOKENS[:, :-1], the drafts a verify of
  [token, drafts...] keeps under greedy-match: the drafts with no miss at or before them (a CumSum of the misses,
  then a sum of its zeros). At M = 1 it is 0. A row whose own drafts are fewer than the verify's keeps
  min(ACCEPTED, its own).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

TOKENS = "mtplab.greedy_tokens"
ACCEPTED = "mtplab.accepted"
_P = "mtplab.greedy."  # the appended nodes' own names
MIN_OPSET = 13


def append_greedy_outputs(model: onnx.ModelProto, ids: str, logits: str, counts: bool = True) -> None:
    """Append TOKENS and ACCEPTED (counts=False: TOKENS alone, for a graph no verify runs, the MTP head's) to `model`'s
    graph (in place), computed from its `ids` input and `logits` output;
    ValueError for a graph whose opset is older than the ops appended (ReduceSum and Slice taking axes as inputs)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise ValueError(f"{model.graph.name or 'the graph'} imports ONNX opset {opset}; mtplab appends its greedy "
                         f"choice with ops of opset {MIN_OPSET} or later (export the model at opset {MIN_OPSET} or later)")
    elem = next((o.type.tensor_type.elem_type for o in model.graph.output if o.name == logits), TensorProto.FLOAT)
    nodes: list[onnx.NodeProto] = []

    def n(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(name: str, value: int) -> str:
        return n("Constant", [], _P + name, value=helper.make_tensor(_P + name, TensorProto.INT64, [1], [value]))

    scores = n("Cast", [logits], _P + "logits_f32", to=TensorProto.FLOAT) if elem in (
        TensorProto.FLOAT16, TensorProto.BFLOAT16) else logits
    tokens = n("ArgMax", [scores], TOKENS, axis=-1, keepdims=0)
    outputs = [helper.make_tensor_value_info(TOKENS, TensorProto.INT64, [None, None])]
    if counts:
        zero, one, last, end = const("0", 0), const("1", 1), const("-1", -1), const("end", 1 << 62)
        drafts = n("Slice", [ids, one, end, last], _P + "drafts")  # ids[:, 1:]
        before = n("Slice", [tokens, zero, last, last], _P + "before")  # tokens[:, :-1]
        differ = n("Not", [n("Equal", [drafts, before], _P + "equal")], _P + "differ")
        missed = n("Cast", [differ], _P + "missed", to=TensorProto.INT64)
        # a draft is kept while no miss came before or at it: no tie for a kernel to break
        clean = n("Equal", [n("CumSum", [missed, last], _P + "misses"), zero], _P + "clean")
        n("ReduceSum", [n("Cast", [clean], _P + "kept", to=TensorProto.INT64), last], ACCEPTED, keepdims=0)
        outputs.append(helper.make_tensor_value_info(ACCEPTED, TensorProto.INT64, [None]))
    model.graph.node.extend(nodes)
    model.graph.output.extend(outputs)


def greedy_model(path: str | Path, ids: str, logits: str, counts: bool = True) -> bytes:
    """The graph at `path` with the greedy outputs appended, serialized for onnxruntime (its external data stays in
    its folder: the session reads it from there)."""
    model = onnx.load(str(path), load_external_data=False)
    append_greedy_outputs(model, ids, logits, counts)
    return model.SerializeToString()
