"""ONNX Runtime sessions and the model's persistent state buffers.

The target's persistent bindings (attention KV buffers, conv carries, GatedDeltaNet states) are
owned here and bound by address into every slot, by both sessions when Verify has a sibling.

An op's output is bound onto its own input's buffer (updated in place) only where the op's kernel
allows it (IN_PLACE). CausalConvWithState's never does: its present carry goes to a buffer of its
own and carry_conv() copies it into the past carry after the run (on the device, in stream order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .arena import Arena, address
from .model import ModelConfig
from .model.graph import NP

ACT_DTYPE = NP

# Where an op's kernel allows an output on its input's buffer: {provider: {op: {(input, output)}}}, as the
# kernels register it (KernelDefBuilder MayInplace) in onnxruntime 1.30-1.32. CUDA: GroupQueryAttention KV
# (past_key 3 -> present_key 1, past_value 4 -> present_value 2) and GatedDeltaNet state (6 -> 1).
# CausalConvWithState allows none on any provider: the CUDA kernel's past and present are __restrict__ and
# the CPU decode path memcpy's past[1:] into present. The CPU kernels register no MayInplace; their
# GroupQueryAttention takes a shared past/present buffer by design (past_present_share_buffer), and mtplab
# holds the CPU to the CUDA table, so one binding rule serves both.
IN_PLACE: dict[str, dict[str, frozenset[tuple[int, int]]]] = {
    "CUDAExecutionProvider": {"GroupQueryAttention": frozenset({(3, 1), (4, 2)}), "GatedDeltaNet": frozenset({(6, 1)})},
}
IN_PLACE["CPUExecutionProvider"] = IN_PLACE["CUDAExecutionProvider"]


def _triple(b) -> tuple[str, Any, bool]:
    return (b.name, b.array, b.output) if hasattr(b, "output") else (b[0], b[1], b[2])


def in_place_pairs(model: onnx.ModelProto, binds) -> list[tuple[str | None, int, int, str, str]]:
    """(op, input index, output index, input, output) of every bound output that shares an input's buffer.

    binds: the executor's Bindings or (name, array, is_output) triples. op is None when no single node
    takes that input and produces that output.
    """
    triples = [_triple(b) for b in binds]
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


def session_options(threads: int = 0):
    """Options of every mtplab session: `threads` intra-op threads (0: onnxruntime's default), one inter-op."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # Several sessions (Primary, a Verify sibling, the MTP head) take turns on the same cores:
    # idle pool threads must sleep, not spin, or they steal the cores of the session running.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


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
):
    """An InferenceSession; with `shared`, weights come from those OrtValues instead of new copies.

    provider: a name, or (name, provider options) as onnxruntime takes it.
    """
    import onnxruntime as ort

    so = session_options(threads)
    for name, value in (shared or {}).items():
        so.add_initializer(name, value)
    try:
        return ort.InferenceSession(str(path), so, providers=[provider])
    except Exception as err:
        op, text = failing_op(err), str(err)
        if op is None or not ("Kernel not found" in text or "Could not find an implementation" in text):
            raise
        ep = provider if isinstance(provider, str) else provider[0]
        since = KERNEL_SINCE.get((op, ep))
        hint = f": its first {ep} kernel ships in onnxruntime {since}" if since else ""
        raise RuntimeError(f"onnxruntime {ort.__version__} has no {ep} kernel for {op}{hint} ({path})") from err


# Kernels that arrived after their op's schema: (op, provider) -> first onnxruntime release with the kernel.
KERNEL_SINCE = {("GatedDeltaNet", "CPUExecutionProvider"): "1.32"}
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


@dataclass
class TargetState:
    """Persistent state of one sequence on the target: buffers bound by address, plus its length."""

    cfg: ModelConfig
    arena: Arena
    length: int = 0
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)
    gdn: dict[int, np.ndarray] = field(default_factory=dict)
    present_conv: dict[int, np.ndarray] = field(default_factory=dict)  # CausalConvWithState's output carry

    @classmethod
    def allocate(cls, cfg: ModelConfig, arena: Arena) -> TargetState:
        st = cls(cfg, arena)
        T = ACT_DTYPE[cfg.dtype]
        kv_shape = (1, cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim)
        for i in cfg.attention_layer_ids:
            st.kv[i] = (
                arena.reserve(f"state.past_key.{i}", kv_shape, T),
                arena.reserve(f"state.past_value.{i}", kv_shape, T),
            )
        for i in cfg.gdn_layer_ids:
            st.conv[i] = arena.reserve(f"state.conv.{i}", (1, cfg.conv_kernel - 1, cfg.gdn_conv_channels), T)
            st.present_conv[i] = arena.reserve(f"state.present_conv.{i}", st.conv[i].shape, T)
            st.gdn[i] = arena.reserve(
                f"state.gdn.{i}", (1, cfg.gdn_value_heads, cfg.gdn_head_dim_v, cfg.gdn_head_dim_k), np.float32
            )
        return st

    def reset(self) -> None:
        self.length = 0
        for a in self.recurrent_arrays():
            a[...] = 0
        for k, v in self.kv.values():
            k[...] = 0
            v[...] = 0

    def carry_conv(self) -> None:
        """After an in-place forward: the conv carries it produced become the committed ones."""
        for i, present in self.present_conv.items():
            self.conv[i][...] = present

    def recurrent_arrays(self) -> list[np.ndarray]:
        return [self.conv[i] for i in self.cfg.gdn_layer_ids] + [self.gdn[i] for i in self.cfg.gdn_layer_ids]

    def recurrent(self) -> dict[str, np.ndarray]:
        """The GDN and conv states by name (what the lossless check compares)."""
        out = {f"conv_state.{i}": self.conv[i] for i in self.cfg.gdn_layer_ids}
        out.update({f"gdn_state.{i}": self.gdn[i] for i in self.cfg.gdn_layer_ids})
        return out


