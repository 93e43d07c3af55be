"""RunResult: one experiment point, saved as one JSON object and flattened to one table row."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mtplab.base.files import write_atomic


@dataclass
class RunResult:
    config: dict
    model: dict
    prompt: list[int]
    tokens: list[int]
    seconds: float
    tokens_per_s: float
    greedy_seconds: float
    greedy_tokens_per_s: float
    speedup: float
    steps: int
    tokens_per_step: float
    acceptance_length: float
    draft_acceptance: float
    acceptance_per_position: list[float]
    drafted: int
    accepted: int
    forwards: dict[str, int]
    time_split: dict[str, float]
    slots: dict[str, dict[str, int]]
    greedy_slots: dict[str, dict[str, int]]
    slot_reasons: dict[str, str]
    arena: dict[str, Any]
    identity: dict[str, Any]
    theory: dict[str, Any]
    env: dict[str, Any]
    lossless: bool = True
    verdict: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    accepted_per_step: list[int] = field(default_factory=list)
    k_per_step: list[int] = field(default_factory=list)  # each step's drafts where they varied (a draft-length policy)
    # Paired timed rounds: every round's samples, medians' 95% bootstrap CIs, stable = CI half-width <= 5%.
    round_samples: list[dict] = field(default_factory=list)
    speedup_ci: list[float] = field(default_factory=list)
    tokens_per_s_ci: list[float] = field(default_factory=list)
    greedy_tokens_per_s_ci: list[float] = field(default_factory=list)
    stable: bool = False
    # From the calibration and no time of the run's: "speedup", the price of the steps the timed rounds made
    # (theory.predict_steps), which the efficiency divides (measured / it per round); "at_alpha", theory.predict's.
    predicted: dict[str, Any] = field(default_factory=dict)
    efficiency: float = float("nan")
    efficiency_ci: list[float] = field(default_factory=list)
    # Named warnings (mtplab.check.flags): what is not an error but a reader must be told; [] in older results.
    warnings: list[dict] = field(default_factory=list)
    # Why its timing is suspect (mtplab.measure.floor: a side beyond its band of its bare replays); [] in older results.
    suspect: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        """Strict JSON: a value that is not a finite number (tokens/step when no step ran, say) is null."""
        return dumps(self.to_dict(), indent=1)

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        return cls(**json.loads(Path(path).read_text()))

    def row(self) -> dict:
        """Flat scalars for a table; nested detail goes in JSON columns."""
        return flatten(self.to_dict())


# A field's kind: the JSON values it takes (a float field is null where it was not finite), in words.
_KINDS = {"float": ((int, float, type(None)), "a number"), "int": ((int,), "an integer"), "bool": ((bool,), "true or false"),
          "str": ((str,), "a string"), "list": ((list,), "a list"), "dict": ((dict,), "an object")}


def type_problem(data: dict) -> str | None:
    """The first field of a result.json whose value is not of its field's kind (a number, a list...), or None."""
    for f in fields(RunResult):
        kind = _KINDS.get(str(f.type).split("[", 1)[0])
        if f.name not in data or kind is None:
            continue
        value, (types, words) = data[f.name], kind
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{f.name} is {value!r}: it takes {words}"
    return None


def engine_steps(result) -> int:
    """The speculative steps one timed run made (a RunResult or its dict): a batch point's own (each step runs every
    row at once; its `steps` counts row-steps, the unit of its pooled acceptance), else `steps`. What a time split
    per step divides by."""
    get = result.get if isinstance(result, dict) else lambda name, default=None: getattr(result, name, default)
    batch = (get("extra") or {}).get("batch") or {}
    return int(batch.get("steps") or get("steps") or 0)


JSON_COLUMNS = (
    "prompt",
    "tokens",
    "acceptance_per_position",
    "forwards",
    "time_split",
    "arena",
    "env",
    "extra",
    "greedy_slots",
    "slot_reasons",
    "model",
    "round_samples",
    "warnings",
)

# A row's columns that are not dotted (a dict field outside JSON_COLUMNS becomes dotted columns, one per key).
RESULT_COLUMNS = tuple(f.name for f in fields(RunResult) if f.name in JSON_COLUMNS or not str(f.type).startswith("dict"))


def finite(value):
    """value with every NaN or infinity (nested, numpy scalars too) replaced by None."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, float) or type(value).__module__ == "numpy":
        try:
            f = float(value)
        except (TypeError, ValueError):
            return value
        return f if math.isfinite(f) else None
    return value


def dumps(value, **kwargs) -> str:
    """json.dumps that never writes NaN or Infinity (strict parsers reject them): they become null."""
    return json.dumps(finite(value), allow_nan=False, default=float, **kwargs)


def flatten(d: dict, top: bool = True) -> dict:
    """Nested dicts become dotted columns; lists and the JSON_COLUMNS (top level only) become JSON text."""
    row: dict[str, Any] = {}
    for key, value in d.items():
        if top and key in JSON_COLUMNS:
            row[key] = dumps(value)
        elif isinstance(value, dict):
            for sub, v in flatten(value, top=False).items():
                row[f"{key}.{sub}"] = v
        elif isinstance(value, list):
            row[key] = dumps(value)
        else:
            row[key] = value
    return row
