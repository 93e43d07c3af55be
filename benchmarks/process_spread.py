"""One sweep point run again in fresh processes: its greedy, speculative rate and speedup between processes.

How far they move between processes, one after another, beside the CIs each process's own paired rounds give.
A sweep runs every point in a process of its own, and its report compares points. Each process here runs the very
point a sweep runs (mtplab.experiment.point: its thread pool, the checked pass, then paired rounds, order alternating) on
the same config, so the points differ only by what each process draws for itself and by the machine's drift over
the minute or two this takes. Per quantity: the median over
processes, the 95% scatter between them (1.96 sigmas of log rate, from the processes' medians) and the median
95% CI half-width within a process. Where the scatter exceeds the within-process width, a point's CI does not hold
what its process drew, and a speedup compared across points carries it: see the report's "Greedy from point to point".
A handful of processes pins the scatter only roughly (six: to within a factor of about two), and at 2-3 rounds a
process's CI is the range of its rounds: read the two columns as orders of magnitude, not to a percent.

With --inside R, one more process holds two engines of the point and runs R rounds of both greedies, then both
speculative runs (A first in even rounds, B first in odd ones): engine A over B on each side (what each engine drew, steadily) and each
side's variation over the rounds (what moved both engines over time).

With --pages both, the processes alternate between malloc's memory on 4 KiB pages and on huge pages
(GLIBC_TUNABLES=glibc.malloc.hugetlb=1, where the kernel gives them on request), and each quantity's ratio huge /
4 KiB is taken over the pairs of neighbouring processes: whether huge pages pay on this machine.

    python benchmarks/process_spread.py [--model small] [--threads 2] [--processes 6] [--rounds 5] [--tokens 48]
                                        [--k 2] [--alpha 0.7] [--schedule fused] [--inside R]
                                        [--pages as-is|huge|4k|both] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

from mtplab.base.memory import TUNABLE, huge_pages_summary, thp_mode
from mtplab.measure import stats

CHILD_LIMIT = 600  # seconds one process may take (a point of small takes about ten)
QUANTITIES = {"greedy_tokens_per_s": "greedy tok/s", "tokens_per_s": "speculative tok/s", "speedup": "speedup"}


def point(args):
    """The point's RunConfig (ValueError for a value a run refuses)."""
    from mtplab.experiment.config import RunConfig

    return RunConfig(model=args.model, threads=args.threads, k=args.k, drafter="oracle", alpha=args.alpha,
                     schedule=args.schedule, tokens=args.tokens, rounds=args.rounds)


def child(args) -> None:
    """One process: the point, run once; its per-quantity median and CI as one JSON line."""
    from mtplab.experiment.point import dedicate_process, run_point

    run = point(args)
    dedicate_process(run)  # as a sweep's point kernel: one thread pool for the process's sessions
    r = run_point(run)
    if not r.lossless:
        raise SystemExit(f"the point is not lossless: {r.verdict}")
    print(json.dumps({q: [getattr(r, q), *getattr(r, q + "_ci")] for q in QUANTITIES}))


def inside(args) -> None:
    """One process, two engines of the point, --inside rounds of both greedies then both speculative runs, A first in
    even rounds and B first in odd ones: each run's tokens/s as one JSON line, [greedy A, greedy B, speculative A,
    speculative B] a round (what each engine draws, and what moves both over time)."""
    from mtplab.engine.engine import Engine
    from mtplab.engine.models import model_for
    from mtplab.experiment.point import dedicate_process
    from mtplab.model.prompts import prompt_tokens

    run = point(args)
    dedicate_process(run)
    art = model_for(run)
    engines = [Engine(run, art), Engine(run, art)]
    prompt = prompt_tokens(art.description.vocab_size, run.prompt_len, run.seed)
    n = run.tokens
    reference = engines[0].greedy(prompt, n + run.k + 1, margins=False).tokens
    for e in engines:  # untimed: each engine's plans captured, its runs warm
        e.greedy(prompt, n, margins=False), e.speculative(prompt, n, reference)
    rows = []
    for r in range(args.inside):  # A before B in even rounds, B before A in odd ones: engine apart from position
        order = engines if r % 2 == 0 else engines[::-1]
        greedy = {id(e): (n - 1) / e.greedy(prompt, n, margins=False).seconds for e in order}
        spec = {id(e): (n - 1) / e.speculative(prompt, n, reference)["seconds"] for e in order}
        rows.append([greedy[id(e)] for e in engines] + [spec[id(e)] for e in engines])
    print(json.dumps(rows))


