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
from .graph import NP


class Stepper:
    """One sequence on the target: KV, conv and GatedDeltaNet state held as host arrays."""

    def __init__(self, cfg: ModelConfig, target: str | Path | bytes, threads: int = 0, providers=None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.cfg = cfg
        model = target if isinstance(target, bytes) else str(target)
        self.session = ort.InferenceSession(model, so, providers=providers or ["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.T = NP[cfg.dtype]
        self.reset()

    def reset(self) -> None:
        cfg, T = self.cfg, self.T
        self.length = 0
        kv = (1, cfg.attn_kv_heads, cfg.max_seq_len, cfg.attn_head_dim)
        self.kv = {i: (np.zeros(kv, T), np.zeros(kv, T)) for i in cfg.attention_layer_ids}
        self.conv = {i: np.zeros((1, cfg.conv_kernel - 1, cfg.gdn_conv_channels), T) for i in cfg.gdn_layer_ids}
        self.gdn = {
            i: np.zeros((1, cfg.gdn_value_heads, cfg.gdn_head_dim_v, cfg.gdn_head_dim_k), np.float32)
            for i in cfg.gdn_layer_ids
        }

    def recurrent(self) -> dict[str, np.ndarray]:
        """The GDN and conv states by the names the engine's state uses (live arrays, not copies)."""
        out = {f"conv_state.{i}": self.conv[i] for i in self.cfg.gdn_layer_ids}
        out.update({f"gdn_state.{i}": self.gdn[i] for i in self.cfg.gdn_layer_ids})
        return out

    def zero_recurrent(self) -> None:
        for a in self.recurrent().values():
            a[...] = 0

    def forward(self, tokens, advance: bool = True) -> dict[str, np.ndarray]:
        """Run `tokens` at the current length; returns logits [M, V] and hidden [M, d] (float32).

        advance=False computes the outputs but keeps every state and the length as they were
        (the KV rows it wrote are beyond the length, so the next forward overwrites them).
        """
        cfg = self.cfg
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        M = ids.shape[1]
        if self.length + M > cfg.max_seq_len:
            raise ValueError(f"sequence would reach {self.length + M} tokens, beyond max_seq_len={cfg.max_seq_len}")
        feeds = {
            "input_ids": ids,
            "seqlens_k": np.array([self.length + M - 1], dtype=np.int32),
            "total_sequence_length": np.array(cfg.max_seq_len, dtype=np.int32),
            "query_seqlens": np.array([M], dtype=np.int32),
            "capture_count": np.array([M], dtype=np.int32),
        }
        for i, (k, v) in self.kv.items():
            feeds[f"past_key.{i}"], feeds[f"past_value.{i}"] = k, v
        for i in cfg.gdn_layer_ids:
            feeds[f"conv_state.{i}"], feeds[f"gdn_state.{i}"] = self.conv[i], self.gdn[i]
        feeds = {n: a for n, a in feeds.items() if n in self.inputs}
        names = ["logits", "hidden"]
        names += [f"present_{part}.{i}" for i in self.kv for part in ("key", "value")]
        names += [f"present_{part}.{i}" for i in cfg.gdn_layer_ids for part in ("conv_state", "gdn_state")]
        out = dict(zip(names, self.session.run(names, feeds)))
        if advance:
            for i in self.kv:
                self.kv[i] = (out[f"present_key.{i}"], out[f"present_value.{i}"])
            for i in cfg.gdn_layer_ids:
                self.conv[i], self.gdn[i] = out[f"present_conv_state.{i}"], out[f"present_gdn_state.{i}"]
            self.length += M
        return {"logits": out["logits"][0].astype(np.float32), "hidden": out["hidden"][0].astype(np.float32)}

    def forward_without_state(self, token: int) -> np.ndarray:
        """Logits of one token with the GDN and conv state zeroed for this forward only (KV kept)."""
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
