"""Speculative-decoding theory (Leviathan et al. 2023) for both step schedules.

schedule="decode-verify" (the seed's): decode (M=1, one guaranteed token) -> k drafts -> verify
(M=k+1) -> n accepted drafts plus one bonus token, so tokens/step = 1 + (1 - a^(k+1)) / (1 - a).
schedule="fused" (vLLM, SGLang): no decode, tokens/step = (1 - a^(k+1)) / (1 - a), which is
Leviathan's expected accepted-plus-bonus count and vLLM's acceptance length.
"""

from __future__ import annotations

import numpy as np


def acceptance_length(alpha: float, k: int) -> float:
    """Expected accepted drafts + 1 bonus (Leviathan's tokens per verify; vLLM's acceptance length)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def tokens_per_step(alpha: float, k: int, schedule: str = "decode-verify") -> float:
    """Tokens per speculative step: acceptance length, plus the decode's guaranteed token if any."""
    return acceptance_length(alpha, k) + (1.0 if schedule == "decode-verify" else 0.0)


def per_position(alpha: float, k: int) -> list[float]:
    """P(accepted >= i) for i = 1..k under independent per-position acceptance alpha."""
    return [alpha**i for i in range(1, k + 1)]


def fit_alpha(per_position_measured: list[float]) -> float:
    """The alpha whose geometric curve alpha^i best fits measured P(accepted >= i) (least squares)."""
    p = np.asarray(per_position_measured, dtype=float)
    if p.size == 0:
        return 0.0
    grid = np.linspace(0.0, 1.0, 2001)
    i = np.arange(1, p.size + 1)
    err = ((grid[:, None] ** i[None, :] - p[None, :]) ** 2).sum(axis=1)
    return float(grid[int(err.argmin())])


def predicted_speedup(
    alpha: float,
    k: int,
    t_greedy: float,
    t_decode: float,
    t_draft: float,
    t_verify: float,
    t_commit: float,
    schedule: str = "decode-verify",
) -> float:
    """Speedup over greedy predicted from alpha and measured costs (seconds).

    t_greedy: greedy seconds per token. Per speculative step: t_decode (one M=1 forward), t_draft
    (one head step, k of them), t_verify (one M=k+1 forward) and t_commit.
    """
    step = t_decode + k * t_draft + t_verify + t_commit
    return tokens_per_step(alpha, k, schedule) * t_greedy / step if step > 0 else float("nan")
