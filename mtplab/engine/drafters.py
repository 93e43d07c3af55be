"""Drafters: the model's MTP head, and a controlled-acceptance oracle for performance studies (at temperature
> 0 the oracle is a mixture drafter: mtplab.engine.mixture).

A drafter kind (DrafterKind, registered in `mtplab.engine.strategies.DRAFTERS`) says which RunConfig
parameters it takes, where its acceptance comes from and whether the MTP head runs. mtplab's own kinds draft every
row of a batch at once (mtplab.engine.speculative, mtplab.engine.batch_head); a kind of the user's own builds a
drafter of one sequence, one per row, which takes: prefill(tokens, hidden) once per generation, then
draft(first, hidden, position, k) per step: k draft tokens following `first`, the token at `position + 1`, given the
target's hidden state at `position` (an array [k], int64; fewer where it stops early); and, where it keeps a cache
of its own, commit(hidden, tokens, start) after each verify: the emitted tokens at positions start + 1.. with the
target's hidden states at start.. (the verify's rows).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np

from mtplab.base.names import canonical
from mtplab.engine.strategies import DRAFTERS
from mtplab.model.description import ModelDescription
from mtplab.runtime.executor import Executor, Slot
from mtplab.runtime.policy import presize
from mtplab.runtime.slot_memory import SlotMemory
from mtplab.runtime.state import MtpState, mtp_io


class Drafter(Protocol):
    def prefill(self, tokens: list[int], hidden) -> None: ...
    def draft(self, first, hidden, position: int, k: int): ...
    def commit(self, hidden, tokens: list[int], start: int) -> None: ...


def head_executor(desc: ModelDescription, dev, state: MtpState, run, arenas: dict) -> tuple[Executor, tuple]:
    """The MTP head's executor on its own session: Slot.PRIMARY a draft step (M=1, label "mtp"), Slot.VERIFY its
    commit (M=k+1: its KV rows for the verified tokens, label "mtp-commit"), each on an arena of its own presized
    (added to `arenas`); and the draft step's I/O at position 0 (for its warm-up)."""
    B = state.batch
    position = 0 if B == 1 else np.zeros(B, dtype=np.int64)
    draft_io = mtp_io(desc, state, np.zeros(B, np.int64), np.zeros((B, desc.hidden_size)), position)
    commit_io = mtp_io(desc, state, np.zeros((B, run.k + 1), np.int64), np.zeros((B, run.k + 1, desc.hidden_size)),
                       position)
    memory = {}
    for slot, label, (feeds, outputs, _) in ((Slot.PRIMARY, "mtp", draft_io), (Slot.VERIFY, "mtp-commit", commit_io)):
        arena = arenas[label] = dev.arena(label)
        presize(arena, feeds, outputs, skip=dev.host_inputs)
        memory[slot] = SlotMemory(arena, host_inputs=dev.host_inputs)
    session = dev.session(desc.mtp)
    executor = Executor({Slot.PRIMARY: session, Slot.VERIFY: session}, memory,
                        labels={Slot.PRIMARY: "mtp", Slot.VERIFY: "mtp-commit"}, backend=dev.backend,
                        max_recaptures=run.max_recaptures, validate=run.validate,
                        plan_per_shape=run.plan_per_shape)  # its commit runs at the verify's M
    return executor, draft_io


class OracleDrafter:
    """Proposes the greedy reference token with probability alpha, else a wrong one (seeded).

    Performance-only, like SGLang's simulated acceptance: never judge accuracy with it. By default
    the MTP head still runs beside it so the draft cost is real (mtplab.engine.speculative); without a head (free
    drafts) it does not.
    Its random numbers are drawn in blocks of DRAWS drafts (the first at the prefill, untimed): draft j of a
    generation is right when the j-th uniform is below alpha, else the reference token shifted by 1 + the j-th
    of the offsets, uniform over 0..vocab-2 (every wrong token equally likely).
    """

    DRAWS = 4096

    def __init__(self, reference: list[int], alpha: float, seed: int, vocab: int):
        self.reference, self.alpha, self.vocab = reference, alpha, vocab
        digest = hashlib.sha256(f"oracle:{seed}:{alpha}".encode()).digest()
        self.rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        self.offset = 0
        self.tokens = [int(t) for t in reference]
        self.uniforms: list[float] = []
        self.shifts: list[int] = []
        self.used = 0
        self._out = np.empty(0, dtype=np.int64)  # the step's drafts

    def prefill(self, tokens: list[int], hidden) -> None:
        # tokens = prompt[1:] + [the prefill's token]: position p's next token is reference[p - offset + 1].
        self.offset = len(tokens)
        self._draw()

    def _draw(self) -> None:
        """The next block of random numbers (the previous block's unused ones are dropped)."""
        self.uniforms = self.rng.random(self.DRAWS).tolist()
        self.shifts = (1 + self.rng.integers(self.vocab - 1, size=self.DRAWS)).tolist()
        self.used = 0

    def draft(self, first, hidden, position: int, k: int):
        """Drafts for the reference tokens after `first` (at position + 1): right with probability alpha."""
        if self.used + k > len(self.uniforms):
            self._draw()
            if k > self.DRAWS:
                raise ValueError(f"the oracle draws {self.DRAWS} numbers at a time: k={k} drafts a step do not fit")
        j, self.used = self.used, self.used + k
        out = self._out
        if out.shape[0] != k:
            out = self._out = np.empty(k, dtype=np.int64)  # reused: whoever takes the drafts reads them at once
        # where the first draft's reference token sits: position - offset + 2
        made = _oracle_drafts(self.tokens, position - self.offset + 2, self.uniforms, self.shifts, j, self.alpha,
                              self.vocab, out)
        return out[:made]  # fewer where the reference ends (the run's last step drafts past it at most)


