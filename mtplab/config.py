"""Run configuration: one frozen dataclass, validated before any work starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .model.config import MAX_TRANSITION_CAPACITY, PRESETS
from .policy import POLICIES

DRAFTERS = ("mtp", "oracle")
COMMITS = ("readvance-batched", "readvance-m1", "select")
BACKENDS = ("cpu", "cuda")
ENGINES = ("mtplab", "ort-genai")
SCHEDULES = ("decode-verify", "fused")


@dataclass(frozen=True)
class RunConfig:
    """One experiment point: greedy baseline + speculative run on one model preset."""

    preset: str = "small"
    k: int = 3
    alpha: float = 0.8
    drafter: str = "mtp"
    policy: str = "sibling-pinned"
    commit: str = "select"
    schedule: str = "decode-verify"
    tokens: int = 128
    backend: str = "cpu"
    seed: int = 0
    prompt_len: int = 8
    oracle_free_drafts: bool = False
    validate: bool = True
    retain_decode_graph_across_spec: bool = True
    max_recaptures: int = 3
    int4: bool = False
    engine: str = "mtplab"

    def __post_init__(self) -> None:
        validate_run(self)

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}: allowed values are {list(allowed)}")


def validate_run(cfg: RunConfig) -> None:
    """Every RunConfig check; errors say what was wrong and what is allowed."""
    _choice("preset", cfg.preset, PRESETS)
    _choice("policy", cfg.policy, POLICIES)
    _choice("commit", cfg.commit, COMMITS)
    _choice("drafter", cfg.drafter, DRAFTERS)
    _choice("backend", cfg.backend, BACKENDS)
    _choice("schedule", cfg.schedule, SCHEDULES)
    _choice("engine", cfg.engine, ENGINES)
    if cfg.engine == "ort-genai" and (cfg.drafter != "mtp" or cfg.backend != "cpu"):
        raise ValueError(
            f"engine='ort-genai' runs the real MTP head on the CPU: needs drafter='mtp' and backend='cpu' "
            f"(got drafter={cfg.drafter!r}, backend={cfg.backend!r})"
        )
    if not isinstance(cfg.k, int) or isinstance(cfg.k, bool) or cfg.k < 1:
        raise ValueError(f"k={cfg.k!r}: must be an integer >= 1")
    if cfg.k + 1 > MAX_TRANSITION_CAPACITY:
        raise ValueError(
            f"k={cfg.k}: k+1={cfg.k + 1} exceeds the GatedDeltaNet transition capacity {MAX_TRANSITION_CAPACITY} "
            f"(allowed: k in 1..{MAX_TRANSITION_CAPACITY - 1})"
        )
    if not 0.0 <= float(cfg.alpha) <= 1.0:
        raise ValueError(f"alpha={cfg.alpha}: must be within [0, 1]")
    if not isinstance(cfg.tokens, int) or cfg.tokens < 1:
        raise ValueError(f"tokens={cfg.tokens!r}: must be an integer >= 1")
    if cfg.prompt_len < 1:
        raise ValueError(f"prompt_len={cfg.prompt_len}: must be >= 1")
    if cfg.max_recaptures < 0:
        raise ValueError(f"max_recaptures={cfg.max_recaptures}: must be >= 0")
    model = PRESETS[cfg.preset]
    need = cfg.prompt_len + cfg.tokens + 2 * (cfg.k + 1)
    if need > model.max_seq_len:
        raise ValueError(
            f"tokens={cfg.tokens}: prompt ({cfg.prompt_len}) + tokens + 2*(k+1) = {need} exceeds the "
            f"{cfg.preset} model's max_seq_len {model.max_seq_len} (allowed: tokens <= "
            f"{model.max_seq_len - cfg.prompt_len - 2 * (cfg.k + 1)})"
        )
