"""Speculative-decoding theory (Leviathan et al. 2023) for both step schedules.

schedule="decode-verify" (the seed's): decode (M=1, one guaranteed token) -> k drafts -> verify
(M=k+1) -> n accepted drafts plus one bonus token, so tokens/step = 1 + (1 - a^(k+1)) / (1 - a).
schedule="fused" (vLLM, SGLang): no decode, tokens/step = (1 - a^(k+1)) / (1 - a), which is
Leviathan's expected accepted-plus-bonus count and vLLM's acceptance length.
"""

from __future__ import annotations

import numpy as np

from mtplab.engine.drafters import row_alphas
from mtplab.engine.strategies import SCHEDULES


def acceptance_length(alpha: float, k: int) -> float:
    """Expected accepted drafts + 1 bonus (Leviathan's tokens per verify; vLLM's acceptance length)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def tokens_per_step(alpha: float, k: int, schedule: str = "decode-verify") -> float:
    """Tokens per speculative step: acceptance length, plus the decode's guaranteed token if any."""
    return acceptance_length(alpha, k) + SCHEDULES.get(schedule).decodes


def per_position(alpha: float, k: int) -> list[float]:
    """P(accepted >= i) for i = 1..k under independent per-position acceptance alpha."""
    return [alpha**i for i in range(1, k + 1)]


def measured_per_position(accepted, k: int, ks=None) -> list[float]:
    """P(accepted >= i) for i = 1..k over the steps that drafted position i (ks: each step's drafts, k where not
    given; 0.0 where no step drafted it)."""
    acc = np.asarray(accepted, dtype=float)
    drafted = np.full(len(acc), k) if ks is None else np.asarray(ks)
    return [float((acc[drafted >= i] >= i).mean()) if (drafted >= i).any() else 0.0 for i in range(1, k + 1)]


def sampled_acceptance(accepted, k: int, tracked: dict, schedule: str = "decode-verify", ks=None) -> dict:
    """Rejection sampling's acceptance, expected against measured, over the drafts the verifies judged.

    A judged draft x ~ q is kept with probability sum(min(p, q)) at its position (tracked: the verify's p and the
    drafter's q, per judged draft), so the kept share of the judged drafts estimates their mean expected
    acceptance; draft i is judged when the i - 1 before it were kept. The expected tokens per step come from the
    expected per-position acceptance e_i as 1 + sum_i prod_{j <= i} e_j (plus the schedule's decodes), the
    closed form with e_i in place of a common alpha (exact when acceptance is independent of the context). ks: each
    step's drafts where a draft-length policy chose them (a position a step did not draft is not judged).
    """
    acc = np.asarray(accepted, dtype=int)
    drafted = np.full(len(acc), k) if ks is None else np.asarray(ks, dtype=int)
    judged = [int(((acc >= i - 1) & (drafted >= i)).sum()) for i in range(1, k + 1)]
    kept = [int((acc >= i).sum()) for i in range(1, k + 1)]
    expected = tracked["expected"]
    total = sum(judged)
    pooled = sum(e * j for e, j in zip(expected, judged) if e is not None) / total if total else None
    chain = np.cumprod([e if e is not None else 0.0 for e in expected])
    return {
        "judged": total,
        "kept": sum(kept),
        "expected": pooled,  # mean sum(min(p, q)) over the judged drafts
        "measured": sum(kept) / total if total else None,
        "expected_per_position": expected,
        "measured_per_position": [c / j if j else None for c, j in zip(kept, judged)],
        "expected_tokens_per_step": float(1.0 + chain.sum()) + SCHEDULES.get(schedule).decodes,
        "measured_tokens_per_step": float(acc.mean() + 1 + SCHEDULES.get(schedule).decodes) if acc.size else None,
    }


def fit_alpha(per_position_measured: list[float]) -> float:
    """The alpha whose geometric curve alpha^i best fits measured P(accepted >= i) (least squares)."""
    p = np.asarray(per_position_measured, dtype=float)
    if p.size == 0:
        return 0.0
    grid = np.linspace(0.0, 1.0, 2001)
    i = np.arange(1, p.size + 1)
    err = ((grid[:, None] ** i[None, :] - p[None, :]) ** 2).sum(axis=1)
    return float(grid[int(err.argmin())])


