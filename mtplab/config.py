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
    rounds: int = 3  # paired greedy/speculative rounds, timed after the untimed checked pass

    def __post_init__(self) -> None:
        validate_run(self)

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CHOICES = {
    "preset": tuple(PRESETS),
    "policy": tuple(POLICIES),
    "commit": COMMITS,
    "drafter": DRAFTERS,
    "backend": BACKENDS,
    "schedule": SCHEDULES,
    "engine": ENGINES,
}


def _integer(lo: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _boolean(v) -> bool:
    return isinstance(v, bool)


# Per-field rules for the fields that are not choices: (accepts, what is allowed).
RULES = {
    "k": (_integer(1), "an integer >= 1"),
    "alpha": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0,
        "within [0, 1], a number",
    ),
    "tokens": (_integer(1), "an integer >= 1"),
    "seed": (_integer(0), "an integer >= 0"),
    "prompt_len": (_integer(1), "an integer >= 1"),
    "max_recaptures": (_integer(0), "an integer >= 0"),
    "rounds": (_integer(1), "an integer >= 1"),
    "oracle_free_drafts": (_boolean, "true or false (a boolean)"),
    "validate": (_boolean, "true or false (a boolean)"),
    "retain_decode_graph_across_spec": (_boolean, "true or false (a boolean)"),
    "int4": (_boolean, "true or false (a boolean)"),
}


def field_problem(name: str, values: list) -> str | None:
    """What is wrong with these values of one RunConfig field, naming every bad one; None if all are fine."""
    if name in CHOICES:
        bad = [v for v in values if not (isinstance(v, str) and v in CHOICES[name])]
        rule = f"allowed values are {list(CHOICES[name])}"
        shown = ", ".join(repr(v) for v in bad)
        return f"unknown {name} {shown}: {rule}" if bad else None
    accepts, rule = RULES[name]
    bad = [v for v in values if not accepts(v)]
    return f"{name}={', '.join(repr(v) for v in bad)}: must be {rule}" if bad else None


def run_problems(values: dict) -> list[str]:
    """Every problem with a RunConfig's field values (defaults for the missing ones), each naming the field."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(RunConfig)})
    if unknown:
        return [f"unknown RunConfig fields {unknown}"]
    cfg = {f.name: f.default for f in dataclasses.fields(RunConfig)} | values
    problems = [p for name, value in cfg.items() if (p := field_problem(name, [value]))]
    if problems:  # the checks across fields need valid fields
        return problems
    if cfg["engine"] == "ort-genai" and (cfg["drafter"] != "mtp" or cfg["backend"] != "cpu"):
        problems.append(
            f"engine='ort-genai' runs the real MTP head on the CPU: needs drafter='mtp' and backend='cpu' "
            f"(got drafter={cfg['drafter']!r}, backend={cfg['backend']!r})"
        )
    if not cfg["validate"] and cfg["commit"] == "readvance-batched" and cfg["policy"] != "shared-jit":
        problems.append(
            "validate=False with commit='readvance-batched': the batched re-advance runs M=n on the Primary slot, and "
            "without the signature check the captured M=1 plan would replay with M=n inputs, which ONNX Runtime's "
            "GroupQueryAttention rejects rather than computing a wrong result; run the negative control with "
            "commit 'readvance-m1' or 'select'"
        )
    k = cfg["k"]
    if k + 1 > MAX_TRANSITION_CAPACITY:
        problems.append(
            f"k={k}: k+1={k + 1} exceeds the GatedDeltaNet transition capacity {MAX_TRANSITION_CAPACITY} "
            f"(allowed: k in 1..{MAX_TRANSITION_CAPACITY - 1})"
        )
    model = PRESETS[cfg["preset"]]
    need = cfg["prompt_len"] + cfg["tokens"] + 2 * (k + 1)
    if need > model.max_seq_len:
        problems.append(
            f"tokens={cfg['tokens']}: prompt ({cfg['prompt_len']}) + tokens + 2*(k+1) = {need} exceeds the "
            f"{cfg['preset']} model's max_seq_len {model.max_seq_len} (allowed: tokens <= "
            f"{model.max_seq_len - cfg['prompt_len'] - 2 * (k + 1)})"
        )
    return problems


def validate_run(cfg: RunConfig) -> None:
    """Every RunConfig check; errors say what was wrong and what is allowed (all of them, joined by '; ')."""
    problems = run_problems(cfg.to_dict())
    if problems:
        raise ValueError("; ".join(problems))
