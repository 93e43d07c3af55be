"""Run configuration: one frozen dataclass, the single source of every run parameter, validated once, before any work.

Each field carries its metadata (`param`): its group (the model, decoding, the executor,
measurement), help text, choices or rule, whether a sweep may vary it, how it shows in a point id,
and its command-line form. The `mtplab run` options (`mtplab.cli.main`), the sweep's dimensions and
point ids (`mtplab.sweep.grid`), the report's parameter tables and the parameters of
notebooks/run_point.ipynb are derived from the fields, so a new field appears in all of them. The
strategy fields (commit, drafter, schedule, acceptance) take the names registered in
`mtplab.engine.strategies`; a drafter's own parameters (the oracle's alpha), set away from their defaults,
are refused with any other drafter (the command line and grids refuse them given at all).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mtplab.engine.fit import acceptance_problem
from mtplab.engine.sampling import FIELDS as SAMPLING_FIELDS
from mtplab.engine.spec import EngineSpec, spec_fields
from mtplab.engine.strategies import ACCEPTANCE, COMMITS, DRAFTERS, K_POLICIES, SCHEDULES
from mtplab.experiment.combinations import batch_problems, k_policy_problems, rounds_problems, sampling_problems
from mtplab.experiment.params import (
    ALPHA,
    AUTO_ROUNDS,
    BACKENDS,
    ENGINES,
    GENAI_MAX_DRAFTS,
    INTEGER_0,
    INTEGER_1,
    INTEGER_2,
    MAX_ROUNDS,
    MODEL_RULE,
    NON_NEGATIVE,
    PROMPT_SET,
    ROUNDS,
    ROUNDS_BUDGET,
    ROUNDS_TARGET,
    THREADS,
    TOP_P,
    UNIT_INTERVAL,
    VERIFY_PLANS,
    integer,
    param,
)
from mtplab.model.config import MAX_TRANSITION_CAPACITY, PRESETS, capacity_problem, k_problem, preset_name
from mtplab.model.folders import model_folder, shipped_models
from mtplab.model.prompts import prompt_problem
from mtplab.runtime.executor import max_recaptures_problem
from mtplab.runtime.policy import POLICIES


def model_name(spec: str, int4: bool = False) -> str:
    """A model's short name: the preset's ("tiny", "tiny-int4" with int4 weights: another model, timed and
    calibrated apart), or the folder's."""
    return preset_name(spec, int4) if spec in PRESETS else Path(spec).name


def _drafter_id(value, values: dict) -> str:
    return DRAFTERS.get(value).id_part(values)


