"""The references the checked pass holds a run to, none of them inside a timed loop:
- a `Watch` on every forward of the greedy reference and of the checked speculative run: any
  NaN or Inf in logits or hidden states is recorded with where it was first seen;
- a `Lockstep` reference: a plain `session.run` stepper (no IOBinding, no plans, no arenas) fed
  one row's text, advanced to each length the speculative run commits that row to, where the committed
  GatedDeltaNet and conv states and KV rows are compared tensor by tensor (memory: one extra state);
- an `anchor`: the float64 numpy reference (`mtplab.model.reference`) on the weights the ONNX
  file holds, for the prefill and the first decoded tokens, which catches a bug that greedy and
  speculative share (the prefill, the decode path);
- where the MTP head runs, a `HeadCheck`: a teacher-forced head (`mtplab.model.stepper.HeadStepper`, fed the
  text's tokens and the lockstep reference's hidden states) whose KV rows the head's KV must hold after every
  commit, and, where the head drafts greedily, whose chained drafts from each step's row must be accepted
  where the engine's were (a difference beyond a near-tie is a head bug: a poisoned cache, a wrong chain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mtplab.check.verdict import STATE_RTOL, StateRule, states_difference
from mtplab.model import Artifact
from mtplab.model.reference import ReferenceModel, weights_from_onnx
from mtplab.model.stepper import HeadStepper, Stepper
from mtplab.runtime.arena import to_numpy

ANCHOR_TOKENS = 16  # greedy tokens the float64 anchor checks on models larger than tiny (see anchor_tokens)
# The anchor compares ONNX Runtime's logits with float64 numpy: rounding of the run's dtype only.
ANCHOR_TOLERANCE = {"fp32": 5e-3, "fp16": 0.25}
# The lockstep reference's argmax may differ from greedy's only where its top logits are this close.
DISAGREEMENT_MARGIN = {"fp32": 1e-3, "fp16": 5e-2, "int8": 5e-2}


def _first_non_finite(a: np.ndarray) -> int | None:
    bad = ~np.isfinite(a)
    return int(np.argmax(bad.reshape(-1))) if bad.any() else None


def fold(check, diff: dict, step: int, length: int) -> None:
    """A state comparison at one commit folded into a check's running worst: its relative difference, whether every
    one so far was bitwise, and the first divergence."""
    check.max_rel_diff = max(check.max_rel_diff, diff["max_rel_diff"])
    check.bitwise &= diff["bitwise"]
    if diff["first_bad"] is not None and check.first_divergence is None:
        check.first_divergence = {"step": step, "length": length} | diff["first_bad"]


@dataclass
class Watch:
    """Looks at every forward's logits and hidden states; keeps the first non-finite one seen."""

    run: str = "greedy"
    forwards: int = 0
    non_finite: dict | None = None

    def start(self, run: str) -> None:
        """Count the forwards of another run from 1 (the first non-finite seen is kept)."""
        self.run, self.forwards = run, 0

    def __call__(self, label: str, length: int, out: dict) -> None:
        self.forwards += 1
        if self.non_finite is not None:
            return
        for tensor in ("logits", "hidden"):
            where = _first_non_finite(to_numpy(out[tensor]))
            if where is not None:
                self.non_finite = {
                    "run": self.run,
                    "forward": self.forwards,
                    "label": label,
                    "position": length,
                    "tensor": tensor,
                    "element": where,
                }
                return


