"""Run configuration: one frozen dataclass, the single source of every run parameter, validated before any work starts.

Each field carries its metadata (`param`): help text, choices or rule, whether a sweep may vary it
and how it shows in a point id, and its command-line form. The `mtplab run` options
(`mtplab.cli`), the sweep's dimensions (`mtplab.grid`) and the parameters of
notebooks/run_point.ipynb are derived from the fields, so a new field appears in all of them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from .executor import max_recaptures_problem
from .model.config import MAX_TRANSITION_CAPACITY, PRESETS, k_problem
from .policy import POLICIES

DRAFTERS = ("mtp", "oracle")
COMMITS = ("readvance-batched", "readvance-m1", "select")
BACKENDS = ("cpu", "cuda")
ENGINES = ("mtplab", "ort-genai")
SCHEDULES = ("decode-verify", "fused")


def _integer(lo: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _boolean(v) -> bool:
    return isinstance(v, bool)


INTEGER_1 = (_integer(1), "an integer >= 1")
INTEGER_0 = (_integer(0), "an integer >= 0")
BOOLEAN = (_boolean, "true or false (a boolean)")
UNIT_INTERVAL = (
    lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0,
    "within [0, 1], a number",
)


MAX_ROUNDS = 1000
THREADS_PER_CORE = 4  # intra-op threads a run may ask for, per core of this machine


def _cores() -> int:
    return os.cpu_count() or 1


ROUNDS = (lambda v: _integer(1)(v) and v <= MAX_ROUNDS, f"an integer in 1..{MAX_ROUNDS}")
THREADS = (
    lambda v: _integer(0)(v) and v <= THREADS_PER_CORE * _cores(),
    f"an integer in 0..{THREADS_PER_CORE * _cores()} (0: onnxruntime's default; at most {THREADS_PER_CORE} per core "
    f"of this machine's {_cores()})",
)


def threads_used(threads: int) -> int:
    """The intra-op threads a session gets for a RunConfig's `threads` (0: onnxruntime's default, every core)."""
    return threads or os.cpu_count() or 1


def param(
    default,
    help: str,
    *,
    choices: tuple | None = None,
    rule: tuple | None = None,
    sweep: bool = True,
    flag: str | None = None,
    cli_unset: bool = False,
    tag: str | None = None,
):
    """A RunConfig field with its metadata.

    help: the one help text (the command line, the notebook and the docs read it);
    choices: the allowed values, or rule: (accepts(value) -> bool, what is allowed);
    sweep: whether a grid spec may vary it (a dimension);
    flag: the command-line option when not `--name-with-dashes` (booleans: `--name` turns on a
    field defaulting False; a field defaulting True gets `--no-...`);
    cli_unset: the option has no default on the command line (given or not is told apart);
    tag: how a point id shows a value other than the default (`tag` + the value; a boolean: the tag
    alone), for a dimension the id does not name otherwise (default: the field's name, and for a
    boolean defaulting True `no` + the name).
    """
    if rule is None and choices is None:
        rule = BOOLEAN if isinstance(default, bool) else None
    meta = {
        "help": help,
        "choices": choices,
        "rule": rule,
        "sweep": sweep,
        "flag": flag,
        "cli_unset": cli_unset,
        "tag": tag,
    }
    return dataclasses.field(default=default, metadata=meta)


def _model_ok(v) -> bool:
    if not isinstance(v, str):
        return False
    if v in ("", *PRESETS):
        return True
    folder = Path(v)
    return (folder / "genai_config.json").is_file() or (folder / "manifest.json").is_file()


MODEL_RULE = (
    _model_ok,
    f"a preset name {list(PRESETS)}, or a folder holding genai_config.json (onnxruntime-genai builder output) "
    "or manifest.json (an mtplab artifact)",
)


@dataclass(frozen=True)
class RunConfig:
    """One experiment point: greedy baseline + speculative run on one model."""

    preset: str = param("small", "model preset (not with --model)", choices=tuple(PRESETS), cli_unset=True)
    model: str = param(
        "",
        "the model: a preset name, or a folder the onnxruntime-genai model builder wrote (empty: --preset)",
        rule=MODEL_RULE,
    )
    k: int = param(3, f"drafts per step (the built-in model: 1..{MAX_TRANSITION_CAPACITY - 1})", rule=INTEGER_1)
    alpha: float = param(
        0.8,
        "oracle drafter acceptance per position, in [0, 1]; not with --drafter mtp",
        rule=UNIT_INTERVAL,
        cli_unset=True,
    )
    drafter: str = param("mtp", "who drafts", choices=DRAFTERS)
    policy: str = param("sibling-pinned", "arena policy", choices=tuple(POLICIES))
    commit: str = param("select", "commit strategy", choices=COMMITS)
    schedule: str = param("decode-verify", "step schedule", choices=SCHEDULES)
    tokens: int = param(128, "tokens to generate", rule=INTEGER_1)
    backend: str = param("cpu", "where the graphs run", choices=BACKENDS)
    seed: int = param(0, "prompt seed, an integer >= 0", rule=INTEGER_0)
    prompt_len: int = param(8, "prompt tokens", rule=INTEGER_1, tag="p")
    oracle_free_drafts: bool = param(False, "oracle drafter skips the MTP head")
    validate: bool = param(
        True, "check each plan's binding signature before replay (off: the negative control)"
    )
    retain_decode_graph_across_spec: bool = param(
        True,
        "keep the decode graph captured across speculative steps (off: the seed before its fix)",
        flag="--no-retain",
        tag="noretain",
    )
    max_recaptures: int = param(
        3,
        "invalidations before a slot falls back for good",
        rule=(lambda v: max_recaptures_problem(v) is None, "an integer >= 0"),
        tag="mr",
    )
    int4: bool = param(False, "int4 weights")
    engine: str = param("mtplab", "whose decoder (ort-genai: the onnxruntime-genai peer)", choices=ENGINES)
    rounds: int = param(
        3, f"paired greedy/speculative timed rounds (1..{MAX_ROUNDS}), timed after the untimed checked pass", rule=ROUNDS
    )
    threads: int = param(
        0,
        "ONNX Runtime intra-op threads per session (0: onnxruntime's default, every core; a sweep gives each "
        "point cores / workers)",
        rule=THREADS,
        tag="th",
    )

    def __post_init__(self) -> None:
        validate_run(self)
        if self.model not in ("", *PRESETS):  # a folder: absolute, so a point's notebook finds it from its own cwd
            object.__setattr__(self, "model", str(Path(self.model).resolve()))

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def model_spec(run) -> str:
    """What a run runs on: its `model` (a preset name or a folder), else its preset."""
    return run.model or run.preset


def model_fields(spec: str) -> dict:
    """The RunConfig fields that name a model: a preset name as `preset`, a folder as `model`."""
    return {"preset": spec} if spec in PRESETS else {"model": spec}


def model_name(spec: str) -> str:
    """A model's short name: the preset's, or the folder's."""
    return spec if spec in PRESETS else Path(spec).name