@dataclass(frozen=True)
class RunConfig:
    """One experiment point: greedy baseline + speculative run on one model."""

    # -- the model
    model: str = param(
        "small",
        f"the model: a preset name ({', '.join(PRESETS)}), a shipped model ({', '.join(shipped_models()) or 'none'}), or "
        "a folder the onnxruntime-genai model builder wrote (or an mtplab artifact)",
        group="model", rule=MODEL_RULE, aliases=("--preset",), id=("body", 0, lambda v, values: model_name(v)),
    )
    int4: bool = param(False, "int4 weights", group="model", id=("tail", 0, None))
    backend: str = param("cpu", "where the graphs run", group="model", choices=BACKENDS, id=("head", 0, "{}"))
    engine: str = param("mtplab", "whose decoder (ort-genai: the onnxruntime-genai peer)", group="model",
                        choices=ENGINES, id=("head", 1, "{}"))
    # -- decoding
    k: int = param(3, f"drafts per step (the built-in model: 1..{MAX_TRANSITION_CAPACITY - 1})", group="decoding",
                   rule=(integer(1), f"an integer >= 1 (1..{MAX_TRANSITION_CAPACITY - 1} for the presets; a folder "
                                      "states its own limit)"), id=("body", 1, "k{}"))
    k_policy: str = param("fixed", "draft-length policy: how many drafts each step makes, at most k "
                          "(mtplab.engine.k_policies)", group="decoding", choices=K_POLICIES.names, tag="kp-",
                          id=("tail", 16, None))
    k_confidence: float = param(0.4, "k_policy='confidence': drafting stops after a draft whose top probability is "
                                "below this, in [0, 1]", group="decoding", rule=UNIT_INTERVAL, tag="kc",
                                id=("tail", 17, None))
    drafter: str = param("mtp", "who drafts", group="decoding", choices=DRAFTERS.names, id=("body", 2, _drafter_id))
    alpha: float | tuple[float, ...] = param(
        0.8, "oracle drafter acceptance per position, in [0, 1] (the oracle's parameter; at temperature > 0 the "
             "weight of the target's own distribution in its draft mixture); at batch B a list of B values sets each "
             "row's own (0.9,0.9,0.9,0.3)", group="decoding",
        rule=ALPHA, cli_unset=True, id=("none", 0, None),
    )
    oracle_free_drafts: bool = param(False, "oracle drafter skips the MTP head (the oracle's parameter)",
                                     group="decoding", tag="free", id=("tail", 2, None))
    commit: str = param("select", "commit strategy", group="decoding", choices=COMMITS.names, id=("body", 4, "{}"))
    schedule: str = param("decode-verify", "step schedule", group="decoding", choices=SCHEDULES.names,
                          id=("body", 5, "{}"))
    acceptance: str = param("greedy-match", "acceptance rule", group="decoding", choices=ACCEPTANCE.names,
                            tag="acc-", id=("tail", 8, None))
    temperature: float = param(0.0, "sampling temperature (0: greedy decoding; > 0 samples, with "
                               "acceptance='rejection-sampling', which a command line or grid naming none gets)", group="decoding", rule=NON_NEGATIVE, tag="T",
                               id=("tail", 9, None))
    top_k: int = param(0, "sample among the top_k most likely tokens only (0: off)", group="decoding", rule=INTEGER_0,
                       tag="topk", id=("tail", 10, None))
    top_p: float = param(1.0, "sample among the fewest most likely tokens holding this mass (1: off)",
                         group="decoding", rule=TOP_P, tag="topp", id=("tail", 11, None))
    sample_seed: int = param(0, "the sampling generator's seed, an integer >= 0 (the same seed, the same tokens)",
                             group="decoding", rule=INTEGER_0, tag="ss", id=("tail", 12, None))
    batch: int = param(1, "sequences decoded together, B >= 1 (row b's prompt has seed + b): greedy at [B, 1]; a "
                       "speculative step verifies [B, k+1] in one forward, each row with its own acceptance and commit",
                       group="decoding", rule=INTEGER_1, tag="b", id=("tail", 15, None))
    # -- the executor
    policy: str = param("sibling-pinned", "arena policy", group="executor", choices=tuple(POLICIES),
                        id=("body", 3, "{}"))
    validate: bool = param(True, "check each plan's binding signature before replay (off: the negative control)",
                           group="executor", id=("tail", 4, None))
    retain_decode_graph_across_spec: bool = param(
        True, "keep the decode graph captured across speculative steps (off: the seed before its fix)",
        group="executor", flag="--no-retain", tag="noretain", id=("tail", 5, None),
    )
    max_recaptures: int = param(
        3, "invalidations in a generation before a slot's plan falls back for good (each M's plan where the Verify slot "
           "keeps one per M)", group="executor",
        rule=(lambda v: max_recaptures_problem(v) is None, "an integer >= 0"), tag="mr", id=("tail", 6, None),
    )
    verify_plans: str = param(
        "per-length", "the Verify slot's plans: per-length (one per M, each captured once: a K that changes from step "
        "to step replays them all), one (a changed M invalidates it: the thrash CUDA-graph engines report) or padded "
        "(one plan at M = k + 1: a step with fewer drafts pads them, and only its own are judged)",
        group="executor", choices=VERIFY_PLANS, tag="vp-", id=("tail", 18, None),
    )
    # -- measurement
    tokens: int = param(128, "tokens to generate (>= 2: the prefill makes the first, the timed decodes the rest)",
                        group="measurement", rule=INTEGER_2, id=("body", 6, "t{}"),
                        per_run=True)
    prompt_len: int = param(8, "prompt tokens", group="measurement", rule=INTEGER_1, tag="p", id=("tail", 3, None),
                            per_run=True)
    seed: int = param(0, "prompt seed, an integer >= 0", group="measurement", rule=INTEGER_0, id=("body", 7, "s{}"))
    prompts: str = param("", "a prompt set of the model's folder (its prompts.json: held-out text by kind, e.g. "
                         "models/pycode's code, docstrings, comments, data), its row seed % its size; empty: prompt_len "
                         "random tokens from the seed", group="measurement", rule=PROMPT_SET, tag="prompts-",
                         id=("tail", 4, None))
    context: int = param(0, "with a prompt set: the last `context` tokens of its row, which ends where the text to "
                         "continue begins (0: the whole row; models/pycode's `context` set holds 1024 a row, for "
                         "acceptance by context length)", group="measurement", rule=INTEGER_0, tag="ctx",
                         id=("tail", 5, None), per_run=True)
    rounds: int | str = param(
        3, f"paired greedy/speculative timed rounds (1..{MAX_ROUNDS}), timed after the untimed checked pass; 'auto': "
           "5 rounds, then more until the speedup's 95% interval half-width is within rounds_target of its centre, "
           "or until rounds_budget runs out, or 200 rounds",
        group="measurement", rule=ROUNDS, id=("tail", 1, "n{}"),
    )
    rounds_target: float = param(0.03, "rounds 'auto': the speedup CI half-width to reach, a share of the median",
                                 group="measurement", rule=ROUNDS_TARGET, tag="rt", id=("tail", 13, None))
    rounds_budget: float = param(60.0, "rounds 'auto': seconds of timed rounds a point may spend to reach its target",
                                 group="measurement", rule=ROUNDS_BUDGET, tag="rb", id=("tail", 14, None))
    threads: int = param(
        0,
        "ONNX Runtime intra-op threads per session (0: onnxruntime's default, every core; a sweep gives each "
        "point cores / workers)",
        group="measurement", rule=THREADS, tag="th", id=("tail", 7, None),
    )

    def __post_init__(self) -> None:
        if isinstance(self.alpha, list):  # a list of one alpha per row: a tuple, as the frozen config holds values
            object.__setattr__(self, "alpha", tuple(self.alpha))
        validate_run(self)
        if self.model not in PRESETS:  # a folder: absolute, so a point's notebook finds it from its own cwd
            object.__setattr__(self, "model", str(model_folder(self.model).resolve()))

    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        """A RunConfig from stored fields (a result.json's config, a notebook's `point`), older names read too."""
        return cls(**upgrade(values))

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def engine_spec(self) -> EngineSpec:
        """The spec of the engine this run decodes on (its engine's fields; the measurement's stay here)."""
        return EngineSpec(**{name: getattr(self, name) for name in spec_fields()})

    def group(self, name: str) -> dict:
        """The fields of one group (GROUPS), by name."""
        return {f.name: getattr(self, f.name) for f in fields() if f.metadata["group"] == name}


