"""The `per-position` commit's graph: a copy of the target whose verify also writes each recurrent layer's state after
every one of its tokens, so that a commit of n tokens takes state n - 1 (an index, as vLLM's and SGLang's
`intermediate_ssm` states are) instead of replaying or re-advancing.

The copy replaces each recurrent node (GatedDeltaNet or LinearAttention) by an If: a forward of M > 1 tokens (a
verify) runs a Loop over its tokens whose body runs the node's op (same attributes) on one token at a time, carrying
the state: the kernel a decode runs, at the decode's M=1, on the verify's own per-token inputs; its outputs make the
node's output and present, and its states go out as `mtplab.states.{layer}` [M - 1, B, *state], the state after
each token but the last (after the last it is the present). A decode (M=1) runs the op itself and writes no state.
The copy lives in mtplab's cache, made once per graph content.

onnxruntime's CUDA graphs cannot capture a Loop (control flow runs on the host between kernels), so this form runs
on the CPU; a GPU would need the verify unrolled, one graph per M.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from mtplab.model.description import ModelDescription
from mtplab.model.onnx_read import attributes, consumer, content_key, data_files, write_copy

PER_POSITION_VERSION = 4
LOOPED = ("GatedDeltaNet", "LinearAttention")
PER_TOKEN_INPUTS = (0, 1, 2, 4, 5)  # query, key, value, decay, beta: [B, M, ...] in both ops
CAPTURE_INPUT = 9  # GatedDeltaNet's capture_count: the body captures nothing
ADDED = "mtplab.pp."


def states_name(layer: int) -> str:
    """The copy's output of layer `layer`'s state after each token."""
    return f"mtplab.states.{layer}"


def positions(M: int) -> int:
    """How many states a forward of M tokens writes: one after each token but its last (whose state is the
    forward's present), none for a decode."""
    return M - 1


def states_bytes(desc: ModelDescription, k: int, batch: int = 1) -> int:
    """Bytes a verify of k drafts writes its per-position states into: k states (one per token but the last) of
    every recurrent layer, per row."""
    return positions(k + 1) * batch * sum(int(np.prod(s.shape)) * np.dtype(s.np_dtype).itemsize
                                          for s in desc.target.states if s.layer in desc.target.position_states
                                          and s.kind == "recurrent")


CUDA_REFUSAL = ("commit='per-position' writes each position's state from a Loop over the verify's tokens, which "
                "onnxruntime's CUDA graphs cannot capture: it runs on the CPU (a GPU needs the verify unrolled per M)")


def per_position_problem(desc: ModelDescription) -> str | None:
    """Why this model cannot write a state per position (None when it can, or is in per-position's form already)."""
    if desc.target.position_states:
        return None
    recurrent = [s for s in desc.target.states if s.kind == "recurrent"]
    if not recurrent:
        return f"commit='per-position' on {desc.name}: it has no recurrent state to keep per position"
    if not desc.select:
        return (f"commit='per-position' on {desc.name} keeps select's conv inputs, and select cannot run: "
                f"{desc.select_refused or 'no select form'}")
    bad = sorted({s.op for s in recurrent} - set(LOOPED))
    if bad:
        return (f"commit='per-position' on {desc.name}: its recurrent state goes through {', '.join(bad)}; "
                f"mtplab loops {' or '.join(LOOPED)} over a verify's tokens")
    return None


def per_position_form(desc: ModelDescription, decodes_apart: bool = False, batch: int = 1) -> ModelDescription:
    """The description whose target is the copy that writes each position's state (made once, cached), and whose
    decode_target is the graph a decode ran before: the user's own at batch 1, the graph batch B runs (a builder
    folder's batch copy, or the built-in graph) else. decodes_apart: the engine's decodes run that graph in a
    session of their own (its states in place where the kernel allows); else they run the copy, whose If makes each
    present: no kernel table lets it onto its past's buffer."""
    if desc.target.position_states:  # in this form already
        return desc
    if why := per_position_problem(desc):
        raise ValueError(why)
    source = desc.target.path
    model = onnx.load(str(source), load_external_data=False)
    from mtplab.model.artifact import cache_dir

    folder = cache_dir() / "per-position" / f"{source.stem}-{content_key(source, model)}-p{PER_POSITION_VERSION}"
    if not all((folder / name).is_file() for name in (source.name, *data_files(model))):
        _write_copy(desc, model, source, folder)
    io = desc.target
    names = {s.layer: states_name(s.layer) for s in io.states if s.kind == "recurrent"}
    # of select's outputs the conv inputs remain (the recurrent nodes whose inputs and transitions it reads are gone)
    states = io.states if decodes_apart else tuple(
        dataclasses.replace(s, in_place=False, ports=None) if s.kind == "recurrent" else s for s in io.states)
    convs = {layer: {"conv_input": roles["conv_input"]} for layer, roles in io.select_outputs.items()
             if "conv_input" in roles}
    target = dataclasses.replace(io, path=folder / source.name, position_states=names, states=states,
                                 select_outputs=convs)
    before = (desc.own_graph() or desc) if batch == 1 else desc
    decode = dataclasses.replace(before.target, states=states)  # the op itself, no Loop
    return dataclasses.replace(desc, target=target, decode_target=decode, select="",
                               select_refused="this engine's verify runs per-position's copy, whose recurrent "
                                              "layers select cannot replay")


def _write_copy(desc: ModelDescription, model: onnx.ModelProto, source: Path, folder: Path) -> None:
    """The copy whose recurrent nodes run token by token in a Loop."""
    act = helper.np_dtype_to_tensor_dtype(np.dtype(desc.target.hidden_type))
    dropped: set[str] = set()
    for s in desc.target.states:
        if s.kind == "recurrent":
            dropped |= _token_by_token(model, s, act)
    kept = [o for o in model.graph.output if o.name not in dropped]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    write_copy(model, source, folder)


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _token_by_token(model: onnx.ModelProto, s, act: int) -> set[str]:
    """Replace the node that advances state `s` by an If: a forward of M > 1 tokens runs a Loop that runs the node's
    op on one token at a time (the node's output and present as before: the tokens' outputs stacked back to
    [B, M, ...], the last carry; and the state after each token but the last), a decode runs the op itself (and
    writes no state). Returns the node's other outputs, which the copy no longer makes (GatedDeltaNet's
    transitions)."""
    node = consumer(model, s.past)
    p, g = f"{ADDED}{s.layer}.", model.graph
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(s.np_dtype))
    first = node.input[0]  # the query: [B, M, ...]
    inputs = ["" if node.op_type == "GatedDeltaNet" and j == CAPTURE_INPUT else name for j, name in enumerate(node.input)]
    while inputs and not inputs[-1]:
        inputs.pop()
    attrs = {k: v for k, v in attributes(node).items() if k != "state_update_capacity"}
    g.initializer.extend([_i64(p + "zero", [0]), _i64(p + "one", [1]), _i64(p + "two", [2]), _i64(p + "three", [3]),
                          _i64(p + "flat", [0, 0, -1])])
    outs = [(p + "v.out", act), (p + "v.present", elem), (p + "v.states", elem)]
    verify = helper.make_graph(_loop(p, s, node, inputs, attrs, elem, act), p + "verify", [],
                               [helper.make_tensor_value_info(n, t, None) for n, t in outs])
    decode = helper.make_graph([
        helper.make_node(node.op_type, inputs, [p + "d.out", p + "d.present"], domain=node.domain, **attrs),
        helper.make_node("Unsqueeze", [p + "d.present", p + "zero"], [p + "d.one"]),
        helper.make_node("Slice", [p + "d.one", p + "zero", p + "zero"], [p + "d.states"]),  # [0, B, *state]
    ], p + "decode", [], [helper.make_tensor_value_info(p + "d." + n.split(".")[-1], t, None) for n, t in outs])
    branch = [
        helper.make_node("Shape", [first], [p + "bm"], start=0, end=2),  # [B, M]
        helper.make_node("Slice", [p + "bm", p + "one", p + "two"], [p + "m"]),
        helper.make_node("Greater", [p + "m", p + "one"], [p + "many.1"]),
        helper.make_node("Squeeze", [p + "many.1"], [p + "many"]),
        helper.make_node("If", [p + "many"], [node.output[0], node.output[1], states_name(s.layer)],
                         then_branch=verify, else_branch=decode),
    ]
    at = list(g.node).index(node)
    nodes = list(g.node)
    nodes[at:at + 1] = branch
    del g.node[:]
    g.node.extend(nodes)
    g.output.append(helper.make_tensor_value_info(states_name(s.layer), elem, None))
    return {name for name in node.output[2:] if name}