def inside_summary(rows: list[list[float]]) -> dict:
    """Two engines of one process over time: each side's median ratio A / B with its CI (what each engine drew,
    steadily), each side's coefficient of variation over the rounds (what moved it over time), and the correlation
    of A's and B's greedy over the rounds (moving together: the machine, not the engine)."""
    a = np.asarray(rows, dtype=float)
    cv = a.std(axis=0, ddof=1) / a.mean(axis=0)
    return {"greedy_a_over_b": stats.summarize(list(a[:, 0] / a[:, 1])),
            "speculative_a_over_b": stats.summarize(list(a[:, 2] / a[:, 3])),
            "greedy_cv": [float(cv[0]), float(cv[1])], "speculative_cv": [float(cv[2]), float(cv[3])],
            "greedy_correlation": float(np.corrcoef(a[:, 0], a[:, 1])[0, 1])}


def spread(rows: list[dict]) -> dict:
    """Per quantity: median over the processes, the 95% scatter between them (fraction), the median 95% CI
    half-width within one (fraction)."""
    out = {}
    for q in QUANTITIES:
        v = np.array([r[q] for r in rows], dtype=float)
        sigma = float(np.std(np.log(v[:, 0]), ddof=1)) if len(v) > 1 else math.nan
        out[q] = {"median": float(np.median(v[:, 0])), "between": math.expm1(1.96 * sigma),
                  "within": float(np.median((v[:, 2] - v[:, 1]) / 2 / v[:, 0])),
                  "values": [float(x) for x in v[:, 0]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", help="a preset name or a builder output folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=0.7)
    ap.add_argument("--schedule", default="fused")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--inside", type=int, default=0,
                    help="also run two engines of the point in one process for this many rounds each (0: not)")
    ap.add_argument("--pages", choices=("as-is", "huge", "4k", "both"), default="as-is",
                    help="the children's pages: as this process has them (as-is), malloc's "
                         "memory on huge pages (huge), on 4 KiB pages (4k), or both: --processes of each, "
                         "alternating, and each quantity's ratio huge / 4 KiB over the pairs of neighbouring processes "
                         "(mtplab.base.memory)")
    ap.add_argument("--child", choices=("point", "inside"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args) if args.child == "point" else inside(args)
    if args.processes < 2 or args.rounds < 2 or args.inside < 0 or 0 < args.inside < 3:
        ap.error(f"--processes {args.processes} --rounds {args.rounds} --inside {args.inside}: a spread needs two "
                 "processes, a CI two rounds, the engines inside one process three rounds (or 0: not run)")
    try:  # a value a run refuses, or a model that is no preset and no folder: said before any process starts
        from mtplab.engine.models import model_for

        model_for(point(args))
    except (ValueError, OSError) as err:
        ap.error(str(err))
    cmd = [sys.executable, __file__, *[f"--{a}={getattr(args, a)}" for a in
                                       ("model", "threads", "rounds", "tokens", "k", "alpha", "schedule", "inside")]]
    kinds = ("4k", "huge") if args.pages == "both" else (args.pages,)
    if "huge" in kinds and huge_pages_env() is None:
        ap.error(f"--pages {args.pages}: malloc's memory cannot be put on huge pages apart here (this process's pages: "
                 f"{huge_pages_summary()}); leave --pages out")
    load = [os.getloadavg()[0]]
    rows: dict[str, list] = {kind: [] for kind in kinds}
    for i in range(args.processes):
        for kind in kinds:
            rows[kind].append(_child(cmd + ["--child=point"], f"process {i + 1}", PAGES[kind]()))
            said = ", ".join(f"{name} {rows[kind][-1][q][0]:.2f}" for q, name in QUANTITIES.items())
            print(f"process {i + 1}" + (f" ({PAGE_NAMES[kind]})" if PAGE_NAMES[kind] else "") + f": {said}",
                  file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    result = {kind: spread(rows[kind]) for kind in kinds}
    print(f"{args.model}, {args.threads} threads, k={args.k} oracle alpha={args.alpha} {args.schedule}, {args.tokens} "
          f"tokens: {args.processes} fresh processes of {args.rounds} paired rounds each"
          + (", each kind of page in turn" if len(kinds) > 1 else "") + f" (load {load[0]:.2f} -> {load[1]:.2f})")
    for kind in kinds:
        print(f"{PAGE_NAMES[kind]:20} {'median':>9} {'between processes (95%)':>24} {'within one (CI, median)':>24}")
        for q, name in QUANTITIES.items():
            s = result[kind][q]
            print(f"{name:20} {s['median']:9.2f} {'±' + format(s['between'], '.1%'):>24} "
                  f"{'±' + format(s['within'], '.1%'):>24}")
    if len(kinds) > 1:
        result["huge_over_4k"] = {q: stats.summarize([h[q][0] / f[q][0] for h, f in zip(rows["huge"], rows["4k"])])
                                  for q in QUANTITIES}
        few = f" ({args.processes} pairs: a CI from so few is about their range)" if args.processes < 5 else ""
        print(f"huge / 4 KiB pages, over the pairs of neighbouring processes{few}: " + ", ".join(
            f"{name} {r['median']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"
            for name, r in ((QUANTITIES[q], result["huge_over_4k"][q]) for q in QUANTITIES)))
    within = None
    if args.inside:
        within = inside_summary(_child(cmd + ["--child=inside"], "the process of two engines"))
        g, sp = within["greedy_a_over_b"], within["speculative_a_over_b"]
        print(f"\ninside one process, two engines, {args.inside} rounds of both greedies then both speculative runs "
              "(A first, then B first):")
        print(f"  engine A / B: greedy {g['median']:.3f} [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}], "
              f"speculative {sp['median']:.3f} [{sp['ci'][0]:.3f}, {sp['ci'][1]:.3f}]")
        print(f"  over the rounds: greedy CV {within['greedy_cv'][0]:.1%} and {within['greedy_cv'][1]:.1%} "
              f"(A and B together: r = {within['greedy_correlation']:.2f}), speculative CV "
              f"{within['speculative_cv'][0]:.1%} and {within['speculative_cv'][1]:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "processes": args.processes, "rounds": args.rounds,
                       "load": load, "spread": result, "inside": within, "confidence": stats.CONFIDENCE}, f, indent=1)


def _other_tunables() -> list[str]:
    return [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and t.partition("=")[0] != TUNABLE]


def huge_pages_env() -> dict | None:
    """This environment with malloc's memory on huge pages; None where the kernel gives none on request (its THP
    mode is not madvise: under always every process has them, under never none can)."""
    if thp_mode() != "madvise":
        return None
    return {**os.environ, "GLIBC_TUNABLES": ":".join([*_other_tunables(), f"{TUNABLE}=1"])}


def small_pages_env() -> dict:
    """This environment less glibc.malloc.hugetlb: a child started with it keeps 4 KiB pages."""
    env, others = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}, _other_tunables()
    return env | ({"GLIBC_TUNABLES": ":".join(others)} if others else {})


PAGES = {"as-is": lambda: None, "huge": huge_pages_env, "4k": small_pages_env}  # a child's environment (None: this one)
PAGE_NAMES = {"as-is": "", "huge": "huge pages", "4k": "4 KiB pages"}


def _child(cmd: list[str], what: str, env: dict | None = None):
    """The last JSON line a child process printed; SystemExit naming `what` where it failed or ran too long."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_LIMIT, env=env)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what} ran past {CHILD_LIMIT} s: stopped") from None
    if done.returncode:
        said = done.stderr.strip().splitlines()
        raise SystemExit(f"{what} failed (exit {done.returncode}): {said[-1] if said else 'no message'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
