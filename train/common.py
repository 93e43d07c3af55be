"""Shared pieces: the model's configuration, the MTP layer, batches and seeding."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "models" / "pycode"
WORK = ROOT / "train" / "work"
SEQ = 256          # tokens per training row
MTP_WEIGHT = 0.3   # loss = main + MTP_WEIGHT * mtp

ARCH = dict(
    vocab_size=2048,
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=48,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=48,
    linear_value_head_dim=48,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    # partial rotary (12 of 48 dims), MRoPE sections summing to 12/2 (text: the three sections share positions)
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 2, 2], "mrope_interleaved": True},
    bos_token_id=0, eos_token_id=0, pad_token_id=0,
)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def text_config() -> Qwen3_5TextConfig:
    cfg = Qwen3_5TextConfig(**copy.deepcopy(ARCH))
    cfg._attn_implementation = "sdpa"
    return cfg


def mtp_layer_config(cfg: Qwen3_5TextConfig) -> Qwen3_5TextConfig:
    """The config the builder's loader gives the MTP decoder layer: one full-attention layer."""
    c = copy.deepcopy(cfg)
    c.layer_types = ["full_attention"]
    c.num_hidden_layers = 1
    return c


class MTPLayer(nn.Module):
    """One MTP layer, DeepSeek-V3 / Qwen3-Next form, under the names the builder reads (mtp.*).

    h' = fc([norm_e(embed(t_{i+1})); norm_h(h_i)]) -> one full-attention Qwen3.5 decoder layer -> norm,
    then the trunk's (shared) LM head predicts t_{i+2}. h_i is the trunk's last hidden state after its final
    norm (the main graph's `hidden_states` output). All norms are Qwen3.5's (1 + w) RMSNorm, stored as w.
    The pair (t_{i+1}, h_i) sits at position i (mtplab's head prefill: entry j pairs token j+1 with hidden j).
    """

    def __init__(self, cfg: Qwen3_5TextConfig):
        super().__init__()
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(mtp_layer_config(cfg), 0)])
        self.norm = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.initializer_range)
            elif isinstance(m, Qwen3_5RMSNorm):
                nn.init.zeros_(m.weight)

    def forward(self, trunk: Qwen3_5ForCausalLM, next_ids, hidden, position_ids, attention_mask=None):
        """next_ids [B,L], hidden [B,L,H] (normed), position_ids [B,L]; mask None = causal, else a bool
        [B,1,L,L] (True = attend). Returns (logits [B,L,V], normed hidden output [B,L,H])."""
        e = trunk.model.embed_tokens(next_ids)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)], dim=-1))
        pos_emb = trunk.model.rotary_emb(x, position_ids)
        x = self.layers[0](x, position_embeddings=pos_emb, attention_mask=attention_mask, position_ids=position_ids)
        g = self.norm(x)
        return trunk.lm_head(g), g


def build(seed: int = 0) -> tuple[Qwen3_5ForCausalLM, MTPLayer]:
    seed_all(seed)
    cfg = text_config()
    trunk = Qwen3_5ForCausalLM(cfg)
    trunk.config._attn_implementation = "sdpa"
    mtp = MTPLayer(cfg)
    return trunk, mtp


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def forward_losses(trunk, mtp, batch: torch.Tensor):
    """batch [B, SEQ+1] int64. Returns (main loss, mtp loss, trunk logits, mtp logits)."""
    x = batch[:, :-1]
    out = trunk.model(input_ids=x)
    h = out.last_hidden_state                      # after the final norm
    logits = trunk.lm_head(h)
    main = nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    L = x.shape[1] - 1                             # pairs (t_{i+1}, h_i), i < L, target t_{i+2}
    pos = torch.arange(L).unsqueeze(0).expand(x.shape[0], -1)
    mlog, _ = mtp(trunk, batch[:, 1:L + 1], h[:, :L], pos)
    mloss = nn.functional.cross_entropy(mlog.flatten(0, 1).float(), batch[:, 2:L + 2].flatten())
    return main, mloss, logits, mlog


def load_stream(name: str) -> np.ndarray:
    return np.load(WORK / f"{name}.npy").astype(np.int64)


def train_batch(stream: np.ndarray, seed: int, step: int, batch: int) -> torch.Tensor:
    """Random windows of SEQ+1 tokens; the same (seed, step) gives the same batch (resumable)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, stream.size - SEQ - 1, size=batch)
    return torch.from_numpy(np.stack([stream[s:s + SEQ + 1] for s in starts]))


def heldout_windows(stream: np.ndarray, n: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of SEQ+1 tokens from the start of the held-out stream (all if n is None)."""
    k = (stream.size - 1) // SEQ
    if n is not None:
        k = min(k, n)
    return torch.from_numpy(np.stack([stream[i * SEQ:i * SEQ + SEQ + 1] for i in range(k)]))


def load_checkpoint(path: Path):
    ck = torch.load(path, map_location="cpu", weights_only=False)
    trunk, mtp = build(ck["args"]["seed"])
    trunk.load_state_dict(ck["trunk"])
    mtp.load_state_dict(ck["mtp"])
    trunk.eval(), mtp.eval()
    return trunk, mtp, ck
