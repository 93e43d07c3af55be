"""A plain `session.run` stepper over the target graph: no IOBinding, no plans, no arenas.

It is the second, independent way of running the model: the lossless check steps it in lockstep
with the speculative run to compare the recurrent state after every commit, and the model build
uses it to generate text (for the MTP head fit) and to measure how much tokens depend on the
recurrent state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import ModelConfig
from .description import ModelDescription, describe_builtin, length_feeds


class Stepper:
    """One sequence on the target: KV, conv and recurrent state held as host arrays.

    Graphs that take an attention_mask get onnxruntime-genai's own form here: separate past and
    present, a KV cache that grows by M each forward and a mask of length L + M. The engine binds
    one static buffer instead; two ways of running the same graph.
    """

    def __init__(self, model: ModelDescription | ModelConfig, target: str | Path | bytes | None = None,
                 threads: int = 0, providers=None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if isinstance(model, ModelConfig):
            model = describe_builtin(model, Path("target.onnx"), Path("mtp.onnx"))
        self.desc, self.io = model, model.target
        self.cfg = model.config  # the built-in model's config (None for other models)
        self.original = model.original_target or model.target.path
        target = self.original if target is None else target
        source = target if isinstance(target, bytes) else str(target)
        self.session = ort.InferenceSession(source, so, providers=providers or ["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.T = model.np_dtype
        self.growing = self.io.lengths == "attention_mask"
        self.reset()

    def reset(self) -> None:
        desc, T = self.desc, self.T
        self.length = 0
        cap = 0 if self.growing else desc.capacity
        self.kv = {kv.layer: (np.zeros((1, kv.heads, cap, kv.head_dim), T),) * 2 for kv in self.io.kv}
        self.states = {s.past: np.zeros(s.shape, np.dtype(s.dtype)) for s in self.io.states}

    def recurrent(self) -> dict[str, np.ndarray]:
        """The conv and recurrent states by the names the engine's state uses (live arrays, not copies)."""
        return {s.key: self.states[s.past] for s in self.io.states}

    def zero_recurrent(self) -> None:
        for a in self.recurrent().values():
            a[...] = 0

    def forward(self, tokens, advance: bool = True) -> dict[str, np.ndarray]:
        """Run `tokens` at the current length; returns logits [M, V] and hidden [M, d] (float32).

        advance=False computes the outputs but keeps every state and the length as they were.
        """
        io, desc = self.io, self.desc
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        M = ids.shape[1]
        if self.length + M > desc.capacity:
            raise ValueError(f"sequence would reach {self.length + M} tokens, beyond the KV capacity {desc.capacity}")
        total = self.length + M if self.growing else desc.capacity
        feeds = {io.input_ids: ids, **length_feeds(io, self.length, M, total)}
        for kv in io.kv:
            feeds[kv.past_key], feeds[kv.past_value] = self.kv[kv.layer]
        for s in io.states:
            feeds[s.past] = self.states[s.past]
        feeds = {n: a for n, a in feeds.items() if n in self.inputs}
        names = [io.logits, io.hidden]
        names += [name for kv in io.kv for name in (kv.present_key, kv.present_value)]
        names += [s.present for s in io.states]
        out = dict(zip(names, self.session.run(names, feeds)))
        if advance:
            for kv in io.kv:
                self.kv[kv.layer] = (out[kv.present_key], out[kv.present_value])
            for s in io.states:
                self.states[s.past] = out[s.present]
            self.length += M
        return {"logits": out[io.logits][0].astype(np.float32), "hidden": out[io.hidden][0].astype(np.float32)}

    def forward_without_state(self, token: int) -> np.ndarray:
        """Logits of one token with the conv and recurrent state zeroed for this forward only (KV kept)."""
        saved = {n: a.copy() for n, a in self.recurrent().items()}
        self.zero_recurrent()
        logits = self.forward([token], advance=False)["logits"][0]
        for n, a in self.recurrent().items():
            a[...] = saved[n]
        return logits


def runnable_providers() -> list[str] | None:
    """Providers that can run the target here: the CPU when its GatedDeltaNet kernel exists (onnxruntime
    >= 1.32), else CUDA when present (onnxruntime-gpu 1.30/1.31 ship the kernel for CUDA only), else None."""
    import onnxruntime as ort

    from .forms import cpu_runs_gated_delta_net

    if cpu_runs_gated_delta_net():
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return None
