"""`make bench`: the benchmarks, each in a process of its own, and one table of what they found.

- greedy and MTP against onnxruntime-genai (benchmarks/mtplab_vs_genai.py) on `small` and on the builder
  fixture (in three processes: one process's ratio moves ±2-3% with its draw of memory placement), and on any
  folder given with --also, at 1 and 2 threads: medians of the per-round paired ratios with 95% CIs; beside greedy, its captured
  plan replayed in a bare loop against genai (the ceiling of any host loop on that forward);
- engine greedy against a bare replay loop, greedy's host path layer by layer, and the speculative host share
  (benchmarks/executor_overhead.py, tiny, 1 thread);
- below greedy's loop, on each model at one thread (benchmarks/forward_gap.py): the same forward through
  onnxruntime's Python module (what mtplab runs) and its libonnxruntime.so (what genai loads), with a static
  attention span (a replayed plan's) against a growing one, and on a session whose first run was a prefill against
  one whose first run was a decode (mtplab's engines warm their decode up first): parts of "greedy mtplab / genai"
  no loop can move;
- one demo point run again in fresh processes (benchmarks/process_spread.py, small, 2 threads): how far its greedy
  and its speedup move between processes, beside the CI each process's own rounds give, with malloc's memory on
  4 KiB pages and on huge pages in turn (where the kernel gives them on request: mtplab.base.memory), and each
  quantity's ratio huge / 4 KiB;
- the efficiency range of the demo's sibling-pinned/select points (demo in the results root, when `make demo` ran),
  how many of them have their whole CI below 0.9 (each point's efficiency is one estimate from a few rounds), and
  how far it follows each point's own greedy (mtplab.report.baseline).
Each line names its thread pool; --pools global per-session runs the pool comparison side by side
(processes alternating). The load average is printed before and after: numbers from a busy machine
are not numbers.

    python benchmarks/bench.py [--rounds 5] [--fixture-rounds 21] [--fixture-processes 3] [--also DIR]
                               [--tokens 128] [--pools global] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mtplab.base.memory import thp_mode

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "tests" / "data" / "builder-tiny"
GOALS = {"greedy": ">= 1.0 (CI low >= 0.95)", "mtp": "> 1", "ratio": "<= 1.2x", "share": "<= 20%",
         "efficiency": ">= 0.9"}


def _run(script: str, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(out.read_text())


def _ci(r: dict, pct: bool = False) -> str:
    lo, hi = r["ci"]
    f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.2f}")
    return f"{f(r['median'])} [{f(lo)}, {f(hi)}]"


def efficiency_range(sweep: Path) -> str | None:
    """min / median / max efficiency of a sweep's sibling-pinned/select mtplab points, or None without the sweep."""
    if not (sweep / "results.parquet").exists():
        return None
    from mtplab.experiment.config import defaults
    from mtplab.report import baseline
    from mtplab.report.tables import ci_pair
    from mtplab.sweep import store

    df = store.load(sweep)
    d = defaults()
    own = df[(df.status == "ok") & (df.engine == "mtplab") & (df.policy == d["policy"]) & (df.commit == d["commit"])]
    e = own.efficiency.dropna()
    if e.empty:
        return None
    highs = [ci_pair(ci)[1] for ci in own.loc[e.index, "efficiency_ci"]]
    below = sum(high < 0.9 for high in highs)  # a point estimate is one draw: its CI says whether it is below
    text = (f"min {e.min():.2f}, median {e.median():.2f}, max {e.max():.2f} over {len(e)} points; "
            f"{below} of {len(highs)} with the whole 95% CI below 0.9")
    drawn = [d for _, _, d in baseline.draws(own) if math.isfinite(d["r"])]
    if drawn:  # how much of the range is the greedy each point drew (mtplab.report.baseline): its largest group
        d = max(drawn, key=lambda d: d["with_efficiency"])
        text += (f"; against each point's greedy slope {d['slope']:.2f} [{d['slope_ci'][0]:.2f}, {d['slope_ci'][1]:.2f}], "
                 f"at the median greedy {d['adjusted'][0]:.2f}-{d['adjusted'][2]:.2f}")
    return text


