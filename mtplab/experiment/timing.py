"""How a calibration times a cost: blocks of calls in a row, a call right after what a step runs before it, and
each sample paired with a sample of T(1) beside it, so that the machine's drift cancels in the ratios a
prediction divides."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from mtplab.measure import floor, stats

# Samples per repeat of the costs every prediction divides (T(M), greedy's token): cheap beside the commits' and the
# head's acceptance, and what decides a prediction's noise.
FORWARD_SAMPLES = 5


def block_time(fn, reps: int, sync: Callable[[], None]) -> float:
    """Seconds per call over `reps` calls in a row, after one untimed call (a slot whose plan the item before left
    at another size recaptures there): a sample pays the occasional slow call, as a run does (a median of single
    calls would hide it, and a speculative step's wide forwards are the ones that have it). sync (Device.sync) at
    both ends: on a device whose runs return once queued, the block holds its calls' device time, queued back to
    back as a run queues them."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def time_after(before, fn, reps: int, sync: Callable[[], None]) -> float:
    """Seconds per call of fn over `reps` calls, each right after an untimed call of `before` (what a run does
    between two of fn's calls), after one untimed pair: a cost in the order a step pays it. A step's draft phase
    follows the target's forwards, which evict the head's weights from the caches; timed back to back, the head
    keeps them and reads far cheaper than a step pays."""
    before(), fn()
    total = 0.0
    for _ in range(reps):
        before()
        total += call_time(fn, sync)
    return total / reps


def time_targets(engine, forward, add, top: int, reps: int) -> int:
    """One repeat's T(M) samples for M = 2..top (each size's first forward untimed: its warm-up and capture), into
    PairedSamples.add; returns how many forwards the target slots ran eager meanwhile (a declined capture): a
    calibration times replays (`target_fallbacks`, 0 when T(M) holds replays only). The caller runs forward(top)
    once before the first repeat: a pinned Verify workspace keeps the size of its first forward, and one sized for
    M=2 declines every larger M's capture (each larger T(M) would time an eager forward)."""
    sync = engine.device.sync
    fallbacks = lambda: sum(c["fallbacks"] for c in engine.target.counters().values())  # noqa: E731
    before = fallbacks()
    for M in range(2, top + 1):
        forward(M)
        for _ in range(FORWARD_SAMPLES):
            add(f"target/{M}", lambda M=M: block_time(lambda: forward(M), reps, sync))
    return fallbacks() - before


def call_time(fn, sync: Callable[[], None]) -> float:
    """Seconds of one call of fn, the device's queued work done at both ends (sync: Device.sync)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


class PairedSamples:
    """Samples of each cost, each timed beside a sample of a reference cost (T(1)), which goes first for every other
    sample of the same cost. summary() gives each cost as its median ratio to the reference beside it times the
    reference's median over every pairing: the machine's drift between items cancels in the ratios that a prediction
    divides."""

    def __init__(self, reference: Callable[[], float], name: str):
        self.reference, self.name = reference, name
        self.references: list[float] = []
        self.ratios: dict[str, list[float]] = {}

    def add(self, name: str, measure: Callable[[], float]) -> None:
        """One sample of `name` (seconds from measure()) and one of the reference beside it."""
        first = len(self.ratios.get(name, ())) % 2 == 0
        ref = self.reference() if first else None
        value = measure()
        ref = ref if first else self.reference()
        self.references.append(ref)
        self.ratios.setdefault(name, []).append(value / ref)

    def summary(self) -> dict[str, dict]:
        """{name: median and CI in seconds, and the ratio to the reference with its CI}; the reference's own entry
        is summarized from its samples."""
        t_ref = stats.median(self.references)
        out = {self.name: stats.summarize(self.references) | {"ratio": 1.0}}
        for name, ratios in self.ratios.items():
            s = stats.summarize(ratios)
            out[name] = {"median": s["median"] * t_ref, "ci": [c * t_ref for c in s["ci"]], "ratio": s["median"],
                         "ratio_ci": s["ci"]}
        return out


IN_PLAN = ("replays", "captures", "warmups", "fallbacks")  # a slot's runs through its plans (not the eager prefills)


class PlanRuns(NamedTuple):
    """What a side's floor reads the change of: every capture state of the engine's executors, by (executor, slot,
    feed shapes), as Executor.plan_runs gives it, and the forwards their slots ran through their plans in all."""

    states: dict
    forwards: int


def plan_runs(engine) -> PlanRuns:
    """The engine's PlanRuns now (before a side, and after it)."""
    executors = (("target", engine.target), ("mtp", engine.mtp))
    return PlanRuns({(name, *key): runs for name, ex in executors for key, runs in ex.plan_runs().items()},
                    sum(c[k] for _, ex in executors for c in ex.activity().values() for k in IN_PLAN))


def floor_seconds(engine, before: PlanRuns, draws: int = 0) -> tuple[float, float]:
    """A side's floor (mtplab.measure.floor), timed right after the side: each plan it ran, replayed bare once per
    FLOOR_SHARE of its runs (at least once; after an untimed one where it ran 2 x FLOOR_SHARE or more), priced at the
    side's count. A plan captured during the side counts its replays since and the runs that set it up (its capture,
    a warm-up); the runs of a plan dropped meanwhile, or of one whose pooled buffers were given back, are not priced
    (the floor stays a lower bound). Returns the floor's seconds (0.0 where the side ran nothing through a plan) and
    the share of the side's runs through its plans that it prices (1.0: all of them). draws: a sampled greedy side's
    (plain sampling's) decodes, each drawing every row's token: its decode plan is replayed with a draw after each
    replay (a sampler's draws are its decoder's work, and a draw right after a forward costs about twice one alone:
    the forward has evicted what it reads)."""
    executors = {"target": engine.target, "mtp": engine.mtp}
    sync, total, priced = engine.device.sync, 0.0, 0
    draw = drawer(engine) if draws and engine.acceptance.samples else None
    now = plan_runs(engine)
    for (name, slot, key), (plan, replays, others) in now.states.items():
        if plan is None:
            continue
        old = before.states.get((name, slot, key), (None, 0, 0))
        count = replays - old[1] if old[0] is plan else replays + others - old[2]
        if count <= 0:
            continue
        reps, ex = max(1, count // floor.FLOOR_SHARE), executors[name]
        # one untimed first where it costs little beside the side (its memory back in the caches, as the side had it)
        if count >= 2 * floor.FLOOR_SHARE and not ex.replay_bare(slot, key, 1):
            continue
        sync()
        t0 = time.perf_counter()
        if draw is None:
            ran_bare = ex.replay_bare(slot, key, reps)
        else:
            ran_bare = all(ex.replay_bare(slot, key, 1) and draw() is not None for _ in range(reps))
        if not ran_bare:
            continue
        sync()
        total += count * (time.perf_counter() - t0) / reps
        priced += count
    ran = now.forwards - before.forwards
    return total, priced / ran if ran else 1.0


def drawer(engine) -> Callable[[], object]:
    """One sampled draw of every row's token from a logits row each, by the acceptance rule's own call (the
    decoder's). It advances the rule's generators: the next generation reseeds them."""
    xp, rows = engine.xp, engine.xp.zeros((engine.batch, engine.desc.vocab_size), dtype=engine.xp.float32)
    if engine.batch == 1:
        return lambda: engine.acceptance.token(xp, rows[0])
    placeholders = xp.zeros(engine.batch, dtype=xp.int64)  # the graph's greedy tokens, which sampling does not read
    return lambda: engine.acceptance.row_tokens(xp, rows, placeholders)


def paired_rounds(plan, paired: Callable[[int], dict]) -> list[dict]:
    """A point's paired rounds: paired(r) (one closed round) while the RoundsPlan wants more, then more while a side
    is beyond its timing floor's band, up to floor.CONFIRM_ROUNDS (how many: the plan's outcome["floor_rounds"])."""
    samples: list[dict] = []
    for r in plan.rounds(samples):
        samples.append(paired(r))
    more = 0
    while more < floor.CONFIRM_ROUNDS and floor.floor_problems(samples):
        samples.append(paired(len(samples)))
        more += 1
    plan.outcome["floor_rounds"] = more
    return samples