def upgrade(values: dict) -> dict:
    """Stored RunConfig fields in today's names, in their order: an older `preset` becomes `model` where `model` is
    empty or absent, and is dropped where `model` names the model."""
    if "preset" not in values:
        return dict(values)
    named = bool(values.get("model"))
    return {("model" if k == "preset" else k): v for k, v in values.items()
            if k != ("preset" if named else "model")}


def fields() -> tuple[dataclasses.Field, ...]:
    """The run parameters: RunConfig's fields, each with its `param` metadata."""
    return dataclasses.fields(RunConfig)


def dimensions() -> tuple[str, ...]:
    """The fields a grid spec may vary, in field order."""
    return tuple(f.name for f in fields() if f.metadata["sweep"])


def defaults() -> dict:
    return {f.name: f.default for f in fields()}


SAMPLED_ACCEPTANCE = "rejection-sampling"  # the acceptance rule a temperature > 0 implies, unless one is named


def with_implied_acceptance(values: dict) -> dict:
    """`values` with the acceptance rule their temperature implies where they name none: at temperature > 0,
    rejection sampling (the lossless rule for sampled decoding); at 0 the default, greedy match. A command line
    and a grid give their values through here; a RunConfig built directly takes what it is given."""
    t = values.get("temperature", 0)
    if "acceptance" in values or isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        return values
    return values | {"acceptance": SAMPLED_ACCEPTANCE}


