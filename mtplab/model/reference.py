"""A plain numpy forward of the built-in model: sequential recurrence, plain attention.

It proves the ONNX graphs right and is the reference for state comparisons. Everything is
computed in float64 from the effective (dequantized) float32 weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mtplab.model.config import ModelConfig
from mtplab.model.graph import EPS
from mtplab.model.weights import Weights, dequantize_int4, rotary_cache


def rmsnorm(x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * gamma


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _l2n(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def rotate(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Non-interleaved rotary embedding of x [..., M, D] at positions pos [M]."""
    half = x.shape[-1] // 2
    c, s = cos[pos], sin[pos]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@dataclass
class ReferenceState:
    """Per-layer state of the reference: KV rows, conv carry [k-1, C], GDN state [Hv, Dv, Dk]."""

    length: int = 0
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)
    gdn: dict[int, np.ndarray] = field(default_factory=dict)


def gdn_step(S: np.ndarray, q, k, v, g, beta, scale):
    """One token of GatedDeltaNet for all value heads. S [Hv, Dv, Dk] (V-major); returns (S, out, delta, decay)."""
    decay = np.exp(g)  # [Hv]
    Sd = S * decay[:, None, None]
    delta = beta[:, None] * (v - np.einsum("hvk,hk->hv", Sd, k))
    S = Sd + delta[:, :, None] * k[:, None, :]
    out = scale * np.einsum("hvk,hk->hv", S, q)
    return S, out, delta, decay


def weights_from_onnx(*paths) -> Weights:
    """The weights an ONNX file really holds, as the reference reads them (int4 dequantized).

    Reading them from the graph (not regenerating them from the config) makes the reference check
    the bytes ONNX Runtime runs; it is also much faster than rebuilding the weights.
    """
    import onnx
    from onnx import numpy_helper

    w: Weights = {}
    for path in paths:
        inits = {t.name: t for t in onnx.load(str(path)).graph.initializer}
        for name, t in inits.items():
            if name.endswith(".q"):
                base = name[:-2]
                w[base] = dequantize_int4(numpy_helper.to_array(t), numpy_helper.to_array(inits[base + ".scales"]))
            elif not name.endswith(".scales") and t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
                w[name] = numpy_helper.to_array(t).astype(np.float32)
    return w


