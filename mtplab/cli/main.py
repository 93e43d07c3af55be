"""The `mtplab` command line."""

from __future__ import annotations

import argparse
import json
import sys

from mtplab.experiment import config
from mtplab.experiment.config import BACKENDS, RunConfig


def _model_build(args) -> int:
    from mtplab.base.files import output_folder_problem
    from mtplab.base.threads import use_global_pool
    from mtplab.model import build_model, preset_config

    if args.out is not None and (problem := output_folder_problem("--out", args.out)):
        print(f"mtplab model build: {problem}", file=sys.stderr)
        return 2
    if args.own_process:  # the build's reference runs thousands of forwards alone: one pool, spinning as default
        use_global_pool(0)
    try:
        art = build_model(preset_config(args.preset, args.int4, args.dtype), out=args.out, force=args.force)
    except ValueError as err:
        print(f"mtplab model build: {err}", file=sys.stderr)
        return 2
    print(art.path)
    print(art.summary())
    return 0


def _model_inspect(args) -> int:
    from mtplab.cli.inspect import inspect_text
    from mtplab.engine.engine import model_for
    from mtplab.model import PRESETS
    from mtplab.model.folders import open_model

    try:
        model = model_for(RunConfig(model=args.folder)) if args.folder in PRESETS else open_model(args.folder)
    except ValueError as err:
        print(f"mtplab model inspect: {err}", file=sys.stderr)
        return 2
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
        print(f"mtplab model export-genai: {err}", file=sys.stderr)
        return 2
    art = build_model(preset_config(args.preset, args.int4))
    print(export_genai(art, args.out))
    return 0


GPU_CHECK_OPTIONS = ("--presets", "--ks", "--tokens", "--out", "--backend", "--budget")


def _doctor(args) -> int:
    from mtplab.cli.doctor import format_report, report

    stray = [o for o in GPU_CHECK_OPTIONS if any(a == o or a.startswith(o + "=") for a in args.argv)]
    if stray and not args.gpu_check:
        print(f"mtplab doctor: {', '.join(stray)} belong to --gpu-check (the device check); without it doctor only "
              "reports", file=sys.stderr)
        return 2
    if args.gpu_check:
        from pathlib import Path

        from mtplab.base.files import output_file_problem
        from mtplab.cli.gpucheck import gpu_check

        if problem := output_file_problem("--out", args.out):
            print(f"mtplab doctor --gpu-check: {problem}", file=sys.stderr)
            return 2
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


def _flag(f) -> str:
    """A RunConfig field's option: its metadata's, else --name-with-dashes (--no-... for a boolean defaulting True)."""
    if f.metadata["flag"]:
        return f.metadata["flag"]
    name = f.name.replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


