"""The lossless oracle: speculative output must equal greedy token for token, and state for state."""

from __future__ import annotations

import sys

import numpy as np

# select rebuilds GatedDeltaNet states by replaying float32 transitions and the conv carry from
# the verify's conv inputs: equal up to rounding. At fp16 the conv inputs of an M=k+1 MatMul can
# round one ulp (2^-10 near 1) away from the M=1 decode's, so the bound is a few fp16 ulps there.
# "int8": fp32 activations whose matmul inputs are rounded to int8 (MatMulNBits accuracy_level 4, the builder's
# int4 export): a 1e-6 difference between a batched and a one-token forward can move an input across a rounding
# step, and the recurrent state carries it on (seen: 0.022 after 14 commits on a 6-layer int4 builder model).
STATE_TOLERANCE = {"fp32": 1e-4, "fp16": 4e-3, "int8": 5e-2}
SELECT_STATE_TOLERANCE = STATE_TOLERANCE["fp32"]


def top2_margin(logits: np.ndarray) -> float:
    """Gap between the largest and second-largest logit of one row."""
    return float(top2_margin_xp(np, np.asarray(logits)))


def top2_margin_xp(xp, row):
    """top2_margin as a 0-d float64 array on the row's device: nothing waits for the device."""
    row = row.astype(xp.float64).ravel()
    top = row.max()
    second = xp.where(row == top, -xp.inf, row).max()
    return xp.where((row == top).sum() > 1, 0.0, top - second)


def token_identity(spec: list[int], greedy: list[int], greedy_margins: list[float]) -> dict:
    """Compare every token; on failure give the first diverging position and greedy's top-2 margin there."""
    n = min(len(spec), len(greedy))
    first = next((i for i in range(n) if spec[i] != greedy[i]), None)
    if first is None and len(spec) != len(greedy):
        first = n
    return {
        "token_identical": first is None,
        "first_divergence": first,
        "margin_at_divergence": None if first is None or first >= len(greedy_margins) else greedy_margins[first],
        "greedy_token_at_divergence": None if first is None or first >= len(greedy) else int(greedy[first]),
        "spec_token_at_divergence": None if first is None or first >= len(spec) else int(spec[first]),
    }


def tensor_difference(a: np.ndarray, b: np.ndarray) -> tuple[float, bool]:
    """(max abs difference, bitwise equal) of two tensors; a NaN or Inf makes the difference infinite,
    so it never passes a tolerance."""
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return (float(diff.max()) if np.isfinite(diff).all() else float("inf")), bool(np.array_equal(a, b))


def state_identity(state: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict:
    """Max abs difference over every GDN and conv state, and whether all are bitwise equal."""
    if set(state) != set(reference):
        raise ValueError(f"state names differ: {sorted(set(state) ^ set(reference))}")
    diffs = [tensor_difference(state[n], reference[n]) for n in state]
    return {"state_max_abs_diff": max(d for d, _ in diffs), "state_bitwise": all(same for _, same in diffs)}


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _state_where(first: dict) -> str:
    return f" after step {first['step']} (length {first['length']}), {first['tensor']}"


def verdict(identity: dict, commit: str, dtype: str = "fp32") -> tuple[bool, str]:
    """(ok, message). Every check that ran must pass; the message names the first failure and where.

    Tokens must match greedy's; nothing non-finite may appear in any forward; greedy must agree
    with the float64 anchor; the state after every commit must match the lockstep reference
    (bitwise for readvance-m1, within STATE_TOLERANCE otherwise).
    """
    fail = "LOSSLESS CHECK FAILED: "
    bad = identity.get("non_finite")
    if bad:
        return False, fail + (
            f"non-finite {bad['tensor']} in the {bad['run']} run, forward {bad['forward']} ({bad['label']}) "
            f"at position {bad['position']}"
        )
    first = identity.get("state_first_divergence")
    if not identity["token_identical"]:
        return False, fail + (
            f"speculative output diverges from greedy at token {identity['first_divergence']} "
            f"(greedy {identity['greedy_token_at_divergence']}, speculative {identity['spec_token_at_divergence']}; "
            f"greedy top-2 logit margin there {_fmt(identity['margin_at_divergence'])})"
            + (f"; the recurrent state first differed{_state_where(first)}" if first and "step" in first else "")
        )
    anchor = identity.get("anchor")
    if anchor and not anchor["ok"]:
        where = anchor["first_token_disagreement"]
        return False, fail + (
            f"greedy disagrees with the float64 reference over the prefill and first {anchor['positions'] - 1} "
            f"tokens: max logit difference {_fmt(anchor['max_logit_diff'])} (tolerance {anchor['tolerance']})"
            + (f", first different token at {where}" if where is not None else "")
            + ": a bug that greedy and speculative share"
        )
    if identity.get("reference_disagreements"):
        d = identity["reference_disagreements"][0]
        return False, fail + (
            f"greedy and the plain session.run reference disagree at position {d['position']} "
            f"(greedy {d['greedy']}, reference {d['reference']})"
        )
    tolerance = STATE_TOLERANCE[dtype]
    diff = identity.get("state_max_abs_diff")
    if first is None and diff is not None:  # a final-state-only comparison
        if not diff <= tolerance or (commit == "readvance-m1" and identity.get("state_bitwise") is False):
            first = {"max_abs_diff": diff, "non_finite": not np.isfinite(diff)}
    if first is not None:
        where = _state_where(first) if "step" in first else " at the end of the run"
        kind = "non-finite" if first["non_finite"] else f"max abs diff {_fmt(first['max_abs_diff'])}"
        rule = "must be bitwise equal for readvance-m1" if commit == "readvance-m1" else f"tolerance {tolerance} at {dtype}"
        return False, fail + f"recurrent state differs from greedy's{where}: {kind} ({rule})"
    if diff is None:
        state = " (state not observable)"
    else:
        checked = identity.get("state_commits_checked")
        after = f" after each of {checked} commits" if checked else ""
        state = f", state bitwise{after}" if identity.get("state_bitwise") else f", state within {diff:.2g}{after}"
    anchored = f"; greedy matches the float64 reference ({_fmt(anchor['max_logit_diff'])})" if anchor else ""
    return True, "identical to greedy: every token" + state + anchored


def shout(message: str) -> None:
    """Print a lossless failure loudly on stderr."""
    bar = "!" * min(len(message), 100)
    print(f"\n{bar}\n{message}\n{bar}\n", file=sys.stderr)