class ReferenceModel:
    """Numpy forward of target.onnx (and mtp.onnx via ReferenceMTP) on the same weights."""

    def __init__(self, cfg: ModelConfig, weights: Weights):
        self.cfg = cfg
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        cos, sin = rotary_cache(cfg)
        self.cos, self.sin = cos.astype(np.float64), sin.astype(np.float64)

    def new_state(self) -> ReferenceState:
        cfg = self.cfg
        st = ReferenceState()
        for i in cfg.attention_layer_ids:
            shape = (cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim)
            st.kv[i] = (np.zeros(shape), np.zeros(shape))
        for i in cfg.gdn_layer_ids:
            st.conv[i] = np.zeros((cfg.conv_kernel - 1, cfg.gdn_conv_channels))
            st.gdn[i] = np.zeros((cfg.gdn_value_heads, cfg.gdn_head_dim_v, cfg.gdn_head_dim_k))
        return st

    def attention(self, x: np.ndarray, p: str, kv: tuple[np.ndarray, np.ndarray], past: int) -> np.ndarray:
        return x + self.attention_context(x, p, kv, past) @ self.w[p + "o"]

    def attention_context(self, x: np.ndarray, p: str, kv: tuple[np.ndarray, np.ndarray], past: int) -> np.ndarray:
        """The attention layer's output before its o projection, [M, H*Dh] (writes K and V rows)."""
        cfg, w = self.cfg, self.w
        H, Hkv, Dh = cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim
        M = x.shape[0]
        qkv = rmsnorm(x, w[p + "attn_norm"]) @ w[p + "qkv"]
        q = qkv[:, : H * Dh].reshape(M, H, Dh).transpose(1, 0, 2)
        k = qkv[:, H * Dh : (H + Hkv) * Dh].reshape(M, Hkv, Dh).transpose(1, 0, 2)
        v = qkv[:, (H + Hkv) * Dh :].reshape(M, Hkv, Dh).transpose(1, 0, 2)
        pos = np.arange(past, past + M)
        q, k = rotate(q, pos, self.cos, self.sin), rotate(k, pos, self.cos, self.sin)
        K, V = kv
        K[:, past : past + M], V[:, past : past + M] = k, v
        T = past + M
        keys = np.repeat(K[:, :T], H // Hkv, axis=0)
        vals = np.repeat(V[:, :T], H // Hkv, axis=0)
        scores = np.einsum("hmd,htd->hmt", q, keys) / np.sqrt(Dh)
        scores = scores + np.where(np.arange(T)[None, :] > pos[:, None], -np.inf, 0.0)[None]
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.einsum("hmt,htd->mhd", probs, vals).reshape(M, H * Dh)

    def mlp(self, x: np.ndarray, p: str) -> np.ndarray:
        return x + self.mlp_features(x, p) @ self.w[p + "down"]

    def mlp_features(self, x: np.ndarray, p: str) -> np.ndarray:
        """The MLP's activations before its down projection, [M, F]."""
        w = self.w
        xn = rmsnorm(x, w[p + "mlp_norm"])
        return silu(xn @ w[p + "gate"]) * (xn @ w[p + "up"])

    def gdn(self, x: np.ndarray, i: int, st: ReferenceState, trace: dict) -> np.ndarray:
        cfg, w, p = self.cfg, self.w, f"layer{i}."
        Hk, Hv, Dk, Dv = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_head_dim_k, cfg.gdn_head_dim_v
        M = x.shape[0]
        xn = rmsnorm(x, w[p + "attn_norm"])
        mixed = xn @ w[p + "qkv"]
        padded = np.concatenate([st.conv[i], mixed], axis=0)
        kern = w[p + "conv"][:, 0, :]  # [C, k]
        kw = kern.shape[1]
        conv = np.stack([np.sum(padded[t : t + kw].T * kern, axis=1) for t in range(M)]) + w[p + "conv_bias"]
        conv = silu(conv)
        st.conv[i] = padded[-(kw - 1) :].copy()
        q = _l2n(conv[:, : Hk * Dk].reshape(M, Hk, Dk))
        k = _l2n(conv[:, Hk * Dk : 2 * Hk * Dk].reshape(M, Hk, Dk))
        v = conv[:, 2 * Hk * Dk :].reshape(M, Hv, Dv)
        rep = Hv // Hk
        g = -np.exp(w[p + "a_log"]) * softplus(xn @ w[p + "decay"] + w[p + "dt_bias"])
        beta = 1.0 / (1.0 + np.exp(-(xn @ w[p + "beta"] + w[p + "beta_bias"])))
        S = st.gdn[i]
        outs, steps = [], []
        for t in range(M):
            S, o, delta, decay = gdn_step(
                S, np.repeat(q[t], rep, axis=0), np.repeat(k[t], rep, axis=0), v[t], g[t], beta[t], 1.0 / np.sqrt(Dk)
            )
            outs.append(o.reshape(-1))
            steps.append((decay, k[t], delta))
        st.gdn[i] = S
        trace[i] = {"conv_input": mixed, "transitions": steps}
        return x + np.stack(outs) @ w[p + "o"]

    def forward(self, tokens: list[int] | np.ndarray, st: ReferenceState) -> dict:
        """Advance st by tokens; returns logits [M, V], hidden [M, d] and a per-GDN-layer trace."""
        w = self.w
        x = w["embed"][np.asarray(tokens)]
        trace: dict = {}
        for i in range(self.cfg.num_layers):
            p = f"layer{i}."
            if i in self.cfg.attention_layer_ids:
                x = self.attention(x, p, st.kv[i], st.length)
            else:
                x = self.gdn(x, i, st, trace)
            x = self.mlp(x, p)
        st.length += len(tokens)
        logits = rmsnorm(x, w["final_norm"]) @ w["lm_head"]
        return {"logits": logits, "hidden": x, "trace": trace}


class ReferenceMTP:
    """Numpy forward of mtp.onnx."""

    def __init__(self, cfg: ModelConfig, weights: Weights):
        self.inner = ReferenceModel(cfg, weights)
        self.kv = self.new_kv()

    def new_kv(self) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.inner.cfg
        shape = (cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim)
        return np.zeros(shape), np.zeros(shape)

    def forward(self, tokens, hidden: np.ndarray, past: int) -> dict:
        m, w = self.inner, self.inner.w
        e = rmsnorm(w["embed"][np.asarray(tokens)], w["mtp.enorm"])
        h = rmsnorm(np.asarray(hidden, dtype=np.float64), w["mtp.hnorm"])
        x = np.concatenate([e, h], axis=-1) @ w["mtp.proj"]
        x = m.attention(x, "mtp.layer.", self.kv, past)
        x = m.mlp(x, "mtp.layer.")
        return {"logits": rmsnorm(x, w["final_norm"]) @ w["lm_head"], "mtp_hidden": x}
