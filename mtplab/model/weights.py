"""Deterministic weights for the built-in model, derived from the config seed.

The model is untrained, so the scales are chosen to give it the properties the experiments need:
clear top-1 logit margins, varied generation, tokens that depend on the context the recurrent
state carries (as in a real hybrid model), and an MTP head that agrees with the target as trained
heads do. The head shares the target's embedding and LM head, has one attention layer + MLP (from
the target's last attention layer, its writes scaled down), and an input projection fitted by
least squares to the target's own hidden states over generated text (`mtplab.model.behaviour`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from mtplab.model.config import ModelConfig

Weights = dict[str, np.ndarray]


def _rng(cfg: ModelConfig, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{cfg.seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _normal(cfg: ModelConfig, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng(cfg, name).standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _norm_gamma(cfg: ModelConfig, name: str, size: int) -> np.ndarray:
    return (1.0 + _normal(cfg, name, (size,), 0.05)).astype(np.float32)


def target_weights(cfg: ModelConfig) -> Weights:
    """All target-model weights as float32 arrays, keyed by initializer name."""
    d, V, F = cfg.hidden_size, cfg.vocab_size, cfg.mlp_size
    # Each of the 2L sublayers adds about layer_scale/sqrt(2L) of the residual's size.
    out_scale = cfg.layer_scale / np.sqrt(2 * cfg.num_layers)
    w: Weights = {"embed": _normal(cfg, "embed", (V, d), 1.0)}
    for i in range(cfg.num_layers):
        p = f"layer{i}."
        w[p + "attn_norm"] = _norm_gamma(cfg, p + "attn_norm", d)
        w[p + "mlp_norm"] = _norm_gamma(cfg, p + "mlp_norm", d)
        if i in cfg.attention_layer_ids:
            H, Hkv, Dh = cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim
            w[p + "qkv"] = _normal(cfg, p + "qkv", (d, (H + 2 * Hkv) * Dh), 1.0 / np.sqrt(d))
            w[p + "o"] = _normal(cfg, p + "o", (H * Dh, d), out_scale * 2.0 / np.sqrt(H * Dh))
        else:
            Hv, Dv = cfg.gdn_value_heads, cfg.gdn_head_dim_v
            C = cfg.gdn_conv_channels
            w[p + "qkv"] = _normal(cfg, p + "qkv", (d, C), 1.0 / np.sqrt(d))
            conv = _normal(cfg, p + "conv", (C, 1, cfg.conv_kernel), 0.3)
            conv[:, 0, :-1] *= np.float32(cfg.conv_memory / 0.3)
            conv[:, 0, -1] += 1.0  # the current token, plus a short memory of conv_memory's size
            w[p + "conv"] = conv
            w[p + "conv_bias"] = _normal(cfg, p + "conv_bias", (C,), 0.05) + _key_alignment(cfg, p)
            w[p + "decay"] = _normal(cfg, p + "decay", (d, Hv), 0.5 / np.sqrt(d))
            w[p + "beta"] = _normal(cfg, p + "beta", (d, Hv), 0.5 / np.sqrt(d))
            w[p + "beta_bias"] = np.full(Hv, cfg.beta_bias, dtype=np.float32)  # small: the state keeps more
            w[p + "a_log"] = _normal(cfg, p + "a_log", (Hv,), 0.3) - 1.0 + np.float32(cfg.decay_shift)
            w[p + "dt_bias"] = _normal(cfg, p + "dt_bias", (Hv,), 0.3)
            # GatedDeltaNet scales its readout by 1/sqrt(Dk): undo that so the gain means the same at any Dk.
            gain = cfg.state_gain * np.sqrt(cfg.gdn_head_dim_k) / 4.0
            w[p + "o"] = _normal(cfg, p + "o", (Hv * Dv, d), out_scale * gain / np.sqrt(Hv * Dv))
        w[p + "gate"] = _normal(cfg, p + "gate", (d, F), 1.0 / np.sqrt(d))
        w[p + "up"] = _normal(cfg, p + "up", (d, F), 1.0 / np.sqrt(d))
        w[p + "down"] = _normal(cfg, p + "down", (F, d), out_scale * 3.0 / np.sqrt(F))
    w["final_norm"] = _norm_gamma(cfg, "final_norm", d)
    w["lm_head"] = lm_head(cfg, w["embed"])
    return w


def _key_alignment(cfg: ModelConfig, p: str) -> np.ndarray:
    """Conv bias that gives every token's query and key a shared direction per head.

    With l2-normalised, near-orthogonal keys the state's readout S q sees little of the past; with a
    shared component it reads a decayed sum over the history, so the state carries context.
    """
    Hk, Dk = cfg.gdn_key_heads, cfg.gdn_head_dim_k
    dirs = _rng(cfg, p + "key_dir").standard_normal((Hk, Dk))
    dirs *= np.sqrt(Dk) / np.linalg.norm(dirs, axis=1, keepdims=True)
    qk = np.float32(cfg.key_alignment) * dirs.astype(np.float32).ravel()
    bias = np.zeros(cfg.gdn_conv_channels, dtype=np.float32)
    bias[: Hk * Dk], bias[Hk * Dk : 2 * Hk * Dk] = qk, qk
    return bias


def successor(cfg: ModelConfig) -> np.ndarray:
    """A random single-cycle permutation of the vocabulary: the context-free next token."""
    order = _rng(cfg, "successor").permutation(cfg.vocab_size)
    succ = np.empty(cfg.vocab_size, dtype=np.int64)
    succ[order] = np.roll(order, -1)
    return succ


def lm_head(cfg: ModelConfig, embed: np.ndarray) -> np.ndarray:
    """Noise plus a planted peak: a hidden state near embed[t] scores successor[t] about bigram_peak.

    Without context, greedy would walk one long cycle through the vocabulary (no short loops);
    the layers' context contributions make the target leave it at some positions, which is where
    a head that only sees the next token's embedding misses.
    """
    d = cfg.hidden_size
    w = _normal(cfg, "lm_head", (d, cfg.vocab_size), cfg.logit_scale / np.sqrt(d))
    unit = embed / np.linalg.norm(embed, axis=1, keepdims=True)
    w[:, successor(cfg)] += (cfg.bigram_peak / np.sqrt(d) * np.sqrt(d)) * unit.T / np.sqrt(d)
    return w


def mtp_weights(cfg: ModelConfig, target: Weights) -> Weights:
    """The MTP head's starting weights (DeepSeek-V3 / Qwen3-Next layout), before `behaviour.fit_head`.

    It shares the target's embedding, final norm and LM head; its one attention layer + MLP start as
    a copy of the target's last attention layer; its input projection passes the next token's
    embedding through. The fit then replaces the projection and the layer's two output projections.
    """
    d = cfg.hidden_size
    last_attn = f"layer{cfg.attention_layer_ids[-1]}."
    proj = np.zeros((2 * d, d), dtype=np.float32)
    proj[:d] = np.eye(d, dtype=np.float32)
    w: Weights = {
        "embed": target["embed"],
        "mtp.enorm": np.ones(d, dtype=np.float32),
        "mtp.hnorm": np.ones(d, dtype=np.float32),
        "final_norm": target["final_norm"],
        "lm_head": target["lm_head"],
    }
    for part in ("attn_norm", "mlp_norm", "qkv", "o", "gate", "up", "down"):
        w[f"mtp.layer.{part}"] = target[last_attn + part]
    w["mtp.proj"] = proj
    return w


def rotary_cache(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [max_seq_len, head_dim/2] for GroupQueryAttention's rotary embedding."""
    half = cfg.attn_head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.attn_head_dim))
    angles = np.arange(cfg.max_seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def quantize_int4(w: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a [K, N] weight for MatMulNBits (4 bits, symmetric, zero point 8).

    Returns (packed [N, K/block, block/2] uint8, scales [N, K/block] float32, dequantized [K, N]).
    """
    K, N = w.shape
    blocks = w.T.reshape(N, K // block, block)
    scales = np.abs(blocks).max(axis=2) / 7.0
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(blocks / scales[:, :, None]) + 8, 0, 15).astype(np.uint8)
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    return packed, scales.astype(np.float32), dequantize_int4(packed, scales)


def dequantize_int4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The [K, N] float32 weight that MatMulNBits computes with (inverse of quantize_int4's packing)."""
    N, blocks, half = packed.shape
    q = np.empty((N, blocks, 2 * half), dtype=np.float32)
    q[:, :, 0::2], q[:, :, 1::2] = packed & 0x0F, packed >> 4
    deq = ((q - 8.0) * scales.astype(np.float32)[:, :, None]).reshape(N, blocks * 2 * half).T
    return np.ascontiguousarray(deq, dtype=np.float32)
