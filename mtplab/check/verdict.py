"""The lossless verdict: speculative output must equal greedy token for token, and state for state."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from mtplab.engine.sampling import settings_text
from mtplab.engine.strategies import COMMITS

# Each commit strategy's guarantee against the plain session.run reference, per backend and precision.
# Tolerances are relative to the compared tensor's largest magnitude: max|a - b| <= rtol * max|b|.
# fp32 1e-5: the M=k+1 verify (select) and the M=n re-advance (readvance-batched) round their matrix products
# differently from M=1, a few ulps (attention feeds later GatedDeltaNet layers, which carry it on); a 1e-5 relative
# drift per commit would be over it after 2 commits. fp16: fp16 activations round each layer's output to 2^-11
# relative, and a batched forward rounds apart from M=1 by an ulp that later layers and the recurrent state carry
# on (tests/data/builder-tiny-gdn holds it). "int8": fp32 activations whose matmul inputs are rounded to int8
# (MatMulNBits accuracy_level 4, the builder's int4 export): a batched forward can move an input across a rounding
# step, and the recurrent state carries it on. A wrong commit moves the state by O(1).
STATE_RTOL = {"fp32": 1e-5, "fp16": 5e-2, "int8": 5e-2}


@dataclass(frozen=True)
class StateRule:
    """What a run's committed state (recurrent, conv and KV rows) must satisfy against the reference."""

    bitwise: bool
    rtol: float
    why: str

    def text(self) -> str:
        return ("bitwise" if self.bitwise else f"relative {self.rtol:g}") + f": {self.why}"


def state_rule(commit: str | None, precision: str, same_device: bool) -> StateRule:
    """The guarantee a commit strategy (its registered `bitwise` and `why`), or greedy decoding itself (None),
    gives on this backend and precision.

    Bitwise where the run and the reference execute the same M=1 kernels on the same device
    (readvance-m1, greedy); a relative tolerance wherever rounding legitimately differs.
    """
    rtol = STATE_RTOL[precision]
    strategy = COMMITS.get(commit) if commit is not None else None
    bitwise, why = (strategy.bitwise, strategy.why) if strategy else (True, "advances one token at a time with the "
                                                                             "reference's kernels")
    commit = commit or "greedy"
    if bitwise and same_device:
        return StateRule(True, 0.0, f"{commit} {why}, on the same device")
    if bitwise:
        return StateRule(False, rtol, f"{commit} runs on another device than the CPU reference: rounding differs")
    return StateRule(False, rtol, f"{commit} {why}")


def batch_rule(rule: StateRule, batch: int, precision: str) -> StateRule:
    """A bitwise rule is not one at batch B > 1: the rows run [B, M] forwards, the reference [1, M] ones, and a kernel
    may take another path at B rows (MatMulNBits' int4 does; fp32 MatMul has been bitwise). The relative tolerance of
    the precision instead."""
    if not rule.bitwise or batch == 1:
        return rule
    return StateRule(False, STATE_RTOL[precision],
                     rule.why + f"; at batch {batch} its [B, M] forwards may round apart from the batch-1 "
                     "reference's [1, M] (another kernel path for more rows)")


def first_difference(a, b) -> int | None:
    """The first index where two sequences differ (the shorter one's length where one is the other's prefix), or
    None where they are equal."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    return n if first is None and len(a) != len(b) else first


def token_identity(spec: list[int], greedy: list[int], greedy_margins: list[float]) -> dict:
    """Compare every token; on failure give the first diverging position and greedy's top-2 margin there."""
    first = first_difference(spec, greedy)
    return {
        "token_identical": first is None,
        "first_divergence": first,
        "margin_at_divergence": None if first is None or first >= len(greedy_margins) else greedy_margins[first],
        "greedy_token_at_divergence": None if first is None or first >= len(greedy) else int(greedy[first]),
        "spec_token_at_divergence": None if first is None or first >= len(spec) else int(spec[first]),
    }


