"""Drafters: the model's MTP head, and a controlled-acceptance oracle for performance studies."""

from __future__ import annotations

import hashlib

import numpy as np

from .arena import array_module
from .executor import Executor, Slot
from .model import ModelConfig
from .runtime import MtpState, mtp_io


class MtpDrafter:
    """Chained drafting with the MTP head: (next token, hidden) -> logits, mtp_hidden -> next draft."""

    def __init__(self, cfg: ModelConfig, executor: Executor, state: MtpState, forwards: dict):
        self.cfg, self.executor, self.state, self.forwards = cfg, executor, state, forwards

    def prefill(self, tokens: list[int], hidden: np.ndarray) -> None:
        """Fill the head's KV cache for the prompt: entry j pairs token j+1 with the target's hidden j."""
        M = len(tokens)
        feeds, outputs, bound = mtp_io(self.cfg, self.state, 0, np.zeros(self.cfg.hidden_size), 0)
        feeds["input_ids"] = np.asarray(tokens, dtype=np.int64).reshape(1, M)
        feeds["hidden_states"] = hidden.reshape(1, M, -1).astype(feeds["hidden_states"].dtype)
        feeds["seqlens_k"] = np.array([M - 1], dtype=np.int32)
        if "query_seqlens" in feeds:
            feeds["query_seqlens"] = np.array([M], dtype=np.int32)
        outputs = {n: ((1, M) + shape[2:], dt) for n, (shape, dt) in outputs.items()}
        self.executor.run_eager(Slot.PRIMARY, feeds, outputs, bound)
        self.forwards[f"mtp/M={M}"] = self.forwards.get(f"mtp/M={M}", 0) + 1

    def draft(self, token, hidden, position: int, k: int):
        """k draft tokens following `token` (an int or a device scalar) and its target hidden state.

        Stays on the device: each draft's argmax feeds the next head step, and the k drafts come
        back as a device array [k] (int64); nothing here waits for the device.
        """
        xp = array_module(self.state.kv[0])
        argmax = np.ndarray.argmax if xp is np else xp.argmax  # numpy: the method, without np.argmax's dispatch
        drafts = xp.empty(k, dtype=np.int64)
        for i in range(k):
            feeds, outputs, bound = mtp_io(self.cfg, self.state, token, hidden, position + i)
            out = self.executor.run(Slot.PRIMARY, feeds, outputs, bound)
            self.forwards["mtp/M=1"] = self.forwards.get("mtp/M=1", 0) + 1
            token = argmax(out["logits"][0, 0])
            hidden = out["mtp_hidden"][0, 0]
            drafts[i] = token
        return drafts


class OracleDrafter:
    """Proposes the greedy reference token with probability alpha, else a wrong one (seeded).

    Performance-only, like SGLang's simulated acceptance: never judge accuracy with it. By default
    it still runs the MTP head so the draft cost is real; free_drafts skips the head.
    """

    def __init__(self, reference: list[int], alpha: float, seed: int, vocab: int, head: MtpDrafter | None):
        self.reference, self.alpha, self.vocab, self.head = reference, alpha, vocab, head
        digest = hashlib.sha256(f"oracle:{seed}:{alpha}".encode()).digest()
        self.rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))

    def prefill(self, tokens: list[int], hidden: np.ndarray) -> None:
        if self.head is not None:
            self.head.prefill(tokens, hidden)

    def draft_at(self, index: int, token: int, hidden: np.ndarray, position: int, k: int) -> list[int]:
        """Drafts for emitted positions index+1 .. index+k."""
        if self.head is not None:
            self.head.draft(token, hidden, position, k)
        out = []
        for i in range(1, k + 1):
            ref = self.reference[index + i]
            if self.rng.random() < self.alpha:
                out.append(ref)
            else:
                out.append(int((ref + 1 + self.rng.integers(self.vocab - 1)) % self.vocab))
        return out
