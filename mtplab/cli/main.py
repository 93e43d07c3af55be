"""The `mtplab` command line."""

from __future__ import annotations

import argparse
import json
import sys

from mtplab.cli import options
from mtplab.cli.options import EpilogFormatter, Formatter, Parser, add_run_options, lenient_number, option_help
from mtplab.experiment import config
from mtplab.experiment.config import RunConfig
from mtplab.experiment.params import BACKENDS


def failed(message: str) -> int:
    """A command's refusal: its message on stderr, and the exit status 2."""
    print(message, file=sys.stderr)
    return 2


def _model_build(args) -> int:
    from mtplab.base.files import output_folder_problem
    from mtplab.base.threads import use_global_pool
    from mtplab.model import build_model, preset_config

    if args.out is not None and (problem := output_folder_problem("--out", args.out)):
        return failed(f"mtplab model build: {problem}")
    if args.own_process:  # the build's reference runs thousands of forwards alone: one pool, spinning as default
        use_global_pool(0)
    try:
        art = build_model(preset_config(args.preset, args.int4, args.dtype), out=args.out, force=args.force)
    except ValueError as err:
        return failed(f"mtplab model build: {err}")
    print(art.path)
    print(art.summary())
    return 0


def _model_inspect(args) -> int:
    from mtplab.cli.inspect import inspect_text
    from mtplab.engine.models import model_for
    from mtplab.model import PRESETS
    from mtplab.model.folders import open_model

    try:
        model = model_for(RunConfig(model=args.folder)) if args.folder in PRESETS else open_model(args.folder)
    except ValueError as err:
        return failed(f"mtplab model inspect: {err}")
    print(inspect_text(model))
    return 0


def _export_genai(args) -> int:
    from mtplab.base.files import output_folder_problem
    from mtplab.experiment.genai_export import export_genai
    from mtplab.experiment.genai_runner import require_genai
    from mtplab.model import build_model, preset_config

    try:
        require_genai()
        if problem := output_folder_problem("--out", args.out):
            raise ValueError(problem)
    except ValueError as err:
        return failed(f"mtplab model export-genai: {err}")
    art = build_model(preset_config(args.preset, args.int4))
    print(export_genai(art, args.out))
    return 0


GPU_CHECK_OPTIONS = ("--presets", "--ks", "--tokens", "--out", "--backend", "--budget")


def _doctor(args) -> int:
    from mtplab.cli.doctor import format_report, report

    stray = [o for o in GPU_CHECK_OPTIONS if any(a == o or a.startswith(o + "=") for a in args.argv)]
    if stray and not args.gpu_check:
        return failed(f"mtplab doctor: {', '.join(stray)} belong to --gpu-check (the device check); without it doctor "
                      "only reports")
    if args.gpu_check:
        from pathlib import Path

        from mtplab.base.files import output_file_problem
        from mtplab.cli.gpucheck import gpu_check

        if problem := output_file_problem("--out", args.out):
            return failed(f"mtplab doctor --gpu-check: {problem}")
        try:
            return gpu_check(args.presets, args.ks, args.tokens, Path(args.out), args.backend, args.budget)
        except ValueError as err:
            return failed(f"mtplab doctor --gpu-check: {err}")
    r = report()
    print(json.dumps(r, indent=1) if args.json else format_report(r))
    return 0


