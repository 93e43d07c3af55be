"""Drafters: the model's MTP head, and a controlled-acceptance oracle for performance studies (at temperature
> 0 the oracle is a mixture drafter: mtplab.engine.mixture).

A drafter kind (DrafterKind, registered in `mtplab.engine.strategies.DRAFTERS`) says which RunConfig
parameters it takes, where its acceptance comes from and whether the MTP head runs, and builds the
run's drafter. Every drafter takes the same calls: prefill(tokens, hidden) once per generation, then
draft(first, hidden, position, k) per step: k draft tokens following `first`, the token at
`position + 1`, given the target's hidden state at `position`; a device array [k] (int64), read before the
next draft (a drafter may write its next drafts into it); and commit(hidden, tokens, start) after each verify:
the emitted tokens at positions start + 1.. with the target's hidden states at start.. (the verify's rows), which
a drafter with a cache of its own (the MTP head's KV) writes into it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from mtplab.base.names import canonical
from mtplab.engine.acceptance import GREEDY_MATCH
from mtplab.engine.mixture import MixtureDrafter
from mtplab.engine.strategies import DRAFTERS
from mtplab.model.description import ModelDescription, length_feeds
from mtplab.runtime.arena import array_module
from mtplab.runtime.executor import Executor, Slot
from mtplab.runtime.policy import presize
from mtplab.runtime.sessions import refused_run
from mtplab.runtime.slot_memory import SlotMemory
from mtplab.runtime.state import MtpState, mtp_io


class Drafter(Protocol):
    def prefill(self, tokens: list[int], hidden) -> None: ...
    def draft(self, first, hidden, position: int, k: int): ...
    def commit(self, hidden, tokens: list[int], start: int) -> None: ...


class HeadRow(NamedTuple):
    """The head's output row that a commit left for the next draft: the row's position, the token it was fed, and
    its index in the commit's outputs."""

    position: int
    token: int
    index: int