def choices(f: dataclasses.Field) -> tuple | None:
    """A field's allowed values (a strategy field's: the names registered now), or None for a rule."""
    c = f.metadata["choices"]
    return tuple(c()) if callable(c) else c


def _field(name: str) -> dataclasses.Field:
    return {f.name: f for f in fields()}[name]


def field_problem(name: str, values: list) -> str | None:
    """What is wrong with these values of one RunConfig field, naming every bad one; None if all are fine."""
    f = _field(name)
    allowed = choices(f)
    if allowed is not None:
        bad = [v for v in values if not (isinstance(v, str) and v in allowed)]
        shown = ", ".join(repr(v) for v in bad)
        return f"unknown {name} {shown}: allowed values are {list(allowed)}" if bad else None
    accepts, rule = f.metadata["rule"]
    bad = [v for v in values if not accepts(v)]
    return f"{name}={', '.join(repr(v) for v in bad)}: must be {rule}" if bad else None


def drafter_params() -> dict[str, list[str]]:
    """Each drafter parameter (a RunConfig field) and the registered drafters that take it."""
    out: dict[str, list[str]] = {}
    for kind in DRAFTERS.values():
        for p in kind.params:
            out.setdefault(p, []).append(kind.name)
    return out


def drafter_param_problems(drafter: str, given: dict) -> list[str]:
    """A drafter parameter given (explicitly: on the command line, in a grid entry) to a drafter that does not take it."""
    out = []
    for name, takers in drafter_params().items():
        if name in given and given[name] is not None and drafter not in takers:
            out.append(f"{name}={given[name]!r} with drafter={drafter!r}: {name} belongs to the "
                       f"{' and '.join(takers)} drafter{'s' if len(takers) > 1 else ''} (drop it, or use "
                       f"drafter={takers[0]!r})")
    return out


# mtplab's own engine's settings: onnxruntime-genai's MtpGenerator (engine='ort-genai') runs its own decoder
ENGINE_ONLY = ("policy", "commit", "schedule", "validate", "retain_decode_graph_across_spec", "max_recaptures",
               "k_policy", "k_confidence", "verify_plans")


def engine_param_problems(engine: str, given: dict, spell=lambda name, value: f"{name}={value!r}") -> list[str]:
    """Settings of mtplab's own engine given (explicitly: on the command line, in a grid entry) with
    engine='ort-genai', which runs none of them: its points would differ in a label only. spell(name, value): how
    the caller writes an option."""
    named = [spell(n, given[n]) for n in ENGINE_ONLY if given.get(n) is not None]
    if engine != "ort-genai" or not named:
        return []
    return [f"{', '.join(named)} with engine='ort-genai': onnxruntime-genai's MtpGenerator runs its own decoder, none "
            f"of mtplab's {', '.join(ENGINE_ONLY)} (drop {'it' if len(named) == 1 else 'them'}, or use engine='mtplab')"]


