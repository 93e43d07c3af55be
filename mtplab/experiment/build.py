"""The engine a point runs on: the run checked against its model before any session is made, an engine given held
to the run it was built for, and the greedy-only run of a reference engine."""

from __future__ import annotations

from mtplab.engine.engine import Engine
from mtplab.engine.fit import commits_on, spec_problems
from mtplab.engine.models import model_for
from mtplab.experiment.config import RunConfig
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
