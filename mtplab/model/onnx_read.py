"""Reading ONNX files: declared inputs and outputs, the node that takes a tensor, attributes, external data."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

ELEM_NAMES = {1: "float32", 10: "float16", 16: "bfloat16", 6: "int32", 7: "int64"}


def io_table(values) -> dict[str, tuple[tuple, str]]:
    """{name: (dims, dtype)} of graph inputs or outputs as declared (a dim: its number, or its name)."""
    out = {}
    for v in values:
        t = v.type.tensor_type
        dims = tuple(d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim)
        out[v.name] = (dims, ELEM_NAMES.get(t.elem_type, str(t.elem_type)))
    return out


def graph_io_table(path: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(inputs, outputs) of an ONNX file as io_table gives them, read without its weights."""
    model = onnx.load(str(path), load_external_data=False)
    return io_table(model.graph.input), io_table(model.graph.output)


def consumer(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    """The first node that takes `name` as an input."""
    return next((n for n in model.graph.node if name in n.input), None)


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def annotated_widths(model: onnx.ModelProto) -> dict[str, int]:
    """{tensor: W} for every [B, S, W] tensor whose W the graph declares (its shape annotations and inputs)."""
    return {name: dims[2] for name, (dims, _) in io_table([*model.graph.value_info, *model.graph.input]).items()
            if len(dims) == 3 and isinstance(dims[2], int) and dims[2] > 0}


def attention_head_size(model: onnx.ModelProto, past_key: str, widths: dict[str, int]) -> tuple[int, str] | None:
    """(head size, where it was read) of the GroupQueryAttention node that reads `past_key`, from the statically
    declared widths (widths: annotated_widths(model)) of its query, key and value [B, S, W] over each one's head count.
    None where the graph does not say: another op, no declared width, or declared widths that do not agree with
    each other and the node's head counts (an annotation can be stale: onnxruntime runs by the real shapes)."""
    node = consumer(model, past_key)
    if node is None or node.op_type != "GroupQueryAttention":
        return None
    attrs = attributes(node)
    heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
    if heads <= 0 or kv_heads <= 0:
        return None
    query, key, value = (list(node.input) + ["", "", ""])[:3]
    packed = not key  # one packed QKV input: [B, S, (heads + 2 kv_heads) * head size]
    read = [(name, widths[name], count) for name, count in
            ((query, heads + 2 * kv_heads if packed else heads), (key, kv_heads), (value, kv_heads))
            if name and name in widths]
    sizes = {width / count for _, width, count in read}
    if len(sizes) != 1 or not next(iter(sizes)).is_integer():
        return None
    name, width, count = read[0]
    return int(next(iter(sizes))), f"{node.name or node.op_type}'s input {name} is [..., {width}] over {count} heads"


def data_files(model: onnx.ModelProto) -> set[str]:
    """The external data files the model's initializers point into (names relative to the model's folder)."""
    return {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }


def data_extents(model: onnx.ModelProto) -> dict[str, int]:
    """Per external data file, the bytes the model's initializers reach into it (offset + length, the furthest)."""
    reach: dict[str, int] = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entry = {e.key: e.value for e in t.external_data}
        if "length" in entry:
            length = int(entry["length"])
        else:
            size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            length = size * int(np.prod(t.dims, dtype=np.int64))
        file = entry.get("location", "")
        reach[file] = max(reach.get(file, 0), int(entry.get("offset", 0)) + length)
    return reach


def copy_data_files(model: onnx.ModelProto, source: Path, dest: Path) -> None:
    """Copy the model's external data files from folder `source` to `dest` (copies: onnx refuses hard- and
    symlinked data files when it loads them)."""
    for name in data_files(model):
        if not (dest / name).exists():
            shutil.copy2(source / name, dest / name)


def content_key(source: Path, model: onnx.ModelProto) -> str:
    """A key for mtplab's cached copies of a graph: its file's bytes and its data files' sizes and times (a copy
    holds the weights: changed weights make a new one)."""
    import hashlib

    key = hashlib.sha256(source.read_bytes())
    for name in sorted(data_files(model)):
        stat = (source.parent / name).stat()
        key.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return key.hexdigest()[:16]


def write_copy(model: onnx.ModelProto, source: Path, folder: Path, then=None) -> None:
    """Save `model` (a changed copy of `source`'s graph) with its data files into `folder`, whole or not at all;
    then(tmp), when given, adds to the folder before it takes its name (its failure leaves no folder)."""
    import os

    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        onnx.save(model, str(tmp / source.name))
        copy_data_files(model, source.parent, tmp)
        if then is not None:
            then(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_OP_PATTERNS = (
    r"kernel for com\.microsoft\.(\w+)\(",
    r"implementation for (\w+)\(",
    r"running (\w+) node",
    r"(?:node:|Name:|name )'([A-Za-z]+)_\d+'",  # the built-in graphs name nodes {op}_{n}
)


def failing_op(err: BaseException | str) -> str | None:
    """The op an onnxruntime error message names, if it names one."""
    import re

    for pattern in _OP_PATTERNS:
        m = re.search(pattern, str(err))
        if m:
            return m.group(1)
    return None


def parameter_count(model: onnx.ModelProto) -> int:
    """Weights as the model counts them: a MatMulNBits weight is its K x N, not its packed bytes and scales."""
    packed, n = set(), 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            a = attributes(node)
            n += int(a.get("K", 0)) * int(a.get("N", 0))
            packed |= set(node.input[1:])
    for t in model.graph.initializer:
        if t.name not in packed:
            size = 1
            for d in t.dims:
                size *= d
            n += size
    return n


def unproduced_inputs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node, input) pairs of the top-level graph whose input nothing produces (an invalid graph)."""
    g = model.graph
    have = {""} | {i.name for i in g.input} | {t.name for t in g.initializer}
    have |= {o for n in g.node for o in n.output}
    return [(n.name or n.op_type, i) for n in g.node for i in n.input if i not in have]


def weight_format(model: onnx.ModelProto) -> str:
    """The graph's quantized weights in words ("" for none)."""
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    if not nbits:
        return ""
    bits = {attributes(n).get("bits", 4) for n in nbits}
    level = {attributes(n).get("accuracy_level", 0) for n in nbits}
    return (f"int{'/'.join(map(str, sorted(bits)))} weights (MatMulNBits x{len(nbits)}"
            + (", int8 matmul inputs: accuracy_level 4" if 4 in level else "") + ")")


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each domain:op the top-level graph holds."""
    return dict(Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node))


ROTARY_CACHE_INPUT = {"RotaryEmbedding": 2, "MRotaryEmbedding": 2, "GroupQueryAttention": 7}  # com.microsoft's cos_cache


def rotary_rows(model: onnx.ModelProto) -> int | None:
    """The fewest positions any rotary table of the graph holds (the rows of a com.microsoft op's 2-D cos_cache
    initializer, [max positions, rotary dim / 2]), or None."""
    inits = {t.name: t for t in model.graph.initializer}
    rows = [int(t.dims[0]) for n in model.graph.node
            if n.domain == "com.microsoft" and (i := ROTARY_CACHE_INPUT.get(n.op_type)) is not None and len(n.input) > i
            and (t := inits.get(n.input[i])) is not None and len(t.dims) == 2]
    return min(rows) if rows else None
