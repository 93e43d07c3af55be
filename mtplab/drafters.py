"""Drafters: the model's MTP head, and a controlled-acceptance oracle for performance studies.

Both take the same calls: prefill(tokens, hidden) once per generation, then
draft(first, hidden, position, k) per step: k draft tokens following `first`, the token at
`position + 1`, given the target's hidden state at `position`; a device array [k] (int64).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np

from .arena import array_module
from .executor import Executor, Slot
from .model.description import ModelDescription
from .runtime import MtpState, mtp_io


class Drafter(Protocol):
    def prefill(self, tokens: list[int], hidden) -> None: ...
    def draft(self, first, hidden, position: int, k: int): ...


class MtpDrafter:
    """Chained drafting with the MTP head: (next token, hidden) -> logits, head hidden -> next draft."""

    def __init__(self, desc: ModelDescription, executor: Executor, state: MtpState, forwards: dict):
        self.desc, self.executor, self.state, self.forwards = desc, executor, state, forwards

    def prefill(self, tokens: list[int], hidden) -> None:
        """Fill the head's KV cache for the prompt: entry j pairs token j+1 with the target's hidden j."""
        feeds, outputs, bound = mtp_io(self.desc, self.state, list(tokens), hidden, 0)
        self.executor.run_eager(Slot.PRIMARY, feeds, outputs, bound)
        key = f"mtp/M={len(tokens)}"
        self.forwards[key] = self.forwards.get(key, 0) + 1

    def draft(self, first, hidden, position: int, k: int):
        """k draft tokens following `first` (an int or a device scalar) and its target hidden state.

        Stays on the device: each draft's argmax feeds the next head step, and the k drafts come
        back as a device array [k] (int64); nothing here waits for the device.
        """
        io = self.desc.mtp
        xp = array_module(self.state.kv[0])
        argmax = np.ndarray.argmax if xp is np else xp.argmax  # numpy: the method, without np.argmax's dispatch
        drafts = xp.empty(k, dtype=np.int64)
        token = first
        for i in range(k):
            feeds, outputs, bound = mtp_io(self.desc, self.state, token, hidden, position + i)
            out = self.executor.run(Slot.PRIMARY, feeds, outputs, bound)
            self.forwards["mtp/M=1"] = self.forwards.get("mtp/M=1", 0) + 1
            token = argmax(out[io.logits][0, 0])
            hidden = out[io.hidden][0, 0]
            drafts[i] = token
        return drafts


class OracleDrafter:
    """Proposes the greedy reference token with probability alpha, else a wrong one (seeded).

    Performance-only, like SGLang's simulated acceptance: never judge accuracy with it. By default
    it still runs the MTP head so the draft cost is real; without a head (free drafts) it skips it.
    """

    def __init__(self, reference: list[int], alpha: float, seed: int, vocab: int, head: MtpDrafter | None, xp=np):
        self.reference, self.alpha, self.vocab, self.head, self.xp = reference, alpha, vocab, head, xp
        digest = hashlib.sha256(f"oracle:{seed}:{alpha}".encode()).digest()
        self.rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        self.offset = 0

    def prefill(self, tokens: list[int], hidden) -> None:
        # tokens = prompt[1:] + [the prefill's token]: position p's next token is reference[p - offset + 1].
        self.offset = len(tokens)
        if self.head is not None:
            self.head.prefill(tokens, hidden)

    def draft(self, first, hidden, position: int, k: int):
        """Drafts for the reference tokens after `first` (at position + 1): right with probability alpha."""
        if self.head is not None:
            self.head.draft(first, hidden, position, k)
        index = position - self.offset + 1  # where `first` sits in the reference
        out = []
        for i in range(1, k + 1):
            ref = self.reference[index + i]
            if self.rng.random() < self.alpha:
                out.append(ref)
            else:
                out.append(int((ref + 1 + self.rng.integers(self.vocab - 1)) % self.vocab))
        return self.xp.asarray(np.asarray(out, dtype=np.int64))