@dataclass
class HeadCheck:
    """The MTP head's KV after every commit against a teacher-forced head, and (judge) its drafts' acceptance per
    position against the teacher-forced head chained from the same rows on the same tokens."""

    head: HeadStepper
    k: int
    judge: bool  # the head drafts greedily: its acceptance is the reference chain's, near-ties aside
    rule: StateRule
    commits: int = 0
    max_rel_diff: float = 0.0
    bitwise: bool = True
    first_divergence: dict | None = None
    judged: list[int] = field(default_factory=list)  # per draft position: steps that judged it
    accepted: list[int] = field(default_factory=list)  # ... where the run accepted it
    agreed: list[int] = field(default_factory=list)  # ... where the teacher-forced chain drafts the text's token
    disagreements: list[dict] = field(default_factory=list)

    @classmethod
    def start(cls, desc, k: int, judge: bool) -> HeadCheck:
        rule = StateRule(False, STATE_RTOL[desc.precision], "the head's rows come from the verify's hidden states, "
                         "which round apart from the reference's M=1 forwards")
        return cls(HeadStepper(desc), k, judge, rule, judged=[0] * k, accepted=[0] * k, agreed=[0] * k)

    @staticmethod
    def judges(engine) -> bool:
        """Whether a run's head drafts are judged against the reference chain: the head drafts (not the oracle) and
        greedily, under a rule that keeps every draft up to the first the target's argmax differs from (a rule that
        keeps fewer rejects drafts the chain agrees with)."""
        return engine.spec.drafter == "mtp" and engine.acceptance.keeps_longest_match

    def check_kv(self, step: int, length: int, kv: tuple) -> None:
        """The head's KV rows [0, length) against the reference's."""
        self.commits += 1
        got = {"mtp.key": to_numpy(kv[0][:, :, :length]), "mtp.value": to_numpy(kv[1][:, :, :length])}
        fold(self, states_difference(got, self.head.rows(length), self.rule), step, length)

    def check_drafts(self, step: int, p: int, n: int, sequence: list[int], hidden: np.ndarray, drafted: int) -> None:
        """A step that drafted from row p and kept n of its drafts: the reference chained from row p on the text's
        tokens must draft the text's token exactly at the positions the run accepted (rounding decides near-ties
        only)."""
        steps = min(n + 1, drafted)
        rows = self.head.chain(p, sequence[p + 1 : p + 1 + steps], hidden)
        margin = DISAGREEMENT_MARGIN[self.head.desc.precision]
        for j, row in enumerate(rows):
            truth, pred = sequence[p + 2 + j], int(row.argmax())
            self.judged[j] += 1
            self.accepted[j] += j < n
            self.agreed[j] += pred == truth
            if (j < n) != (pred == truth):
                gap = float(row[pred] - row[truth]) if pred != truth else float(row[pred] - np.partition(row, -2)[-2])
                if gap > margin and len(self.disagreements) < 8:
                    self.disagreements.append({"step": step, "draft_position": j + 1, "position": p + 2 + j,
                                               "accepted": j < n, "reference": pred, "text": truth, "margin": gap})

    def summary(self) -> dict:
        rates = [[c / j if j else None for c, j in zip(counts, self.judged)] for counts in (self.accepted, self.agreed)]
        return {
            "head_kv_commits_checked": self.commits,
            "head_kv_max_rel_diff": self.max_rel_diff if self.commits else None,
            "head_kv_bitwise": self.bitwise if self.commits else None,
            "head_kv_first_divergence": self.first_divergence,
            "head_kv_rule": self.rule.text(),
            "head_drafts_judged": list(self.judged) if self.judge else None,
            "head_acceptance_by_position": rates[0] if self.judge else None,
            "head_reference_agreement_by_position": rates[1] if self.judge else None,
            "head_draft_disagreements": self.disagreements,
        }