class MtpDrafter:
    """Chained drafting with the MTP head: (next token, hidden) -> logits, head hidden -> next draft."""

    def __init__(self, desc: ModelDescription, executor: Executor, state: MtpState, forwards: dict,
                 choose=GREEDY_MATCH.draft_token):
        self.desc, self.executor, self.state, self.forwards = desc, executor, state, forwards
        self.xp = array_module(state.kv[0])  # where its drafts live
        self.choose = choose  # the acceptance rule's draft_token(xp, row)
        self._hot: HeadSteps | None = None  # the head step _draft_on_host runs
        self._on_host = self.xp is np and state.batch == 1  # drafts from host tokens, on the step's prepared feeds
        self._tokens = np.empty(0, dtype=np.int64)  # on the host: [first, d1..dk], the drafts its view
        self._ready: HeadRow | None = None  # the last commit's row a draft from its position may start from
        self._commit_out: dict | None = None  # that commit's outputs (the Verify slot's buffers)
        self.stop: Callable | None = None  # stop(logits row) after a draft: end the step's drafting there

    def prefill(self, tokens: list[int], hidden) -> None:
        """Fill the head's KV cache for the prompt: entry j pairs token j+1 with the target's hidden j (its last
        row is a first draft from the prompt's end, as a commit's is)."""
        feeds, outputs, bound = mtp_io(self.desc, self.state, list(tokens), hidden, 0)
        try:
            self._commit_out = self.executor.run_eager(Slot.PRIMARY, feeds, outputs, bound)
        except RuntimeError as err:  # onnxruntime's: the head's graph does not run with the buffers described
            raise refused_run(f"{self.desc.name}'s MTP head (its prefill)", err) from err
        key = f"mtp/M={len(tokens)}"
        self.forwards[key] = self.forwards.get(key, 0) + 1
        self._ready = HeadRow(len(tokens) - 1, int(tokens[-1]), len(tokens) - 1)

    def commit(self, hidden, tokens: list[int], start: int) -> None:
        """Rewrite the head's KV rows start.. for what the verify kept: row start + i pairs tokens[i] (the emitted
        token at start + i + 1) with the target's hidden state at start + i (`hidden`: the verify's [k+1, H] rows).

        Drafting writes provisional rows (a draft's token with the head's own hidden state); left in place, the
        head would attend to its own guesses, rejected ones included, as if they were the text. One head forward
        at the fixed M = k+1 of the verify rewrites them (a plan replayed every step): rows past the n+1 kept ones
        are padding, written beyond the committed length, where the next drafts write before they read. The last
        kept row's outputs are what a draft from position start + n (the fused schedule's next step) starts from.
        """
        M, n = int(hidden.shape[0]), len(tokens)
        if not 1 <= n <= M:
            raise ValueError(f"a head commit takes 1..{M} tokens (the verify's rows), got {n}")
        padded = list(tokens) + [tokens[-1]] * (M - n)
        feeds, outputs, bound = mtp_io(self.desc, self.state, padded, hidden, start)
        self._commit_out = self.executor.run(Slot.VERIFY, feeds, outputs, bound)
        key = f"mtp-commit/M={M}"
        self.forwards[key] = self.forwards.get(key, 0) + 1
        self._ready = HeadRow(start + n - 1, int(tokens[-1]), n - 1)

    def draft(self, first, hidden, position: int, k: int):
        """k draft tokens following `first` (an int or a device scalar) and its target hidden state. Each draft (the
        acceptance rule's draft_token, argmax by default) feeds the next head step; the k drafts come back as a device
        array [k] (int64), nothing here waits for the device. Where the last commit's last row was this very step
        (the token `first` at `position`: the fused schedule), the first draft is read from it."""
        ready, self._ready = self._ready, None
        if ready is not None and ready.position == position and k and isinstance(first, (int, np.integer)) and (
                int(first) == ready.token):
            return self._draft_from_row(ready.index, position, k)
        return self._draft(first, hidden, position, k)

    def _draft_from_row(self, index: int, position: int, k: int):
        """The drafts of a step whose first head step the last commit ran (its row `index`): the first draft from
        that row's logits, the rest chained from its hidden state."""
        io, xp, out = self.desc.mtp, self.xp, self._commit_out
        drafts = xp.empty(k, dtype=np.int64)
        drafts[0] = self.choose(xp, out[io.logits][0, index])
        if k > 1 and self.stop is not None and self.stop(_host(out[io.logits][0, index])):
            return drafts[:1]
        if k > 1:
            rest = self._draft(drafts[0], out[io.hidden][0, index], position + 1, k - 1)
            drafts = drafts[: 1 + rest.shape[0]]  # fewer where the policy stopped drafting early
            drafts[1:] = rest
        return drafts

    def _draft(self, first, hidden, position: int, k: int):
        if self._on_host:  # host tokens: the step's feeds rewritten in place, replayed
            return self._draft_on_host(first, hidden, position, k)
        io, xp, pick = self.desc.mtp, self.xp, self.choose
        drafts = xp.empty(k, dtype=np.int64)
        token = first
        for i in range(k):
            feeds, outputs, bound = mtp_io(self.desc, self.state, token, hidden, position + i)
            out = self.executor.run(Slot.PRIMARY, feeds, outputs, bound)
            self.forwards["mtp/M=1"] = self.forwards.get("mtp/M=1", 0) + 1
            token = pick(xp, out[io.logits][0, 0])
            hidden = out[io.hidden][0, 0]
            drafts[i] = token
            if i + 1 < k and self.stop is not None and self.stop(_host(out[io.logits][0, 0])):
                return drafts[: i + 1]
        return drafts

    def _draft_on_host(self, token, hidden, position: int, k: int) -> np.ndarray:
        """draft()'s head steps on the host: mtp_io's M=1 feeds, built once (again when the KV buffers change),
        rewritten in place before each step (token, hidden state, lengths), and the head's replayer on them (it
        decides as Executor.run does). The drafts: a view of [first, d1..dk], rewritten by the next draft."""
        hot, fixed, state = self._hot, self.state.io_cache.get(1), self.state
        if hot is None or fixed is None or fixed.kv is not state.kv or hot.feeds is not fixed.feeds or (
                hot.executor is not self.executor):
            hot = self._head_steps(token, hidden, position)
        feeds, buffer = hot.feeds, hot.hidden
        buffer[...] = hidden  # as mtp_io feeds it: [1, 1, H], of the target's hidden dtype
        feeds[hot.hidden_name] = buffer
        tokens = self._tokens
        if tokens.shape[0] < k + 1:  # [first, d1..dk], reused: the drafts are its view, read before the next draft
            tokens = self._tokens = np.empty(k + 1, dtype=np.int64)
        tokens[0] = token
        done = 0
        try:
            for i in range(k):
                hot.ids[...] = token
                length_feeds(self.desc.mtp, position + i, 1, self.desc.capacity, feeds)
                if i:
                    buffer[0, 0] = hidden
                out = hot.run()
                done += 1
                token = self.choose(np, out[hot.logits][0, 0])
                hidden = out[hot.hidden_out][0, 0]
                tokens[i + 1] = token
                if i + 1 < k and self.stop is not None and self.stop(out[hot.logits][0, 0]):
                    break
        finally:  # counted once, and kept true when a step raises
            self.forwards["mtp/M=1"] = self.forwards.get("mtp/M=1", 0) + done
        return tokens[1 : 1 + done]

    def _head_steps(self, token, hidden, position: int) -> HeadSteps:
        """The head's M=1 step as _draft_on_host runs it, made for mtp_io's feeds (one object while the KV buffers
        stay); the hidden state goes into one array of its own in them."""
        desc, io = self.desc, self.desc.mtp
        feeds, outputs, bound = mtp_io(desc, self.state, token, hidden, position)
        buffer = np.empty((1, 1, desc.hidden_size), dtype=desc.target.hidden_type)
        self._hot = HeadSteps(feeds, self.executor, self.executor.replayer(Slot.PRIMARY, feeds, outputs, bound),
                              feeds[io.input_ids], buffer, io.hidden_input, io.logits, io.hidden)
        return self._hot