def predicted_speedup(
    alpha: float,
    k: int,
    t_greedy: float,
    t_decode: float,
    t_draft: float,
    t_verify: float,
    t_commit: float,
    schedule: str = "decode-verify",
) -> float:
    """Speedup over greedy predicted from alpha and measured costs (seconds).

    t_greedy: greedy seconds per token. Per speculative step: t_decode (one M=1 forward), t_draft
    (one head step, k of them), t_verify (one M=k+1 forward) and t_commit.
    """
    step = t_decode + k * t_draft + t_verify + t_commit
    return tokens_per_step(alpha, k, schedule) * t_greedy / step if step > 0 else float("nan")


def accepted_distribution(alpha: float, k: int) -> list[float]:
    """P(n accepted drafts = j) for j = 0..k under per-position acceptance alpha."""
    return [alpha**j * (1.0 - alpha) for j in range(k)] + [alpha**k]


def covers(calibration: dict, k: int, commit: str) -> bool:
    """Whether the calibration measured what a prediction at k needs: T(k+1) and the commit of k+1 tokens."""
    return str(k + 1) in calibration["target"] and str(k + 1) in calibration["commit"].get(commit, {})


def expected_steps(alpha: float, k: int, schedule: str, tokens: int) -> float:
    """Expected speculative steps until a run has made `tokens` tokens (the prefill's token first).

    A run stops at the step that reaches n, so its last step is partly wasted (the overshoot, uncounted):
    at tens of tokens that end effect is a few percent of the speedup, which the infinite-length
    tokens/step alone misses.
    """
    dist = accepted_distribution(alpha, k)
    extra = SCHEDULES.get(schedule).extra_tokens  # tokens a step makes beyond its accepted drafts
    need = max(tokens - 1, 0)
    f = [0.0] * (need + k + extra + 1)  # f[m]: expected steps still to run with m tokens still to make
    for m in range(1, need + 1):
        f[m] = 1.0 + sum(p * f[max(m - (j + extra), 0)] for j, p in enumerate(dist))
    return f[need]


def verify_seconds(calibration: dict, k: int, commit: str) -> float:
    """The calibrated verify of k drafts under `commit`: T(k+1), or the verify the commit's own graph runs where it
    has one (per-position's writes a state per token)."""
    own = (calibration.get("verify") or {}).get(commit, {})
    return own.get(str(k + 1), calibration["target"][str(k + 1)])


def greedy_seconds(calibration: dict) -> float:
    """Greedy decoding's calibrated cost per token (T(1) for a calibration from before it was measured)."""
    return calibration.get("greedy_token", calibration["target"]["1"])


def on_the_copy(calibration: dict, commit: str = "") -> dict:
    """The calibration as a point sees it whose Primary slot runs mtplab's copy of the graph (a shared policy: one
    session holds both slots' plans), where the calibration's Primary ran the graph before it: the M=1 forward, its
    eager run and greedy's token each cost what the copy adds too (a builder graph's copy with select's outputs, or
    the copy of a commit with a graph of its own, per-position's)."""
    own = (calibration.get("copy_decode") or {}).get(commit)
    copy = {"1": own} if own is not None else calibration.get("copy_target")
    if not copy:
        return calibration
    extra = copy["1"] - calibration["target"]["1"]
    out = {**calibration, "target": {**calibration["target"], "1": copy["1"]}}
    if "1" in (calibration.get("eager") or {}):
        out["eager"] = {**calibration["eager"], "1": calibration["eager"]["1"] + extra}
    if "greedy_token" in calibration:
        out["greedy_token"] = calibration["greedy_token"] + extra
    return out


def draft_seconds(calibration: dict, k: int, schedule: str = "decode-verify") -> float:
    """The calibrated draft phase of k drafts: the head's commit of the verify's k + 1 rows and the k - 1 head steps
    that chain from its last row (the fused schedule's), plus one head step where a decode comes first (k head
    steps in all: decode-verify's first draft is its own). k - 1 + decodes head steps for a calibration from before
    the phase was measured."""
    s = SCHEDULES.get(schedule)
    phase = (calibration.get("draft") or {}).get(str(k))
    if phase is None:
        return s.head_steps(k) * calibration["head"]
    return phase + s.decodes * calibration["head"]


