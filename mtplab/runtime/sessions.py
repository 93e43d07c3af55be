"""ONNX Runtime sessions: made with shared weights and mtplab's thread settings, a graph's in-place bindings
checked against what its provider's kernels allow, and a run onnxruntime refuses told in one line.

The state buffers those sessions bind: mtplab.runtime.state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper

from mtplab.base.threads import session_options
from mtplab.model.description import IN_PLACE, GraphIO
from mtplab.model.greedy_outputs import greedy_model
from mtplab.model.onnx_read import failing_op
from mtplab.runtime.arena import address


def in_place_pairs(model: onnx.ModelProto, binds) -> list[tuple[str | None, int, int, str, str]]:
    """(op, input index, output index, input, output) of every bound output that shares an input's buffer.

    binds: the executor's Bindings or (name, array, is_output) triples. op is None when no single node
    takes that input and produces that output.
    """
    triples = [tuple(b[:3]) for b in binds]
    inputs = {address(a): name for name, a, out in triples if not out}
    pairs = []
    for out_name, a, out in triples:
        in_name = inputs.get(address(a)) if out else None
        if in_name is None:
            continue
        node = next((n for n in model.graph.node if in_name in n.input and out_name in n.output), None)
        if node is None:
            pairs.append((None, -1, -1, in_name, out_name))
        else:
            pairs.append(
                (node.op_type, list(node.input).index(in_name), list(node.output).index(out_name), in_name, out_name)
            )
    return pairs


def check_in_place(model: onnx.ModelProto, binds, provider: str) -> None:
    """Raise ValueError naming every output bound on an input's buffer where the op's kernel does not allow it."""
    table = IN_PLACE.get(provider, {})
    bad = [
        f"{o} on {i} ({op or 'not one node'} {ii}->{oi})"
        for op, ii, oi, i, o in in_place_pairs(model, binds)
        if (ii, oi) not in table.get(op, ())
    ]
    if bad:
        raise ValueError(f"bound in place where the {provider} kernel does not allow it: {'; '.join(bad)}")


def shared_initializers(path, device: str = "cpu") -> dict[str, Any]:
    """The model's weights as OrtValues on `device` ("cpu" or "cuda"), for add_initializer in several sessions."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    return {
        t.name: ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(t), device, 0) for t in model.graph.initializer
    }


def make_session(
    path,
    shared: dict[str, Any] | None = None,
    threads: int = 0,
    provider: str | tuple[str, dict] = "CPUExecutionProvider",
    greedy: tuple[str, str, bool] | None = None,
):
    """An InferenceSession; with `shared`, weights come from those OrtValues instead of new copies.

    provider: a name, or (name, provider options) as onnxruntime takes it. greedy: the graph's (token ids input,
    logits output, whether it counts kept drafts), for a graph that also outputs its greedy choice
    (mtplab.model.greedy_outputs). The session's `graph_path` is the file it was made from (onnxruntime's own is None
    for a graph it loads from bytes).
    """
    import onnxruntime as ort

    so = session_options(threads)
    for name, value in (shared or {}).items():
        so.add_initializer(name, value)
    ep = provider if isinstance(provider, str) else provider[0]
    source: str | bytes = str(path)
    if greedy is not None:
        source = greedy_model(path, *greedy)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(Path(path).parent))
    try:
        session = ort.InferenceSession(source, so, providers=[provider])
    except Exception as err:
        op, text = failing_op(err), str(err)
        if op is None or not ("Kernel not found" in text or "Could not find an implementation" in text):
            raise
        since = KERNEL_SINCE.get((op, ep))
        hint = f": its first {ep} kernel ships in onnxruntime {since}" if since else ""
        raise RuntimeError(f"onnxruntime {ort.__version__} has no {ep} kernel for {op}{hint} ({path})") from err
    if ep not in session.get_providers():  # onnxruntime falls back to the CPU EP with a warning, e.g. when the
        # CUDA EP's libraries (CUDA, cuDNN) do not load: device buffers bound into a CPU session would not run
        raise ValueError(f"onnxruntime {ort.__version__} made {Path(path).name}'s session on {session.get_providers()}, "
                         f"not on {ep}: {ep} is not available here (its onnxruntime package, or the libraries it loads, "
                         "are missing; `mtplab doctor` says what is installed)")
    session.graph_path = Path(path)
    return session


def graph_session(io: GraphIO, shared: dict[str, Any] | None = None, threads: int = 0,
                  provider: str | tuple[str, dict] = "CPUExecutionProvider"):
    """A session of a target or head graph as the engine runs it: outputting its greedy choice (greedy_outputs; the
    kept drafts' count too where io.counts)."""
    return make_session(io.path, shared, threads, provider, greedy=(io.input_ids, io.logits, io.counts))


def refused_run(what: str, err: BaseException) -> ValueError:
    """An onnxruntime error from running a graph as one line that says what did not run (a CLI prints it as it is)."""
    import onnxruntime as ort

    return ValueError(f"onnxruntime {ort.__version__} does not run {what}: {' '.join(str(err).split())}")


# Kernels that arrived after their op's schema: (op, provider) -> first onnxruntime release with the kernel.
KERNEL_SINCE = {("GatedDeltaNet", "CPUExecutionProvider"): "1.32"}
