"""Sampling at temperature > 0: the transform, rejection sampling exactly, and the whole loop statistically.

1. The rule alone, exactly: the distribution of the token one accept-or-resample step emits is p, for
   any draft distribution q (no sampling: `step_distribution` sums over the draft).
1b. One verify, position by position, statistically: at k = 3 and 4, with temperature, top-k, top-p and both,
   the token emitted at each position a verify reaches (kept drafts, then the resample or the bonus) against that
   position's target distribution from a reference transform written out in the test, 3000 verifies each; five
   planted bugs (a residual wrong from draft position 2 on, or only after the 4th verify, the bonus from row
   k - 1, top-p dropped on the verify side, top-p cut before top-k) each caught.
2. The whole loop, statistically: on a tiny model with an 8-token vocabulary, the joint distribution of the
   first 3 tokens after a fixed prompt (at k = 1 and the fused schedule: the prefill's token and the first
   verify's two, a kept or resampled draft and then the bonus or the next step's), from speculative sampling
   (the MTP head drafting, select committing) against plain target sampling, N = N_RUNS runs each from
   seeds of their own: a two-sample chi-square test (cells with fewer than 5 expected per side pooled) at
   a false-alarm rate of FALSE_ALARM per test, beside the total-variation distance of the two histograms
   (sampling noise alone gives TV ~0.16 over ~150 sparse cells). At N = 1000 the test detects, with 92%
   power, a difference of TV 0.15 spread over all cells; 0.07 moved between two likely cells it sees with
   31-100% power by the pair (31-48% between the two likeliest, of mass 0.25 and 0.16), so a bug that only
   trades mass between likely outcomes can pass at this N (simulated with multinomials of the exact
   distribution; false alarms at or below the stated rate in 20,000 simulated pairs). A residual taken against
   another draft position's q shows only weakly at k = 2, whose draft rows are alike. The
   seeds are fixed, so a given build passes or fails every time. Settings: T = 1; T = 1 on decode-verify counting
   tokens 3-5 (after the first step: a bug that starts at the second step shows there); T = 1 with the head's
   rows flattened (q at temperature 10: rejection sampling is exact for any q it draws from, and this one is
   rejected half the time, so the resample and bonus paths carry weight), also at k = 2 (the second
   draft judged after the first in one verify); T = 0.5 with top-k 2 on the decode-verify schedule; the
   oracle at T = 1 (its mixture of the target's distribution and a distractor, alpha 0.5, k = 2); two draft-length
   policies at k = 3 (mtplab.engine.k_policies): confidence (a step's drafting ends on the head's own top
   probability: K depends on the drafts, 1, 2 or 3 here) and goodput on tokens 3-5 (K chosen from the first step's
   acceptance).
3. Planted bugs, each caught by the same test at the same N (among them a uniform drawn again by the next step).
4. A batch of four rows sampled together: the rows' tokens pooled against the same truth, a planted bug caught too.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.check import flags
from mtplab.engine import sampling, speculative
from mtplab.engine.engine import Engine
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.sampling import Sampling, step_distribution
from mtplab.experiment.config import ConfigError, RunConfig
from mtplab.measure import theory
from mtplab.measure.stats import goodness_of_fit, two_sample_chi_square
from mtplab.model import build_model, preset
from mtplab.model.prompts import prompt_tokens

FALSE_ALARM = 1e-3  # the chance that the loop test fails a correct implementation
N_RUNS = 1000  # runs per side (the module's docstring says what this N detects)
V, K = 8, 1
COUNTED = 3  # tokens per run whose joint is compared


# -- 1. the rule alone, exactly ---------------------------------------------------------------------
def _cases(rng):
    p = rng.dirichlet(np.ones(V))
    near = p * np.exp(0.1 * rng.standard_normal(V))
    holes = p.copy()
    holes[[1, 4]] = 0.0  # q has no mass where p has some
    p_holes = p.copy()
    p_holes[[0, 6]] = 0.0  # p has no mass where q has some
    p_holes /= p_holes.sum()
    return {
        "q = p": (p, p),
        "q close to p": (p, near / near.sum()),
        "q reversed": (p, p[::-1].copy()),
        "q zero where p > 0": (p, holes / holes.sum()),
        "p zero where q > 0": (p_holes, p),
        "q one-hot": (p, np.eye(V)[3]),
    }


@pytest.mark.parametrize("case", list(_cases(np.random.default_rng(0))))
def test_one_step_emits_exactly_the_targets_distribution(case):
    for seed in range(5):
        p, q = _cases(np.random.default_rng(seed))[case]
        np.testing.assert_allclose(step_distribution(p, q), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bug", ["residual from p", "accept with q/p"])
def test_a_planted_rule_bug_moves_the_exact_distribution(bug, monkeypatch):
    if bug == "residual from p":
        monkeypatch.setattr(sampling, "residual", lambda xp, p, q: p)
    else:
        monkeypatch.setattr(sampling, "keep_probability", lambda xp, p_x, q_x: xp.minimum(1.0, q_x / p_x))
    p, q = _cases(np.random.default_rng(0))["q reversed"]
    assert np.abs(step_distribution(p, q) - p).sum() / 2 > 0.01


def test_the_transform_applies_temperature_then_top_k_then_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(Sampling(1.0).probs(np, logits), [0.4, 0.3, 0.2, 0.1])
    hot = Sampling(2.0).probs(np, logits)
    np.testing.assert_allclose(hot, np.sqrt([0.4, 0.3, 0.2, 0.1]) / np.sqrt([0.4, 0.3, 0.2, 0.1]).sum())
    np.testing.assert_allclose(Sampling(1.0, top_k=2).probs(np, logits), [4 / 7, 3 / 7, 0, 0])
    np.testing.assert_allclose(Sampling(1.0, top_k=1).probs(np, logits), [1, 0, 0, 0])  # top-1 is greedy
    np.testing.assert_allclose(Sampling(1.0, top_k=9).probs(np, logits), [0.4, 0.3, 0.2, 0.1])  # beyond V: all
    np.testing.assert_allclose(Sampling(1.0, top_p=0.65).probs(np, logits), [4 / 7, 3 / 7, 0, 0])  # 0.4 < 0.65
    np.testing.assert_allclose(Sampling(1.0, top_p=0.7).probs(np, logits), [4 / 7, 3 / 7, 0, 0])  # 0.4+0.3 >= 0.7
    np.testing.assert_allclose(Sampling(1.0, top_p=0.71).probs(np, logits), [4 / 9, 3 / 9, 2 / 9, 0])
    rows = Sampling(1.0, top_k=3, top_p=0.9).probs(np, np.stack([logits, logits[::-1]]))
    np.testing.assert_allclose(rows[1], rows[0][::-1])  # row by row


def test_top_k_cuts_before_top_p_does():
    """top-k then top-p: of [0.4, 0.3, 0.2, 0.1], the top 2 renormalized hold 4/7 in the first, which alone reaches
    p = 0.5; top-p first would keep two tokens and top-k then both."""
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(Sampling(1.0, top_k=2, top_p=0.5).probs(np, logits), [1, 0, 0, 0])


# -- 1b. one verify, position by position -----------------------------------------------------------
# The emitted token at each position a verify reaches (its kept drafts, then the resample or the bonus) has that
# position's target distribution, whatever the drafts' distributions: with target and draft rows fixed per position
# (no context), each position's tokens over many verifies are a sample of p_j. Each position's histogram is held to
# the reference transform below by Pearson's goodness of fit (cells expecting fewer than 5 pooled) at FALSE_ALARM;
# the seeds are fixed, so a build passes or fails every time.
VERIFY_V, VERIFIES = 6, 3000
VERIFY_SETTINGS = {  # name: (k, temperature, top_k, top_p, the logits' scale)
    "k=4, T=0.8": (4, 0.8, 0, 1.0, 1.5),
    "k=4, top-k 3": (4, 1.0, 3, 1.0, 1.5),
    "k=4, top-p 0.7": (4, 1.0, 0, 0.7, 1.5),
    "k=3, top-k 4 then top-p 0.8": (3, 0.9, 4, 0.8, 0.5),  # flat rows: the order of the two cuts matters
}


def _reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The transform written out once more, row by row: softmax at the temperature, the top_k largest kept, then the
    fewest largest whose mass reaches top_p."""
    out = []
    for row in np.atleast_2d(logits):
        p = np.exp((row - row.max()) / temperature)
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        if top_k:
            p[order[top_k:]] = 0.0
            p /= p.sum()
        if top_p < 1.0:
            mass = np.cumsum(p[order])
            p[order[int(np.searchsorted(mass, top_p)) + 1:]] = 0.0
            p /= p.sum()
        out.append(p)
    return np.array(out)


