"""One experiment point: the greedy baseline and a speculative run in one process, checked and measured."""

from __future__ import annotations

import numpy as np

from . import lossless, oracle, theory
from .config import RunConfig
from .engine import Engine, prompt_tokens
from .env import environment
from .executor import Slot
from .model import Artifact
from .result import RunResult


def _diff(after: dict, before: dict) -> dict:
    return {slot: {k: v - before.get(slot, {}).get(k, 0) for k, v in c.items()} for slot, c in after.items()}


def _counters(engine: Engine) -> dict:
    return engine.target.counters() | engine.mtp.counters()


def run_point(run: RunConfig, artifact: Artifact | None = None, engine: Engine | None = None) -> RunResult:
    """One point on the engine the config names: mtplab's own, or the onnxruntime-genai peer."""
    if run.engine == "ort-genai":
        from .peer import run_peer_point

        return run_peer_point(run, artifact)
    return run_mtplab_point(run, artifact, engine)


# A supplied engine runs its own config; only the run's length may differ from it.
PER_RUN_FIELDS = ("tokens", "prompt_len")


def check_engine(run: RunConfig, engine: Engine, artifact: Artifact | None) -> None:
    """Refuse an engine built for another config (or model) than the run's: the result would misreport it."""
    have, want = engine.run_cfg.to_dict(), run.to_dict()
    diff = {k: (have[k], v) for k, v in want.items() if k not in PER_RUN_FIELDS and have[k] != v}
    if diff or (artifact is not None and artifact.path != engine.art.path):
        detail = (
            f"differs in {diff} as (engine, run)" if diff else f"engine model {engine.art.path}, run {artifact.path}"
        )
        raise ValueError(f"the engine was built for another config than this run ({detail}): build one for this run")


