"""The `mtplab` command line."""

from __future__ import annotations

import argparse
import json
import sys

from .config import COMMITS, DRAFTERS, SCHEDULES, RunConfig, run_problems
from .policy import POLICIES


def _model_build(args) -> int:
    from .model import build_model, preset

    try:
        cfg = preset(args.preset, weight_format="int4" if args.int4 else "fp32", dtype=args.dtype)
        art = build_model(cfg, out=args.out, force=args.force)
    except ValueError as err:
        print(f"mtplab model build: {err}", file=sys.stderr)
        return 2
    print(art.path)
    print(art.summary())
    return 0


def _export_genai(args) -> int:
    from .genai import export_genai, require_genai
    from .model import build_model, preset

    try:
        require_genai()
    except ValueError as err:
        print(f"mtplab model export-genai: {err}", file=sys.stderr)
        return 2
    art = build_model(preset(args.preset, weight_format="int4" if args.int4 else "fp32"))
    print(export_genai(art, args.out))
    return 0


def _doctor(args) -> int:
    from .doctor import format_report, report

    if args.gpu_check:
        from pathlib import Path

        from .gpucheck import gpu_check

        try:
            return gpu_check(args.presets, args.ks, args.tokens, Path(args.out), args.backend, args.budget)
        except ValueError as err:
            print(f"mtplab doctor --gpu-check: {err}", file=sys.stderr)
            return 2
    r = report()
    print(json.dumps(r, indent=1) if args.json else format_report(r))
    return 0


def _number(text: str):
    """An option's number, or its text unchanged so that validation names it with the others."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _run_config(args) -> tuple[RunConfig | None, list[str]]:
    """The run's RunConfig, or every problem with the options at once."""
    values = {
        "preset": args.preset,
        "k": args.k,
        "alpha": RunConfig.alpha if args.alpha is None else args.alpha,
        "drafter": args.drafter,
        "policy": args.policy,
        "commit": args.commit,
        "schedule": args.schedule,
        "tokens": args.tokens,
        "backend": args.backend,
        "seed": args.seed,
        "oracle_free_drafts": args.oracle_free_drafts,
        "validate": not args.no_validate,
        "retain_decode_graph_across_spec": not args.no_retain,
        "int4": args.int4,
        "engine": args.engine,
        "rounds": args.rounds,
    }
    problems = [f"--{p}" for p in run_problems(values)]
    if args.alpha is not None and args.drafter == "mtp":
        problems.append(
            f"--alpha {args.alpha} with --drafter mtp: alpha is the oracle drafter's acceptance; the MTP head's "
            "is measured (drop --alpha, or use --drafter oracle)"
        )
    return (None if problems else RunConfig(**values)), problems


def _run(args) -> int:
    run, problems = _run_config(args)
    if problems:
        print("mtplab run: " + "\n  ".join(["bad options:", *problems]), file=sys.stderr)
        return 2
    from .experiment import run_point, summary

    try:
        if run.engine == "mtplab":  # the cached calibration, measured first when missing (and said so)
            from .calibrate import load_or_measure

            load_or_measure(run.preset, say=lambda m: print(f"mtplab run: {m}", file=sys.stderr))
        result = run_point(run)
    except ValueError as err:  # the peer engine without its package, no CUDA backend: before any work
        print(f"mtplab run: {err}", file=sys.stderr)
        return 2
    if args.out:
        result.save(args.out)
    print(result.to_json() if args.json else summary(result))
    if not result.lossless and not args.allow_mismatch:
        return 1
    return 0


def _calibrate(args) -> int:
    from .calibrate import cache_key, cache_path, format_table, measure, threads_now
    from .model.config import PRESETS
    from .result import dumps, write_atomic

    if args.preset not in PRESETS or not (isinstance(args.repeats, int) and args.repeats >= 1):
        print(
            f"mtplab calibrate: --preset {args.preset!r} must be one of {list(PRESETS)} and --repeats "
            f"{args.repeats!r} an integer >= 1",
            file=sys.stderr,
        )
        return 2
    calib = measure(args.preset, repeats=args.repeats)
    text = dumps(calib, indent=1)
    write_atomic(cache_path(cache_key(args.preset, threads_now())), text)
    if args.out:
        from pathlib import Path

        write_atomic(Path(args.out), text)
    print(format_table(calib))
    return 0


def _sweep(args) -> int:
    from .sweep import main as sweep_main

    return sweep_main(args)