@dataclass
class Lockstep:
    """The independent reference stepped to every committed length, compared state and KV by state and KV."""

    stepper: Stepper
    sequence: list[int]  # prompt + greedy tokens (a sampled run's own emitted tokens): every committed prefix
    rule: StateRule
    keep_at: int | None = None  # a length whose reference state is kept (the timed greedy runs end there)
    sampled: bool = False  # the sequence is sampled: no argmax to agree with
    kept: dict | None = None
    commits: int = 0
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    bitwise: bool = True
    first_divergence: dict | None = None
    reference_disagreements: list[dict] = field(default_factory=list)
    head: HeadCheck | None = None  # where the MTP head runs
    hidden: list[np.ndarray] = field(default_factory=list)  # the reference's hidden state at each position
    last_length: int = 0  # the length at the last check

    @classmethod
    def start(cls, art: Artifact, prompt: list[int], greedy_tokens: list[int], rule: StateRule,
              keep_at: int | None = None, sampled: bool = False, head: HeadCheck | None = None):
        """A lockstep reference after the prompt, comparing under `rule` (oracle.state_rule) and the head's
        (where it runs) fed as the checks come."""
        step = Stepper(art.description)
        out = step.forward(prompt)
        return cls(step, list(prompt) + list(greedy_tokens), rule, keep_at, sampled, head=head,
                   hidden=list(out["hidden"]), last_length=len(prompt),
                   kept=step.snapshot() if keep_at == len(prompt) else None)

    def advance_to(self, length: int) -> None:
        while self.stepper.length < length:
            pos = self.stepper.length
            out = self.stepper.forward([self.sequence[pos]])
            self.hidden.append(out["hidden"][0])
            if self.stepper.length == self.keep_at:
                self.kept = self.stepper.snapshot()
            expected = self.sequence[pos + 1] if pos + 1 < len(self.sequence) and not self.sampled else None
            row = out["logits"][0]
            got = int(row.argmax())
            if expected is not None and got != expected and len(self.reference_disagreements) < 8:
                margin = float(row[got]) - float(row[expected])
                if margin > DISAGREEMENT_MARGIN[self.stepper.desc.precision]:  # not a near-tie that rounding decides
                    self.reference_disagreements.append(
                        {"position": pos + 1, "greedy": expected, "reference": got, "margin": margin}
                    )

    def check(self, step: int, length: int, state: dict[str, np.ndarray], head_kv: tuple | None = None,
              extra_tokens: int | None = None, drafted: int | None = None) -> None:
        """Compare the committed state and KV rows at `length` with the reference's; keep the first divergence.
        head_kv: the MTP head's KV, held to the teacher-forced head's rows; extra_tokens: the tokens a step makes
        beyond its accepted drafts (the schedule's), where this check follows a step: its drafts are judged
        (drafted: how many the step made, the head's k where not given)."""
        self.commits += 1
        previous, self.last_length = self.last_length, length
        if length > len(self.sequence):  # a commit kept more tokens than were ever emitted: nothing to step to
            if self.first_divergence is None:
                self.first_divergence = {"step": step, "length": length, "tensor": "its length", "non_finite": False,
                                         "beyond": len(self.sequence)}
            return
        self.advance_to(length)
        if self.head is not None and head_kv is not None:
            reference = self.head.head  # fed row j: the text's token j + 1 with the reference's hidden state j
            if reference.length < length:
                reference.forward(self.sequence[reference.length + 1 : length + 1],
                                  np.stack(self.hidden[reference.length : length]))
            self.head.check_kv(step, length, head_kv)
            n = length - previous - (extra_tokens or 0)
            drafted = self.head.k if drafted is None else drafted
            if self.head.judge and extra_tokens is not None and 0 <= n <= drafted:
                p = length - n - 2  # the row the step drafted from
                self.head.check_drafts(step, p, n, self.sequence, self.hidden[p], drafted)
        diff = states_difference(state, self.stepper.snapshot(), self.rule)
        self.max_abs_diff = max(self.max_abs_diff, diff["max_abs_diff"])
        fold(self, diff, step, length)

    def summary(self) -> dict:
        return {
            "state_max_abs_diff": self.max_abs_diff if self.commits else None,
            "state_max_rel_diff": self.max_rel_diff if self.commits else None,
            "state_bitwise": self.bitwise if self.commits else None,
            "state_first_divergence": self.first_divergence,
            "state_commits_checked": self.commits,
            "state_rule": self.rule.text(),
            "kv_checked": bool(self.stepper.kv),
            "state_reference_bytes": sum(a.nbytes for a in self.stepper.snapshot().values()),
            "reference_disagreements": self.reference_disagreements,
        } | (self.head.summary() if self.head is not None else {})


def anchor(art: Artifact, prompt: list[int], logits: list[np.ndarray], tokens: list[int],
           sampled: bool = False, ref: ReferenceModel | None = None) -> dict | None:
    """Greedy's first logits rows (prefill's last, then each decode) against the float64 reference.

    logits[j] is the row that produced tokens[j]. Reports the max logit difference, the first
    token the reference disagrees on, and whether both stay within ANCHOR_TOLERANCE. None for a
    model mtplab has no numpy reference of (builder models: the lockstep stepper is their reference).
    ref: the reference already made (reference_model), where one anchors several sequences.
    """
    cfg = art.description.config
    if cfg is None:
        return None
    ref = ref or reference_model(art)
    # One teacher-forced forward over the prompt and greedy's first tokens: row P-1+j produced tokens[j].
    out = ref.forward(list(prompt) + list(tokens[: len(logits) - 1]), ref.new_state())["logits"]
    rows = list(out[len(prompt) - 1 :])
    tolerance = ANCHOR_TOLERANCE[cfg.dtype]
    diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - r))) for a, r in zip(logits, rows)]
    worst = max(diffs) if all(np.isfinite(diffs)) else float("inf")
    # A token disagreement counts where the reference prefers another token by more than rounding can explain
    # (sampled tokens are not the argmax: their logits are compared, not their choice).
    first = None if sampled else next((j for j, r in enumerate(rows) if r.max() - r[tokens[j]] > tolerance), None)
    return {
        "positions": len(rows),
        "max_logit_diff": worst,
        "tolerance": tolerance,
        "first_token_disagreement": first,
        "ok": worst <= tolerance and first is None,
    }


def reference_model(art: Artifact) -> ReferenceModel | None:
    """The float64 numpy reference of a built-in model (None for a model mtplab has none of)."""
    cfg = art.description.config
    return None if cfg is None else ReferenceModel(cfg, weights_from_onnx(art.target))


def anchor_tokens(desc, n: int) -> int:
    """How many of greedy's tokens the float64 anchor checks: every token on a model as small as tiny
    (layers x hidden^2 under 1e6: the numpy forward costs milliseconds), else the first ANCHOR_TOKENS."""
    cfg = desc.config
    if cfg is not None and cfg.num_layers * cfg.hidden_size**2 < 1e6:
        return n
    return min(n, ANCHOR_TOKENS)
