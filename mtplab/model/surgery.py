"""`select` on builder models: a copy of the target that also outputs what replaying a prefix needs.

Two forms, by the op that carries the recurrent state. mtplab's copy lives in its cache, never in
the user's folder.
- LinearAttention (the builder's CPU export) exposes no per-token transitions. The copy adds as
  graph outputs each LinearAttention's per-token inputs (query, key, value, decay, beta); after a
  verify of k+1 tokens, `OpReplay` runs the same LinearAttention op (same attributes) on the
  first n of them from the committed state, in a small graph of its own (`replay_graph`).
- GatedDeltaNet (`linear_attn_op=gated_delta_net`, the builder's CUDA export) emits its compact
  per-token transitions itself: the copy sets each node's `state_update_capacity`, feeds it a
  `capture_count` input (the tokens of the forward) and outputs its `state_update`, which select
  replays as for the built-in model (`S *= decay; S += outer(delta, key)`).
Either way each CausalConvWithState's input is an output too, and the conv carry is rebuilt from
its first n tokens: no re-advance forward of the target.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from mtplab.base.threads import session_options
from mtplab.model.config import MAX_TRANSITION_CAPACITY
from mtplab.model.description import ModelDescription, SelectOutput
from mtplab.model.graph import TransitionLayout
from mtplab.model.onnx_read import attributes, consumer, write_copy

SURGERY_VERSION = 3
LINEAR_ROLES = ("query", "key", "value", "past_state", "decay", "beta")
NP_TO_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
REPLAYED = ("LinearAttention", "GatedDeltaNet")
ADDED = "mtplab."  # every name the copy adds (outputs, constants) starts so: the user's graph has none of them
CAPTURE_COUNT = "capture_count"  # GatedDeltaNet input 9: how many of the forward's tokens to capture
CAPTURE_INPUT, STATE_UPDATE_OUTPUT = 9, 2


def refusal(desc: ModelDescription, model: onnx.ModelProto) -> str:
    """Why this model's form cannot give `select` what it needs ("" when it can)."""
    ops = sorted({s.op for s in desc.target.states if s.kind == "recurrent"})
    if len(ops) > 1:
        return f"its recurrent layers mix {', '.join(ops)}; select replays one form per model"
    for s in desc.target.states:
        node = consumer(model, s.past)
        attrs = attributes(node)
        if s.kind == "recurrent" and s.op not in REPLAYED:
            return (f"its recurrent state goes through {s.op}, whose per-token transitions mtplab cannot read "
                    f"(select replays {' or '.join(REPLAYED)}); use readvance-m1 or readvance-batched")
        if attrs.get("state_window", 0) or attrs.get("dilation", 1) != 1:
            return f"{node.op_type} {node.name} uses a windowed or dilated form mtplab cannot replay"
        if attrs.get("state_update_capacity", 0):
            return (f"{node.op_type} {node.name} already captures transitions (state_update_capacity "
                    f"{attrs['state_update_capacity']}, the paged-attention export), a form mtplab does not feed")
        if s.op == "GatedDeltaNet" and len(node.input) > 3 and node.input[3]:
            return f"{node.name} takes ragged cu_seqlens, a form mtplab does not feed"
    return ""


def select_copy(desc: ModelDescription, model: onnx.ModelProto, content: str) -> ModelDescription:
    """The description with its target swapped for mtplab's copy that outputs select's inputs (cached by content)."""
    from mtplab.model.artifact import cache_dir

    why = refusal(desc, model)
    if why:
        return dataclasses.replace(desc, select="", select_refused=why)
    folder = cache_dir() / "builder" / f"{desc.name}-{content}-s{SURGERY_VERSION}"
    original = desc.target.path
    copy, shapes_file = folder / original.name, folder / "select_outputs.json"
    if not shapes_file.exists():
        try:
            _write_copy(desc, model, folder)
        except Exception as err:  # noqa: BLE001 - onnxruntime's own errors: select is refused with the reason
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return dataclasses.replace(desc, select="", select_refused=f"mtplab's copy with select's outputs does not "
                                                                      f"run on the CPU here ({first[:300]})")
    shapes = json.loads(shapes_file.read_text())
    select = {
        int(layer): {role: SelectOutput(o["name"], tuple(o["shape"]), o["dtype"]) for role, o in roles.items()}
        for layer, roles in shapes.items()
    }
    if not _captures(desc):
        target = dataclasses.replace(desc.target, path=copy, select_outputs=select)
        return dataclasses.replace(desc, target=target, select="replay-op", original_target=original)
    layout, why = _transition_layout(desc, select)
    if layout is None:
        return dataclasses.replace(desc, select="", select_refused=why)
    target = dataclasses.replace(desc.target, path=copy, select_outputs=select, capture_count=True)
    return dataclasses.replace(desc, target=target, select="transitions", original_target=original,
                               transition_capacity=layout.capacity, transitions=layout)


