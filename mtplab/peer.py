"""A sweep point on the onnxruntime-genai peer, in mtplab's RunResult (fields genai lacks stay empty)."""

from __future__ import annotations

from . import oracle
from .config import RunConfig
from .engine import Engine, model_for, prompt_tokens
from .env import environment
from .genai import GenaiPeer, export_genai, require_genai
from .model import Artifact, cache_dir
from .result import RunResult


def exported(art: Artifact):
    """The genai export of an artifact, cached beside it."""
    folder = cache_dir() / f"{art.path.name}-genai"
    if not (folder / "manifest.json").exists():
        export_genai(art, folder)
    return folder


def run_peer_point(run: RunConfig, artifact: Artifact | None = None) -> RunResult:
    """Greedy (og.Generator) and MTP (og.MtpGenerator, real head, k drafts) on the same model and prompt,
    checked against mtplab's greedy reference."""
    require_genai()
    art = artifact or model_for(run)
    cfg, n = art.config, run.tokens
    prompt = prompt_tokens(cfg.vocab_size, run.prompt_len, run.seed)
    reference = Engine(run.replace(engine="mtplab"), art).greedy(prompt, n)
    peer = GenaiPeer(exported(art))
    peer.greedy(prompt, 16)  # warm-up
    greedy_tokens, greedy_s = peer.greedy(prompt, n)
    tokens, seconds, stats = peer.mtp(prompt, n, run.k)
    again_tokens, again_s = peer.greedy(prompt, n)
    greedy_rate = (len(greedy_tokens) + len(again_tokens)) / (greedy_s + again_s)
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
    tokens_per_s = len(tokens) / seconds
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
        seconds=seconds,
        tokens_per_s=tokens_per_s,
        greedy_seconds=(greedy_s + again_s) / 2,
        greedy_tokens_per_s=greedy_rate,
        speedup=tokens_per_s / greedy_rate,
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
        env=environment(run.backend) | {"engine": "onnxruntime-genai " + _genai_version()},
        lossless=ok,
        verdict=verdict,
        extra={"genai_stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))}},
    )


def _genai_version() -> str:
    import importlib.metadata as md

    return md.version("onnxruntime-genai")