def predict(alpha: float, k: int, schedule: str, commit: str, calibration: dict, tokens: int | None = None,
            eager_share: dict | None = None) -> dict:
    """A point's speedup from alpha, k, the schedule, the commit and the calibration alone.

    Greedy costs its calibrated cost per token (its loop: T(1) plus per-token host work; T(1) for an
    older calibration). A step costs [T(1) if decode-verify] + the draft phase of k drafts (k head steps
    for an older calibration) + T(k+1) + the expected commit cost over the accepted count (commit of
    j+1 tokens when j drafts pass). eager_share: the share of each slot's forwards that ran outside a plan
    ({"primary": f, "verify": f}, counts from the point's checked run, no time), priced at the eager
    T(M). tokens: the run's length, so the last step's overshoot is priced (else an infinitely long run).
    No time from the point's own run enters: that is what makes measured/predicted an efficiency.
    """
    greedy, parts, commits = _prices(k, schedule, commit, calibration, eager_share)
    commit_cost = sum(p * commits[str(j + 1)] for j, p in enumerate(accepted_distribution(alpha, k)))
    step = sum(parts.values()) + commit_cost
    per_step = tokens_per_step(alpha, k, schedule)
    if tokens is not None and tokens > 1:
        speedup = (tokens - 1) * greedy / (expected_steps(alpha, k, schedule, tokens) * step)
    else:
        speedup = per_step * greedy / step
    target, eager, t1 = calibration["target"], calibration.get("eager") or {}, calibration["target"]["1"]
    decodes = SCHEDULES.get(schedule).decodes
    return {
        "alpha": alpha,
        "tokens_per_step": per_step,
        "step_seconds": step,
        "greedy_seconds_per_token": greedy,
        "speedup": speedup,
        "verify_cost_ratio": verify_seconds(calibration, k, commit) / t1,
        "draft_cost_ratio": draft_seconds(calibration, k, schedule) / k / t1,  # a draft of the phase, as a step pays it
        "commit_cost_ratio": commit_cost / t1,
        "decode_cost_ratio": float(decodes),
        "fallback_cost_ratio": (eager[str(k + 1)] / target[str(k + 1)]) if str(k + 1) in eager else None,
    }


def _prices(k: int, schedule: str, commit: str, calibration: dict, eager_share: dict | None,
            verified: int | None = None) -> tuple[float, dict, dict]:
    """(greedy's cost per token, a step's decode, draft and verify costs, the commit's cost per committed count)
    from a calibration: predict's and predict_steps' one pricing. verified: the drafts the verify runs at (a padded
    verify's k_max), k where not given."""
    v = k if verified is None else verified
    target, eager, share = calibration["target"], calibration.get("eager") or {}, eager_share or {}

    def forward(M: int, slot: str) -> float:
        f = share.get(slot, 0.0) if str(M) in eager else 0.0
        return (1 - f) * target[str(M)] + f * eager.get(str(M), target[str(M)])

    own = (calibration.get("verify") or {}).get(commit, {})  # a commit whose verify runs a graph of its own
    parts = {"decode": SCHEDULES.get(schedule).decodes * forward(1, "primary"), "draft": draft_seconds(calibration, k, schedule),
             "verify": verify_seconds(calibration, v, commit) if own else forward(v + 1, "verify")}
    return greedy_seconds(calibration), parts, calibration["commit"][commit]


def step_seconds(k: int, schedule: str, commit: str, calibration: dict, verified: int | None = None) -> float:
    """A step's decode, draft and verify at k drafts (the verify at `verified` where padded), priced by the
    calibration (its commit apart)."""
    return float(sum(_prices(k, schedule, commit, calibration, None, verified)[1].values()))