def _captures(desc: ModelDescription) -> bool:
    """The GatedDeltaNet form: the copy captures transitions (else LinearAttention's inputs are replayed)."""
    return any(s.kind == "recurrent" and s.op == "GatedDeltaNet" for s in desc.target.states)


def _transition_layout(desc: ModelDescription, select: dict) -> tuple[TransitionLayout | None, str]:
    """The transitions' layout from each layer's state [1, Hv, Dv, Dk] and its state_update width (scalar decay:
    Hv + Hk*Dk + Hv*Dv floats per token); (None, why) for any other width."""
    layouts = set()
    for s in desc.target.states:
        if s.kind != "recurrent":
            continue
        _, Hv, Dv, Dk = s.shape
        width, C = select[s.layer]["transitions"].shape[1], MAX_TRANSITION_CAPACITY
        keys = width // C - Hv - Hv * Dv
        if width % C or keys <= 0 or keys % Dk or Hv % (keys // Dk):
            return None, (f"layer {s.layer}'s GatedDeltaNet state update is {width} floats for {C} tokens, not the "
                          f"scalar-decay layout mtplab replays (per-key-dimension decay?)")
        layouts.add(TransitionLayout(C, Hv, keys // Dk, Dk, Dv))
    if len(layouts) != 1:
        return None, "its GatedDeltaNet layers differ in shape; select replays one layout per model"
    return layouts.pop(), ""


def _exposed(desc: ModelDescription, model: onnx.ModelProto) -> dict[int, dict[str, tuple[str, str, int | None]]]:
    """{layer: {role: (source tensor, output name, axis of the tokens or None)}} of what select needs."""
    out: dict[int, dict[str, tuple[str, str, int | None]]] = {}
    for s in desc.target.states:
        node = consumer(model, s.past)
        roles = out.setdefault(s.layer, {})
        if s.kind == "conv":
            roles["conv_input"] = (node.input[0], f"{ADDED}conv_input.{s.layer}", 1 if "channels-last" in s.layout else 2)
        elif s.op == "GatedDeltaNet":
            name = f"{ADDED}transitions.{s.layer}"
            roles["transitions"] = (name, name, None)
        else:
            for role, name in zip(LINEAR_ROLES, node.input):
                if name and role != "past_state":
                    roles[role] = (name, f"{ADDED}{role}.{s.layer}", 1)
    return out


def _expose(copy: onnx.ModelProto, exposed) -> None:
    """Each exposed tensor becomes a graph output through a Mul by one (exact). Not the tensor itself: the CPU
    computes an fp16 graph's ops that lack fp16 kernels in float32 between casts, and a tensor that is also a
    graph output is rounded to fp16 for its consumer as well (an fp16 export's logits move), while the Mul leaves
    the consumer's input as it was (bitwise)."""
    typed = {v.name: v.type.tensor_type.elem_type
             for v in onnx.shape_inference.infer_shapes(copy).graph.value_info}
    have = {o.name for o in copy.graph.output}
    for roles in exposed.values():
        for source, name, _ in roles.values():
            if name in have:
                continue
            if source != name:
                elem = typed.get(source, TensorProto.FLOAT)
                one = f"{ADDED}one.{elem}"
                if not any(t.name == one for t in copy.graph.initializer):
                    copy.graph.initializer.append(helper.make_tensor(one, elem, [], [1.0]))
                copy.graph.node.append(helper.make_node("Mul", [source, one], [name], name=f"{name}.expose"))
            copy.graph.output.append(helper.make_empty_tensor_value_info(name))
            have.add(name)


def _capture_transitions(desc: ModelDescription, copy: onnx.ModelProto, exposed) -> None:
    """Each GatedDeltaNet node of the copy captures up to MAX_TRANSITION_CAPACITY transitions per forward."""
    for s in desc.target.states:
        if s.kind != "recurrent" or s.op != "GatedDeltaNet":
            continue
        node = consumer(copy, s.past)
        node.attribute.append(helper.make_attribute("state_update_capacity", MAX_TRANSITION_CAPACITY))
        ins = list(node.input) + [""] * (CAPTURE_INPUT + 1 - len(node.input))
        ins[CAPTURE_INPUT] = CAPTURE_COUNT
        outs = list(node.output) + [""] * (STATE_UPDATE_OUTPUT + 1 - len(node.output))
        outs[STATE_UPDATE_OUTPUT] = exposed[s.layer]["transitions"][1]
        del node.input[:], node.output[:]
        node.input.extend(ins)
        node.output.extend(outs)
    copy.graph.input.append(helper.make_tensor_value_info(CAPTURE_COUNT, TensorProto.INT32, ["batch_size"]))


def _write_copy(desc: ModelDescription, model: onnx.ModelProto, folder: Path) -> None:
    """Write the target copy with the extra outputs, link its weights, and probe the outputs' shapes."""
    source = desc.target.path
    exposed = _exposed(desc, model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if _captures(desc):
        _capture_transitions(desc, copy, exposed)
    _expose(copy, exposed)

    def probed(tmp: Path) -> None:
        shapes = _probe(desc, tmp / source.name, exposed)
        (tmp / "select_outputs.json").write_text(json.dumps(shapes, indent=1))

    write_copy(copy, source, folder, then=probed)


def _probe(desc: ModelDescription, path: Path, exposed) -> dict:
    """Run the copy once on 2 tokens to learn each exposed output's shape and dtype."""
    import onnxruntime as ort

    from mtplab.model.description import length_feeds

    io, M = desc.target, 2
    session = ort.InferenceSession(str(path), session_options(1), providers=["CPUExecutionProvider"])
    feeds = {io.input_ids: np.zeros((1, M), np.int64), **length_feeds(io, 0, M, M)}
    if _captures(desc):
        feeds[CAPTURE_COUNT] = np.array([M], np.int32)
    for kv in io.kv:
        empty = np.zeros((1, kv.heads, 0, kv.head_dim), kv.np_dtype)
        feeds[kv.past_key], feeds[kv.past_value] = empty, empty
    for s in io.states:
        feeds[s.past] = np.zeros(s.shape, s.np_dtype)
    names = [name for roles in exposed.values() for _, name, _ in roles.values()]
    values = dict(zip(names, session.run(names, feeds)))
    shapes: dict = {}
    for layer, roles in exposed.items():
        for role, (_, name, axis) in roles.items():
            shape = list(values[name].shape)
            shape[0] = 1
            if axis is not None:
                shape[axis] = None
            shapes.setdefault(str(layer), {})[role] = {"name": name, "shape": shape, "dtype": str(values[name].dtype)}
    return shapes


def replay_graph(desc: ModelDescription) -> tuple[bytes, list]:
    """The LinearAttention form's replay graph: each linear-attention layer's LinearAttention node (same
    attributes) fed from past_state.{i} and the prefix's inputs {role}.{i}, giving present.{i}; and
    [(state, roles fed)]."""
    model = onnx.load(str(desc.target.path), load_external_data=False)
    graph_in, graph_out, nodes, layers = [], [], [], []
    for s in desc.target.states:
        if s.kind != "recurrent":
            continue
        node = consumer(model, s.past)
        roles = desc.target.select_outputs[s.layer]
        names = []
        for role, name in zip(LINEAR_ROLES, node.input):
            local = f"{role}.{s.layer}" if name else ""
            if role == "past_state":
                graph_in.append(helper.make_tensor_value_info(local, NP_TO_ONNX[s.dtype], list(s.shape)))
            elif name:
                o = roles[role]
                dims = [d if d is not None else "T" for d in o.shape]
                graph_in.append(helper.make_tensor_value_info(local, NP_TO_ONNX[o.dtype], dims))
            names.append(local)
        out = f"present.{s.layer}"
        graph_out.append(helper.make_tensor_value_info(out, NP_TO_ONNX[s.dtype], list(s.shape)))
        attrs = attributes(node)
        nodes.append(helper.make_node(node.op_type, names, [f"output.{s.layer}", out], domain=node.domain, **attrs))
        layers.append((s, [r for r, n in zip(LINEAR_ROLES, names) if n and r != "past_state"]))
    graph = helper.make_graph(nodes, "select_replay", graph_in, graph_out)
    replay = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return replay.SerializeToString(), layers
