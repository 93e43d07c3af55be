"""A plain `session.run` stepper over the target graph: no IOBinding, no plans, no arenas.

It is the second, independent way of running the model: the lossless check steps it in lockstep
with the speculative run to compare the recurrent state after every commit, and the model build
uses it to generate text (for the MTP head fit) and to measure how much tokens depend on the
recurrent state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtplab.base.threads import session_options
from mtplab.model.config import ModelConfig
from mtplab.model.description import ModelDescription, beyond_capacity, describe_builtin


class Stepper:
    """One sequence on the target: KV, conv and recurrent state held as host arrays.

    Graphs that take an attention_mask get onnxruntime-genai's own form here: separate past and
    present, a KV cache that grows by M each forward and a mask of length L + M. The engine binds
    one static buffer instead; two ways of running the same graph.
    """

    def __init__(self, model: ModelDescription | ModelConfig, target: str | Path | bytes | None = None,
                 threads: int = 0, providers=None):
        import onnxruntime as ort

        so = session_options(threads)
        if isinstance(model, ModelConfig):
            model = describe_builtin(model, Path("target.onnx"), Path("mtp.onnx"))
        self.desc, self.io = model, model.target
        self.cfg = model.config  # the built-in model's config (None for other models)
        self.original = model.original_target or model.target.path
        target = self.original if target is None else target
        source = target if isinstance(target, bytes) else str(target)
        self.session = ort.InferenceSession(source, so, providers=providers or ["CPUExecutionProvider"])
        self.declared = {i.name: i for i in self.session.get_inputs()}
        self.inputs = set(self.declared)
        self.growing = self.io.lengths == "attention_mask"
        self.reset()

    def reset(self) -> None:
        desc = self.desc
        self.length = 0
        cap = 0 if self.growing else desc.capacity
        self.kv = {kv.layer: (np.zeros((1, kv.heads, cap, kv.head_dim), kv.np_dtype),) * 2 for kv in self.io.kv}
        self.states = {s.past: np.zeros(s.shape, s.np_dtype) for s in self.io.states}

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
        io = self.io
        feeds = self.feeds(tokens)
        M = feeds[io.input_ids].shape[1]
        names = self.output_names()
        out = dict(zip(names, self.session.run(names, feeds)))
        if advance:
            for kv in io.kv:
                self.kv[kv.layer] = (out[kv.present_key], out[kv.present_value])
            for s in io.states:
                self.states[s.past] = out[s.present]
            self.length += M
        return {"logits": out[io.logits][0].astype(np.float32), "hidden": out[io.hidden][0].astype(np.float32)}

    def feeds(self, tokens) -> dict[str, np.ndarray]:
        """The graph's feeds for `tokens` at the current length: ids, lengths and positions, KV and states."""
        io, desc = self.io, self.desc
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        M = ids.shape[1]
        if self.length + M > desc.capacity:
            raise beyond_capacity(self.length + M, desc.capacity)
        total = self.length + M if self.growing else desc.capacity
        feeds = {io.input_ids: ids, **own_feeds(self.declared, self.length, M, total)}
        for kv in io.kv:
            feeds[kv.past_key], feeds[kv.past_value] = self.kv[kv.layer]
        for s in io.states:
            feeds[s.past] = self.states[s.past]
        return {n: a for n, a in feeds.items() if n in self.inputs}

    def output_names(self) -> list[str]:
        """What a forward reads: logits, hidden states, each KV's and state's present."""
        io = self.io
        names = [io.logits, io.hidden]
        names += [name for kv in io.kv for name in (kv.present_key, kv.present_value)]
        return names + [s.present for s in io.states]

    def snapshot(self) -> dict[str, np.ndarray]:
        """Copies of the conv and recurrent states and of every attention layer's KV rows [0, length):
        what the lossless check compares with the engine's `TargetState.snapshot`."""
        out = {name: a.copy() for name, a in self.recurrent().items()}
        for layer, (k, v) in self.kv.items():
            out[f"kv.{layer}.key"] = k[:, :, : self.length].copy()
            out[f"kv.{layer}.value"] = v[:, :, : self.length].copy()
        return out

    def forward_without_state(self, token: int) -> np.ndarray:
        """Logits of one token with the conv and recurrent state zeroed for this forward only (KV kept)."""
        saved = {n: a.copy() for n, a in self.recurrent().items()}
        self.zero_recurrent()
        logits = self.forward([token], advance=False)["logits"][0]
        for n, a in self.recurrent().items():
            a[...] = saved[n]
        return logits


