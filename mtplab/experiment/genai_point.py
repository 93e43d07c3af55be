"""A sweep point on the onnxruntime-genai peer, in mtplab's RunResult (fields genai lacks stay empty)."""

from __future__ import annotations

from mtplab.base.threads import SETTLE_LIMIT, settle, thread_pool, threads_used
from mtplab.check import verdict as oracle
from mtplab.engine.engine import Engine
from mtplab.engine.models import model_for
from mtplab.engine.sampling import settings, settings_text
from mtplab.experiment.build import check_run_on_model, reference_run
from mtplab.experiment.config import RunConfig
from mtplab.experiment.genai_builder import builder_peer_folder
from mtplab.experiment.genai_export import HEAD_THREADS, PEER_FORM, drop_older_forms, export_genai
from mtplab.experiment.genai_runner import GenaiPeer, genai_version, require_genai
from mtplab.measure import rounds as measure
from mtplab.measure.env import environment
from mtplab.measure.result import RunResult
from mtplab.model import Artifact, cache_dir
from mtplab.model.prompts import run_prompt


def exported(art: Artifact, threads: int = 0):
    """The og.Model folders (target/, mtp/) of a model for `threads` intra-op threads (RunConfig.threads),
    made once in the cache: a builder folder gets the copy genai needs (mtplab.experiment.genai_builder), the
    built-in model its export."""
    threads = threads_used(threads)
    if art.description.kind == "builder":
        return builder_peer_folder(art, threads)
    folder = cache_dir() / f"{art.path.name}-genai-v{PEER_FORM}-t{threads}"
    if not (folder / "manifest.json").exists():
        export_genai(art, folder, threads)
        drop_older_forms(folder, f"{art.path.name}-genai-v*-t{threads}")
    return folder


def peer_rounds(peer, engine: Engine, prompt: list[int], n: int, k: int, plan: measure.RoundsPlan) -> dict:
    """Paired rounds as the plan says: genai greedy and genai MTP (order alternating), then mtplab's greedy, each
    round.

    Every side counts and is timed as mtplab.measure.rounds says, and starts once the threads of the side before
    it are idle (mtplab.base.threads.settle: genai's pools and mtplab's spin after a run); `settled`: the seconds
    waited before each side, in order.
    """
    samples, last, greedy_tokens, settled = [], None, None, []
    for r in plan.rounds(samples):
        order = ("greedy", "mtp") if r % 2 == 0 else ("mtp", "greedy")
        sample = measure.paired_round(r, order)
        for side in (*order, "mtplab greedy"):
            settled.append(settle())
            if side == "greedy":
                tokens, seconds = peer.greedy(prompt, n)
                measure.record_side(sample, side, [tokens], n, seconds)
                greedy_tokens = greedy_tokens or tokens
            elif side == "mtp":
                tokens, seconds, stats = peer.mtp(prompt, n, k)
                measure.record_side(sample, side, [tokens], n, seconds)
                last = (tokens, stats)
            else:
                g = engine.greedy(prompt, n, margins=False)
                sample["mtplab_greedy_tokens_per_s"] = measure.tokens_per_s(g.tokens, n, g.seconds)
        samples.append(measure.close_round(sample))
    return {"samples": samples, "tokens": last[0], "stats": last[1], "greedy_tokens": greedy_tokens,
            "settled": settled}


