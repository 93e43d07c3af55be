"""Deterministic weights for the built-in model, derived from the config seed.

The model is untrained, so the scales are chosen to give it the properties the experiments need:
clear top-1 logit margins, varied generation, and an MTP head that agrees with the target better
than chance (the head is derived from the target: same embedding and LM head, a copy of the last
attention layer and its MLP, and a projection that passes the next token's embedding through).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .config import ModelConfig

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
            conv[:, 0, -1] += 1.0  # mostly the current token, with a short memory
            w[p + "conv"] = conv
            w[p + "conv_bias"] = _normal(cfg, p + "conv_bias", (C,), 0.05)
            w[p + "decay"] = _normal(cfg, p + "decay", (d, Hv), 0.5 / np.sqrt(d))
            w[p + "beta"] = _normal(cfg, p + "beta", (d, Hv), 0.5 / np.sqrt(d))
            w[p + "a_log"] = _normal(cfg, p + "a_log", (Hv,), 0.3) - 1.0
            w[p + "dt_bias"] = _normal(cfg, p + "dt_bias", (Hv,), 0.3)
            w[p + "o"] = _normal(cfg, p + "o", (Hv * Dv, d), out_scale * 4.0 / np.sqrt(Hv * Dv))
        w[p + "gate"] = _normal(cfg, p + "gate", (d, F), 1.0 / np.sqrt(d))
        w[p + "up"] = _normal(cfg, p + "up", (d, F), 1.0 / np.sqrt(d))
        w[p + "down"] = _normal(cfg, p + "down", (F, d), out_scale * 3.0 / np.sqrt(F))
    w["final_norm"] = _norm_gamma(cfg, "final_norm", d)
    w["lm_head"] = lm_head(cfg, w["embed"])
    return w


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
    """MTP head weights derived from the target's (DeepSeek-V3 / Qwen3-Next layout)."""
    d = cfg.hidden_size
    last_attn = f"layer{cfg.attention_layer_ids[-1]}."
    proj = np.zeros((2 * d, d), dtype=np.float32)
    proj[:d] = np.eye(d, dtype=np.float32)  # the next token's embedding passes through
    proj[d:] = _normal(cfg, "mtp.proj_h", (d, d), 0.1 / np.sqrt(d))  # a little of the hidden state
    w: Weights = {
        "embed": target["embed"],
        "mtp.enorm": np.ones(d, dtype=np.float32),
        "mtp.hnorm": np.ones(d, dtype=np.float32),
        "mtp.proj": proj,
        "final_norm": target["final_norm"],
        "lm_head": target["lm_head"],
    }
    for part in ("attn_norm", "mlp_norm", "qkv", "o", "gate", "up", "down"):
        w[f"mtp.layer.{part}"] = target[last_attn + part]
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
    deq = ((q.astype(np.float32) - 8.0) * scales[:, :, None]).reshape(N, K).T
    return packed, scales.astype(np.float32), np.ascontiguousarray(deq, dtype=np.float32)