def genai_rows(name: str, runs: list[dict]) -> list[tuple[str, str, str, str]]:
    """The table's rows of mtplab_vs_genai runs on one model and thread count: each ratio from the run whose value is
    the median over the runs (processes), every run's median beside it where there are several."""
    def row(what: str, pick, goal: str = "") -> tuple[str, str, str, str]:
        values = sorted((pick(r) for r in runs), key=lambda v: v["median"])
        text = _ci(values[(len(values) - 1) // 2])
        if len(values) > 1:
            medians = ", ".join(f"{v['median']:.2f}" for v in values)
            text += f" ({len(values)} processes: {medians})"
        return name, what, text, goal

    def lowest(schedule: str):  # each schedule against the same genai MtpGenerator run, its lowest over k
        return lambda r: min((v for key, v in r["ratios"].items() if key.startswith("mtp") and key.endswith(schedule)),
                             key=lambda v: v["median"])

    rows = [row("greedy mtplab / genai", lambda r: r["ratios"]["greedy"], GOALS["greedy"]),
            row("greedy's bare plan replay / genai (ceiling)", lambda r: r["ratios"]["bare"])]
    rows += [row(f"MTP mtplab {schedule} / genai, lowest over k", lowest(schedule), GOALS["mtp"])
             for schedule in ("fused", "decode-verify")]
    rows += [(name, "OUTPUT DIFFERS FROM GREEDY", str(r["identical"]), "") for r in runs if not all(r["identical"].values())]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fixture-rounds", type=int, default=21,
                    help="rounds on the builder fixture (a 0.13 ms forward: 21 rounds take seconds; 5 gave CIs 0.4 wide)")
    ap.add_argument("--fixture-processes", type=int, default=3,
                    help="processes per thread count on the builder fixture, each its own draw of memory placement "
                         "(one process's ratio moves ±2-3%%): the table gives the median process and every one's median")
    ap.add_argument("--also", action="append", default=[], metavar="DIR",
                    help="another model folder to run against genai too (e.g. scripts/make-builder-fixture --state-heavy)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pools", nargs="+", default=["global"], choices=("global", "per-session"))
    ap.add_argument("--quick", action="store_true", help="tiny and the fixture only, 3 rounds of 64 tokens")
    args = ap.parse_args()
    for option in ("rounds", "fixture_rounds", "fixture_processes", "tokens"):
        if getattr(args, option) < 1:
            ap.error(f"--{option.replace('_', '-')} {getattr(args, option)}: must be at least 1")
    rounds, tokens = (3, 64) if args.quick else (args.rounds, args.tokens)
    models = ["tiny", str(FIXTURE)] if args.quick else ["small", str(FIXTURE)]
    for folder in args.also:
        if not (Path(folder) / "genai_config.json").is_file():
            ap.error(f"--also {folder}: not a builder output folder (no genai_config.json)")
    print(f"load before: {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models + [str(Path(f).resolve()) for f in args.also]:
            fixture = model == str(FIXTURE) and not args.quick
            for threads in (1, 2):
                for pool in args.pools:
                    n = args.fixture_rounds if fixture else rounds
                    runs = [_run("mtplab_vs_genai.py", ["--model", model, "--threads", str(threads), "--rounds", str(n),
                                                        "--tokens", str(tokens), "--pool", pool],
                                 Path(tmp) / f"genai-{len(rows)}-{i}.json")
                            for i in range(args.fixture_processes if fixture else 1)]
                    name = f"{Path(model).name}, {threads} thread{'s' if threads > 1 else ''}, {pool} pool"
                    rows += genai_rows(name, runs)
        for model in models:
            out = Path(tmp) / f"gap-{Path(model).name}.json"
            r = _run("forward_gap.py", ["--model", model, "--rounds", "5" if args.quick else "21"], out)
            rows.append((f"{Path(model).name}, 1 thread", "a forward: Python module / libonnxruntime.so",
                         _ci(r["ratios"]["build"]), ""))
            rows.append((f"{Path(model).name}, 1 thread", "a forward: static span / growing span",
                         _ci(r["ratios"]["span"]), ""))
            rows.append((f"{Path(model).name}, 1 thread", "a forward: session prefilled first / decoded first",
                         _ci(r["ratios"]["history"]), ""))
        for pool in args.pools:
            out = Path(tmp) / f"overhead-{pool}.json"
            measured = _run("executor_overhead.py", ["--threads", "1", "--pool", pool]
                            + (["--rounds", "5"] if args.quick else []), out)
            t, layers = measured["per_token"], measured["greedy_layers"]
            name = f"tiny, 1 thread, {pool} pool"
            rows.append((name, "greedy's host path by layer, x plan replay",
                         ", ".join(f"{layer.lstrip('+ ').split(',')[0]} {m['ratio']:.2f}" for layer, m in layers.items()
                                   if layer != "plan replay"), ""))
            rows.append((name, "engine greedy / bare replay loop", _ci({"median": t["ratio"], "ci": t["ratio_ci"]}),
                         GOALS["ratio"]))
            rows.append((name, "speculative host share (k=3): as clocked (upper)",
                         _ci({"median": t["share"], "ci": t["share_ci"]}, True), GOALS["share"]))
            rows.append((name, "  less the forward clock's own cost (lower)",
                         _ci({"median": t["share_unclocked"], "ci": t["share_unclocked_ci"]}, True), GOALS["share"]))
        spread_model, spread_threads = ("tiny", 2) if args.quick else ("small", 2)  # the demo's model and threads
        out = Path(tmp) / "spread.json"
        pages = "as-is" if thp_mode() != "madvise" else "both"  # huge / 4 KiB pages side by side where malloc has both
        r = _run("process_spread.py", ["--model", spread_model, "--threads", str(spread_threads), "--pages", pages]
                 + (["--processes", "3", "--rounds", "3"] if args.quick else []), out)
        name = f"{spread_model}, {spread_threads} threads, {r['processes']} processes"
        for kind, pages_named in (("as-is", ""), ("4k", ", 4 KiB pages"), ("huge", ", huge pages")):
            for q, what in (("greedy_tokens_per_s", "one point's greedy"), ("speedup", "one point's speedup")):
                if kind in r["spread"]:
                    s = r["spread"][kind][q]
                    rows.append((name, f"{what}{pages_named}: between processes (95%)",
                                 f"±{s['between']:.1%} (within one ±{s['within']:.1%})", ""))
        if "huge_over_4k" in r["spread"]:
            for q, what in (("greedy_tokens_per_s", "greedy"), ("speedup", "speedup")):
                rows.append((name, f"{what}, huge / 4 KiB pages (neighbouring processes)",
                             _ci(r["spread"]["huge_over_4k"][q]), ""))
    from mtplab.base.paths import results_root

    demo = efficiency_range(results_root() / "demo")  # where `make demo` wrote it ($MTPLAB_RESULTS, else results/)
    rows.append((f"{results_root().name}/demo", "efficiency, sibling-pinned/select points", demo or "no demo sweep (make demo)",
                 GOALS["efficiency"]))
    print(f"\nload after: {os.getloadavg()}")
    width = max(28, *(len(value) for _, _, value, goal in rows if goal))  # the goals in one column
    measure = max(48, *(len(what) for _, what, _, _ in rows))
    print(f"{'where':42} {'measure':{measure}} {'median [95% CI]':{width}} goal")
    for where, what, value, goal in rows:
        print(f"{where:42} {what:{measure}} {value:{width}} {goal}")


if __name__ == "__main__":
    main()