def run_mtplab_point(run: RunConfig, artifact: Artifact | None = None, engine: Engine | None = None) -> RunResult:
    """The lossless check, then greedy, speculative and greedy again, timed, in one RunResult.

    The checked pass (untimed) runs first and warms every plan up; its counters are the point's
    slot counters. The greedy baseline is measured before and after the timed speculative run and
    pooled, so drift over the point cancels out of the speedup.
    """
    if engine is not None:
        check_engine(run, engine, artifact)
    engine = engine or Engine(run, artifact)
    cfg, k, n = engine.cfg, run.k, run.tokens
    prompt = prompt_tokens(cfg.vocab_size, run.prompt_len, run.seed)
    # Untimed first: the greedy reference and the checked speculative run (it also warms every plan up).
    mark: dict = {}

    def after_reference() -> None:
        mark.update(slots=_counters(engine), forwards=dict(engine.forwards))

    reference, _, identity = lossless.checked_pass(engine, prompt, n, after_reference)
    greedy_slots = mark["slots"]
    slots = _diff(_counters(engine), greedy_slots)
    forwards = {key: v - mark["forwards"].get(key, 0) for key, v in engine.forwards.items()}
    forwards = {key: v for key, v in forwards.items() if v}
    # Timed: greedy, speculative, greedy again; they do only what the decoders they measure do.
    greedy = engine.greedy(prompt, n + k + 1)
    timed_before = _counters(engine)
    spec = engine.speculative(prompt, n, reference=reference.tokens)
    timed_slots = _diff(_counters(engine), timed_before)
    tokens = spec["tokens"][:n]
    timed = oracle.token_identity(tokens, reference.tokens[:n], reference.margins)
    if identity["token_identical"] and not timed["token_identical"]:
        identity |= timed | {"diverged_in": "timed run"}
    ok, verdict = oracle.verdict(identity, run.commit, cfg.dtype)
    if not ok:
        oracle.shout(verdict)
    # Greedy again after the speculative run (A B A): the baseline brackets the measurement.
    # (After the identity check: it resets the engine's state.)
    primary = engine.target.state[Slot.PRIMARY]
    fallbacks = primary.fallbacks
    again = engine.greedy(prompt, n + k + 1)
    if primary.fallbacks == fallbacks:
        baseline = "before and after"
        greedy_tokens_per_s = (greedy.decodes + again.decodes) / (greedy.seconds + again.seconds)
    else:  # the Primary slot lost its plan for good (CUDA graph ids spent): not the same baseline any more
        baseline = "before only: the Primary slot ran eager after the speculative run"
        greedy_tokens_per_s = greedy.decodes / greedy.seconds

    steps = len(spec["accepted"])
    acc = np.asarray(spec["accepted"], dtype=float)
    accepted = int(acc.sum())
    generated = len(spec["tokens"]) - 1  # after the prefill's token, as for greedy
    tokens_per_s = generated / spec["seconds"]
    per_position = [float((acc >= i).mean()) if steps else 0.0 for i in range(1, k + 1)]
    alpha = run.alpha if run.drafter == "oracle" else theory.fit_alpha(per_position)
    split = spec["split"]
    per_step = {name: (t / steps if steps else 0.0) for name, t in split.items()}
    t_draft = per_step["draft"] / k
    t_greedy = 1.0 / greedy_tokens_per_s
    predicted = theory.predicted_speedup(
        alpha, k, t_greedy, per_step["decode"], t_draft, per_step["verify"], per_step["commit"], run.schedule
    )
    return RunResult(
        config=run.to_dict(),
        model={
            "name": cfg.name,
            "hash": cfg.config_hash(),
            "summary": engine.art.summary(),
            "parameters": engine.art.manifest["parameters"],
        },
        prompt=prompt,
        tokens=tokens,
        seconds=spec["seconds"],
        tokens_per_s=tokens_per_s,
        greedy_seconds=(greedy.seconds + again.seconds) / 2,
        greedy_tokens_per_s=greedy_tokens_per_s,
        speedup=tokens_per_s / greedy_tokens_per_s,
        steps=steps,
        tokens_per_step=(generated / steps) if steps else float("nan"),
        acceptance_length=1.0 + (accepted / steps if steps else 0.0),
        draft_acceptance=accepted / (steps * k) if steps else 0.0,
        acceptance_per_position=per_position,
        drafted=steps * k,
        accepted=accepted,
        forwards=forwards,
        time_split=split,
        slots=slots,
        greedy_slots=greedy_slots,
        slot_reasons={engine.target.labels[s]: st.reason for s, st in engine.target.state.items()},
        arena={name: a.stats() for name, a in engine.arenas.items()}
        | ({"cuda_graphs": graphs} if (graphs := engine.device.graph_stats()) else {}),
        identity=identity,
        theory={
            "alpha": alpha,
            "tokens_per_step": theory.tokens_per_step(alpha, k, run.schedule),
            "acceptance_length": theory.acceptance_length(alpha, k),
            "acceptance_per_position": theory.per_position(alpha, k),
            "speedup": predicted,
            "verify_cost_ratio": per_step["verify"] / t_greedy,
            "draft_cost_ratio": t_draft / t_greedy,
            "commit_cost_ratio": per_step["commit"] / t_greedy,
            "decode_cost_ratio": per_step["decode"] / t_greedy,
        },
        env=environment(run.backend),
        lossless=ok,
        verdict=verdict,
        extra={"greedy_baseline": baseline, "timed_slots": timed_slots},
        accepted_per_step=[int(a) for a in spec["accepted"]],
    )


def summary(r: RunResult) -> str:
    """A human summary: throughput, acceptance, per-slot counters in the seed's form, identity."""
    c = r.config
    lines = [
        f"mtplab run  engine={c['engine']} preset={c['preset']} k={c['k']} drafter={c['drafter']}"
        + (f" alpha={c['alpha']}" if c["drafter"] == "oracle" else "")
        + f" policy={c['policy']} commit={c['commit']} schedule={c['schedule']} tokens={c['tokens']} backend={c['backend']}",
        f"  greedy      {r.greedy_tokens_per_s:8.1f} tok/s",
        f"  speculative {r.tokens_per_s:8.1f} tok/s   speedup {r.speedup:.2f}x"
        + (f"   (theory {r.theory['speedup']:.2f}x)" if "speedup" in r.theory else ""),
        f"  tokens/step {r.tokens_per_step:.2f}"
        + (f" (theory {r.theory['tokens_per_step']:.2f})" if "tokens_per_step" in r.theory else "")
        + "   acceptance length "
        f"{r.acceptance_length:.2f}   draft acceptance {r.draft_acceptance:.1%}",
        "  per position P(accepted>=i): " + " ".join(f"{p:.2f}" for p in r.acceptance_per_position),
        "  time split: " + " ".join(f"{k}={v:.3f}s" for k, v in r.time_split.items()),
    ]
    for slot, counters in r.slots.items():
        lines.append(
            f"  {slot}: "
            + " ".join(f"{k}={v}" for k, v in counters.items())
            + (f"   [{r.slot_reasons[slot]}]" if r.slot_reasons.get(slot) else "")
        )
    lines.append(("  OK: " if r.lossless else "  FAIL: ") + r.verdict)
    return "\n".join(lines)