def _by_position(setting: str, plant=None) -> tuple[np.ndarray, np.ndarray]:
    """(counts [k+1, V] of the emitted token at each position over VERIFIES verifies, the reference p [k+1, V])."""
    k, temperature, top_k, top_p, scale = VERIFY_SETTINGS[setting]
    rng = np.random.default_rng(list(VERIFY_SETTINGS).index(setting))
    target = scale * rng.standard_normal((k + 1, VERIFY_V))
    draft = target[:k] + 0.5 * scale * rng.standard_normal((k, VERIFY_V))  # a head near the target: most kept
    rule = sampling.SampledRun(Sampling(temperature, top_k, top_p), seed=7, xp=np)
    if plant is not None:
        plant(rule)
    counts = np.zeros((k + 1, VERIFY_V), dtype=np.int64)
    for _ in range(VERIFIES):
        drafts = np.array([rule.draft_token(np, draft[i]) for i in range(k)], dtype=np.int64)
        n, targets = rule.accept(np, drafts, target, target.argmax(-1), None)  # the graph's choice, unread here
        counts[np.arange(n + 1), [*drafts[:n], targets[n]]] += 1
    return counts, _reference_probs(target, temperature, top_k, top_p)


def _worst_position(counts: np.ndarray, reference: np.ndarray) -> tuple[int, float]:
    """(the position, its p-value) that fits its reference worst (stats.goodness_of_fit)."""
    return min(((j, goodness_of_fit(c, p)) for j, (c, p) in enumerate(zip(counts, reference))), key=lambda t: t[1])