def tensor_difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float, bool]:
    """(max abs difference, that relative to max|b|, bitwise equal) of two tensors of one shape.

    A NaN or Inf makes both differences infinite, so they never pass a tolerance; a shape
    difference too. The relative scale of an all-zero reference is 1e-30 (any difference fails).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), float("inf"), False
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    if diff.size == 0:
        return 0.0, 0.0, True
    if not np.isfinite(diff).all():
        return float("inf"), float("inf"), False
    worst = float(diff.max())
    scale = max(float(np.abs(b).max()), 1e-30)
    return worst, worst / scale, bool(np.array_equal(a, b))


def states_difference(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], rule: StateRule) -> dict:
    """Every tensor of two state snapshots (same names) under a rule: the worst differences and the first
    tensor that breaks the rule (None if none)."""
    if set(got) != set(ref):
        raise ValueError(f"state names differ: {sorted(set(got) ^ set(ref))}")
    out = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "bitwise": True, "first_bad": None}
    for name in ref:
        worst, rel, same = tensor_difference(got[name], ref[name])
        out["max_abs_diff"] = max(out["max_abs_diff"], worst)
        out["max_rel_diff"] = max(out["max_rel_diff"], rel)
        out["bitwise"] &= same
        bad = not same if rule.bitwise else not rel <= rule.rtol
        if bad and out["first_bad"] is None:
            out["first_bad"] = {"tensor": name, "max_abs_diff": worst, "max_rel_diff": rel,
                                "non_finite": worst == float("inf")}
    return out


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _state_where(first: dict) -> str:
    return f" after step {first['step']} (length {first['length']}), {first['tensor']}"


def verdict(identity: dict) -> tuple[bool, str]:
    """(ok, message). Every check that ran must pass; the message names the first failure and where.

    Tokens must match greedy's; nothing non-finite may appear in any forward; greedy must agree
    with the float64 anchor; the state and KV after every commit must match the lockstep reference
    under the commit's rule (`state_rule`, named in the message).
    """
    fail = "LOSSLESS CHECK FAILED: "
    if identity.get("row") is not None:  # a batch: the first row that fails (mtplab.check.lossless.pooled)
        fail += f"row {identity['row']} of {identity['rows']}: "
    bad = identity.get("non_finite")
    if bad:
        return False, fail + (
            f"non-finite {bad['tensor']} in the {bad['run']} run, forward {bad['forward']} ({bad['label']}) "
            f"at position {bad['position']}"
        )
    first = identity.get("state_first_divergence")
    sampled = identity.get("sampled")
    if not sampled and not identity["token_identical"]:
        return False, fail + (
            f"speculative output diverges from greedy at token {identity['first_divergence']} "
            f"(greedy {identity['greedy_token_at_divergence']}, speculative {identity['spec_token_at_divergence']}; "
            f"greedy top-2 logit margin there {_fmt(identity['margin_at_divergence'])})"
            + (f"; the recurrent state first differed{_state_where(first)}" if first and "step" in first else "")
        )
    alone = identity.get("batch_one")
    if alone and not alone["identical"] and alone["exact"]:
        plans = ", a Verify plan per length" if alone.get("padded") else ""
        steps_only = alone.get("first_step") is not None and not (sampled and alone["first_divergence"] is not None)
        where = (f"its accepted count or K at step {alone['first_step'] + 1} differs from a batch-1 run of its seeds "
                 f"(seed {alone['seed']}{plans})" if steps_only else
                 f"its sampled tokens differ from a batch-1 run of its seeds (seed {alone['seed']}, sample_seed "
                 f"{alone['sample_seed']}{plans}) at token {alone['first_divergence']}")
        return False, fail + where + ": the row did not decode by itself"
    twin = identity.get("padded_twin")
    if twin and not twin["identical"] and twin["exact"]:
        row = f"row {twin['row']}'s " if twin.get("row") is not None else "its "
        where = (f"at step {twin['first_step'] + 1} (its accepted count or K)" if twin["first_step"] is not None else
                 f"at token {twin['first_divergence']}")
        return False, fail + (f"{row}run with one padded Verify plan differs from the same run with a plan per length "
                              f"{where}: the padding changed what was judged")
    anchor = identity.get("anchor")
    if anchor and not anchor["ok"]:
        where = anchor["first_token_disagreement"]
        baseline = "the plain-sampling baseline" if sampled else "greedy"
        return False, fail + (
            f"{baseline} disagrees with the float64 reference over the prefill and first {anchor['positions'] - 1} "
            f"tokens: max logit difference {_fmt(anchor['max_logit_diff'])} (tolerance {anchor['tolerance']})"
            + (f", first different token at {where}" if where is not None else "")
            + f": a bug that {'it' if sampled else 'greedy'} and speculative share"
        )
    if identity.get("reference_disagreements"):
        d = identity["reference_disagreements"][0]
        return False, fail + (
            f"greedy and the plain session.run reference disagree at position {d['position']}"
            + (f" of row {d['row']}" if "row" in d else "") + " "
            f"(greedy {d['greedy']}, reference {d['reference']})"
        )
    rule = identity.get("state_rule") or "the lockstep reference's rule"
    if first is not None:
        where = _state_where(first) if "step" in first else " at the end of the run"
        kind = "non-finite" if first["non_finite"] else (
            f"{first['length']} tokens, beyond the {first['beyond']} of the prompt and every token emitted"
            if first.get("beyond") is not None else
            f"max abs diff {_fmt(first['max_abs_diff'])}, relative {_fmt(first.get('max_rel_diff'))}")
        return False, fail + f"committed state differs from the reference's{where}: {kind} (rule: {rule})"
    head = identity.get("head_kv_first_divergence")
    if head is not None:
        return False, fail + (f"the MTP head's KV differs from a teacher-forced head's{_state_where(head)}: "
                              f"max relative diff {_fmt(head['max_rel_diff'])} (rule: {identity['head_kv_rule']})")
    if identity.get("head_draft_disagreements"):
        d = identity["head_draft_disagreements"][0]
        return False, fail + (
            f"the MTP head's draft {d['draft_position']} at step {d['step']} (position {d['position']}) was "
            f"{'accepted' if d['accepted'] else 'rejected'}, where a teacher-forced head chained from the same row "
            f"drafts {d['reference']} and the text has {d['text']} (margin {_fmt(d['margin'])})")
    rows = f" in each of its {identity['rows']} rows" if identity.get("rows", 1) > 1 else ""
    if sampled:
        return True, f"sampled ({settings_text(sampled)}): state and KV follow the emitted tokens{rows}{_state_text(identity)}"
    return True, f"identical to greedy: every token{rows}{_state_text(identity, ', state and KV')}"


def _state_text(identity: dict, what: str = "") -> str:
    """How the committed state held against the reference, in a few words: bitwise or within the rule's tolerance."""
    if identity.get("state_max_abs_diff") is None:
        return what.replace(", state and KV", "") + " (state not observable)"
    what = what if identity.get("kv_checked") or not what else ", state"
    checked = identity.get("state_commits_checked")
    at = f" at {checked} checks" if checked else ""
    if identity.get("state_bitwise"):
        return f"{what} bitwise{at}"
    rule = identity.get("state_rule") or ""
    tolerance = rule.split(":")[0].split()[-1] + " relative" if rule.startswith("relative ") else "the rule's tolerance"
    return f"{what} within {tolerance}{at} (worst {_fmt(identity.get('state_max_rel_diff'))})"


