"""What a run's config implies it executes: the forwards by (slot, M) of a greedy or speculative run, the K its
draft-length policy chooses, and the checked speculative run held to them (the timed runs are then held to it,
mtplab.check.audit)."""

from __future__ import annotations

import hashlib

import numpy as np

from mtplab.check.trace import Trace
from mtplab.check.verdict import first_difference
from mtplab.engine.drafters import OracleDrafter, row_alphas
from mtplab.engine.strategies import COMMITS, DRAFTERS, K_POLICIES, SCHEDULES


def greedy_forwards(prompt_len: int, n: int) -> dict[str, int]:
    """The forwards by (slot, M) a greedy run of n tokens makes: the prefill, then n - 1 M=1 decodes (n >= 2)."""
    return {f"prefill/M={prompt_len}": 1, "primary/M=1": n - 1}


def head_forwards(run, steps: int, ks: list[int] | None = None) -> dict[str, int]:
    """The MTP head's forwards over `steps` speculative steps where the run's drafter runs it: each step's head steps
    (Schedule.head_steps) and its commit of the verify's rows (ks: each step's drafts; k each where not given);
    none where the head does not run."""
    if not DRAFTERS.get(run.drafter).uses_head(run):
        return {}
    ks = [run.k] * steps if ks is None else ks
    out = {"mtp/M=1": sum(SCHEDULES.get(run.schedule).head_steps(k) for k in ks)}
    for k in ks:  # at the verify's M (a padded verify's k_max + 1)
        key = f"mtp-commit/M={run.verified(k) + 1}"
        out[key] = out.get(key, 0) + 1
    return out


def expected_forwards(run, prompt_len: int, accepted: list[list[int]], widths: list[int]) -> dict[str, int]:
    """The forwards by (slot, M) a speculative run makes, from its config alone, for these accepted counts (per row)
    and steps (widths: each batch step's drafts, its longest row's): the prefill, the schedule's decodes and one
    verify per step, the head's if the drafter runs it, and each row's commits."""
    steps = len(widths)
    want: dict[str, int] = {f"prefill/M={prompt_len}": 1, "primary/M=1": SCHEDULES.get(run.schedule).decodes * steps}
    for k in widths:
        key = f"verify/M={run.verified(k) + 1}"
        want[key] = want.get(key, 0) + 1
    if DRAFTERS.get(run.drafter).uses_head(run):  # the head's prefill (M = the prompt), then its steps'
        want[f"mtp/M={prompt_len}"] = 1
    commit = COMMITS.get(run.commit)
    if len(accepted) == 1:  # one sequence's commits (a strategy of the user's own says them for one sequence)
        parts = [commit.forwards(accepted[0])]
    else:  # each batch step commits the rows still decoding, together
        parts = [commit.step_forwards([row[i] for row in accepted if i < len(row)]) for i in range(steps)]
    parts.append(head_forwards(run, steps, widths))
    for part in parts:
        for key, n in part.items():
            want[key] = want.get(key, 0) + n
    return {key: v for key, v in want.items() if v}


def checked_problems(engine, trace: Trace, prompt_len: int, widths: list[int]) -> list[str]:
    """Where the checked speculative run did not do what its config implies, row by row (the timed runs are held to
    it): each row's drafts per step within 1..k and chosen by its draft-length policy, its accepted counts within
    them and (an oracle's) its seeded draws', its tokens what its steps make; the run's forwards what its schedule,
    drafter and commit make for them (widths: each batch step's drafts)."""
    run, out = engine.spec, []
    rows = trace.accepted or []
    per_step = SCHEDULES.get(run.schedule).extra_tokens  # tokens a step makes beyond its accepted drafts
    for b, accepted in enumerate(rows):
        where = f"row {b}: " if len(rows) > 1 else ""
        ks = trace.ks[b] if trace.ks is not None else [run.k] * len(accepted)
        if len(ks) != len(accepted) or any(not 1 <= k <= run.k for k in ks):
            out.append(f"{where}draft lengths outside 1..{run.k} or not one a step: {len(ks)} for {len(accepted)} "
                       f"steps, {sorted(set(ks))}")
            ks = [run.k] * len(accepted)
        if any(not 0 <= a <= k for a, k in zip(accepted, ks)):
            bad = sorted({(a, k) for a, k in zip(accepted, ks) if not 0 <= a <= k})
            out.append(f"{where}accepted counts outside 0..K of their step, (accepted, K): {bad}")
        out += [where + p for p in chosen_problems(engine, accepted, ks) + oracle_problems(engine, accepted, ks, b)]
        made = 1 + sum(a + per_step for a in accepted)
        if len(trace.tokens[b]) != made:
            out.append(f"{where}it made {len(trace.tokens[b])} tokens, its {len(accepted)} steps account for {made}")
    want = expected_forwards(run, prompt_len, rows, widths)
    if trace.forwards != want:
        diff = forwards_diff(trace.forwards, want)
        out.append(f"its forwards are not what {run.schedule}, drafter {run.drafter} and commit {run.commit} make "
                   f"for its accepted counts, (ran, expected): {diff}")
    return out + trace.honesty_problems()