def predict_steps(accepted: list[int], k, schedule: str, commit: str, calibration: dict, tokens: int,
                  eager_share: dict | None = None, verified: int | None = None) -> dict:
    """The speedup the calibration prices for the steps a run made: len(accepted) steps, each committing its
    accepted count + 1, against greedy's tokens - 1 tokens. predict's costs at the acceptance a run realized, not
    the alpha it was set or calibrated to: a run of a few dozen steps lands away from its alpha by chance (the same
    seed, the same draws, every round), which is no part of how well it executes. Like predict, it reads no time
    from the run: measured / this is the run's efficiency. "phases": each phase's price per step (seconds; the
    commit's, its mean over the steps). Greedy's side is the tokens the run's rates count: the
    tokens - 1 after the prefill's, or fewer where its steps made fewer (a run stopped early)."""
    if not accepted or tokens <= 1:
        raise ValueError(f"predict_steps prices a run's steps: got {len(accepted)} steps and tokens={tokens}")
    prices = step_prices(accepted, k, schedule, commit, calibration, eager_share, verified)
    greedy, phases = prices.pop("greedy"), prices
    steps = len(accepted)
    step = sum(phases.values())
    made = sum(int(j) for j in accepted) + steps * SCHEDULES.get(schedule).extra_tokens
    counted = min(made, tokens - 1)
    return {"steps": steps, "tokens_per_step": made / steps, "step_seconds": step, "phases": phases,
            "greedy_seconds_per_token": greedy, "speedup": counted * greedy / (steps * step)}


def step_prices(accepted: list[int], k, schedule: str, commit: str, calibration: dict,
                eager_share: dict | None = None, verified: int | None = None) -> dict:
    """What the calibration prices the steps a run made at, in seconds: each phase per step ("decode", "draft",
    "verify", each step at its own K where k is a list of them, a draft-length policy's; "commit", the mean of the
    commits of each step's accepted count + 1) and greedy per token ("greedy"): predict_steps' costs, which the
    report also sets each timed phase against. verified: the drafts every verify runs at (a padded Verify plan's
    k), each step's own K where None. ValueError for a commit count the calibration did not measure."""
    if not isinstance(k, int):  # a K per step: each distinct K priced once, the phases averaged over the steps
        ks = [int(j) for j in k]
        priced = {j: _prices(j, schedule, commit, calibration, eager_share, verified) for j in set(ks)}
        greedy, _, commits = priced[ks[0]]
        parts = {p: sum(priced[j][1][p] for j in ks) / len(ks) for p in priced[ks[0]][1]}
    else:
        greedy, parts, commits = _prices(k, schedule, commit, calibration, eager_share, verified)
    if missing := sorted({int(j) + 1 for j in accepted} - {int(n) for n in commits}):
        raise ValueError(f"the calibration prices commits of {sorted(int(n) for n in commits)} tokens, not of {missing}")
    return parts | {"commit": sum(commits[str(int(j) + 1)] for j in accepted) / len(accepted), "greedy": greedy}


def steps_cdf(alpha: float, k: int, schedule: str, tokens: int) -> np.ndarray:
    """P(one row has its `tokens` tokens within s steps), s = 0, 1, ... until certain (the prefill's token first)."""
    dist = accepted_distribution(alpha, k)
    extra = SCHEDULES.get(schedule).extra_tokens
    need = max(tokens - 1, 0)
    done = np.zeros(need + 1)  # done[m]: P(finished within s steps with m tokens still to make)
    done[0] = 1.0
    left = np.arange(need + 1)
    cdf = [done[need]]
    while cdf[-1] < 1.0 - 1e-12 and len(cdf) <= need + 1:  # every step makes a token at least
        done = sum(p * done[np.maximum(left - (j + extra), 0)] for j, p in enumerate(dist))
        done[0] = 1.0
        cdf.append(done[need])
    return np.array(cdf)


def expected_batch_steps(alpha, k: int, schedule: str, tokens: int, batch: int) -> float:
    """Expected steps until every one of `batch` independent rows has its tokens: E[max of the rows' steps]
    (a batch steps until its slowest row is done; the rows done earlier ride along). alpha: one for every row, or a
    list of one per row."""
    cdfs = [steps_cdf(a, k, schedule, tokens) for a in row_alphas(alpha, batch)]
    span = max(len(c) for c in cdfs)  # each row's cdf is 1 from its own end on
    together = np.prod([np.pad(c, (0, span - len(c)), constant_values=1.0) for c in cdfs], axis=0)
    return float(np.sum(1.0 - together))