def run_problems(values: dict) -> list[str]:
    """Every problem with a RunConfig's field values (defaults for the missing ones), each naming the field."""
    unknown = sorted(set(values) - {f.name for f in fields()})
    if unknown:
        return [f"unknown RunConfig fields {unknown} (the fields are {[f.name for f in fields()]})"]
    cfg = defaults() | values
    bad = {name: p for name, value in cfg.items() if (p := field_problem(name, [value]))}
    # a commit a backend cannot run, named beside the backend's own problem (a backend this machine lacks is valid)
    refused = COMMITS.get(cfg["commit"]).backend_refusal(cfg["backend"]) if (
        cfg["commit"] in COMMITS.names() and cfg["backend"] in BACKENDS) else None
    backend_refused = [refused] if refused else []
    if bad:  # the checks across fields need valid fields: those whose fields are all valid still run
        problems = list(bad.values())
        if not bad.keys() & {*SAMPLING_FIELDS, "acceptance", "drafter"}:
            problems += sampling_problems(cfg, defaults())
        if not bad.keys() & {"rounds", *AUTO_ROUNDS}:
            problems += rounds_problems(cfg, defaults())
        if not bad.keys() & {"k", "model"} and (k_refused := _preset_k_problem(cfg)):
            problems.append(k_refused)
        return problems + backend_refused
    problems = []
    if cfg["engine"] == "ort-genai" and (not DRAFTERS.get(cfg["drafter"]).peer or cfg["backend"] != "cpu"):
        peers = [d.name for d in DRAFTERS.values() if d.peer]
        problems.append(
            f"engine='ort-genai' runs the real MTP head on the CPU: needs drafter in {peers} and backend='cpu' "
            f"(got drafter={cfg['drafter']!r}, backend={cfg['backend']!r})"
        )
    if cfg["engine"] == "ort-genai" and cfg["k"] > GENAI_MAX_DRAFTS:
        problems.append(f"k={cfg['k']} with engine='ort-genai': its MtpGenerator drafts at most {GENAI_MAX_DRAFTS} tokens "
                        "a step (speculative.max_draft_tokens)")
    problems += sampling_problems(cfg, defaults())
    problems += rounds_problems(cfg, defaults())
    problems += batch_problems(cfg, defaults())
    if why := acceptance_problem(cfg["acceptance"], cfg["batch"]):  # its form, and at batch > 1 its rows
        problems.append(why)
    problems += k_policy_problems(cfg, defaults())
    problems += backend_refused
    commit = COMMITS.get(cfg["commit"])
    if not cfg["validate"] and commit.primary_multi_token and cfg["policy"] != "shared-jit":
        others = [c.name for c in COMMITS.values() if not c.primary_multi_token]
        problems.append(
            f"validate=False with commit={commit.name!r}: its commits run M=n on the Primary slot, and "
            "without the signature check the captured M=1 plan would replay with M=n inputs, which ONNX Runtime's "
            "GroupQueryAttention rejects rather than computing a wrong result; run the negative control with "
            f"commit in {others}"
        )
    # A drafter's parameters, set away from their defaults, belong to it.
    problems += drafter_param_problems(
        cfg["drafter"], {n: cfg[n] for n in drafter_params() if cfg[n] != _field(n).default}
    )
    folder = cfg["model"] not in PRESETS
    if folder and cfg["int4"]:
        problems.append(
            "int4=True with a model folder: int4 builds a preset's weights as int4; a folder's weights are as it was "
            "exported (the model builder's -p int4)"
        )
    if cfg["prompts"] and (problem := prompt_problem(cfg["model"], cfg["prompts"], cfg["context"])):
        problems.append(problem)
    if cfg["context"] and not cfg["prompts"]:
        problems.append(f"context={cfg['context']}: it cuts a prompt set's rows, so it needs prompts (a set of the "
                        "model's folder, e.g. pycode's context); random-token prompts take prompt_len instead")
    k = cfg["k"]
    k_refused = _preset_k_problem(cfg)
    if k_refused:
        problems.append(k_refused)
    model = PRESETS.get(cfg["model"])  # a folder's capacity is checked when it is opened (mtplab.engine.fit.check_run_on_model)
    if model is not None and not k_refused and (  # a k the model refuses sets no limit on the tokens worth naming
        problem := capacity_problem(cfg["prompt_len"], cfg["tokens"], k, model.max_seq_len,
                                    f"the {cfg['model']} model's max_seq_len")
    ):
        problems.append(problem)
    return problems


def _preset_k_problem(cfg: dict) -> str | None:
    """Why a preset cannot verify k drafts, or None (a folder's own limit is checked when it is opened)."""
    return None if cfg["model"] not in PRESETS else k_problem(cfg["k"])


class ConfigError(ValueError):
    """A RunConfig refused: every problem (`problems`), each saying what was wrong and what is allowed."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def validate_run(cfg) -> None:
    """Every RunConfig check, once (RunConfig.__post_init__); ConfigError names all the problems."""
    problems = run_problems(dataclasses.asdict(cfg))
    if problems:
        raise ConfigError(problems)
