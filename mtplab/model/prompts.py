"""The prompt sets a model folder ships (prompts.json: held-out text of a few kinds, tokenized), and a run's prompt
from them: row seed % n of the set its `prompts` names."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from mtplab.model.folders import model_folder

PROMPTS_FILE = "prompts.json"


@functools.cache
def _sets(folder: str) -> dict[str, tuple[tuple[int, ...], ...]]:
    path = Path(folder) / PROMPTS_FILE
    if not path.is_file():
        return {}
    kinds = json.loads(path.read_text())["kinds"]
    return {kind: tuple(tuple(int(t) for t in p["tokens"]) for p in prompts) for kind, prompts in kinds.items()}


def prompt_sets(model: str) -> dict[str, tuple[tuple[int, ...], ...]]:
    """A model's prompt sets by kind (its folder's prompts.json); empty for a preset or a folder with none."""
    return _sets(str(model_folder(model).resolve()))


def prompt_problem(model: str, kind: str, context: int = 0) -> str | None:
    """Why a model has no prompt set of that kind, or none whose rows hold `context` tokens (0: whole rows), or None."""
    sets = prompt_sets(model)
    if kind in sets:
        shortest = min(len(row) for row in sets[kind])
        if context > shortest:
            return (f"context={context}: {Path(model).name}'s prompt set {kind!r} holds {shortest} tokens a row "
                    f"(allowed: 0 for whole rows, or 1..{shortest})")
        return None
    if not sets:
        return (f"prompts={kind!r}: {Path(model).name} ships no prompt sets (a model folder's {PROMPTS_FILE}, as "
                "models/pycode has); leave prompts empty for prompt_len random tokens")
    return f"prompts={kind!r}: {Path(model).name} has no such prompt set (allowed: {sorted(sets)})"


def prompt_from_set(model: str, kind: str, seed: int, context: int = 0) -> list[int]:
    """Row seed % n of the model's prompt set `kind`: its last `context` tokens (0: all of it)."""
    rows = prompt_sets(model)[kind]
    return list(rows[seed % len(rows)][-context:] if context else rows[seed % len(rows)])


def prompt_tokens(vocab: int, length: int, seed: int) -> list[int]:
    """A deterministic prompt of random tokens for a seed."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


def run_prompt(run, vocab: int, seed: int | None = None) -> list[int]:
    """A run's prompt: row seed % n of its model's prompt set `run.prompts` (its last run.context tokens, 0: all),
    else prompt_len random tokens from the seed (run.seed unless given: a batch's row b takes seed + b)."""
    seed = run.seed if seed is None else seed
    if run.prompts:
        return prompt_from_set(run.model, run.prompts, seed, run.context)
    return prompt_tokens(vocab, run.prompt_len, seed)


def run_prompts(run, vocab: int) -> np.ndarray:
    """A run's prompts [B, P], one per row: row b's is the batch-1 prompt of seed + b."""
    return np.array([run_prompt(run, vocab, run.seed + b) for b in range(run.batch)], dtype=np.int64)