def riding_share(alpha, k: int, schedule: str, tokens: int, batch: int) -> float:
    """The expected share of a batch's row-steps spent on rows that already have their tokens (riding along until
    the slowest row is done): 1 - mean row steps / E[max of the rows' steps]. The slowest row's cost to the batch."""
    alphas = row_alphas(alpha, batch)
    own = np.mean([float(np.sum(1.0 - steps_cdf(a, k, schedule, tokens))) for a in alphas])
    return float(1.0 - own / expected_batch_steps(alphas, k, schedule, tokens, batch))


def batch_commit_seconds(alpha, k: int, commit: str, table: dict, batch: int) -> float:
    """A step's expected commit cost at batch B from a batch calibration's commit table (every row committing n
    tokens, n = 1..k+1), with the rows' counts c = accepted + 1 independent (alpha: one for every row, or one per row):
    select: its expected cost over a row's count (each row replays its own);
    readvance-m1: the cost at the largest count among the B rows (that many [B, 1] forwards);
    readvance-batched: one forward per distinct count, each priced at its own count (so restoring the state is
    counted once per distinct count: an upper bound by one restore per extra count)."""
    dists = np.array([accepted_distribution(a, k) for a in row_alphas(alpha, batch)])  # P(c = j + 1), per row
    cost = [table[str(j + 1)] for j in range(k + 1)]
    if commit == "readvance-m1":
        cdf = np.prod(np.cumsum(dists, axis=1), axis=0)
        return float(sum((cdf[j] - (cdf[j - 1] if j else 0.0)) * cost[j] for j in range(k + 1)))
    if commit == "readvance-batched":
        return float(sum((1.0 - np.prod(1.0 - dists[:, j])) * c for j, c in enumerate(cost)))
    return float(sum(p * c for p, c in zip(dists.mean(axis=0), cost)))


def predict_batch(alpha, k: int, schedule: str, commit: str, calibration: dict, tokens: int, batch: int) -> dict:
    """A batch point's speedup from alpha (one for every row, or one per row), k, the schedule, the commit and a
    calibration at its batch B: T(B, M) for the forwards, the draft phase at [B, 1], greedy's cost per [B, 1] step
    and the commit at B (batch_commit_seconds). Greedy makes tokens - 1 steps; speculative E[max over the rows'
    steps] (the batch waits for its slowest row), each costing [T(B, 1) if decode-verify] + draft + T(B, k+1) +
    commit. Every step is priced at all B rows: the rows done early ride along through the forwards (their commit
    is skipped, which this overprices a little)."""
    target = calibration["target"]
    greedy = greedy_seconds(calibration)
    draft = draft_seconds(calibration, k, schedule)
    commit_cost = batch_commit_seconds(alpha, k, commit, calibration["commit"][commit], batch)
    verify = verify_seconds(calibration, k, commit)
    step = SCHEDULES.get(schedule).decodes * target["1"] + draft + verify + commit_cost
    # the rows pooled, as a point counts them (every row's tokens over every row's steps): each row makes its tokens
    # in about tokens / its own tokens per step steps, so the pool's is the rows' harmonic mean
    per_step = float(1.0 / np.mean([1.0 / tokens_per_step(a, k, schedule) for a in row_alphas(alpha, batch)]))
    if tokens > 1:
        steps = expected_batch_steps(alpha, k, schedule, tokens, batch)
        speedup = (tokens - 1) * greedy / (steps * step)
    else:  # nothing after the prefill's token to time: the long-run ratio of the rows
        steps, speedup = float("nan"), per_step * greedy / step
    return {
        "alpha": list(alpha) if isinstance(alpha, (list, tuple)) else alpha,
        "batch": batch,
        "tokens_per_step": per_step,
        "expected_steps": steps,
        "riding_share": riding_share(alpha, k, schedule, tokens, batch) if tokens > 1 else float("nan"),
        "step_seconds": step,
        "greedy_seconds_per_token": greedy,
        "speedup": speedup,
        "verify_cost_ratio": verify / target["1"],
        "commit_cost_ratio": commit_cost / target["1"],
    }
