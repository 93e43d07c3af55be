"""`mtplab model inspect`: what mtplab finds in a model folder, before running anything on it."""

from __future__ import annotations

from pathlib import Path

from mtplab.base.threads import session_options
from mtplab.engine.strategies import COMMITS
from mtplab.model.description import ModelDescription


def missing_ops(paths, providers: list[str]) -> dict[str, list[str] | str]:
    """{graph file: ops it uses that the installed onnxruntime has no schema for, or whose kernel is missing; or, where
    the session fails for another reason (weights that do not read, say), that reason as a string}."""
    import onnx
    import onnxruntime as ort

    from mtplab.model.artifact import available_ops
    from mtplab.model.onnx_read import failing_op

    have, out = available_ops(), {}
    for path in paths:
        model = onnx.load(str(path), load_external_data=False)
        lacking = sorted({n.op_type for n in model.graph.node} - have)
        if not lacking:
            try:
                ort.InferenceSession(str(path), session_options(1), providers=providers)
            except Exception as err:  # noqa: BLE001 - a missing kernel, or why the graph does not load, is what we report
                op = failing_op(err)
                lacking = [op] if op else " ".join(str(err).split())[:400]
        out[Path(path).name] = lacking
    return out


def commit_lines(desc: ModelDescription) -> list[str]:
    """Each registered commit strategy on this model: how it runs, or why it is refused."""
    lines = []
    for strategy in COMMITS.values():
        why = strategy.refusal(desc)
        lines.append(f"  {strategy.name}: runs ({strategy.how(desc)})" if why is None else f"  {strategy.name}: refused: {why}")
    return lines


def inspect_text(model, providers: list[str] | None = None) -> str:
    """The inspection report, as `mtplab model inspect` prints it."""
    desc: ModelDescription = model.description
    t, h = desc.target, desc.mtp
    lines = [model.summary()]
    if hasattr(model, "options"):
        lines.append(f"builder options, as the folder tells them: {model.options()}")
    lines += ["", f"layers: {desc.layers_line()}"]
    for i, kind in enumerate(desc.layer_kinds):
        lines.append(f"  layer {i}: {kind}")
    lines += ["", f"target graph {Path(desc.original_target or t.path).name}: inputs and outputs"]
    lines.append(f"  tokens: {t.input_ids}; lengths: {_lengths(t)}; positions: {_positions(t)}")
    lines.append(f"  logits: {t.logits} ({t.logits_type.name}); hidden state for the head: {t.hidden} ({t.hidden_type.name})")
    for kv in t.kv:
        lines.append(f"  KV layer {kv.layer}: {kv.past_key}/{kv.past_value} -> {kv.present_key}/{kv.present_value} "
                     f"[1, {kv.heads}, capacity {desc.capacity}, {kv.head_dim}] {kv.dtype} (one buffer, past and present)")
    lines.append("state layouts:")
    for s in t.states:
        lines.append(f"  layer {s.layer} {s.kind}: {s.past} -> {s.present} {list(s.shape)} {s.dtype}, {s.layout} "
                     f"(from {s.op}); {_state_buffers(s)}")
    lines += ["", f"MTP head {h.path.name}: tokens {h.input_ids}, hidden {h.hidden_input} -> logits {h.logits}, "
                  f"hidden {h.hidden}; KV {h.kv[0].past_key}/{h.kv[0].past_value}; lengths: {_lengths(h)}"]
    lines += ["", "commit strategies:", *commit_lines(desc)]
    if desc.original_target is not None:
        lines.append(f"graphs: Verify runs mtplab's copy with select's outputs ({t.path}); Primary (greedy, the decode, "
                     f"prefills, re-advances) runs {desc.original_target.name} given a session of its own (the sibling "
                     "policies), else the copy too")
    if desc.max_k() is not None:
        lines.append(f"draft length: k in 1..{desc.max_k()}")
    else:
        lines.append(f"draft length: any k >= 1 whose verify headroom 2*(k+1) fits the KV capacity {desc.capacity}")
    providers = providers or ["CPUExecutionProvider"]
    lacking = missing_ops([desc.original_target or t.path, h.path], providers)
    lines.append("")
    for name, ops in lacking.items():
        if isinstance(ops, str):
            lines.append(f"{name} does not load on {', '.join(providers)}: {ops}")
        else:
            lines.append(f"ops {', '.join(providers)} lacks in {name}: {', '.join(ops) if ops else 'none'}")
    return "\n".join(lines)


def _lengths(io) -> str:
    if io.lengths == "seqlens":
        return "seqlens_k + total_sequence_length" + (" + query_seqlens" if io.query_seqlens else "")
    return "attention_mask [1, capacity] (the graph derives seqlens_k and the total length from it)"


def _positions(io) -> str:
    if not io.positions:
        return "none (rotary inside the attention op)"
    return f"position_ids [{', '.join(map(str, io.positions))}, M]" + (" (MRoPE)" if len(io.positions) == 2 else "")


def _state_buffers(s) -> str:
    """Where a state's present goes, per provider (mtplab.model.description.IN_PLACE)."""
    own = "own present buffer, copied after the forward"
    cpu, cuda = s.in_place_on("CPUExecutionProvider"), s.in_place_on("CUDAExecutionProvider")
    if cpu == cuda:
        return "in place" if cpu else own
    return f"in place on the CPU; on CUDA its {own}" if cpu else f"in place on CUDA; on the CPU its {own}"