@pytest.mark.parametrize("setting", list(VERIFY_SETTINGS))
def test_every_position_a_verify_emits_has_its_targets_distribution(setting):
    counts, reference = _by_position(setting)
    assert counts[-1].sum() > 50 and counts[1].sum() < VERIFIES  # the bonus and the resample both carry weight
    position, p_value = _worst_position(counts, reference)
    assert p_value > FALSE_ALARM / counts.shape[0], (position, p_value)


VERIFY_BUGS = {  # name: (setting, plant)
    "the residual drawn from p at draft positions 2 and after": ("k=4, T=0.8", "residual from position 2"),
    "the residual drawn from p only after the 4th verify": ("k=4, T=0.8", "residual after 4 verifies"),
    "the bonus drawn from p[k-1]": ("k=3, top-k 4 then top-p 0.8", "bonus from k-1"),
    "top-p dropped on the verify side": ("k=4, top-p 0.7", "verify without top-p"),
    "top-p before top-k": ("k=3, top-k 4 then top-p 0.8", "top-p first"),
}


class _TopPFirst(Sampling):
    """Test double of the transform with its two cuts swapped (top-p, then top-k)."""

    def probs(self, xp, logits):
        p = Sampling(self.temperature, 0, self.top_p).probs(xp, logits)
        return Sampling(1.0, self.top_k).probs(xp, np.log(np.where(p > 0, p, 1e-300)))


@pytest.mark.parametrize("bug", list(VERIFY_BUGS))
def test_the_position_test_catches_a_planted_bug(bug, monkeypatch):
    setting, kind = VERIFY_BUGS[bug]
    real_residual = sampling.residual
    verifies = []

    def residual_from(j):
        return lambda xp, p, q: xp.concatenate([real_residual(xp, p[:j], q[:j]), p[j:q.shape[0]]])

    def plant(rule):
        if kind == "residual from position 2":
            monkeypatch.setattr(sampling, "residual", residual_from(1))  # rows 1.. are draft positions 2..
        elif kind == "residual after 4 verifies":
            def counted(xp, p, q):
                verifies.append(1)
                return (real_residual if len(verifies) <= 4 else residual_from(0))(xp, p, q)
            monkeypatch.setattr(sampling, "residual", counted)
        elif kind == "bonus from k-1":
            monkeypatch.setattr(sampling, "bonus", lambda xp, p, q: p[-2:-1])
        elif kind == "verify without top-p":
            rule.sampling = Sampling(rule.sampling.temperature, rule.sampling.top_k, 1.0)
        else:
            rule.sampling = rule.draft_sampling = _TopPFirst(rule.sampling.temperature, rule.sampling.top_k,
                                                             rule.sampling.top_p)
    counts, reference = _by_position(setting, plant)
    position, p_value = _worst_position(counts, reference)
    assert p_value < FALSE_ALARM / counts.shape[0], (bug, position, p_value)


