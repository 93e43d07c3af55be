"""`mtplab model inspect`: what mtplab finds in a model folder, before running anything on it."""

from __future__ import annotations

from pathlib import Path

from .description import ModelDescription

COMMITS = ("readvance-m1", "readvance-batched", "select")


def open_model(path: str | Path):
    """A builder output folder (genai_config.json) or an mtplab artifact folder (manifest.json)."""
    from .artifact import load_artifact
    from .builder import is_builder_folder, open_builder

    folder = Path(path)
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise ValueError(f"{folder}: {what} (expected a folder the onnxruntime-genai model builder wrote, or an "
                         "mtplab artifact; `mtplab model inspect` also takes a preset name)")
    if is_builder_folder(folder):
        return open_builder(folder)
    if not (folder / "manifest.json").is_file():
        raise ValueError(f"{folder}: neither genai_config.json (onnxruntime-genai builder output) nor manifest.json "
                         "(an mtplab artifact, `mtplab model build --out`) is there")
    return load_artifact(folder)


def missing_ops(paths, providers: list[str]) -> dict[str, list[str]]:
    """{graph file: ops it uses that the installed onnxruntime has no schema for, or whose session fails}."""
    import onnx
    import onnxruntime as ort

    from ..runtime import failing_op
    from .artifact import available_ops

    have, out = available_ops(), {}
    for path in paths:
        model = onnx.load(str(path), load_external_data=False)
        lacking = sorted({n.op_type for n in model.graph.node} - have)
        if not lacking:
            try:
                ort.InferenceSession(str(path), providers=providers)
            except Exception as err:  # noqa: BLE001 - a missing kernel is what we report
                lacking = [failing_op(err) or f"session fails: {str(err)[:120]}"]
        out[Path(path).name] = lacking
    return out


def commit_lines(desc: ModelDescription) -> list[str]:
    lines = []
    for commit in COMMITS:
        why = desc.commit_problem(commit)
        if why is None:
            how = {
                "readvance-m1": "restore the state, re-advance the accepted tokens one M=1 forward each",
                "readvance-batched": "restore the state, re-advance the accepted tokens in one M=n forward",
                "select": {"transitions": "replay GatedDeltaNet's per-token transitions",
                           "replay-op": "replay LinearAttention on the accepted prefix's inputs (graph surgery "
                                        "on a cached copy of the target)"}.get(desc.select, desc.select),
            }[commit]
            lines.append(f"  {commit}: runs ({how})")
        else:
            lines.append(f"  {commit}: refused: {why}")
    return lines


def inspect_text(model, providers: list[str] | None = None) -> str:
    """The inspection report, as `mtplab model inspect` prints it."""
    desc: ModelDescription = model.description
    t, h = desc.target, desc.mtp
    lines = [model.summary(), "", f"layers: {desc.layers_line()}"]
    for i, kind in enumerate(desc.layer_kinds):
        lines.append(f"  layer {i}: {kind}")
    lines += ["", f"target graph {Path(desc.original_target or t.path).name}: inputs and outputs"]
    lines.append(f"  tokens: {t.input_ids}; lengths: {_lengths(t)}; positions: {_positions(t)}")
    lines.append(f"  logits: {t.logits} ({t.dtype}); hidden state for the head: {t.hidden}")
    for kv in t.kv:
        lines.append(f"  KV layer {kv.layer}: {kv.past_key}/{kv.past_value} -> {kv.present_key}/{kv.present_value} "
                     f"[1, {kv.heads}, capacity {desc.capacity}, {kv.head_dim}] (one buffer, past and present)")
    lines.append("state layouts:")
    for s in t.states:
        lines.append(f"  layer {s.layer} {s.kind}: {s.past} -> {s.present} {list(s.shape)} {s.dtype}, {s.layout} "
                     f"(from {s.op}); {'in place' if s.in_place else 'own present buffer, copied after the forward'}")
    lines += ["", f"MTP head {h.path.name}: tokens {h.input_ids}, hidden {h.hidden_input} -> logits {h.logits}, "
                  f"hidden {h.hidden}; KV {h.kv[0].past_key}/{h.kv[0].past_value}; lengths: {_lengths(h)}"]
    lines += ["", "commit strategies:", *commit_lines(desc)]
    if desc.max_k() is not None:
        lines.append(f"draft length: k in 1..{desc.max_k()}")
    else:
        lines.append(f"draft length: any k >= 1 whose verify headroom 2*(k+1) fits the KV capacity {desc.capacity}")
    providers = providers or ["CPUExecutionProvider"]
    lacking = missing_ops([desc.original_target or t.path, h.path], providers)
    lines.append("")
    for name, ops in lacking.items():
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