def _loop(p: str, s, node, inputs: list[str], attrs: dict, elem: int, act: int) -> list:
    """The verify's nodes: the op run token by token in a Loop, its outputs as the node's and the states kept."""
    i, cond, carry = p + "i", p + "cond", p + "carry"
    body = [helper.make_node("Unsqueeze", [i, p + "b.zero"], [p + "start"]),
            helper.make_node("Add", [p + "start", p + "b.one"], [p + "end"])]
    tokens = []
    for j, name in enumerate(inputs):
        if j in PER_TOKEN_INPUTS and name:
            token = f"{p}token.{j}"
            body.append(helper.make_node("Slice", [name, p + "start", p + "end", p + "b.one"], [token]))
            tokens.append(token)
        else:
            tokens.append(carry if name == s.past else name)
    body += [helper.make_node(node.op_type, tokens, [p + "out", p + "next"], domain=node.domain, **attrs),
             helper.make_node("Identity", [cond], [p + "cond.out"]),
             helper.make_node("Identity", [p + "next"], [p + "state"])]
    graph = helper.make_graph(
        body, f"{p}body",
        [helper.make_tensor_value_info(i, TensorProto.INT64, []), helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
         helper.make_tensor_value_info(carry, elem, None)],
        [helper.make_tensor_value_info(p + "cond.out", TensorProto.BOOL, []),
         helper.make_tensor_value_info(p + "next", elem, None), helper.make_tensor_value_info(p + "out", act, None),
         helper.make_tensor_value_info(p + "state", elem, None)],
        initializer=[_i64(p + "b.zero", [0]), _i64(p + "b.one", [1])])
    return [
        helper.make_node("Squeeze", [p + "m"], [p + "trip"]),
        helper.make_node("Loop", [p + "trip", "", s.past], [p + "v.present", p + "outs", p + "states"], body=graph),
        # the tokens' outputs [M, B, 1, ...] back to the node's [B, M, ...]
        helper.make_node("Shape", [p + "outs"], [p + "outs.shape"]),
        helper.make_node("Shape", [p + "outs.shape"], [p + "outs.rank"]),
        helper.make_node("Slice", [p + "outs.shape", p + "three", p + "outs.rank"], [p + "rest"]),
        helper.make_node("Reshape", [p + "outs", p + "flat"], [p + "outs.flat"]),
        helper.make_node("Transpose", [p + "outs.flat"], [p + "outs.rows"], perm=[1, 0, 2]),
        helper.make_node("Concat", [p + "bm", p + "rest"], [p + "out.shape"], axis=0),
        helper.make_node("Reshape", [p + "outs.rows", p + "out.shape"], [p + "v.out"]),
        # the states after each token but the last (the last is present)
        helper.make_node("Sub", [p + "m", p + "one"], [p + "kept"]),
        helper.make_node("Slice", [p + "states", p + "zero", p + "kept"], [p + "v.states"]),
    ]
