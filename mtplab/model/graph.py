"""ONNX graphs of the built-in model: the hybrid target decoder and its MTP head.

Real com.microsoft ops throughout: GroupQueryAttention (KV cache shared past/present, updated in
place), GatedDeltaNet (recurrent state plus compact per-token transitions), CausalConvWithState,
RMSNormalization (opset 23) and, for int4 weights, MatMulNBits. The version-dependent parts follow
the config's graph form (mtplab.model.forms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mtplab.base.arrays import array_module
from mtplab.model.config import INT4_BLOCK, ModelConfig
from mtplab.model.weights import Weights, quantize_int4, rotary_cache

MS = "com.microsoft"
OPSET = 23
ELEM = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
NP = {"fp32": np.float32, "fp16": np.float16}
EPS = 1e-6


class _Graph:
    """Accumulates nodes and initializers; names are made unique by a counter."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.ops: set[str] = set()
        self.n = 0
        self.dequantized: Weights = {}

    def tmp(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def node(
        self, op: str, inputs: list[str], outputs: list[str] | None = None, domain: str = "", **attrs
    ) -> list[str]:
        outputs = outputs or [self.tmp(op.lower())]
        name = self.tmp(op)  # named, so that a runtime error names the node and its op
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs))
        self.ops.add(f"{domain + '::' if domain else ''}{op}")
        return outputs

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def act(self, name: str, array: np.ndarray) -> str:
        """An initializer in the activation dtype."""
        return self.init(name, array.astype(NP[self.cfg.dtype]))

    def const_i64(self, values: list[int]) -> str:
        return self.init(self.tmp("shape"), np.array(values, dtype=np.int64))

    def rmsnorm(self, x: str, gamma: np.ndarray, name: str) -> str:
        return self.node("RMSNormalization", [x, self.act(name, gamma)], axis=-1, epsilon=EPS)[0]

    def linear(self, x: str, w: np.ndarray, name: str) -> str:
        """x @ w, with w [K, N]: MatMul at fp32/fp16 or MatMulNBits for int4 weights."""
        if self.cfg.weight_format == "int4":
            K, N = w.shape
            packed, scales, deq = quantize_int4(w, INT4_BLOCK)
            self.dequantized[name] = deq
            return self.node(
                "MatMulNBits",
                [x, self.init(name + ".q", packed), self.act(name + ".scales", scales)],
                domain=MS,
                K=K,
                N=N,
                bits=4,
                block_size=INT4_BLOCK,
            )[0]
        self.dequantized[name] = w
        return self.node("MatMul", [x, self.act(name, w)])[0]


