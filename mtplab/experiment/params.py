"""What a RunConfig field is: `param` declares it with its metadata, and the rules its values are held to (a rule:
(accepts(value) -> bool, what is allowed, in words))."""

from __future__ import annotations

import dataclasses
import os

from mtplab.model.config import PRESETS
from mtplab.model.folders import model_folder, shipped_models

BACKENDS = ("cpu", "cuda")
ENGINES = ("mtplab", "ort-genai")
VERIFY_PLANS = ("per-length", "one", "padded")  # the Verify slot: a plan per M, one plan, or one plan at M = k + 1
GENAI_MAX_DRAFTS = 16  # onnxruntime-genai's bound on speculative.max_draft_tokens (it refuses more when the run starts)
GROUPS = ("model", "decoding", "executor", "measurement")


INT64_MAX = 2**63 - 1  # a results table's integer columns are 64-bit: a larger value could never be collected


def integer(lo: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= INT64_MAX


def _boolean(v) -> bool:
    return isinstance(v, bool)


INTEGER_1 = (integer(1), "an integer >= 1 (at most 2**63 - 1)")
INTEGER_0 = (integer(0), "an integer >= 0 (at most 2**63 - 1)")
INTEGER_2 = (integer(2), "an integer >= 2 (at most 2**63 - 1)")
BOOLEAN = (_boolean, "true or false (a boolean)")
def _number(within):
    """A rule's test: a real number (not a boolean) that `within` accepts (NaN never is)."""
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and within(v)


UNIT_INTERVAL = (_number(lambda v: 0.0 <= v <= 1.0), "within [0, 1], a number")
_unit = _number(lambda v: 0.0 <= v <= 1.0)
# the oracle's alpha: one for every row, or a list of one per batch row
ALPHA = (lambda v: _unit(v) or (isinstance(v, (list, tuple)) and len(v) > 0 and all(map(_unit, v))),
         "within [0, 1], a number (or, for `mtplab run` and run_point at batch B, a list of B such numbers, one per "
         "row)")


NON_NEGATIVE = (_number(lambda v: 0.0 <= v < float("inf")), "a number >= 0")
TOP_P = (_number(lambda v: 0.0 < v <= 1.0), "within (0, 1], a number")


MAX_ROUNDS = 1000
THREADS_PER_CORE = 4  # intra-op threads a run may ask for, per core of this machine


def _cores() -> int:
    return os.cpu_count() or 1


ROUNDS = (lambda v: v == "auto" or (integer(1)(v) and v <= MAX_ROUNDS), f"an integer in 1..{MAX_ROUNDS}, or 'auto'")
AUTO_ROUNDS = ("rounds_target", "rounds_budget")  # the fields that size rounds='auto' (and nothing else)
ROUNDS_TARGET = (_number(lambda v: 0.0 < v < 1.0), "within (0, 1), a number (0.03: within 3% of the speedup)")
ROUNDS_BUDGET = (_number(lambda v: 0.0 < v < float("inf")), "a number of seconds > 0")
THREADS = (
    lambda v: integer(0)(v) and v <= THREADS_PER_CORE * _cores(),
    f"an integer in 0..{THREADS_PER_CORE * _cores()} (0: onnxruntime's default; at most {THREADS_PER_CORE} per core "
    f"of this machine's {_cores()})",
)


def param(
    default,
    help: str,
    *,
    group: str,
    choices=None,
    rule: tuple | None = None,
    sweep: bool = True,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    cli_unset: bool = False,
    tag: str | None = None,
    id: tuple | None = None,
    per_run: bool = False,
):
    """A RunConfig field with its metadata.

    group: one of GROUPS (the command line's option groups, the report's parameter table);
    help: the one help text (the command line, the notebook and the docs read it);
    choices: the allowed values (a tuple, or a registry's `names` for a strategy), or rule:
    (accepts(value) -> bool, what is allowed);
    sweep: whether a grid spec may vary it (a dimension);
    flag: the command-line option when not `--name-with-dashes` (booleans: `--name` turns on a
    field defaulting False; a field defaulting True gets `--no-...`); aliases: older option names;
    cli_unset: the option has no default on the command line (given or not is told apart);
    id: where a point id names it: ("head" | "body" | "tail", rank, form), form a format string for
    the canonical value or a function (value, all values) -> text; None for a field its drafter names
    ("none"); default ("tail", 100, None): tag + the value when not the default (a boolean: the tag alone;
    tag defaults to the field's name, `no` + the name for a boolean defaulting True). Head and tail
    parts show only values other than the default; body parts always show.
    per_run: a supplied Engine may run it with another value (the run's length).
    """
    assert group in GROUPS, group
    if rule is None and choices is None:
        rule = BOOLEAN if isinstance(default, bool) else None
    meta = {
        "group": group,
        "help": help,
        "choices": choices,
        "rule": rule,
        "sweep": sweep,
        "flag": flag,
        "aliases": aliases,
        "cli_unset": cli_unset,
        "tag": tag,
        "id": ("tail", 100, None) if id is None else id,
        "per_run": per_run,
    }
    return dataclasses.field(default=default, metadata=meta)


def _model_ok(v) -> bool:
    if not isinstance(v, str):
        return False
    if v in PRESETS:
        return True
    folder = model_folder(v)
    return (folder / "genai_config.json").is_file() or (folder / "manifest.json").is_file()


PROMPT_SET = (lambda v: isinstance(v, str) and (v == "" or v.replace("-", "").replace("_", "").isalnum()),
              "a prompt set's name (letters, digits, - and _), or empty")

MODEL_RULE = (
    _model_ok,
    f"a preset name {list(PRESETS)}, a shipped model {shipped_models()}, or a folder holding genai_config.json "
    "(onnxruntime-genai builder output) or manifest.json (an mtplab artifact)",
)
