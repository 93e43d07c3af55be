"""A sweep point on the onnxruntime-genai peer, in mtplab's RunResult (fields genai lacks stay empty)."""

from __future__ import annotations

import numpy as np

from . import oracle
from .config import RunConfig, threads_used
from .engine import Engine, model_for, prompt_tokens
from .env import environment
from .genai import GenaiPeer, export_genai, require_genai
from .model import Artifact, cache_dir
from .result import RunResult
from .stats import summarize


def exported(art: Artifact, threads: int = 0):
    """The genai export of an artifact for `threads` intra-op threads (RunConfig.threads), cached beside it."""
    threads = threads_used(threads)
    folder = cache_dir() / f"{art.path.name}-genai-v2-t{threads}"
    if not (folder / "manifest.json").exists():
        export_genai(art, folder, threads)
    return folder


def peer_rounds(peer, engine: Engine, prompt: list[int], n: int, k: int, rounds: int) -> dict:
    """Paired rounds: genai greedy and genai MTP (order alternating), then mtplab's greedy, each round.

    Every side counts the n - 1 tokens after the prefill's token, timed from after the prefill.
    """
    samples, last = [], None
    for r in range(rounds):
        order = ("greedy", "mtp") if r % 2 == 0 else ("mtp", "greedy")
        sample: dict = {"round": r, "order": "-".join(order)}
        for side in order:
            if side == "greedy":
                tokens, seconds = peer.greedy(prompt, n)
                sample["greedy_tokens_per_s"], sample["greedy_tokens"] = (len(tokens) - 1) / seconds, tokens
            else:
                tokens, seconds, stats = peer.mtp(prompt, n, k)
                sample["tokens_per_s"], sample["seconds"], last = (len(tokens) - 1) / seconds, seconds, (tokens, stats)
        g = engine.greedy(prompt, n, margins=False)
        sample["mtplab_greedy_tokens_per_s"] = g.decodes / g.seconds
        sample["speedup"] = sample["tokens_per_s"] / sample["greedy_tokens_per_s"]
        samples.append(sample)
    return {"samples": samples, "tokens": last[0], "stats": last[1]}


def run_peer_point(run: RunConfig, artifact: Artifact | None = None) -> RunResult:
    """Greedy (og.Generator) and MTP (og.MtpGenerator, real head, k drafts) on the same model and prompt,
    checked against mtplab's greedy reference."""
    require_genai()
    art = artifact or model_for(run)
    cfg, n = art.config, run.tokens
    prompt = prompt_tokens(cfg.vocab_size, run.prompt_len, run.seed)
    engine = Engine(run.replace(engine="mtplab"), art)
    reference = engine.greedy(prompt, n)
    peer = GenaiPeer(exported(art, run.threads))
    peer.greedy(prompt, 16)  # warm-ups, both generators
    peer.mtp(prompt, 16, run.k)
    measured = peer_rounds(peer, engine, prompt, n, run.k, run.rounds)
    samples, tokens, stats = measured["samples"], measured["tokens"], measured["stats"]
    greedy_tokens = samples[0].pop("greedy_tokens")
    for sample in samples[1:]:
        sample.pop("greedy_tokens")
    speedup = summarize([s["speedup"] for s in samples])
    spec_tps = summarize([s["tokens_per_s"] for s in samples])
    greedy_tps = summarize([s["greedy_tokens_per_s"] for s in samples])
    mtplab_greedy = summarize([s["mtplab_greedy_tokens_per_s"] for s in samples])
    identity = oracle.token_identity(tokens, reference.tokens[: len(tokens)], reference.margins)
    greedy_identity = oracle.token_identity(greedy_tokens, reference.tokens[: len(greedy_tokens)], reference.margins)
    identity |= {
        "state_max_abs_diff": None,
        "state_bitwise": None,
        "greedy_token_identical": greedy_identity["token_identical"],
        "stopped_at_eos": len(tokens) < n,
    }
    ok, verdict = oracle.verdict(identity, run.commit, cfg.dtype)
    if ok and not greedy_identity["token_identical"]:
        ok, verdict = False, "LOSSLESS CHECK FAILED: genai greedy differs from mtplab greedy: " + str(greedy_identity)
    if not ok:
        oracle.shout(verdict)
    rounds = max(1, int(stats.get("rounds", 0)))
    accepted, evaluated = int(stats.get("draft_tokens_accepted", 0)), int(stats.get("draft_tokens_evaluated", 0))
    return RunResult(
        config=run.to_dict(),
        model={
            "name": cfg.name,
            "hash": cfg.config_hash(),
            "summary": art.summary(),
            "parameters": art.manifest["parameters"],
        },
        prompt=prompt,
        tokens=tokens,
        seconds=float(np.median([s["seconds"] for s in samples])),
        tokens_per_s=spec_tps["median"],
        greedy_seconds=(n - 1) / greedy_tps["median"],
        greedy_tokens_per_s=greedy_tps["median"],
        speedup=speedup["median"],
        steps=int(stats.get("rounds", 0)),
        tokens_per_step=len(tokens) / rounds,
        acceptance_length=1.0 + accepted / rounds,
        draft_acceptance=accepted / evaluated if evaluated else 0.0,
        acceptance_per_position=[],
        drafted=evaluated,
        accepted=accepted,
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
        env=environment(run.backend, run.threads) | {"engine": "onnxruntime-genai " + _genai_version()},
        lossless=ok,
        verdict=verdict,
        extra={
            "genai_stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
            "draft_acceptance_denominator": "draft tokens evaluated (og.MtpGenerator.get_stats), last round",
            "mtplab_greedy_tokens_per_s": mtplab_greedy["median"],
            "mtplab_greedy_tokens_per_s_ci": mtplab_greedy["ci"],
        },
        round_samples=samples,
        speedup_ci=speedup["ci"],
        tokens_per_s_ci=spec_tps["ci"],
        greedy_tokens_per_s_ci=greedy_tps["ci"],
        stable=speedup["stable"],
    )


def _genai_version() -> str:
    import importlib.metadata as md

    return md.version("onnxruntime-genai")
