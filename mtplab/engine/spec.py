"""What an Engine is built for: its model and where it runs, the speculative strategies and their parameters, and
the executor's settings. mtplab.experiment.config.RunConfig validates every value of a run and builds the spec of
its engine (RunConfig.engine_spec()); the measurement's own fields (tokens, rounds, prompts) stay there."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mtplab.runtime.executor import Slot


@dataclass(frozen=True)
class EngineSpec:
    """One engine's configuration (the RunConfig fields of the same names say what each is and allows)."""

    model: str
    int4: bool
    backend: str
    threads: int
    k: int
    k_policy: str
    k_confidence: float
    drafter: str
    alpha: float
    oracle_free_drafts: bool
    seed: int
    commit: str
    schedule: str
    acceptance: str
    temperature: float
    top_k: int
    top_p: float
    sample_seed: int
    batch: int
    policy: str
    validate: bool
    retain_decode_graph_across_spec: bool
    max_recaptures: int
    verify_plans: str

    @property
    def plan_per_shape(self) -> frozenset:
        """The slots that keep a plan per input shape (Executor.plan_per_shape), on the target's executor and the
        head's alike: the Verify slot, one plan per M, unless verify_plans='one'."""
        return frozenset({Slot.VERIFY}) if self.verify_plans == "per-length" else frozenset()

    def verified(self, drafts: int) -> int:
        """The drafts a verify of `drafts` runs at (its M - 1): k where verify_plans='padded', else drafts."""
        return self.k if self.verify_plans == "padded" else drafts

    def replace(self, **changes) -> EngineSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def spec_fields() -> tuple[str, ...]:
    """The names of EngineSpec's fields, in order."""
    return tuple(f.name for f in dataclasses.fields(EngineSpec))