def _run(args) -> int:
    from mtplab.base.files import output_file_problem
    from mtplab.model import PRESETS

    run, problems = options.run_config(args)
    if problem := output_file_problem("--out", args.out):
        problems.append(problem)
    if getattr(args, "backend", None) == "cuda":  # before anything is built for a device that is not here
        from mtplab.runtime.device import require_cuda

        try:
            require_cuda()
        except ValueError as err:
            problems.append(f"--backend cuda: {err}")
    if problems:
        return failed("mtplab run: " + "\n  ".join(["bad options:", *problems]))
    from mtplab.experiment.point import dedicate_process, run_point
    from mtplab.experiment.result_text import result_text

    if args.own_process:  # this process runs this point only: its sessions share one thread pool
        dedicate_process(run)
    try:
        model = None
        # a folder is opened once and checked against the run before anything is measured; a preset's build is
        # loaded (or made) here too, before its calibration: a runtime that cannot run it is refused first
        if run.model not in PRESETS or run.batch > 1 or run.engine == "mtplab":
            from mtplab.engine.models import model_for
            from mtplab.experiment.build import check_run_on_model

            model = model_for(run)
            check_run_on_model(run, model.description)
        calibration = None
        if run.engine == "mtplab":  # the cached calibration, measured first when missing (and said so)
            from mtplab.experiment.calibrate import load_or_measure

            say = lambda m: print(f"mtplab run: {m}", file=sys.stderr)  # noqa: E731
            calibration = load_or_measure(run.model, say=say, threads=run.threads, int4=run.int4, batch=run.batch)
        result = run_point(run, model, calibration=calibration)
    except ValueError as err:  # the peer engine without its package, no CUDA backend: before any work
        return failed(f"mtplab run: {err}")
    if args.out:
        result.save(args.out)
    print(result.to_json() if args.json else result_text(result, args.verbose))
    if not result.lossless and not args.allow_mismatch:
        return 1
    if result.suspect and not args.allow_suspect:
        return 3
    return 0


def _calibrate(args) -> int:
    from mtplab.base.files import output_file_problem, write_atomic
    from mtplab.base.threads import threads_used
    from mtplab.experiment.calibrate import REPEATS, cache_key, cache_path, measure
    from mtplab.experiment.calibration_text import format_table
    from mtplab.measure.result import dumps

    given, problems = options.given_options(args)
    if problem := output_file_problem("--out", args.out):
        problems.append(problem)
    values = config.defaults() | given
    model, threads, batch, int4 = values["model"], values["threads"], values["batch"], values["int4"]
    # as a run of these would be refused (a bad value; int4 with a folder), the other fields at their defaults
    problems += [options.as_options(p) for p in config.run_problems({"model": model, "threads": threads, "batch": batch, "int4": int4})]
    if not (isinstance(args.repeats, int) and not isinstance(args.repeats, bool) and args.repeats >= 1):
        problems.append(f"--repeats {args.repeats!r}: must be an integer >= 1")
    if args.recheck and (args.out or not problems and batch > 1):
        problems.append("--recheck measures at batch 1 and writes nothing: it takes neither --batch nor --out")
    if problems:
        return failed("mtplab calibrate: " + "\n  ".join(["bad options:", *problems]))
    from mtplab.base.threads import use_global_pool

    if args.own_process:  # as the points it calibrates run: every session on one pool
        use_global_pool(threads)
    if args.recheck:
        import json

        from mtplab.experiment.calibrate import recheck_now

        try:
            now = recheck_now(model, threads_used(threads), repeats=args.repeats, int4=int4)
        except ValueError as err:
            return failed(f"mtplab calibrate: {err}")
        print(json.dumps(now))
        return 0
    try:
        calib = measure(model, repeats=args.repeats, threads=threads, int4=int4, batch=batch)
    except ValueError as err:  # a folder mtplab refuses (or int4 with a folder): before any measurement
        return failed(f"mtplab calibrate: {err}")
    text = dumps(calib, indent=1)
    key = cache_key(model, threads_used(threads), args.repeats, int4, batch)
    path = cache_path(key)
    write_atomic(path, text)
    if args.out:
        from pathlib import Path

        write_atomic(Path(args.out), text)
    print(format_table(calib))
    print(f"written to {path}" + ("" if args.repeats == REPEATS else
          f" (--repeats {args.repeats}: kept apart from the {REPEATS}-repeat calibration runs and sweeps use)"))
    return 0


def _sweep(args) -> int:
    from mtplab.sweep.run import main as sweep_main

    return sweep_main(args)