def fields(cls=RunConfig) -> tuple[dataclasses.Field, ...]:
    """The run parameters of a RunConfig(-like) dataclass: its fields that carry `param` metadata."""
    return tuple(f for f in dataclasses.fields(cls) if "help" in f.metadata)


def dimensions(cls=RunConfig) -> tuple[str, ...]:
    """The fields a grid spec may vary, in field order."""
    return tuple(f.name for f in fields(cls) if f.metadata["sweep"])


def defaults(cls=RunConfig) -> dict:
    return {f.name: f.default for f in fields(cls)}


def _field(name: str, cls=RunConfig) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def field_problem(name: str, values: list, cls=RunConfig) -> str | None:
    """What is wrong with these values of one RunConfig field, naming every bad one; None if all are fine."""
    meta = _field(name, cls).metadata
    if meta["choices"] is not None:
        choices = meta["choices"]
        bad = [v for v in values if not (isinstance(v, str) and v in choices)]
        rule = f"allowed values are {list(choices)}"
        shown = ", ".join(repr(v) for v in bad)
        return f"unknown {name} {shown}: {rule}" if bad else None
    accepts, rule = meta["rule"]
    bad = [v for v in values if not accepts(v)]
    return f"{name}={', '.join(repr(v) for v in bad)}: must be {rule}" if bad else None


def run_problems(values: dict, cls=RunConfig) -> list[str]:
    """Every problem with a RunConfig's field values (defaults for the missing ones), each naming the field."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        return [f"unknown RunConfig fields {unknown}"]
    cfg = defaults(cls) | values
    problems = [p for name, value in cfg.items() if (p := field_problem(name, [value], cls))]
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
    folder = cfg["model"] not in ("", *PRESETS)
    if cfg["model"] and cfg["preset"] != _field("preset", cls).default and cfg["preset"] != cfg["model"]:
        problems.append(
            f"preset={cfg['preset']!r} and model={cfg['model']!r}: give one (model takes a preset name or a folder)"
        )
    if folder and cfg["int4"]:
        problems.append(
            "int4=True with a model folder: int4 builds a preset's weights as int4; a folder's weights are as it was "
            "exported (the model builder's -p int4)"
        )
    if cfg["oracle_free_drafts"] and cfg["drafter"] != "oracle":
        problems.append(f"oracle_free_drafts=True belongs to the oracle drafter (got drafter={cfg['drafter']!r})")
    k = cfg["k"]
    if not folder and (problem := k_problem(k)):  # a folder's own limit is checked when it is opened
        problems.append(problem)
    spec = cfg["model"] or cfg["preset"]
    model = PRESETS.get(spec)  # a folder's capacity is checked when it is opened (engine.check_run_on_model)
    if model is not None and (
        problem := capacity_problem(cfg["prompt_len"], cfg["tokens"], k, model.max_seq_len, f"the {spec} model's max_seq_len")
    ):
        problems.append(problem)
    return problems


def naming_problem(given: dict) -> str | None:
    """Why the fields a user gave name the model twice (`preset` and `model` both given), or None.

    `preset` has a default, so RunConfig alone cannot tell a given preset from the default: the
    command line and grid specs call this with what was written.
    """
    if given.get("preset") is not None and given.get("model"):
        return (f"preset={given['preset']!r} and model={given['model']!r}: name the model once (model takes a "
                "preset name or a folder)")
    return None


def capacity_problem(prompt_len: int, tokens: int, k: int, capacity: int, what: str) -> str | None:
    """Why a run's prompt, tokens and verify headroom 2*(k+1) do not fit a KV capacity (`what` names it), or None."""
    headroom = 2 * (k + 1)
    if prompt_len + headroom >= capacity:
        return (
            f"prompt_len={prompt_len}: the prompt and 2*(k+1) = {headroom} tokens of verify headroom leave no room "
            f"for tokens in {what} {capacity}"
        )
    need = prompt_len + tokens + headroom
    if need > capacity:
        return (
            f"tokens={tokens}: prompt ({prompt_len}) + tokens + 2*(k+1) = {need} exceeds {what} {capacity} "
            f"(allowed: tokens <= {capacity - prompt_len - headroom})"
        )
    return None


def validate_run(cfg) -> None:
    """Every RunConfig check; errors say what was wrong and what is allowed (all of them, joined by '; ')."""
    problems = run_problems(dataclasses.asdict(cfg), type(cfg))
    if problems:
        raise ValueError("; ".join(problems))