def _oracle_drafts(reference, index, uniforms, shifts, j, alpha, vocab, out) -> int:
    """out[i] = reference[index + i] where uniform j + i is below alpha, else that token shifted by shift j + i
    (mod vocab), while the reference lasts: the drafts made. A plain loop: a step drafts a handful of tokens, where
    each numpy call costs more than the loop."""
    made = min(len(out), max(0, len(reference) - index)) if index >= 0 else 0
    for i in range(made):
        token = reference[index + i]
        out[i] = token if uniforms[j + i] < alpha else (token + shifts[j + i]) % vocab
    return made


class DrafterKind:
    """What a drafter is to the rest of mtplab.

    name: the RunConfig `drafter` value; summary: one line.
    params: the RunConfig fields it takes (refused with any other drafter; the oracle's alpha).
    acceptance: where its acceptance comes from, for the prediction and the acceptance warning:
    "setting" (the `alpha` it is given), "calibration" (the MTP head's, measured apart) or None (no prediction).
    needs_reference: it may draft from the greedy reference's tokens; reads_reference(run): it does in this run.
    peer: the onnxruntime-genai peer runs this drafter too.
    samples: it drafts through the acceptance rule (draft_token or draft_from), so a sampling rule has its
    distributions.
    confident: it can end a step's drafting early on its own top probability (k_policy='confidence').
    per_row: build() makes a drafter of one sequence, one per row of a batch (a drafter of the user's own); mtplab's
    own draft every row at once (mtplab.engine.speculative).
    """

    name: str = ""
    summary: str = ""
    params: tuple[str, ...] = ()
    acceptance: str | None = None
    peer: bool = False  # the onnxruntime-genai peer runs it too (its MtpGenerator runs the model's MTP head)
    samples: bool = False  # drafts through the acceptance rule (a sampling rule gets its distributions)
    needs_reference: bool = False
    confident: bool = False
    per_row: bool = True

    def reads_reference(self, run) -> bool:
        """Whether this run's drafter reads the greedy reference's tokens."""
        return self.needs_reference

    def uses_head(self, run) -> bool:
        """Whether the MTP head runs k steps per speculative step (and its prefill) in this run."""
        return False

    def build(self, engine, reference: list[int] | None) -> Drafter:
        """A drafter of one row's sequence on an Engine (its public attributes: desc, xp, spec, device); reference:
        that row's greedy tokens, where it reads them."""
        raise NotImplementedError

    def id_part(self, values: dict) -> str:
        """How a point id names this drafter with its parameters (values: the run's fields)."""
        return self.name

    def text(self, values: dict) -> str:
        """This drafter with its parameters, in words."""
        return self.name


class MtpKind(DrafterKind):
    name = "mtp"
    summary = "the model's MTP head, chained k steps"
    acceptance = "calibration"
    peer = True
    samples = True
    confident = True
    per_row = False

    def uses_head(self, run) -> bool:
        return True


class OracleKind(DrafterKind):
    name = "oracle"
    summary = ("the greedy reference's token with probability alpha, else a wrong one; at temperature > 0 a draft "
               "from alpha * the target's distribution + (1 - alpha) * a fixed token (performance studies only)")
    params = ("alpha", "oracle_free_drafts")
    acceptance = "setting"
    samples = True  # at temperature > 0 it draws through the rule (mtplab.engine.mixture)
    needs_reference = True
    per_row = False

    def reads_reference(self, run) -> bool:
        return run.temperature == 0  # the mixture drafts from the target itself

    def uses_head(self, run) -> bool:
        return not run.oracle_free_drafts

    def id_part(self, values: dict) -> str:
        return self.name + "-".join(canonical(float(a)) for a in row_alphas(values["alpha"], 1))

    def text(self, values: dict) -> str:
        return f"oracle alpha={','.join(f'{float(a):g}' for a in row_alphas(values['alpha'], 1))}"


def row_alphas(alpha, batch: int) -> list[float]:
    """The oracle's alpha of each row: a run's one alpha for all `batch` rows, or its list of one per row."""
    return [float(a) for a in alpha] if isinstance(alpha, (list, tuple)) else [float(alpha)] * batch


MTP = DRAFTERS.register(MtpKind())
ORACLE = DRAFTERS.register(OracleKind())