def chosen_problems(engine, accepted: list[int], ks: list[int]) -> list[str]:
    """Where a run drafted other than its draft-length policy chooses: the policy replayed on the run's own accepted
    counts must choose each step's K (a policy that stops drafting on the drafter's confidence: at most k); no step
    keeps more drafts than it made."""
    run = engine.spec
    policy = K_POLICIES.get(run.k_policy)
    over = next((i for i, (k, a) in enumerate(zip(ks, accepted)) if a > k), None)
    if over is not None:
        return [f"it kept {accepted[over]} drafts at step {over + 1}, where it drafted {ks[over]}"]
    if policy.needs_confidence:
        return []
    chooser, want = policy.make(run, engine.k_costs), []
    for k, a in zip(ks, accepted):
        want.append(chooser.next_k())
        chooser.observe(k, a)
    if want == ks:
        return []
    first = first_difference(ks, want)
    return [f"it drafted {ks[first]} at step {first + 1}, where k_policy={policy.name!r} chooses {want[first]} for its "
            f"accepted counts ({sum(a != b for a, b in zip(ks, want))} of {len(ks)} steps differ)"]


def oracle_uniforms(seed: int, alpha: float, vocab: int):
    """The oracle's uniforms, block after block, as its contract (OracleDrafter) draws them: a block of DRAWS uniforms,
    then the block's DRAWS shifts (the wrong tokens, not read here), from a generator seeded by seed and alpha."""
    digest = hashlib.sha256(f"oracle:{seed}:{alpha}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    while True:
        block = rng.random(OracleDrafter.DRAWS)
        rng.integers(vocab - 1, size=OracleDrafter.DRAWS)
        yield block


def oracle_problems(engine, accepted: list[int], ks: list[int], row: int = 0) -> list[str]:
    """Where a greedy run's oracle accepted other than its seeded draws say (oracle_draw_problems, at the row's seed
    and alpha: a batch's row b draws from seed + b, at its own alpha)."""
    run = engine.spec
    if run.drafter != "oracle" or engine.acceptance.samples:
        return []
    alpha = row_alphas(run.alpha, run.batch)[row]
    return oracle_draw_problems(accepted, ks, run.seed + row, alpha, engine.desc.vocab_size)


def oracle_draw_problems(accepted: list[int], ks: list[int], seed: int, alpha: float, vocab: int) -> list[str]:
    """Where an oracle's accepted counts at greedy decoding differ from its seeded draws: draft i of a step is the
    reference's token exactly when its uniform is below alpha, and a greedy verify keeps the leading right ones.
    Exact, so a correct run is never flagged, and an oracle accepting at another rate than its alpha is, at any run
    length. (The last step may keep fewer, where the reference ends.) A batch's row b: seed + b, its own alpha."""
    blocks = oracle_uniforms(seed, alpha, vocab)
    block, used, want = next(blocks), 0, []
    for k in ks:
        if used + k > OracleDrafter.DRAWS:  # a step that does not fit draws the next block
            block, used = next(blocks), 0
        right = block[used : used + k] < alpha
        want.append(int(right.argmin()) if not right.all() else k)
        used += k
    off = [i for i, (a, w) in enumerate(zip(accepted, want)) if a != w and not (i == len(want) - 1 and a < w)]
    if not off:
        return []
    i = off[0]
    return [f"the oracle (alpha {alpha:g}, seed {seed}) accepted {accepted[i]} drafts at step {i + 1}, where "
            f"its seeded draws keep {want[i]} ({len(off)} of {len(want)} steps differ; accepted "
            f"{sum(accepted)}, its draws {sum(want)})"]


def forwards_diff(ran: dict, want: dict) -> dict[str, tuple[int, int]]:
    """{forward key: (ran, wanted)} where the two counts differ."""
    return {k: (ran.get(k, 0), want.get(k, 0)) for k in sorted(set(ran) | set(want)) if ran.get(k, 0) != want.get(k, 0)}
