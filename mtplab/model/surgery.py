"""`select` on builder models: a copy of the target that also outputs what replaying a prefix needs.

The builder's CPU graph updates its recurrent state with LinearAttention and exposes no per-token
transitions. mtplab's copy (in its cache, never the user's folder) adds as graph outputs each
LinearAttention's per-token inputs (query, key, value, decay, beta) and each CausalConvWithState's
input. After a verify of k+1 tokens, `OpReplay` runs the same LinearAttention op (same attributes)
on the first n of those inputs from the committed state, in a small graph of its own (the
replay graph, `replay_graph`), and rebuilds the conv carry from the first n conv inputs: no
re-advance forward of the target.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from mtplab.base.threads import session_options
from mtplab.model.description import ModelDescription, SelectOutput
from mtplab.model.onnx_read import attributes, consumer, copy_data_files

SURGERY_VERSION = 1
LINEAR_ROLES = ("query", "key", "value", "past_state", "decay", "beta")
NP_TO_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def refusal(desc: ModelDescription, model: onnx.ModelProto) -> str:
    """Why this model's form cannot give `select` what it needs ("" when it can)."""
    for s in desc.target.states:
        node = consumer(model, s.past)
        attrs = attributes(node)
        if s.kind == "recurrent" and s.op != "LinearAttention":
            return (f"its recurrent state goes through {s.op}, whose per-token transitions this export does not "
                    "output (select replays LinearAttention's inputs); use readvance-m1 or readvance-batched")
        if attrs.get("state_window", 0) or attrs.get("dilation", 1) != 1 or attrs.get("state_update_capacity", 0):
            return f"{node.op_type} {node.name} uses a windowed, dilated or capture form mtplab cannot replay"
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
        _write_copy(desc, model, folder)
    shapes = json.loads(shapes_file.read_text())
    select = {
        int(layer): {role: SelectOutput(o["name"], tuple(o["shape"]), o["dtype"]) for role, o in roles.items()}
        for layer, roles in shapes.items()
    }
    target = dataclasses.replace(desc.target, path=copy, select_outputs=select)
    return dataclasses.replace(desc, target=target, select="replay-op", original_target=original)


def _exposed(desc: ModelDescription, model: onnx.ModelProto) -> dict[int, dict[str, tuple[str, int]]]:
    """{layer: {role: (tensor name, axis of the tokens)}} of what select needs."""
    out: dict[int, dict[str, tuple[str, int]]] = {}
    for s in desc.target.states:
        node = consumer(model, s.past)
        roles = out.setdefault(s.layer, {})
        if s.kind == "conv":
            roles["conv_input"] = (node.input[0], 1 if "channels-last" in s.layout else 2)
        else:
            for role, name in zip(LINEAR_ROLES, node.input):
                if name and role != "past_state":
                    roles[role] = (name, 1)
    return out


def _write_copy(desc: ModelDescription, model: onnx.ModelProto, folder: Path) -> None:
    """Write the target copy with the extra outputs, link its weights, and probe the outputs' shapes."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source = desc.target.path
    exposed = _exposed(desc, model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for roles in exposed.values():
        for name, _ in roles.values():
            if name not in have:
                copy.graph.output.append(helper.make_empty_tensor_value_info(name))
                have.add(name)
    onnx.save(copy, str(tmp / source.name))
    copy_data_files(model, source.parent, tmp)
    shapes = _probe(desc, tmp / source.name, exposed)
    (tmp / "select_outputs.json").write_text(json.dumps(shapes, indent=1))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def _probe(desc: ModelDescription, path: Path, exposed) -> dict:
    """Run the copy once on 2 tokens to learn each exposed output's shape and dtype."""
    import onnxruntime as ort

    from mtplab.model.description import length_feeds

    io, M = desc.target, 2
    session = ort.InferenceSession(str(path), session_options(1), providers=["CPUExecutionProvider"])
    feeds = {io.input_ids: np.zeros((1, M), np.int64), **length_feeds(io, 0, M, M)}
    for kv in io.kv:
        empty = np.zeros((1, kv.heads, 0, kv.head_dim), desc.np_dtype)
        feeds[kv.past_key], feeds[kv.past_value] = empty, empty
    for s in io.states:
        feeds[s.past] = np.zeros(s.shape, np.dtype(s.dtype))
    names = [name for roles in exposed.values() for name, _ in roles.values()]
    values = dict(zip(names, session.run(names, feeds)))
    shapes: dict = {}
    for layer, roles in exposed.items():
        for role, (name, axis) in roles.items():
            shape = list(values[name].shape)
            shape[0], shape[axis] = 1, None
            shapes.setdefault(str(layer), {})[role] = {"name": name, "shape": shape, "dtype": str(values[name].dtype)}
    return shapes


def replay_graph(desc: ModelDescription) -> tuple[bytes, list]:
    """The replay graph: each linear-attention layer's LinearAttention node (same attributes) fed from
    past_state.{i} and the prefix's inputs {role}.{i}, giving present.{i}; and [(state, roles fed)]."""
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
