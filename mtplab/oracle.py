"""The lossless oracle: speculative output must equal greedy token for token, and state for state."""

from __future__ import annotations

import sys

import numpy as np

# select rebuilds GatedDeltaNet states by replaying float32 transitions and the conv carry from
# the verify's conv inputs: equal up to rounding. At fp16 the conv inputs of an M=k+1 MatMul can
# round one ulp (2^-10 near 1) away from the M=1 decode's, so the bound is a few fp16 ulps there.
STATE_TOLERANCE = {"fp32": 1e-4, "fp16": 4e-3}
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


def state_identity(state: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict:
    """Max abs difference over every GDN and conv state, and whether all are bitwise equal."""
    if set(state) != set(reference):
        raise ValueError(f"state names differ: {sorted(set(state) ^ set(reference))}")
    diff = max(float(np.max(np.abs(state[n].astype(np.float64) - reference[n]))) for n in state)
    bitwise = all(np.array_equal(state[n], reference[n]) for n in state)
    return {"state_max_abs_diff": diff, "state_bitwise": bitwise}


def verdict(identity: dict, commit: str, dtype: str = "fp32") -> tuple[bool, str]:
    """(ok, message). Tokens must match; readvance-m1 states must be bitwise; select within tolerance."""
    if not identity["token_identical"]:
        return False, (
            f"LOSSLESS CHECK FAILED: speculative output diverges from greedy at token {identity['first_divergence']} "
            f"(greedy {identity['greedy_token_at_divergence']}, speculative {identity['spec_token_at_divergence']}; "
            f"greedy top-2 logit margin there {identity['margin_at_divergence']})"
        )
    diff = identity.get("state_max_abs_diff")
    if commit == "readvance-m1" and identity.get("state_bitwise") is False:
        return (
            False,
            f"LOSSLESS CHECK FAILED: readvance-m1 state is not bitwise equal to greedy (max abs diff {diff:.3g})",
        )
    tolerance = STATE_TOLERANCE[dtype]
    if diff is not None and diff > tolerance:
        return False, (
            f"LOSSLESS CHECK FAILED: recurrent state differs from greedy's by {diff:.3g} (tolerance {tolerance} at {dtype})"
        )
    if diff is None:
        state = " (state not observable)"
    else:
        state = ", state bitwise" if identity.get("state_bitwise") else f", state within {diff:.2g}"
    return True, "identical to greedy: every token" + state


def shout(message: str) -> None:
    """Print a lossless failure loudly on stderr."""
    bar = "!" * min(len(message), 100)
    print(f"\n{bar}\n{message}\n{bar}\n", file=sys.stderr)