def _host(row) -> np.ndarray:
    """A logits row on the host (a device array copied: the confidence policy's read, once per draft)."""
    return row.get() if hasattr(row, "get") else np.asarray(row)


def head_executor(desc: ModelDescription, dev, state: MtpState, run, path, arenas: dict) -> tuple[Executor, tuple]:
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
    session = dev.session(path)
    executor = Executor({Slot.PRIMARY: session, Slot.VERIFY: session}, memory,
                        labels={Slot.PRIMARY: "mtp", Slot.VERIFY: "mtp-commit"}, backend=dev.backend,
                        max_recaptures=run.max_recaptures, validate=run.validate,
                        plan_per_shape=run.plan_per_shape)  # its commit runs at the verify's M
    return executor, draft_io


class HeadSteps(NamedTuple):
    """The head's M=1 step as _draft_on_host runs it: mtp_io's feeds, the executor, its Primary slot's replayer on
    them, the feeds' token ids and hidden state, and the names of the hidden state's feed and of the logits and hidden
    state outputs."""

    feeds: dict
    executor: Executor
    run: Callable[[], dict]
    ids: np.ndarray
    hidden: np.ndarray
    hidden_name: str
    logits: str
    hidden_out: str


class OracleDrafter:
    """Proposes the greedy reference token with probability alpha, else a wrong one (seeded).

    Performance-only, like SGLang's simulated acceptance: never judge accuracy with it. By default
    it still runs the MTP head so the draft cost is real; without a head (free drafts) it skips it.
    Its random numbers are drawn in blocks of DRAWS drafts (the first at the prefill, untimed): draft j of a
    generation is right when the j-th uniform is below alpha, else the reference token shifted by 1 + the j-th
    of the offsets, uniform over 0..vocab-2 (every wrong token equally likely).
    """

    DRAWS = 4096

    def __init__(self, reference: list[int], alpha: float, seed: int, vocab: int, head: MtpDrafter | None, xp=np):
        self.reference, self.alpha, self.vocab, self.head, self.xp = reference, alpha, vocab, head, xp
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
        if self.head is not None:
            self.head.prefill(tokens, hidden)

    def _draw(self) -> None:
        """The next block of random numbers (the previous block's unused ones are dropped)."""
        self.uniforms = self.rng.random(self.DRAWS).tolist()
        self.shifts = (1 + self.rng.integers(self.vocab - 1, size=self.DRAWS)).tolist()
        self.used = 0

    def commit(self, hidden, tokens: list[int], start: int) -> None:
        if self.head is not None:
            self.head.commit(hidden, tokens, start)

    def draft(self, first, hidden, position: int, k: int):
        """Drafts for the reference tokens after `first` (at position + 1): right with probability alpha."""
        if self.head is not None:
            self.head.draft(first, hidden, position, k)
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
        if made < k:  # the reference ends (the run's last step drafts past it at most)
            out = out[:made]
        return out if self.xp is np else self.xp.asarray(out)


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
    """

    name: str = ""
    summary: str = ""
    params: tuple[str, ...] = ()
    acceptance: str | None = None
    peer: bool = False  # the onnxruntime-genai peer runs it too (its MtpGenerator runs the model's MTP head)
    samples: bool = False  # drafts through the acceptance rule (a sampling rule gets its distributions)
    needs_reference: bool = False
    confident: bool = False

    def reads_reference(self, run) -> bool:
        """Whether this run's drafter reads the greedy reference's tokens."""
        return self.needs_reference

    def uses_head(self, run) -> bool:
        """Whether the MTP head runs k steps per speculative step (and its prefill) in this run."""
        return False

    def build(self, engine, reference: list[int] | None) -> Drafter:
        """The run's drafter on an Engine (its public attributes: desc, xp, head, spec)."""
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

    def uses_head(self, run) -> bool:
        return True

    def build(self, engine, reference):
        return engine.head