def _report(args) -> int:
    from .report import make_report

    try:
        path = make_report(args.sweep_dir)
    except ValueError as err:
        print(f"mtplab report: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mtplab", description="MTP speculative decoding under device graphs on hybrid models"
    )
    sub = p.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build and inspect models").add_subparsers(dest="model_command", required=True)
    b = model.add_parser("build", help="build the built-in model (cached by config hash)")
    b.add_argument("--preset", default="small")
    b.add_argument("--int4", action="store_true", help="int4 weights through MatMulNBits (block 32)")
    b.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"])
    b.add_argument("--out", help="artifact directory (default: the cache)")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.set_defaults(func=_model_build)

    e = model.add_parser("export-genai", help="write the model in onnxruntime-genai's form (target/ and mtp/)")
    e.add_argument("--preset", default="small")
    e.add_argument("--int4", action="store_true")
    e.add_argument("--out", required=True)
    e.set_defaults(func=_export_genai)

    d = sub.add_parser("doctor", help="report runtime, ops, CUDA and kernel status")
    d.add_argument("--json", action="store_true")
    d.add_argument("--gpu-check", action="store_true", help="run the CUDA backend's device check (see README)")
    d.add_argument("--presets", nargs="+", default=["small", "base"], help="gpu-check: presets to build and run")
    d.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3], help="gpu-check: draft lengths")
    d.add_argument("--tokens", type=int, default=64, help="gpu-check: tokens per run")
    d.add_argument("--backend", default="cuda", help="gpu-check: cuda, or cpu to rehearse it on the CPU EP")
    d.add_argument("--budget", type=float, default=270.0, help="gpu-check: seconds after which no run starts")
    d.add_argument("--out", default="gpu-check.json", help="gpu-check: result JSON")
    d.set_defaults(func=_doctor)

    r = sub.add_parser("run", help="greedy baseline vs speculative decoding, one point")
    r.add_argument("--preset", default="small")
    r.add_argument("--k", type=_number, default=3)
    r.add_argument("--drafter", default="mtp", help=f"one of {list(DRAFTERS)}")
    r.add_argument(
        "--alpha", type=_number, help="oracle drafter acceptance per position (default 0.8; not with --drafter mtp)"
    )
    r.add_argument("--policy", default="sibling-pinned", help=f"one of {list(POLICIES)}")
    r.add_argument("--commit", default="select", help=f"one of {list(COMMITS)}")
    r.add_argument("--schedule", default="decode-verify", help=f"one of {list(SCHEDULES)}")
    r.add_argument("--tokens", type=_number, default=128)
    r.add_argument("--backend", default="cpu")
    r.add_argument("--seed", type=_number, default=0, help="prompt seed, an integer >= 0")
    r.add_argument("--int4", action="store_true")
    r.add_argument("--rounds", type=_number, default=3, help="paired greedy/speculative timed rounds (>= 1)")
    r.add_argument("--engine", default="mtplab", help="mtplab, or ort-genai (the onnxruntime-genai peer)")
    r.add_argument("--oracle-free-drafts", action="store_true", help="oracle drafter skips the MTP head")
    r.add_argument("--no-validate", action="store_true", help="negative control: replay without the signature check")
    r.add_argument(
        "--no-retain", action="store_true", help="retain_decode_graph_across_spec off (the seed before its fix)"
    )
    r.add_argument("--allow-mismatch", action="store_true", help="exit 0 even if the lossless check fails")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object")
    r.add_argument("--out", help="also save the RunResult JSON here")
    r.set_defaults(func=_run)

    c = sub.add_parser("calibrate", help="measure the cost model's forward, head and commit times (cached)")
    c.add_argument("--preset", default="small")
    c.add_argument("--repeats", type=_number, default=3, help="interleaved repeats, at least 1")
    c.add_argument("--out", help="also write calibration.json here")
    c.set_defaults(func=_calibrate)

    s = sub.add_parser("sweep", help="run a grid of points through papermill")
    s.add_argument("spec", nargs="?", help="grid spec YAML (or use --preset)")
    s.add_argument("--preset", help="named grid: smoke or default")
    s.add_argument("--name", help="sweep name (folder under results/)")
    s.add_argument("--results", default="results", help="results root")
    s.add_argument("--workers", type=_number, help="processes, at least 1 (default: the core count)")
    s.add_argument("--timeout", type=_number, default=600, help="seconds per point, at least 1")
    s.add_argument("--resume", action="store_true", help="skip points already finished")
    s.add_argument("--executor", default="local", help="where points run: local (process pool) or ray")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray sized to this machine)")
    s.add_argument(
        "--allow-mismatch", action="store_true", help="exit 0 even if a point's lossless check fails (as for run)"
    )
    s.set_defaults(func=_sweep)

    rep = sub.add_parser("report", help="render a sweep into report.html")
    rep.add_argument("sweep_dir")
    rep.set_defaults(func=_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