@pytest.mark.parametrize("values, message", [
    ({"temperature": 0.7}, "temperature=0.7 samples, but acceptance='greedy-match' decodes greedily"),
    ({"acceptance": "rejection-sampling"}, "acceptance='rejection-sampling' samples: give temperature > 0"),
    ({"top_k": 5}, "top_k=5: it shapes sampling, which needs temperature > 0"),
    ({"top_p": 0.9, "sample_seed": 3}, "top_p=0.9, sample_seed=3: they shape sampling, which needs temperature > 0"),
    ({"temperature": -1.0}, "temperature=-1.0: must be a number >= 0"),
    ({"top_p": 0.0}, "top_p=0.0: must be within (0, 1], a number"),
])
def test_sampling_settings_that_disagree_are_refused_naming_what_to_change(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        RunConfig(model="tiny", **values)


# -- 2. the whole loop, statistically -------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_vocab():
    """tiny with an 8-token vocabulary and flatter logits (its own are nearly one-hot at T = 1): the joint of 3
    tokens has 512 cells, about 80 of them seen in 300 runs."""
    return build_model(preset("tiny", vocab_size=V, logit_scale=1.0, bigram_peak=2.0))


def _engine(art, flat_drafts: bool = False, **changes) -> Engine:
    values = {"temperature": 1.0, "schedule": "fused", "k": K, "commit": "select"} | changes
    run = RunConfig(model="tiny", tokens=COUNTED, acceptance="rejection-sampling", **values)
    engine = Engine(run, art)
    # prices of a step at K drafts for a policy that weighs them (made up: the verify grows with K)
    engine.k_costs = StepCosts({j: 1.0 + 0.1 * j for j in range(1, run.k + 1)}, {n: 0.1 for n in range(1, run.k + 2)}, 1)
    if flat_drafts:
        engine.acceptance.draft_sampling = Sampling(10.0)
    return engine


def _joint(engine: Engine, speculative: bool, start: int = 0) -> tuple[np.ndarray, float | None]:
    """Counts of COUNTED tokens from token `start` after a fixed prompt over N_RUNS runs, one sampling seed each (the
    two sides draw from seeds apart: shared random numbers would make them alike beyond chance), and the share of
    first drafts kept (speculative)."""
    prompt, stop = prompt_tokens(V, 6, 0), start + COUNTED
    counts, kept = np.zeros(V**COUNTED, dtype=np.int64), 0
    for seed in range(N_RUNS * speculative, N_RUNS * (1 + speculative)):
        engine.acceptance.seed = seed
        if speculative:
            run = engine.speculative(prompt, stop)
            tokens, kept = run["tokens"], kept + (run["accepted"][0] >= 1)
        else:
            tokens = engine.greedy(prompt, stop, margins=False).tokens
        counts[np.ravel_multi_index(tokens[start:stop], (V,) * COUNTED)] += 1
    return counts, kept / N_RUNS if speculative else None


def _chi_square(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(p-value, total-variation distance) of two histograms of equal size: Pearson's two-sample chi-square on
    the cells with at least 5 expected per side, the rest pooled into one cell."""
    _, _, p_value = two_sample_chi_square(a, b)
    return p_value, float(np.abs(a - b).sum() / (2 * a.sum()))


SETTINGS = {  # name: (the target's sampling, the speculative run's changes)
    "T=1": ({"temperature": 1.0}, {}),
    # tokens 3-5, after the first step's: what a bug that starts at the second step moves (decode-verify, k = 1)
    "T=1, decode-verify, tokens 3-5": ({"temperature": 1.0}, {"schedule": "decode-verify", "start": 3}),
    "T=1, flat drafts": ({"temperature": 1.0}, {"flat_drafts": True}),
    "T=1, flat drafts, k=2": ({"temperature": 1.0}, {"flat_drafts": True, "k": 2}),  # two drafts judged in one verify
    "T=0.5, top-k 2": ({"temperature": 0.5, "top_k": 2}, {"schedule": "decode-verify"}),
    "T=1, mixture oracle": ({"temperature": 1.0}, {"drafter": "oracle", "alpha": 0.5, "k": 2}),
    # draft-length policies: K chosen per step from the drafts' confidence, or from past acceptance and prices
    "T=1, confidence policy, k=3": ({"temperature": 1.0}, {"k": 3, "k_policy": "confidence", "k_confidence": 0.5}),
    # tokens 3-5: from the second step on, where goodput's K follows the first step's acceptance
    "T=1, goodput policy, k=3, tokens 3-5": ({"temperature": 1.0}, {"k": 3, "k_policy": "goodput", "start": 3}),
    "T=1, probe policy, k=3, tokens 3-5": ({"temperature": 1.0}, {"k": 3, "k_policy": "probe", "start": 3}),
    # the state after each verified token, taken by index: what the second step samples from
    "T=1, per-position commit, tokens 3-5": ({"temperature": 1.0}, {"k": 2, "commit": "per-position", "start": 3}),
}
TRUTHS = {"T=1": ({"temperature": 1.0}, 0), "T=0.5, top-k 2": ({"temperature": 0.5, "top_k": 2}, 0),
          "T=1, tokens 3-5": ({"temperature": 1.0}, 3)}  # name: (the target's sampling, the first token counted)


def _truth(setting: str) -> str:
    target, changes = SETTINGS[setting]
    return next(name for name, t in TRUTHS.items() if t == (target, changes.get("start", 0)))


@pytest.fixture(scope="module")
def plain(small_vocab):
    """Plain target sampling, the truth, at each temperature and top-k, and from a later token."""
    return {name: _joint(_engine(small_vocab, **t), speculative=False, start=start)[0]
            for name, (t, start) in TRUTHS.items()}


def _speculative(art, setting: str, plant=None, monkeypatch=None) -> tuple[np.ndarray, float]:
    target, changes = SETTINGS[setting]
    changes = dict(changes)
    start = changes.pop("start", 0)
    engine = _engine(art, **target, **changes)
    if plant is not None:
        plant(engine, monkeypatch)
    return _joint(engine, speculative=True, start=start)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_sampling_has_the_targets_joint_distribution(small_vocab, plain, setting):
    spec, kept = _speculative(small_vocab, setting)
    p_value, tv = _chi_square(spec, plain[_truth(setting)])
    print(f"{setting}: p = {p_value:.2g}, TV = {tv:.3f}, first drafts kept {kept:.0%}")
    assert p_value > FALSE_ALARM, (p_value, tv)
    assert 0 < kept < 1  # both paths ran: kept drafts and resampled ones


# Each bug, and the setting it shows at. Drafting from another q is no bug (rejection sampling is exact for the q it
# drew from); the target's own transform lost is. Accepting with p/q without the min is no bug either for a uniform
# draw (u < p/q and u < min(1, p/q) are one event): the ratio inverted is planted instead.
PLANTED = {
    "residual drawn from p": ("T=1, flat drafts", lambda e, mp: mp.setattr(sampling, "residual", lambda xp, p, q: p)),
    "bonus drawn from q": ("T=1, flat drafts", lambda e, mp: mp.setattr(sampling, "bonus", lambda xp, p, q: q[-1:])),
    "accept with q/p": ("T=1, flat drafts", lambda e, mp: mp.setattr(sampling, "keep_probability",
                                                                     lambda xp, p_x, q_x: xp.minimum(1.0, q_x / p_x))),
    "temperature on the draft only": ("T=0.5, top-k 2",
                                      lambda e, mp: setattr(e.acceptance, "sampling", Sampling(1.0, top_k=2))),
    "top-k on the draft only": ("T=0.5, top-k 2", lambda e, mp: setattr(e.acceptance, "sampling", Sampling(0.5))),
    "judged against another q than drawn from": ("T=1, mixture oracle", lambda e, mp: _judge_without_distractor(e)),
    "the bonus's uniform drawn again by the next decode": ("T=1, decode-verify, tokens 3-5",
                                                           lambda e, mp: _reuse_the_last_uniform(e)),
}


class _ReusingGenerator:
    """Test double around a numpy Generator for a planted bug: the last uniform of a verify's draw (the bonus's or
    the resample's) comes back once more at the next single draw (the next step's decode)."""

    def __init__(self, rng):
        self.rng, self.carry = rng, None

    def random(self, size=None):
        if size is None:
            value, self.carry = (self.rng.random(), None) if self.carry is None else (self.carry, None)
            return value
        out = self.rng.random(size)
        self.carry = out[-1]
        return out


def _reuse_the_last_uniform(engine: Engine) -> None:
    rule, fresh = engine.acceptance, engine.acceptance.new_generation

    def new_generation():
        fresh()
        rule.rng = _ReusingGenerator(rule.rng)

    rule.new_generation = new_generation


def _judge_without_distractor(engine: Engine) -> None:
    """The mixture draws from q but the verify judges it against q with the distractor's mass taken out."""
    rule, draw_from = engine.acceptance, engine.acceptance.draft_from

    def planted(xp, q):
        token = draw_from(xp, q)
        rule.q[-1] = xp.where(q == q.max(), 0.0, q) if q.max() >= 0.5 else q  # the distractor holds >= 1 - alpha
        rule.q[-1] = rule.q[-1] / rule.q[-1].sum()
        return token

    rule.draft_from = planted


@pytest.mark.filterwarnings("ignore:divide by zero")  # a planted q with no mass where a draft came from
@pytest.mark.parametrize("bug", list(PLANTED))
def test_the_loop_test_catches_a_planted_bug(small_vocab, plain, bug, monkeypatch):
    setting, plant = PLANTED[bug]
    spec, _ = _speculative(small_vocab, setting, plant, monkeypatch)
    p_value, tv = _chi_square(spec, plain[_truth(setting)])
    print(f"{bug}: p = {p_value:.2g}, TV = {tv:.3f}")
    assert p_value < FALSE_ALARM, (p_value, tv)


@pytest.mark.parametrize("bug", [None, "residual drawn from p"])
def test_each_row_of_a_batch_has_the_targets_joint_distribution(small_vocab, plain, bug, monkeypatch):
    """Four rows sampled together (mtplab.engine.speculative.generate), each from a generator of its own: the rows
    share the prompt, so a batch run gives four samples of the joint, N_RUNS in all, against plain sampling at batch 1 (flat drafts: the
    resample and bonus paths carry weight). The rows' tokens are each a batch-1 run's (tests/test_batch.py); this
    holds what they pool to, and a planted bug is caught the same way at batch 4."""
    engine = _engine(small_vocab, batch=4, flat_drafts=True)
    if bug is not None:
        PLANTED[bug][1](engine, monkeypatch)
    prompts = np.array([prompt_tokens(V, 6, 0)] * 4, dtype=np.int64)
    counts = np.zeros(V**COUNTED, dtype=np.int64)
    for r in range(N_RUNS // 4):
        engine.acceptance.seed = N_RUNS + 4 * r  # row b draws from seed + b: the rows' seeds never repeat
        for tokens in speculative.generate(engine, prompts, COUNTED).tokens:
            counts[np.ravel_multi_index(tokens[:COUNTED], (V,) * COUNTED)] += 1
    p_value, tv = _chi_square(counts, plain["T=1"])
    print(f"batch 4, {bug or 'no bug'}: p = {p_value:.2g}, TV = {tv:.3f}")
    assert (p_value < FALSE_ALARM) == (bug is not None), (p_value, tv)


def test_the_same_seed_gives_the_same_tokens(small_vocab):
    prompt = prompt_tokens(V, 6, 0)
    a = _engine(small_vocab, sample_seed=7, k=3).speculative(prompt, 24)["tokens"]
    b = _engine(small_vocab, sample_seed=7, k=3).speculative(prompt, 24)["tokens"]
    c = _engine(small_vocab, sample_seed=8, k=3).speculative(prompt, 24)["tokens"]
    assert a == b and a != c


# -- the oracle at temperature > 0: expected acceptance against measured ------------------------------------------
@pytest.mark.parametrize("alpha", [0.2, 0.8])
def test_the_mixture_oracle_keeps_drafts_at_the_rate_sum_min_p_q_sets(alpha):
    art = build_model(preset("tiny"))
    engine = Engine(RunConfig(model="tiny", drafter="oracle", alpha=alpha, temperature=1.0, k=3, tokens=160,
                              acceptance="rejection-sampling"), art)
    engine.acceptance.track(3)
    run = engine.speculative(prompt_tokens(art.description.vocab_size, 8, 0), 160)
    tracked = engine.acceptance.tracked()
    sa = theory.sampled_acceptance(run["accepted"], 3, tracked)
    assert tracked["judged"] == [sum(1 for a in run["accepted"] if a >= i - 1) for i in (1, 2, 3)]
    # q = alpha p + (1 - alpha) [d]: sum(min(p, q)) = alpha + (1 - alpha) p(d), at least alpha
    assert alpha - 1e-9 <= sa["expected"] <= alpha + (1 - alpha) * 0.5, sa
    assert flags.sampled_warning(sa) is None, sa  # kept at the expected rate within the test's false-alarm line
    assert engine.acceptance.expected is None  # tracking stopped


def test_the_mixture_oracle_is_reproducible_and_a_second_run_only_looks_rows_up():
    art = build_model(preset("tiny"))
    run = RunConfig(model="tiny", drafter="oracle", alpha=0.5, temperature=0.8, top_k=20, k=2, tokens=48,
                    acceptance="rejection-sampling", schedule="fused")
    engine = Engine(run, art)
    prompt = prompt_tokens(art.description.vocab_size, 8, 0)
    first = engine.speculative(prompt, 48)
    rows = engine.drafter_memory["target rows"]
    computed = rows.forwards
    again = engine.speculative(prompt, 48)
    assert again["tokens"] == first["tokens"] and again["accepted"] == first["accepted"]
    assert rows.forwards == computed > 0  # the timed rounds repeat the checked run: no target forward of their own
    other = Engine(run.replace(sample_seed=1), art).speculative(prompt, 48)
    assert other["tokens"] != first["tokens"]


def test_sampled_acceptance_far_from_its_expectation_is_flagged():
    ok = {"judged": 400, "kept": 352, "expected": 0.9, "measured": 0.88}
    bad = ok | {"kept": 300, "measured": 0.75}
    assert flags.sampled_warning(ok) is None
    w = flags.sampled_warning(bad)
    assert w["name"] == "sampled_acceptance" and "kept 300 of 400 judged drafts (75.0%)" in w["message"]
    # near-certain acceptance: one rejection in 300 is no alarm (a normal z-test would give z = -5.6)
    assert flags.sampled_warning({"judged": 300, "kept": 299, "expected": 0.9999, "measured": 299 / 300}) is None
    assert flags.sampled_warning({"judged": 10, "kept": 10, "expected": 1.0000000002, "measured": 1.0}) is None


def test_a_sampled_oracle_point_reports_expected_beside_measured_acceptance():
    from conftest import synthetic_calibration

    from mtplab.experiment.point import run_mtplab_point
    from mtplab.experiment.result_text import result_text

    r = run_mtplab_point(RunConfig(model="tiny", drafter="oracle", alpha=0.6, temperature=1.0, k=3, tokens=48,
                                   rounds=2, acceptance="rejection-sampling"), calibration=synthetic_calibration())
    sa = r.theory["sampled_acceptance"]
    assert r.lossless and not r.identity["timed_audit"]["problems"], r.verdict
    assert sa["judged"] > 0 and 0.6 - 1e-9 <= sa["expected"] < 1
    assert r.theory["alpha_source"].startswith("measured in the checked run")
    assert "oracle_acceptance" not in {w["name"] for w in r.warnings}  # alpha^i is greedy's law, not the mixture's
    text = result_text(r)
    assert "against an expected sum(min(p, q))" in text
    assert "\n  sampling T=1  " in text and "\n  greedy " not in text  # the baseline named for what it is


def test_a_tiny_temperature_is_greedy_not_nan():
    """logits / 1e-320 overflow: the largest is put at 0 first, so the others go to -inf and it keeps all the mass."""
    logits = np.array([[0.5, 2.0, -1.0, 2.0], [3.0, 1.0, 0.0, -2.0]], dtype=np.float32)
    p = Sampling(1e-320).probs(np, logits)
    assert np.isfinite(p).all() and p.tolist() == [[0.0, 0.5, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]]