def _report(args) -> int:
    from mtplab.report.publish import make_report

    if args.results:  # this command's own results root: where a sweep's name is looked up
        import os
        from pathlib import Path

        os.environ["MTPLAB_RESULTS"] = str(Path(args.results).resolve())
    try:
        path = make_report(args.sweep_dir, notebook="04_when_mtp_pays" if args.study else "report",
                           say=lambda line: print(f"mtplab report: {line}", file=sys.stderr))
    except ValueError as err:
        return failed(f"mtplab report: {err}")
    print(path)
    return 0


def _compare(args) -> int:
    from mtplab.base.files import output_file_problem
    from mtplab.report.compare import make_compare

    if problem := output_file_problem("--out", args.out):
        return failed(f"mtplab compare: {problem}")
    try:
        path = make_compare(args.a, args.b, args.out)
    except ValueError as err:
        return failed(f"mtplab compare: {err}")
    print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    from mtplab.model import PRESETS
    from mtplab.sweep.grid import presets as sweep_presets
    from mtplab.sweep.pool import EXECUTORS

    fmt = {"formatter_class": Formatter}
    p = Parser(prog="mtplab", description="MTP speculative decoding under device graphs on hybrid models", **fmt)
    sub = p.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build and inspect models", **fmt).add_subparsers(
        dest="model_command", required=True
    )
    b = model.add_parser("build", help="build the built-in model (cached by config hash)", **fmt)
    b.add_argument("--preset", default="small", choices=list(PRESETS), help="model preset")
    b.add_argument("--int4", action="store_true", help="int4 weights through MatMulNBits (block 32)")
    b.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"], help="activation dtype")
    b.add_argument("--out", help="artifact directory (default: the cache)")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.set_defaults(func=_model_build)

    e = model.add_parser(
        "export-genai", help="write the model in onnxruntime-genai's form (target/ and mtp/)", **fmt
    )
    e.add_argument("--preset", default="small", choices=list(PRESETS), help="model preset")
    e.add_argument("--int4", action="store_true", help="int4 weights through MatMulNBits")
    e.add_argument("--out", required=True, help="output folder (required)")
    e.set_defaults(func=_export_genai)

    from mtplab.model.builder import builder_forms_text

    i = model.add_parser(
        "inspect", help="what mtplab finds in a model folder: layers, I/O, state layouts, commits, missing ops",
        epilog="onnxruntime-genai model builder forms (genai 0.18, onnxruntime 1.32, tried):\n" + builder_forms_text(),
        formatter_class=EpilogFormatter,
    )
    i.add_argument("folder", help="a folder the onnxruntime-genai model builder wrote, or a preset name")
    i.set_defaults(func=_model_inspect)

    d = sub.add_parser("doctor", help="report runtime, ops, CUDA and kernel status", **fmt)
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--gpu-check", action="store_true", help="run the CUDA backend's device check (see README)")
    d.add_argument("--presets", nargs="+", default=["small", "base"], help="gpu-check: presets to build and run")
    d.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3], help="gpu-check: draft lengths")
    d.add_argument("--tokens", type=int, default=64, help="gpu-check: tokens per run")
    d.add_argument(
        "--backend", default="cuda", choices=list(BACKENDS), help="gpu-check: cuda, or cpu to rehearse it on the CPU EP"
    )
    d.add_argument("--budget", type=float, default=270.0, help="gpu-check: seconds after which no run starts")
    d.add_argument("--out", default="gpu-check.json", help="gpu-check: result JSON")
    d.set_defaults(func=_doctor)

    # Options are named as the spec's keys (--prompt-len is prompt_len); validation reports every bad one.
    r = sub.add_parser("run", help="greedy baseline vs speculative decoding, one point", **fmt)
    add_run_options(r)
    r.add_argument("--allow-mismatch", action="store_true", help="exit 0 even if the lossless check fails")
    r.add_argument("--allow-suspect", action="store_true",
                   help="exit 0 even if a timed side is beyond its timing floor's band (else exit 3)")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object")
    r.add_argument("--verbose", action="store_true", help="the identity check's details under its one-line verdict")
    r.add_argument("--out", help="also save the RunResult JSON here")
    r.set_defaults(func=_run)

    c = sub.add_parser("calibrate", help="measure the cost model's forward, head and commit times (cached)", **fmt)
    add_run_options(c, only=("model", "int4", "threads", "batch"))
    c.add_argument("--repeats", type=lenient_number, default=3, help="interleaved repeats, at least 1")
    c.add_argument("--out", help="also write calibration.json here")
    c.add_argument("--recheck", action="store_true",
                   help="measure again what every prediction divides (greedy's seconds per token, each T(M) over T(1)) "
                        "and print it as JSON, writing nothing: a sweep's re-check at its end, on the thread pool its "
                        "calibration and points ran on")
    c.set_defaults(func=_calibrate)

    s = sub.add_parser("sweep", help="run a grid of points through papermill", **fmt)
    s.add_argument("spec", nargs="?", help="grid spec YAML (or use --grid)")
    s.add_argument(
        "--grid",
        "--preset",
        dest="preset",
        metavar="GRID",
        help=option_help("named grid, instead of a spec (--preset: its older name; a spec's `preset` is the model's)", sweep_presets()),
    )
    s.add_argument("--name", help="sweep name, the folder under --results (default: the spec's name)")
    s.add_argument("--results", default=None, help="results root (default: $MTPLAB_RESULTS, else results/ in this checkout)")
    s.add_argument(
        "--workers",
        type=lenient_number,
        default=1,
        help="points run at once; 1 gives each point every core and timings you can trust "
        "(more points at once share the memory bandwidth and slow each other)",
    )
    s.add_argument("--timeout", type=lenient_number, default=600, help="seconds per point, at least 1")
    s.add_argument("--resume", action="store_true", help="skip points already finished")
    s.add_argument("--yes", action="store_true", help="run a grid of more points than the sweep's limit (2,000)")
    s.add_argument(
        "--reuse-calibration",
        action="store_true",
        help="use this machine's cached cost-model calibration instead of measuring it at the sweep's start "
        "(the report says which)",
    )
    s.add_argument("--executor", default="local", help=option_help("where points run", EXECUTORS))
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray sized to this machine)")
    s.add_argument(
        "--allow-mismatch", action="store_true", help="exit 0 even if a point's lossless check fails (as for run)"
    )
    s.set_defaults(func=_sweep)

    rep = sub.add_parser("report", help="render a sweep into report.html", **fmt)
    rep.add_argument("sweep_dir", help="a finished sweep's folder (e.g. results/demo), or its name (demo) in the "
                                       "results root ($MTPLAB_RESULTS, else results/)")
    rep.add_argument("--study", action="store_true",
                     help="render the study (notebooks/04_when_mtp_pays.ipynb: the seed's path, break-even acceptance, "
                          "your hardware's prediction) into study.html instead, from a `mtplab sweep --grid study`")
    rep.add_argument("--results", default=None, help="the results root a name is looked up in (as `mtplab sweep "
                                                      "--results` takes it; default: $MTPLAB_RESULTS, else results/)")
    rep.set_defaults(func=_report)

    c = sub.add_parser("compare", help="two sweeps side by side, points matched by their parameters", **fmt)
    c.add_argument("a", help="the baseline sweep's folder (A), or its name in the results root")
    c.add_argument("b", help="the sweep compared with it (B), its folder or name: ratios are B/A")
    c.add_argument("--out", help="HTML file to write (default: <B>/compare-<A's name>.html)")
    c.set_defaults(func=_compare)
    return p


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """The `mtplab` command. own_process: this process runs this command only (the `mtplab` executable, `python -m
    mtplab`), so a run or a calibration may give every session one shared thread pool (mtplab.base.threads)."""
    from mtplab.engine.strategies import PluginError

    try:
        args = parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        args.own_process = own_process
        return args.func(args)
    except PluginError as err:  # a plugin module named in the environment that does not import: one line, any command
        return failed(f"mtplab: {err}")


if __name__ == "__main__":
    sys.exit(main(own_process=True))