def target_io(cfg: ModelConfig, st: TargetState, tokens: np.ndarray, recurrent_in_place: bool = True):
    """(feeds, outputs, bound) for a forward of `tokens` at the state's current length.

    Lengths are static-shaped, as onnxruntime-genai arranges them for graph replay:
    total_sequence_length is always the KV capacity (a host-side input that a CUDA graph bakes),
    and the real lengths travel in seqlens_k and, where the graph form has it, query_seqlens
    (device-side, re-read each replay).

    KV is always in place (GroupQueryAttention with past and present on one buffer). The GatedDeltaNet
    states are in place too, and the conv carries go to TargetState.present_conv (copy them with
    carry_conv() after the run), unless recurrent_in_place=False, when both go to outputs of their
    own and the committed state is left untouched.
    """
    M = int(tokens.shape[-1])
    T = ACT_DTYPE[cfg.dtype]
    if st.length + M > cfg.max_seq_len:
        raise ValueError(f"sequence would reach {st.length + M} tokens, beyond max_seq_len={cfg.max_seq_len}")
    feeds = {
        "input_ids": token_ids(tokens, M),
        "seqlens_k": np.array([st.length + M - 1], dtype=np.int32),
        "total_sequence_length": np.array(cfg.max_seq_len, dtype=np.int32),
        **_query_seqlens(cfg, M),
        "capture_count": np.array([M], dtype=np.int32),
    }
    outputs: dict[str, tuple[tuple[int, ...], Any]] = {
        "logits": ((1, M, cfg.vocab_size), T),
        "hidden": ((1, M, cfg.hidden_size), T),
    }
    bound: list[tuple[str, Any, bool]] = []
    for i, (k, v) in st.kv.items():
        bound += [(f"past_key.{i}", k, False), (f"present_key.{i}", k, True)]
        bound += [(f"past_value.{i}", v, False), (f"present_value.{i}", v, True)]
    for i in cfg.gdn_layer_ids:
        bound += [(f"conv_state.{i}", st.conv[i], False), (f"gdn_state.{i}", st.gdn[i], False)]
        if recurrent_in_place:
            bound += [
                (f"present_conv_state.{i}", st.present_conv[i], True),
                (f"present_gdn_state.{i}", st.gdn[i], True),
            ]
        else:
            outputs[f"present_conv_state.{i}"] = (st.conv[i].shape, T)
            outputs[f"present_gdn_state.{i}"] = (st.gdn[i].shape, np.float32)
        outputs[f"gdn_transitions.{i}"] = ((1, cfg.transition_capacity * cfg.transition_width), np.float32)
        outputs[f"conv_input.{i}"] = ((1, M, cfg.gdn_conv_channels), T)
    return feeds, outputs, bound


def _query_seqlens(cfg: ModelConfig, M: int) -> dict[str, np.ndarray]:
    """The query_seqlens feed where the graph form has that input."""
    return {"query_seqlens": np.array([M], dtype=np.int32)} if cfg.form.query_seqlens else {}


def token_ids(tokens: Any, M: int) -> Any:
    """input_ids [1, M] int64 from Python ints, or from a host or device array (which stays where it is)."""
    if hasattr(tokens, "reshape"):
        return tokens.reshape(1, M).astype(np.int64, copy=False)
    return np.asarray(tokens, dtype=np.int64).reshape(1, M)


@dataclass
class MtpState:
    """The MTP head's own KV cache and the length it holds."""

    kv: tuple[np.ndarray, np.ndarray]
    length: int = 0

    @classmethod
    def allocate(cls, cfg: ModelConfig, arena: Arena) -> MtpState:
        shape = (1, cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim)
        T = ACT_DTYPE[cfg.dtype]
        return cls((arena.reserve("state.mtp_key", shape, T), arena.reserve("state.mtp_value", shape, T)))


def mtp_io(cfg: ModelConfig, st: MtpState, token: int, hidden: np.ndarray, position: int):
    """(feeds, outputs, bound) for one MTP-head step: next token + hidden at `position`."""
    T = ACT_DTYPE[cfg.dtype]
    feeds = {
        "input_ids": token_ids(token, 1),
        "hidden_states": hidden.astype(T, copy=False).reshape(1, 1, cfg.hidden_size),
        "seqlens_k": np.array([position], dtype=np.int32),
        "total_sequence_length": np.array(cfg.max_seq_len, dtype=np.int32),
        **_query_seqlens(cfg, 1),
    }
    outputs = {"logits": ((1, 1, cfg.vocab_size), T), "mtp_hidden": ((1, 1, cfg.hidden_size), T)}
    k, v = st.kv
    bound = [
        ("past_key.0", k, False),
        ("present_key.0", k, True),
        ("past_value.0", v, False),
        ("present_value.0", v, True),
    ]
    return feeds, outputs, bound