class OracleKind(DrafterKind):
    name = "oracle"
    summary = ("the greedy reference's token with probability alpha, else a wrong one; at temperature > 0 a draft "
               "from alpha * the target's distribution + (1 - alpha) * a fixed token (performance studies only)")
    params = ("alpha", "oracle_free_drafts")
    acceptance = "setting"
    samples = True  # at temperature > 0 it draws through the rule (mtplab.engine.mixture)
    needs_reference = True

    def reads_reference(self, run) -> bool:
        return run.temperature == 0  # the mixture drafts from the target itself

    def uses_head(self, run) -> bool:
        return not run.oracle_free_drafts

    def build(self, engine, reference):
        run = engine.spec
        if engine.acceptance.samples:  # temperature > 0: the mixture of the target's distribution and a distractor
            # the head runs for its cost only, drafting argmax: the run's random numbers and q rows stay the mixture's
            head = None if run.oracle_free_drafts else MtpDrafter(
                engine.desc, engine.mtp, engine.mtp_state, engine.forwards, GREEDY_MATCH.draft_token)
            return MixtureDrafter(engine, run.alpha, run.seed, head)
        head = None if run.oracle_free_drafts else engine.head
        return OracleDrafter(reference, run.alpha, run.seed, engine.desc.vocab_size, head, engine.xp)

    def id_part(self, values: dict) -> str:
        return self.name + "-".join(canonical(float(a)) for a in row_alphas(values["alpha"], 1))

    def text(self, values: dict) -> str:
        return f"oracle alpha={','.join(f'{float(a):g}' for a in row_alphas(values['alpha'], 1))}"


def row_alphas(alpha, batch: int) -> list[float]:
    """The oracle's alpha of each row: a run's one alpha for all `batch` rows, or its list of one per row."""
    return [float(a) for a in alpha] if isinstance(alpha, (list, tuple)) else [float(alpha)] * batch


MTP = DRAFTERS.register(MtpKind())
ORACLE = DRAFTERS.register(OracleKind())