def details(identity: dict) -> list[str]:
    """What the one-line verdict leaves out, a line each: the state rule and why, the float64 anchor, the MTP head's
    check, and what a sampled run's check does not cover (mtplab run --verbose prints them)."""
    out = []
    if identity.get("state_rule"):
        checked = identity.get("state_commits_checked")
        out.append(f"state and KV: rule {identity['state_rule']}; checked after every commit and at the end of the run"
                   + (f" ({checked} checks)" if checked else "")
                   + f"; worst difference {_fmt(identity.get('state_max_abs_diff'))} absolute, "
                   f"{_fmt(identity.get('state_max_rel_diff'))} relative")
    anchor = identity.get("anchor")
    if anchor:
        baseline = "the sampled baseline's logits match" if identity.get("sampled") else "greedy matches"
        out.append(f"anchor: {baseline} the float64 reference over {anchor['positions']} positions "
                   f"(max logit difference {_fmt(anchor['max_logit_diff'])}, tolerance {anchor['tolerance']})")
    if identity.get("head_kv_commits_checked"):
        out.append(f"MTP head: its KV within {_fmt(identity.get('head_kv_max_rel_diff'))} relative of a teacher-forced "
                   f"head's at {identity['head_kv_commits_checked']} checks (rule {identity.get('head_kv_rule')})")
    by_position = identity.get("head_acceptance_by_position")
    if by_position:
        agreed = identity.get("head_reference_agreement_by_position") or []
        out.append("MTP head: kept, of the drafts judged at each draft position, " + " ".join(_fmt(a) for a in by_position)
                   + "; the teacher-forced head drafts the text's token at " + " ".join(_fmt(a) for a in agreed))
    if identity.get("sampled"):
        out.append("sampled: the tokens' distribution is the target's by the rejection rule, held exactly and "
                   "statistically by the test suite, not per run")
    return out


def shout(message: str) -> None:
    """Print a lossless failure loudly on stderr."""
    bar = "!" * min(len(message), 100)
    print(f"\n{bar}\n{message}\n{bar}\n", file=sys.stderr)
