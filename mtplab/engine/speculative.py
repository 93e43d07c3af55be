"""Speculative decoding on an Engine: the run's drafter, the prefill, then one schedule step at a time until there
are n tokens. Each step (draft, verify on Slot.VERIFY, accept, commit) is the schedule's short function
(mtplab.engine.schedules) over the Engine's public step parts."""

from __future__ import annotations

import time
from collections.abc import Callable

from mtplab.engine.drafters import Drafter
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.schedules import Phases
from mtplab.engine.strategies import DRAFTERS, K_POLICIES, SCHEDULES
from mtplab.model.description import beyond_capacity


def drafter_for(engine, reference: list[int] | None) -> Drafter:
    """The run's drafter (its registered kind builds it; the oracle drafts from the greedy reference)."""
    run = engine.spec
    kind = DRAFTERS.get(run.drafter)
    if kind.reads_reference(run) and reference is None:
        raise ValueError(f"the {kind.name} drafter needs the greedy reference tokens")
    return kind.build(engine, reference)


def k_chooser(engine):
    """The run's draft-length chooser for one generation (mtplab.engine.k_policies); a policy that prices steps reads
    engine.k_costs (the point runner sets them from the calibration)."""
    policy = K_POLICIES.get(engine.spec.k_policy)
    costs: StepCosts | None = engine.k_costs
    if policy.needs_costs and costs is None:
        raise ValueError(f"k_policy={policy.name!r} prices each step's K with the cost-model calibration: run it "
                         "through run_point or `mtplab run` (which load it), or set engine.k_costs "
                         "(mtplab.engine.k_policies.StepCosts)")
    return policy.make(engine.spec, costs)


def check_reference(engine, reference: list[int] | None, n: int) -> None:
    """A reference-reading drafter reads up to k + 1 tokens past the n a run makes (its last step's drafts)."""
    run, need = engine.spec, n + engine.k + 1
    if DRAFTERS.get(run.drafter).reads_reference(run) and reference is not None and len(reference) < need:
        raise ValueError(f"the {run.drafter} drafter drafts from the greedy reference: a run of {n} tokens "
                         f"at k={engine.k} needs its first {need} tokens (n + k + 1), got {len(reference)}")


def generate(engine, prompt: list[int], n: int, reference: list[int] | None = None,
             on_commit: Callable | None = None) -> dict:
    """Speculative decoding until at least n tokens: tokens, seconds, accepted counts and drafts per step ("k": what
    the draft-length policy chose, or fewer where the drafter stopped early), the phases' time split and when the
    timed window opened.

    on_commit(step, length, emitted), when given, is called after every commit (the checked pass compares the
    committed state there; timed runs pass nothing).
    """
    check_reference(engine, reference, n)
    if len(prompt) + n + engine.k > engine.desc.capacity:  # its last verify's reach, at most (the head's is less)
        raise beyond_capacity(len(prompt) + n + engine.k, engine.desc.capacity)
    drafter = drafter_for(engine, reference)
    chooser = engine.k_chooser = k_chooser(engine)
    if chooser.stop is not None:
        drafter.stop = chooser.stop
    out = engine.start(prompt)
    emitted = [int(engine.device.read(engine.acceptance.token(engine.xp, out["logits"][0, -1])))]
    engine.prompt, engine.emitted = list(prompt), emitted
    drafter.prefill(prompt[1:] + emitted, out["hidden"][0])
    engine.last_hidden[...] = out["hidden"][0, -1]
    engine.setup_done()  # the head's prefill is untimed setup too
    step, phases = SCHEDULES.get(engine.spec.schedule).step, Phases()
    accepted: list[int] = []
    ks: list[int] = []
    t_start = time.perf_counter()
    while len(emitted) < n:
        accepted.append(step(engine, emitted, drafter, phases))
        ks.append(engine.last_k)
        if on_commit is not None:
            on_commit(len(accepted), engine.state.length, emitted)
    seconds = time.perf_counter() - t_start
    return {"tokens": emitted, "seconds": seconds, "accepted": accepted, "k": ks, "split": phases.seconds,
            "started": t_start}