def add_run_options(p: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One option per RunConfig field (or those named in `only`), from its metadata, in option groups by field group.

    Numbers are parsed leniently (a bad one reaches validation, which names it with the others);
    a boolean is a switch turning its default around. An older option name (an alias) is an option of
    its own, so that giving both is refused rather than one silently winning.
    """
    groups = {name: p.add_argument_group(f"{name} options") for name in config.GROUPS} if only is None else {}
    for f in config.fields():
        if only is not None and f.name not in only:
            continue
        # argparse formats help texts with %: a literal one ("95% interval") must be written %%
        meta, where = f.metadata | {"help": f.metadata["help"].replace("%", "%%")}, groups.get(f.metadata["group"], p)
        if isinstance(f.default, bool):
            action = "store_false" if f.default else "store_true"
            text = (f"turns {f.name} off: {meta['help']} (default: not given, {f.name} on)" if f.default
                    else meta["help"] + " (default: off)")
            where.add_argument(_flag(f), dest=f.name, action=action, default=None, help=text)
            continue
        kind = _number if isinstance(f.default, (int, float)) else None
        text = _help(meta["help"], config.choices(f))
        text += f" (default {f.default} when not given)" if meta["cli_unset"] else f" (default: {f.default})"
        where.add_argument(_flag(f), dest=f.name, type=kind, help=text)
        for n, alias in enumerate(meta["aliases"]):
            where.add_argument(alias, dest=f"{f.name}__alias{n}", type=kind, metavar=f.name.upper(), help=f"older name of {_flag(f)}")


def given_options(args) -> tuple[dict, list[str]]:
    """The RunConfig fields the command line gave (an alias's value under its field), and each field named twice."""
    given, twice = {}, []
    for f in config.fields():
        if getattr(args, f.name, None) is not None:
            given[f.name] = getattr(args, f.name)
        for n, alias in enumerate(f.metadata["aliases"]):
            other = getattr(args, f"{f.name}__alias{n}", None)
            if other is None:
                continue
            if f.name in given:
                twice.append(f"{alias} {other!r} and {_flag(f)} {given[f.name]!r}: name the {f.name} once")
            else:
                given[f.name] = other
    return given, twice


def as_options(problem: str) -> str:
    """A RunConfig problem in the command line's words: each field named by its option (`k=0` -> `--k 0`)."""
    import re

    for f in sorted(config.fields(), key=lambda f: -len(f.name)):
        flag = "--" + f.name.replace("_", "-")
        problem = re.sub(rf"(?<![\w-]){f.name}=", f"{flag} ", problem)
        problem = re.sub(rf"^unknown {f.name} ", f"unknown --{f.name.replace('_', '-')} ", problem)
    return problem


def _run_config(args) -> tuple[RunConfig | None, list[str]]:
    """The run's RunConfig, or every problem with the options at once."""
    given, problems = given_options(args)
    values = config.defaults() | config.with_implied_acceptance(given)
    try:
        run = RunConfig(**values)
    except config.ConfigError as err:
        run, problems = None, problems + [as_options(p) for p in err.problems]
    # A drafter parameter given at all (its default value too) belongs to its drafter, as in a grid.
    explicit = {n: v for n, v in given.items() if n in config.drafter_params()}
    problems += [t for p in config.drafter_param_problems(values["drafter"], explicit) if (t := as_options(p)) not in problems]
    by_name = {f.name: f for f in config.fields()}
    problems += [as_options(p) for p in config.engine_param_problems(
        values["engine"], given, lambda n, v: _flag(by_name[n]) if isinstance(v, bool) else f"{_flag(by_name[n])} {v}")]
    return (None if problems else run), problems


def _run(args) -> int:
    from mtplab.base.files import output_file_problem
    from mtplab.model import PRESETS

    run, problems = _run_config(args)
    if problem := output_file_problem("--out", args.out):
        problems.append(problem)
    if getattr(args, "backend", None) == "cuda":  # before anything is built for a device that is not here
        from mtplab.runtime.device import require_cuda

        try:
            require_cuda()
        except ValueError as err:
            problems.append(f"--backend cuda: {err}")
    if problems:
        print("mtplab run: " + "\n  ".join(["bad options:", *problems]), file=sys.stderr)
        return 2
    from mtplab.experiment.point import dedicate_process, result_text, run_point

    if args.own_process:  # this process runs this point only: its sessions share one thread pool
        dedicate_process(run)
    try:
        model = None
        # a folder is opened once and checked against the run before anything is measured; a preset's build is
        # loaded (or made) here too, before its calibration: a runtime that cannot run it is refused first
        if run.model not in PRESETS or run.batch > 1 or run.engine == "mtplab":
            from mtplab.engine.engine import model_for
            from mtplab.engine.fit import check_run_on_model

            model = model_for(run)
            check_run_on_model(run, model.description)
        calibration = None
        if run.engine == "mtplab":  # the cached calibration, measured first when missing (and said so)
            from mtplab.experiment.batch_calibrate import load_or_measure_batch

            say = lambda m: print(f"mtplab run: {m}", file=sys.stderr)  # noqa: E731
            calibration = load_or_measure_batch(run.model, run.batch, say=say, threads=run.threads, int4=run.int4)
        result = run_point(run, model, calibration=calibration)
    except ValueError as err:  # the peer engine without its package, no CUDA backend: before any work
        print(f"mtplab run: {err}", file=sys.stderr)
        return 2
    if args.out:
        result.save(args.out)
    print(result.to_json() if args.json else result_text(result, args.verbose))
    if not result.lossless and not args.allow_mismatch:
        return 1
    return 0


def _calibrate(args) -> int:
    from mtplab.base.files import output_file_problem, write_atomic
    from mtplab.base.threads import threads_used
    from mtplab.experiment.calibrate import REPEATS, cache_key, cache_path, format_table, measure
    from mtplab.measure.result import dumps

    given, problems = given_options(args)
    if problem := output_file_problem("--out", args.out):
        problems.append(problem)
    values = config.defaults() | given
    model, threads, batch, int4 = values["model"], values["threads"], values["batch"], values["int4"]
    # as a run of these would be refused (a bad value; int4 with a folder), the other fields at their defaults
    problems += [as_options(p) for p in config.run_problems({"model": model, "threads": threads, "batch": batch, "int4": int4})]
    if not (isinstance(args.repeats, int) and not isinstance(args.repeats, bool) and args.repeats >= 1):
        problems.append(f"--repeats {args.repeats!r}: must be an integer >= 1")
    if args.recheck and (args.out or not problems and batch > 1):
        problems.append("--recheck measures at batch 1 and writes nothing: it takes neither --batch nor --out")
    if problems:
        print("mtplab calibrate: " + "\n  ".join(["bad options:", *problems]), file=sys.stderr)
        return 2
    from mtplab.base.threads import use_global_pool

    if args.own_process:  # as the points it calibrates run: every session on one pool
        use_global_pool(threads)
    if args.recheck:
        import json

        from mtplab.experiment.calibrate import recheck_now

        try:
            now = recheck_now(model, threads_used(threads), repeats=args.repeats, int4=int4)
        except ValueError as err:
            print(f"mtplab calibrate: {err}", file=sys.stderr)
            return 2
        print(json.dumps(now))
        return 0
    from mtplab.experiment.batch_calibrate import batch_key, measure_batch

    try:
        if batch > 1:
            calib = measure_batch(model, batch, repeats=args.repeats, threads=threads, int4=int4)
        else:
            calib = measure(model, repeats=args.repeats, threads=threads, int4=int4)
    except ValueError as err:  # a folder mtplab refuses (or int4 with a folder): before any measurement
        print(f"mtplab calibrate: {err}", file=sys.stderr)
        return 2
    text = dumps(calib, indent=1)
    key = (batch_key(model, threads, batch, args.repeats, int4) if batch > 1
           else cache_key(model, threads_used(threads), args.repeats, int4))
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
        path = make_report(args.sweep_dir, notebook="04_when_mtp_pays" if args.study else "report")
    except ValueError as err:
        print(f"mtplab report: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose mistakes are one line from the command they belong to: an unrecognized option is
    refused by that command (with the option it most likely meant), not by `mtplab` with its whole usage."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not self._subparsers:  # a command's own parser (a group's leaves it to its command)
            from mtplab.base.names import likeliest

            options = [o for o in self._option_string_actions if o.startswith("--")]
            named = [extra + (f" (did you mean {close}?)" if extra.startswith("-") and (
                close := likeliest(extra.split("=")[0], options)) else "") for extra in extras]
            self.error(f"unrecognized argument{'s' if len(extras) > 1 else ''}: {', '.join(named)}")
        return namespace, extras

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists every option)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help: `off` for a flag; none added where the help says it already."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.default is None:
            return text + " (default: none)"
        if action.default is False or (isinstance(action, argparse._StoreFalseAction) and action.default is True):
            return text + " (default: off)"  # a switch: off unless given
        return super()._get_help_string(action)


class _EpilogFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """_Formatter whose description and epilog keep their own lines."""


def _help(text: str, choices=None) -> str:
    """An option's help with its choices; the formatter appends the default."""
    return text + (f" (choices: {', '.join(choices)})" if choices else "")


def _compare(args) -> int:
    from mtplab.base.files import output_file_problem
    from mtplab.report.compare import make_compare

    if problem := output_file_problem("--out", args.out):
        print(f"mtplab compare: {problem}", file=sys.stderr)
        return 2
    try:
        path = make_compare(args.a, args.b, args.out)
    except ValueError as err:
        print(f"mtplab compare: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    from mtplab.model import PRESETS
    from mtplab.sweep.grid import presets as sweep_presets
    from mtplab.sweep.pool import EXECUTORS

    fmt = {"formatter_class": _Formatter}
    p = _Parser(prog="mtplab", description="MTP speculative decoding under device graphs on hybrid models", **fmt)
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
        formatter_class=_EpilogFormatter,
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
    r.add_argument("--json", action="store_true", help="print exactly one JSON object")
    r.add_argument("--verbose", action="store_true", help="the identity check's details under its one-line verdict")
    r.add_argument("--out", help="also save the RunResult JSON here")
    r.set_defaults(func=_run)

    c = sub.add_parser("calibrate", help="measure the cost model's forward, head and commit times (cached)", **fmt)
    add_run_options(c, only=("model", "int4", "threads", "batch"))
    c.add_argument("--repeats", type=_number, default=3, help="interleaved repeats, at least 1")
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
        help=_help("named grid, instead of a spec (--preset: its older name; a spec's `preset` is the model's)", sweep_presets()),
    )
    s.add_argument("--name", help="sweep name, the folder under --results (default: the spec's name)")
    s.add_argument("--results", default=None, help="results root (default: $MTPLAB_RESULTS, else results/ in this checkout)")
    s.add_argument(
        "--workers",
        type=_number,
        default=1,
        help="points run at once; 1 gives each point every core and timings you can trust "
        "(more points at once share the memory bandwidth and slow each other)",
    )
    s.add_argument("--timeout", type=_number, default=600, help="seconds per point, at least 1")
    s.add_argument("--resume", action="store_true", help="skip points already finished")
    s.add_argument("--yes", action="store_true", help="run a grid of more points than the sweep's limit (2,000)")
    s.add_argument(
        "--reuse-calibration",
        action="store_true",
        help="use this machine's cached cost-model calibration instead of measuring it at the sweep's start "
        "(the report says which)",
    )
    s.add_argument("--executor", default="local", help=_help("where points run", EXECUTORS))
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
        print(f"mtplab: {err}", file=sys.stderr)
        return 2


def console() -> int:
    """The executable's entry point as checkouts before mtplab.cli.entry installed it (a console script not made again
    since)."""
    return main(own_process=True)


if __name__ == "__main__":
    sys.exit(main(own_process=True))
