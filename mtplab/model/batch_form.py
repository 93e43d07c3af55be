"""Builder graphs at batch B > 1: copies of the target and the head whose GroupQueryAttention nodes take each row's
query length.

A builder graph derives its lengths from a [B, total] attention mask. onnxruntime's GroupQueryAttention then runs a
forward of M > 1 tokens after a past (a verify, a prompt's prefill into a static-capacity cache) at batch 1 only
("batch_size must be 1 when sequence_length > 1 and past context is given"), unless it is told every row's query
length: input 16, `query_seqlens` (onnxruntime >= 1.32), which mtplab's built-in graphs feed. A copy adds one graph
input, `query_seqlens` [B] int32, and wires it into every GroupQueryAttention node; everything else is the graph's
own. The copies live in mtplab's cache, made once per graph content, never in the user's folder.
"""

from __future__ import annotations

import dataclasses

import onnx
from onnx import TensorProto, helper

from mtplab.model.description import GraphIO, ModelDescription
from mtplab.model.forms import schema_features
from mtplab.model.onnx_read import consumer, content_key, data_files, write_copy

QUERY_SEQLENS = "query_seqlens"
QUERY_SEQLENS_INPUT = 16  # GroupQueryAttention's input index
BATCH_FORM_VERSION = 1


def needs_copies(desc: ModelDescription) -> bool:
    """Whether a batch > 1 needs copies of the graphs: they take an attention mask and no query lengths."""
    return any(io.lengths == "attention_mask" and not io.query_seqlens for io in (desc.target, desc.mtp))


def batch_form_problem(desc: ModelDescription) -> str | None:
    """Why the graphs cannot be given per-row query lengths (None when they can, or need none)."""
    if not needs_copies(desc):
        return None
    if not schema_features()["gqa_query_seqlens"]:
        import onnxruntime

        return (f"an M > 1 forward after a past at batch > 1 needs GroupQueryAttention's query_seqlens (input 16), "
                f"which onnxruntime {onnxruntime.__version__} lacks (>= 1.32 has it)")
    for what, io in (("target", desc.target), ("MTP head", desc.mtp)):
        model = onnx.load(str(io.path), load_external_data=False)
        for kv in io.kv:
            node = consumer(model, kv.past_key)
            if node is None or node.op_type != "GroupQueryAttention":
                return (f"the {what}'s {kv.past_key} goes into {node.op_type if node is not None else 'no node'}, "
                        "not GroupQueryAttention, whose per-row query lengths a batch > 1 feeds")
    return None


def batch_form(desc: ModelDescription) -> ModelDescription:
    """The description whose target and head take query_seqlens: copies where the graphs take an attention mask and
    no query lengths (made once, cached), else desc itself. original_target stays the user's graph."""
    if not needs_copies(desc):
        return desc
    return dataclasses.replace(desc, target=_with_query_seqlens(desc.target), mtp=_with_query_seqlens(desc.mtp))


def _with_query_seqlens(io: GraphIO) -> GraphIO:
    if io.query_seqlens:
        return io
    source = io.path
    model = onnx.load(str(source), load_external_data=False)
    from mtplab.model.artifact import cache_dir

    folder = cache_dir() / "builder-batch" / f"{source.stem}-{content_key(source, model)}-q{BATCH_FORM_VERSION}"
    if not all((folder / name).is_file() for name in (source.name, *data_files(model))):  # whole, or made again
        _wire_query_seqlens(model)
        write_copy(model, source, folder)
    return dataclasses.replace(io, path=folder / source.name, query_seqlens=True)


def _wire_query_seqlens(model: onnx.ModelProto) -> None:
    """query_seqlens wired into every GroupQueryAttention node."""
    model.graph.input.append(helper.make_tensor_value_info(QUERY_SEQLENS, TensorProto.INT32, ["batch_size"]))
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            inputs = list(node.input) + [""] * (QUERY_SEQLENS_INPUT + 1 - len(node.input))
            inputs[QUERY_SEQLENS_INPUT] = QUERY_SEQLENS
            del node.input[:]
            node.input.extend(inputs)