class HeadStepper:
    """The MTP head by plain `session.run`, teacher-forced: row j of its KV pairs the text's token j + 1 with the
    target's hidden state j (from the target's own Stepper), as a real engine's head cache holds it after each
    commit. The lossless check compares the engine's head KV with it and chains it from the rows a speculative
    step drafted from. Its own code, like Stepper's: no IOBinding, no plans, no feeds of the engine's."""

    def __init__(self, model: ModelDescription, threads: int = 0, providers=None):
        import onnxruntime as ort

        self.desc, self.io = model, model.mtp
        self.session = ort.InferenceSession(str(self.io.path), session_options(threads),
                                            providers=providers or ["CPUExecutionProvider"])
        self.declared = {i.name: i for i in self.session.get_inputs()}
        self.growing = self.io.lengths == "attention_mask"
        (self.layer,) = self.io.kv
        cap = 0 if self.growing else model.capacity
        kv = self.layer
        self.kv = (np.zeros((1, kv.heads, cap, kv.head_dim), kv.np_dtype),) * 2
        self.length = 0

    def forward(self, tokens, hidden, advance: bool = True) -> dict[str, np.ndarray]:
        """The head over M tokens and the target's hidden states [M, H] at its length: logits [M, V] and the head's
        hidden states [M, H] (float32); advance=False keeps its KV and length."""
        logits, out_hidden, kv = self._run(tokens, hidden, self.length, self.kv)
        if advance:
            self.kv, self.length = kv, self.length + len(logits)
        return {"logits": logits, "hidden": out_hidden}

    def chain(self, at: int, tokens: list[int], hidden) -> np.ndarray:
        """Logits [len(tokens), V] of the head chained from row `at` as a speculative step drafts: step i feeds
        tokens[i] and the hidden state before it (the target's `hidden` [H] first, then the head's own), onto its
        rows [0, at) and the chain's own rows. Its KV and length stay."""
        kv, rows = self.kv, []
        for i, token in enumerate(tokens):
            logits, hidden, kv = self._run([token], hidden, at + i, kv)
            rows.append(logits[0])
        return np.stack(rows) if rows else np.zeros((0, self.desc.vocab_size), np.float32)

    def _run(self, tokens, hidden, at: int, kv: tuple) -> tuple[np.ndarray, np.ndarray, tuple]:
        io, desc = self.io, self.desc
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        M = ids.shape[1]
        if at + M > desc.capacity:
            raise beyond_capacity(at + M, desc.capacity)
        past_k, past_v = kv
        if self.growing:
            past_k, past_v = past_k[:, :, :at], past_v[:, :, :at]
        total = at + M if self.growing else desc.capacity
        feeds = {io.input_ids: ids, **own_feeds(self.declared, at, M, total),
                 io.hidden_input: np.asarray(hidden).reshape(1, M, -1).astype(io.hidden_type),
                 self.layer.past_key: past_k, self.layer.past_value: past_v}
        names = [io.logits, io.hidden, self.layer.present_key, self.layer.present_value]
        logits, out_hidden, key, value = self.session.run(names, {n: a for n, a in feeds.items() if n in self.declared})
        return logits[0].astype(np.float32), out_hidden[0].astype(np.float32), (key, value)

    def rows(self, length: int) -> dict[str, np.ndarray]:
        """Copies of its KV rows [0, length)."""
        k, v = self.kv
        return {"mtp.key": k[:, :, :length].copy(), "mtp.value": v[:, :, :length].copy()}


def runnable_providers() -> list[str] | None:
    """Providers that can run the target here: the CPU when its GatedDeltaNet kernel exists (onnxruntime
    >= 1.32), else CUDA when present (onnxruntime-gpu 1.30/1.31 ship the kernel for CUDA only), else None."""
    import onnxruntime as ort

    from mtplab.model.forms import cpu_runs_gated_delta_net

    if cpu_runs_gated_delta_net():
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return None


_INT = {"tensor(int32)": np.int32, "tensor(int64)": np.int64}


def _shape(arg, default: tuple) -> tuple:
    """A declared input's shape with its symbolic dims read as 1, or `default` when it declares none."""
    dims = getattr(arg, "shape", None)
    if dims is None:
        return default
    return tuple(d if isinstance(d, int) else 1 for d in dims)


def own_feeds(declared: dict, length: int, M: int, total: int) -> dict[str, np.ndarray]:
    """The length and position feeds for M new tokens at positions length..length+M-1, from first principles.

    Deliberately its own code: it reads only the graph's declared inputs (names, ranks, dtypes) and never the
    engine's feed building, so a position or length bug there shows up as a disagreement with this reference.
    total: the attention span (the KV capacity of a static cache, or length + M for a growing one).
    """
    feeds: dict[str, np.ndarray] = {}
    for name, arg in declared.items():
        dtype = _INT.get(arg.type, np.int64)
        if name == "seqlens_k":  # GroupQueryAttention: index of the last valid key per row
            feeds[name] = np.full(_shape(arg, (1,)), length + M - 1, dtype)
        elif name == "total_sequence_length":
            feeds[name] = np.full(_shape(arg, ()), total, dtype)
        elif name in ("query_seqlens", "capture_count"):  # new tokens this forward
            feeds[name] = np.full(_shape(arg, (1,)), M, dtype)
        elif name == "attention_mask":
            mask = np.zeros((1, total), dtype)
            mask[0, : length + M] = 1
            feeds[name] = mask
        elif name == "position_ids":  # [1, M], or [3, 1, M] for multimodal rotary (the same positions thrice)
            rank = len(arg.shape) if arg.shape is not None else 2
            lead = (3, 1) if rank == 3 else (1,)
            feeds[name] = np.tile(np.arange(length, length + M, dtype=dtype), (*lead, 1))
    return feeds
