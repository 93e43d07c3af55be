"""What a batch-1 point and a batch point share: what the run asks of its model, the check that an engine was built
for the run, and where a prediction's per-position acceptance comes from."""

from __future__ import annotations

from mtplab.engine.engine import Engine
from mtplab.engine.fit import commits_on, spec_problems
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.models import model_for
from mtplab.engine.strategies import DRAFTERS, SCHEDULES
from mtplab.experiment.config import RunConfig
from mtplab.measure import theory
from mtplab.model import Artifact
from mtplab.model.config import capacity_problem
from mtplab.model.prompts import run_prompt


def check_run_on_model(run: RunConfig, desc) -> None:
    """ValueError, before any session is made, if the run asks what the model cannot do: its engine's spec
    (mtplab.engine.fit), and its prompt and tokens within the model's KV capacity."""
    capacity = capacity_problem(len(run_prompt(run, desc.vocab_size)), run.tokens, run.k, desc.capacity,
                                f"{desc.name}'s KV capacity")
    if problems := spec_problems(run.engine_spec(), desc, strategies=run.engine == "mtplab", also=(capacity,)):
        raise ValueError("; ".join(problems))


def reference_run(run: RunConfig, desc) -> RunConfig:
    """The run of an engine that only decodes greedily (a reference for another engine): k=1 and a commit the
    model supports, whatever the run asks of its own engine."""
    supported, _ = commits_on(desc)
    commit = run.commit if run.commit in supported else (supported or [run.commit])[0]
    return run.replace(engine="mtplab", k=1, commit=commit)


def engine_for(run: RunConfig, artifact: Artifact | None, engine: Engine | None) -> Engine:
    """The engine a point runs on: the one given (refused when built for another run or model), else one built for
    the run; either way the run checked against its model first (check_run_on_model)."""
    if engine is not None:
        check_engine(run, engine, artifact)
        check_run_on_model(run, engine.desc)
        return engine
    artifact = artifact or model_for(run)
    check_run_on_model(run, artifact.description)
    return Engine(run, artifact)


def check_engine(run: RunConfig, engine: Engine, artifact: Artifact | None) -> None:
    """Refuse an engine built for another config (or model) than the run's: the result would misreport it."""
    have, want = engine.spec.to_dict(), run.engine_spec().to_dict()
    diff = {k: (have[k], v) for k, v in want.items() if have[k] != v}
    if diff or (artifact is not None and artifact.path != engine.art.path):
        detail = (
            f"differs in {diff} as (engine, run)" if diff else f"engine model {engine.art.path}, run {artifact.path}"
        )
        raise ValueError(f"the engine was built for another config than this run ({detail}): build one for this run")


def acceptance_alpha(run: RunConfig, calibration: dict, accepted: list[int] | None = None,
                     ks: list[int] | None = None) -> tuple[float | None, str]:
    """The per-position acceptance a prediction uses, and where it comes from (the run's drafter says; a sampled
    run's own, measured: the calibration measures greedy acceptance, and sampling accepts otherwise; ks: each step's
    drafts where a draft-length policy chose them)."""
    if run.temperature > 0:
        if not accepted:
            return None, "none (a sampled run's acceptance is its own, and it has no steps)"
        per_position = theory.measured_per_position(accepted, run.k, ks)
        return theory.fit_alpha(per_position), f"measured in the checked run (temperature {run.temperature:g})"
    source = DRAFTERS.get(run.drafter).acceptance
    if source == "setting":
        return run.alpha, "oracle setting"
    if source == "calibration":
        return calibration["mtp_acceptance"]["alpha"], "acceptance calibration"
    return None, f"none (the {run.drafter} drafter's acceptance is neither set nor calibrated)"


def step_costs(run: RunConfig, calibration: dict) -> StepCosts:
    """What a draft-length policy prices a step at K (1..k) with: the calibration's decode, draft and verify at K and
    its commit of n tokens (ValueError where it did not measure k + 1 tokens)."""
    if not theory.covers(calibration, run.k, run.commit):
        raise ValueError(f"k_policy={run.k_policy!r} prices steps of up to k={run.k} drafts, beyond what the "
                         f"calibration measured (its verify sizes {sorted(int(m) for m in calibration['target'])}): "
                         "give a smaller k, or k_policy='fixed'")
    commits = {int(m): float(s) for m, s in calibration["commit"][run.commit].items()}
    verified = run.k if run.verify_plans == "padded" else None  # a padded verify costs k + 1 tokens whatever K drafts
    return StepCosts({j: theory.step_seconds(j, run.schedule, run.commit, calibration, verified)
                      for j in range(1, run.k + 1)},
                     commits, SCHEDULES.get(run.schedule).extra_tokens)


def commit_memory(engine) -> dict:
    """What the run's commit holds beyond what every commit does: per-position's states, written by each verify."""
    from mtplab.model.per_position import states_bytes

    io = engine.desc.target
    if not io.position_states:
        return {}
    layers = len(io.position_states)
    return {"per_position": {"states_per_verify": engine.spec.k, "layers": layers,
                             "state_bytes": states_bytes(engine.desc, 1) // layers,  # one layer's, one row's
                             "bytes": states_bytes(engine.desc, engine.spec.k, engine.batch)}}