def _value(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def target_signature(cfg: ModelConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Inputs and outputs of target.onnx (B the batch, M the token axis: both dynamic)."""
    T = ELEM[cfg.dtype]
    Hkv, Dh, S = cfg.attn_kv_heads, cfg.attn_head_dim, cfg.max_seq_len
    Hv, Dv, Dk, C = cfg.gdn_value_heads, cfg.gdn_head_dim_v, cfg.gdn_head_dim_k, cfg.gdn_conv_channels
    ins = [
        _value("input_ids", TensorProto.INT64, ["B", "M"]),
        _value("seqlens_k", TensorProto.INT32, ["B"]),
        _value("total_sequence_length", TensorProto.INT32, []),
        *[_value("query_seqlens", TensorProto.INT32, ["B"])] * cfg.form.query_seqlens,
        _value("capture_count", TensorProto.INT32, ["B"]),
    ]
    outs = [_value("logits", T, ["B", "M", cfg.vocab_size]), _value("hidden", T, ["B", "M", cfg.hidden_size])]
    for i in range(cfg.num_layers):
        if i in cfg.attention_layer_ids:
            for kv in ("key", "value"):
                ins.append(_value(f"past_{kv}.{i}", T, ["B", Hkv, S, Dh]))
                outs.append(_value(f"present_{kv}.{i}", T, ["B", Hkv, S, Dh]))
        else:
            ins.append(_value(f"conv_state.{i}", T, ["B", cfg.conv_kernel - 1, C]))
            ins.append(_value(f"gdn_state.{i}", TensorProto.FLOAT, ["B", Hv, Dv, Dk]))
            outs.append(_value(f"present_conv_state.{i}", T, ["B", cfg.conv_kernel - 1, C]))
            outs.append(_value(f"present_gdn_state.{i}", TensorProto.FLOAT, ["B", Hv, Dv, Dk]))
            outs.append(
                _value(f"gdn_transitions.{i}", TensorProto.FLOAT, ["B", cfg.transition_capacity * transition_layout(cfg).width])
            )
            outs.append(_value(f"conv_input.{i}", T, ["B", "M", C]))
    return ins, outs


def mtp_signature(cfg: ModelConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Inputs and outputs of mtp.onnx."""
    T = ELEM[cfg.dtype]
    kv = ["B", cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim]
    ins = [
        _value("input_ids", TensorProto.INT64, ["B", "M"]),
        _value("hidden_states", T, ["B", "M", cfg.hidden_size]),
        _value("seqlens_k", TensorProto.INT32, ["B"]),
        _value("total_sequence_length", TensorProto.INT32, []),
        *[_value("query_seqlens", TensorProto.INT32, ["B"])] * cfg.form.query_seqlens,
        _value("past_key.0", T, kv),
        _value("past_value.0", T, kv),
    ]
    outs = [
        _value("logits", T, ["B", "M", cfg.vocab_size]),
        _value("mtp_hidden", T, ["B", "M", cfg.hidden_size]),
        _value("present_key.0", T, kv),
        _value("present_value.0", T, kv),
    ]
    return ins, outs


def _attention(g: _Graph, x: str, w: Weights, p: str, past: tuple[str, str], present: tuple[str, str]) -> str:
    cfg = g.cfg
    xn = g.rmsnorm(x, w[p + "attn_norm"], p + "attn_norm")
    qkv = g.linear(xn, w[p + "qkv"], p + "qkv")
    cos, sin = rotary_cache(cfg)
    inputs = [qkv, "", "", past[0], past[1], "seqlens_k", "total_sequence_length"]
    inputs += [g.act(p + "cos", cos), g.act(p + "sin", sin)]
    if cfg.form.query_seqlens:  # else M>1 after a past is the subsequent-prompt path (batch 1)
        inputs += [""] * 7 + ["query_seqlens"]  # position_ids, attention_bias, head_sink, k/v scales, q/k norms
    out = g.node(
        "GroupQueryAttention",
        inputs,
        [g.tmp("attn"), present[0], present[1]],
        domain=MS,
        num_heads=cfg.attn_heads,
        kv_num_heads=cfg.attn_kv_heads,
        do_rotary=1,
    )[0]
    return g.node("Add", [x, g.linear(out, w[p + "o"], p + "o")])[0]


def _gdn(g: _Graph, x: str, w: Weights, i: int) -> str:
    cfg, p = g.cfg, f"layer{i}."
    Hk, Hv, Dk, Dv = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_head_dim_k, cfg.gdn_head_dim_v
    xn = g.rmsnorm(x, w[p + "attn_norm"], p + "attn_norm")
    mixed = g.linear(xn, w[p + "qkv"], p + "qkv")
    g.node("Identity", [mixed], [f"conv_input.{i}"])
    conv = g.node(
        "CausalConvWithState",
        [mixed, g.act(p + "conv", w[p + "conv"]), g.act(p + "conv_bias", w[p + "conv_bias"]), f"conv_state.{i}"],
        [g.tmp("conv"), f"present_conv_state.{i}"],
        domain=MS,
        channels_last=1,
        activation="silu",
    )[0]
    split = g.init(g.tmp("split"), np.array([Hk * Dk, Hk * Dk, Hv * Dv], dtype=np.int64))
    q, k, v = g.node("Split", [conv, split], [g.tmp("q"), g.tmp("k"), g.tmp("v")], axis=-1)
    q = g.node("Reshape", [q, g.const_i64([0, -1, Hk, Dk])])[0]
    k = g.node("Reshape", [k, g.const_i64([0, -1, Hk, Dk])])[0]
    v = g.node("Reshape", [v, g.const_i64([0, -1, Hv, Dv])])[0]
    decay = g.linear(xn, w[p + "decay"], p + "decay")
    beta = g.node("Add", [g.linear(xn, w[p + "beta"], p + "beta"), g.act(p + "beta_bias", w[p + "beta_bias"])])[0]
    if cfg.form.float32_gates and cfg.dtype != "fp32":
        decay = g.node("Cast", [decay], to=TensorProto.FLOAT)[0]
        beta = g.node("Cast", [beta], to=TensorProto.FLOAT)[0]
    out = g.node(
        "GatedDeltaNet",
        [
            q,
            k,
            v,
            "",
            decay,
            beta,
            f"gdn_state.{i}",
            g.init(p + "a_log", w[p + "a_log"]),
            g.init(p + "dt_bias", w[p + "dt_bias"]),
            "capture_count",
        ],
        [g.tmp("gdn"), f"present_gdn_state.{i}", f"gdn_transitions.{i}"],
        domain=MS,
        state_update_capacity=cfg.transition_capacity,
        gate_activation=cfg.form.gate_activation,
        beta_activation="sigmoid",
        qk_l2_norm=1,
    )[0]
    out = g.node("Reshape", [out, g.const_i64([0, -1, Hv * Dv])])[0]
    return g.node("Add", [x, g.linear(out, w[p + "o"], p + "o")])[0]


def _mlp(g: _Graph, x: str, w: Weights, p: str) -> str:
    xn = g.rmsnorm(x, w[p + "mlp_norm"], p + "mlp_norm")
    gate = g.linear(xn, w[p + "gate"], p + "gate")
    up = g.linear(xn, w[p + "up"], p + "up")
    act = g.node("Mul", [g.node("Mul", [gate, g.node("Sigmoid", [gate])[0]])[0], up])[0]
    return g.node("Add", [x, g.linear(act, w[p + "down"], p + "down")])[0]


def _model(g: _Graph, ins, outs, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, ins, outs, initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
        producer_name="mtplab",
    )
    model.ir_version = 10
    return model


def build_target(cfg: ModelConfig, w: Weights) -> tuple[onnx.ModelProto, set[str], Weights]:
    """The target decoder graph; returns (model, ops used, effective fp32 weights for the reference)."""
    g = _Graph(cfg)
    x = g.node("Gather", [g.act("embed", w["embed"]), "input_ids"])[0]
    for i in range(cfg.num_layers):
        p = f"layer{i}."
        if i in cfg.attention_layer_ids:
            x = _attention(g, x, w, p, (f"past_key.{i}", f"past_value.{i}"), (f"present_key.{i}", f"present_value.{i}"))
        else:
            x = _gdn(g, x, w, i)
        x = _mlp(g, x, w, p)
    g.node("Identity", [x], ["hidden"])
    xn = g.rmsnorm(x, w["final_norm"], "final_norm")
    g.node("Identity", [g.linear(xn, w["lm_head"], "lm_head")], ["logits"])
    ins, outs = target_signature(cfg)
    return _model(g, ins, outs, "mtplab_target"), g.ops, g.dequantized


def build_mtp(cfg: ModelConfig, w: Weights) -> tuple[onnx.ModelProto, set[str], Weights]:
    """The MTP head: norm(embed(next)) ++ norm(hidden) -> proj -> attention + MLP -> norm -> LM head."""
    g = _Graph(cfg)
    e = g.rmsnorm(g.node("Gather", [g.act("embed", w["embed"]), "input_ids"])[0], w["mtp.enorm"], "mtp.enorm")
    h = g.rmsnorm("hidden_states", w["mtp.hnorm"], "mtp.hnorm")
    x = g.linear(g.node("Concat", [e, h], axis=-1)[0], w["mtp.proj"], "mtp.proj")
    x = _attention(g, x, w, "mtp.layer.", ("past_key.0", "past_value.0"), ("present_key.0", "present_value.0"))
    x = _mlp(g, x, w, "mtp.layer.")
    g.node("Identity", [x], ["mtp_hidden"])
    xn = g.rmsnorm(x, w["final_norm"], "final_norm")
    g.node("Identity", [g.linear(xn, w["lm_head"], "lm_head")], ["logits"])
    ins, outs = mtp_signature(cfg)
    return _model(g, ins, outs, "mtplab_mtp"), g.ops, g.dequantized


@dataclass(frozen=True)
class TransitionLayout:
    """GatedDeltaNet's compact state update (scalar decay): per token, Hv decays, Hk keys of Dk, Hv deltas of Dv,
    struct-of-arrays over `capacity` tokens in one float32 row."""

    capacity: int
    value_heads: int
    key_heads: int
    key_dim: int
    value_dim: int

    @property
    def group(self) -> int:
        """Value heads per key head (each key head serves this many)."""
        return self.value_heads // self.key_heads

    @property
    def width(self) -> int:
        """Floats per token."""
        return self.value_heads + self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def split(self, flat):
        """(decay [..., C, Hv], key [..., C, Hk, Dk], delta [..., C, Hv, Dv]) views of a transitions row [..., C*width]
        (the leading axes kept: one layer's [1, C*width] gives [C, ...], L layers' [L, 1, C*width] give [L, C, ...])."""
        C, Hv, Hk, Dk, Dv = self.capacity, self.value_heads, self.key_heads, self.key_dim, self.value_dim
        if flat.ndim >= 2 and flat.shape[-2] != 1:
            raise ValueError(f"transitions rows are [..., 1, {C * self.width}], got {list(flat.shape)}")
        lead = flat.shape[:-2]
        flat = flat.reshape(*lead, -1)
        decay = flat[..., : C * Hv].reshape(*lead, C, Hv)
        key = flat[..., C * Hv : C * (Hv + Hk * Dk)].reshape(*lead, C, Hk, Dk)
        delta = flat[..., C * (Hv + Hk * Dk) : C * self.width].reshape(*lead, C, Hv, Dv)
        return decay, key, delta


def transition_layout(cfg: ModelConfig) -> TransitionLayout:
    """The built-in model's transitions."""
    return TransitionLayout(cfg.transition_capacity, cfg.gdn_value_heads, cfg.gdn_key_heads, cfg.gdn_head_dim_k,
                            cfg.gdn_head_dim_v)


def replay_transitions(layout: TransitionLayout, state: np.ndarray, flat: np.ndarray, n: int) -> None:
    """Advance a GatedDeltaNet state [1, Hv, Dv, Dk] (V-major) in place by the first n transitions (host arrays:
    the closed form; device arrays: the token-by-token form)."""
    xp = array_module(state)
    if xp is np:
        replay_transitions_closed(state, *layout.split(flat[None]), n, layout.group)
    else:
        replay_transitions_xp(xp, state[0], *layout.split(flat), n, layout.group)


def replay_transitions_xp(xp, state, decay, key, delta, n: int, rep: int) -> None:
    """S = decay*S + outer(delta, key), n times, with any array module (numpy here, CuPy on the device).

    state [Hv, Dv, Dk]; decay [C, Hv]; key [C, Hk, Dk]; delta [C, Hv, Dv]; rep = Hv // Hk.
    The reference form, token by token (the CUDA kernel's order of operations).
    """
    if n <= 0:
        return
    keys = xp.repeat(key[:n], rep, axis=1)  # [n, Hv, Dk]: each key head repeated for its value heads, once
    for t in range(n):
        state *= decay[t][:, None, None]
        state += delta[t][:, :, None] * keys[t][:, None, :]


def replay_transitions_closed(state, decay, key, delta, n: int, rep: int) -> None:
    """The same update in closed form on the host, a fixed handful of numpy calls for any n and any number of
    layers L (a leading axis on every array: state [L, Hv, Dv, Dk], decay [L, C, Hv], key [L, C, Hk, Dk],
    delta [L, C, Hv, Dv]):

        S_n = (d_1 ... d_n) S_0 + sum_t (d_{t+1} ... d_n) delta_t key_t^T

    one batched matmul instead of 2n broadcast products per layer. One token is the token-by-token form's own
    two operations (bitwise); more round differently (products of decays, one sum): within 1e-5 relative.
    """
    if n <= 0:
        return
    L, Hv, Dv, Dk = state.shape
    Hk = Hv // rep
    if n == 1:
        state *= decay[:, 0, :, None, None]
        grouped = state.reshape(L, Hk, rep, Dv, Dk)
        grouped += delta[:, 0].reshape(L, Hk, rep, Dv)[..., None] * key[:, 0, :, None, None, :]
        return
    # after[:, t] = decay[:, t+1] * ... * decay[:, n-1]: what token t's update is decayed by later (1 for the last)
    after = np.ones((L, n, Hv), dtype=decay.dtype)
    np.cumprod(decay[:, n - 1 : 0 : -1], axis=1, out=after[:, n - 2 :: -1])
    weighted = delta[:, :n] * after[..., None]  # [L, n, Hv, Dv]
    # [L, Hk, rep*Dv, n] @ [L, Hk, n, Dk]: value head h reads key head h // rep
    update = np.matmul(weighted.reshape(L, n, Hk, rep * Dv).transpose(0, 2, 3, 1), key[:, :n].transpose(0, 2, 1, 3))
    state *= (after[:, 0] * decay[:, 0])[..., None, None]
    state += update.reshape(L, Hv, Dv, Dk)


def rebuild_conv(conv_state: np.ndarray, conv_input: np.ndarray, n: int, channels_first: bool = False) -> None:
    """Set a conv carry [B, k-1, C] in place to its value after the first n of conv_input [B, M, C], for every
    row B (one layer's batch of 1, or L layers stacked).

    channels_first: the carry is [B, C, k-1] and the input [B, C, M] (the builder's CausalConvWithState).
    """
    if channels_first:
        conv_state, conv_input = conv_state.transpose(0, 2, 1), conv_input.transpose(0, 2, 1)
    width = conv_state.shape[1]
    if n >= width:
        conv_state[...] = conv_input[:, n - width : n]
    elif n > 0:
        kept = conv_state[:, n:].copy()
        conv_state[:, : width - n] = kept
        conv_state[:, width - n :] = conv_input[:, :n]
