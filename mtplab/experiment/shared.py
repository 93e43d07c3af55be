"""What a batch-1 point and a batch point share: the check that an engine was built for the run, and where a
prediction's per-position acceptance comes from."""

from __future__ import annotations

from mtplab.engine.engine import Engine
from mtplab.engine.strategies import DRAFTERS
from mtplab.experiment import config
from mtplab.experiment.config import RunConfig
from mtplab.measure import theory
from mtplab.model import Artifact


def check_engine(run: RunConfig, engine: Engine, artifact: Artifact | None) -> None:
    """Refuse an engine built for another config (or model) than the run's: the result would misreport it."""
    have, want = engine.run_cfg.to_dict(), run.to_dict()
    per_run = {f.name for f in config.fields() if f.metadata["per_run"]}  # only the run's length may differ
    diff = {k: (have[k], v) for k, v in want.items() if k not in per_run and have[k] != v}
    if diff or (artifact is not None and artifact.path != engine.art.path):
        detail = (
            f"differs in {diff} as (engine, run)" if diff else f"engine model {engine.art.path}, run {artifact.path}"
        )
        raise ValueError(f"the engine was built for another config than this run ({detail}): build one for this run")


def acceptance_alpha(run: RunConfig, calibration: dict, accepted: list[int] | None = None) -> tuple[float | None, str]:
    """The per-position acceptance a prediction uses, and where it comes from (the run's drafter says; a sampled
    run's own, measured: the calibration measures greedy acceptance, and sampling accepts otherwise)."""
    if run.temperature > 0:
        if not accepted:
            return None, "none (a sampled run's acceptance is its own, and it has no steps)"
        per_position = theory.measured_per_position(accepted, run.k)
        return theory.fit_alpha(per_position), f"measured in the checked run (temperature {run.temperature:g})"
    source = DRAFTERS.get(run.drafter).acceptance
    if source == "setting":
        return run.alpha, "oracle setting"
    if source == "calibration":
        return calibration["mtp_acceptance"]["alpha"], "acceptance calibration"
    return None, f"none (the {run.drafter} drafter's acceptance is neither set nor calibrated)"