def run_genai_point(run: RunConfig, artifact: Artifact | None = None) -> RunResult:
    """Greedy (og.Generator) and MTP (og.MtpGenerator, real head, k drafts) on the same model and prompt,
    checked against mtplab's greedy reference."""
    require_genai()
    art = artifact or model_for(run)
    check_run_on_model(run, art.description)
    n = run.tokens
    prompt = run_prompt(run, art.description.vocab_size)
    engine = Engine(reference_run(run, art.description), art)
    reference = engine.greedy(prompt, n)
    sampling = settings(run)
    sampled = run.temperature > 0
    peer = GenaiPeer(exported(art, run.threads), sampling if sampled else None)
    peer.greedy(prompt, 16)  # warm-ups, both generators
    peer.mtp(prompt, 16, run.k)
    plan = measure.RoundsPlan.of(run)
    measured = peer_rounds(peer, engine, prompt, n, run.k, plan)
    samples, tokens, stats = measured["samples"], measured["tokens"], measured["stats"]
    greedy_tokens = measured["greedy_tokens"]
    if sampled:  # genai's own sampler and acceptance: its tokens have nothing of mtplab's to equal
        identity = {"token_identical": None, "first_divergence": None, "sampled": sampling,
                    "greedy_token_identical": None}
        ok, verdict = True, (f"sampled ({settings_text(sampling)}) by onnxruntime-genai's own sampler and speculative acceptance: its tokens are not compared "
                             "(mtplab tests its own sampler's distribution, not genai's)")
    else:
        identity = oracle.token_identity(tokens, reference.tokens[: len(tokens)], reference.margins)
        greedy_identity = oracle.token_identity(greedy_tokens, reference.tokens[: len(greedy_tokens)],
                                                reference.margins)
        identity["greedy_token_identical"] = greedy_identity["token_identical"]
        ok, verdict = oracle.verdict(identity | {"state_max_abs_diff": None})
        if ok and not greedy_identity["token_identical"]:
            ok, verdict = False, "LOSSLESS CHECK FAILED: genai greedy differs from mtplab greedy: " + str(greedy_identity)
    identity |= {"state_max_abs_diff": None, "state_bitwise": None, "stopped_at_eos": len(tokens) < n}
    if not ok:
        oracle.shout(verdict)
    accepted, evaluated = int(stats.get("draft_tokens_accepted", 0)), int(stats.get("draft_tokens_evaluated", 0))
    mtplab_greedy = measure.summary_of(samples, "mtplab_greedy_tokens_per_s")
    # genai reports no per-step acceptance: per-position acceptance stays empty
    acceptance = measure.acceptance(int(stats.get("rounds", 0)), accepted, evaluated, len(tokens) - 1)
    return measure.run_result(
        samples,
        n,
        acceptance,
        config=run.to_dict(),
        model=art.identity(),
        prompt=prompt,
        tokens=tokens,
        forwards={
            "target": int(stats.get("target_forward_passes", 0)),
            "draft": int(stats.get("draft_forward_passes", 0)),
        },
        time_split={},
        slots={},
        greedy_slots={},
        slot_reasons={},
        arena={},
        identity=identity,
        theory={},
        env=environment(run.backend, run.threads) | {
            "engine": "onnxruntime-genai " + genai_version(),
            # genai makes its own sessions: a pool each, its session_options' intra-op threads, onnxruntime's spinning
            # (the MTP head's on HEAD_THREADS: mtplab.experiment.genai_export says why)
            "thread_pool": {"kind": "per session (onnxruntime-genai's own)", "threads": threads_used(run.threads),
                            "head_threads": HEAD_THREADS, "spinning": "onnxruntime's default (on)"},
        },
        lossless=ok,
        verdict=verdict,
        extra={
            "genai_stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
            "draft_acceptance_denominator": "draft tokens evaluated (og.MtpGenerator.get_stats), last round",
            "mtplab_greedy_tokens_per_s": mtplab_greedy["median"],
            "mtplab_greedy_thread_pool": thread_pool(),  # the pool mtplab's greedy beside genai's ran on
            "mtplab_greedy_tokens_per_s_ci": mtplab_greedy["ci"],
            # each side began once the process's threads were idle: the longest wait for the previous side's spin, and
            # the sides that began at settle's limit with the threads still busy (the report names them)
            "settle_max_ms": round(1000 * max(measured["settled"], default=0.0), 1),
            "settle_limited": sum(w >= SETTLE_LIMIT for w in measured["settled"]),
            "rounds": plan.outcome,
        },
    )
