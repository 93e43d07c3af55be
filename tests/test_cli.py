"""`mtplab` command line: validation before work, one JSON object, exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtplab.cli.main import main
from mtplab.runtime.device import cuda_available


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "0"], "--k 0: must be an integer >= 1"),
        (["--k", "8"], "k+1=9 exceeds the GatedDeltaNet transition capacity 8"),
        (["--drafter", "oracle", "--alpha", "1.5"], "--alpha 1.5: must be within [0, 1]"),
        (["--drafter", "oracle", "--alpha", "0.9,0.2"], "--alpha (0.9, 0.2) sets each row's own acceptance: give one "
                                                        "value per row of a batch, --batch 2 (got --batch 1)"),
        (["--drafter", "oracle", "--alpha", "0.9,x"], "--alpha (0.9, 'x'): must be within [0, 1], a number (or, for"),
        (["--policy", "tiled"], "unknown --policy 'tiled'"),
        (["--commit", "rewind"], "unknown --commit 'rewind'"),
        (["--drafter", "ngram"], "unknown --drafter 'ngram'"),
        (["--tokens", "100000"], "exceeds the tiny model's max_seq_len 256"),
        (["--schedule", "eagle"], "unknown --schedule 'eagle'"),
        (["--seed", "-1"], "--seed -1: must be an integer >= 0"),
        (["--seed", str(2**63)], f"--seed {2**63}: must be an integer >= 0 (at most 2**63 - 1)"),  # a results table's int64
        (["--rounds", "1000000000"], "--rounds 1000000000: must be an integer in 1..1000"),
        (["--threads", "20000"], "--threads 20000: must be an integer in 0.."),
        (["--model", "tiny"], "--preset 'tiny' and --model 'tiny': name the model once"),
        (["--tokens", "1"], "--tokens 1: must be an integer >= 2"),
        (["--out", "."], "--out .: is a folder; give a file path"),
        (["--engine", "ort-genai", "--k", "17"], "--k 17 with --engine 'ort-genai': its MtpGenerator drafts at most 16"),
    ],
)
def test_bad_options_fail_before_any_work(args, message, capsys):
    assert main(["run", "--preset", "tiny", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA backend")
@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA backend")
def test_cuda_backend_without_a_gpu_says_what_is_missing_with_the_bad_options_before_any_build(capsys):
    assert main(["run", "--preset", "base", "--backend", "cuda", "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtplab run: bad options:") and "pip install 'mtplab[gpu]'" in err and "--seed -1" in err
    assert "building" not in err  # base is built by no test: a build would have said so


def test_json_prints_exactly_one_object(tiny, capsys):
    assert main(["run", "--preset", "tiny", "--k", "2", "--tokens", "24", "--json", "--allow-suspect"]) == 0
    out = capsys.readouterr().out
    obj = json.loads(out)
    assert obj["config"]["k"] == 2 and obj["lossless"] is True


def test_human_summary_has_counters_in_the_seed_form(tiny, capsys):
    assert main(["run", "--preset", "tiny", "--k", "2", "--tokens", "24", "--policy", "shared-max", "--allow-suspect"]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "verify: captures=1 replays=" in out and "OK: identical to greedy" in out


def test_identity_failure_exits_nonzero_unless_allowed(tiny, capsys):
    # its timing is no part of it: a loaded machine may read the point suspect (exit 3 unless allowed)
    bad = ["run", "--preset", "tiny", "--tokens", "48", "--policy", "sibling", "--no-validate", "--allow-suspect"]
    assert main(bad) == 1
    assert "LOSSLESS CHECK FAILED" in capsys.readouterr().err
    assert main(bad + ["--allow-mismatch"]) == 0


def test_model_build_prints_path_and_summary(tmp_path, capsys):
    assert main(["model", "build", "--preset", "tiny", "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(tmp_path / "m") and "GatedDeltaNet" in lines[1] and "params" in lines[1]


def test_doctor_reports_ops(capsys):
    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ops"]["GatedDeltaNet"] is True and "CPUExecutionProvider" in r["providers"]


def test_every_bad_option_is_reported_together_before_any_work(capsys):
    assert main(["run", "--preset", "tiny", "--k", "0", "--seed", "-1", "--policy", "tiled", "--tokens", "x"]) == 2
    err = capsys.readouterr().err
    for message in (
        "--k 0: must be",
        "--seed -1: must be an integer >= 0",
        "unknown --policy 'tiled'",
        "--tokens 'x': must be",
    ):
        assert message in err
    # a k beyond the model's limit is named beside the other bad options
    assert main(["run", "--preset", "tiny", "--k", "9", "--commit", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "--k 9: k+1=10 exceeds the GatedDeltaNet transition capacity 8" in err and "unknown --commit 'bogus'" in err
    # a k beyond the model's own limit is that problem alone: the token limit it would imply is no one's mistake
    assert main(["run", "--preset", "tiny", "--k", "99"]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  --k 99: k+1=100 exceeds the GatedDeltaNet transition capacity 8 (allowed: k in 1..7)"]


def test_alpha_with_the_mtp_drafter_is_an_error(capsys):
    assert main(["run", "--preset", "tiny", "--drafter", "mtp", "--alpha", "0.3"]) == 2
    assert "--alpha 0.3 with --drafter 'mtp': alpha belongs to the oracle drafter" in capsys.readouterr().err


def test_mtplab_engine_settings_with_the_genai_peer_are_an_error(capsys):
    """The peer runs none of them: a run that names one would be labelled with a setting it never ran."""
    assert main(["run", "--preset", "tiny", "--engine", "ort-genai", "--policy", "shared-jit", "--no-retain"]) == 2
    assert ("--policy shared-jit, --no-retain with --engine 'ort-genai': onnxruntime-genai's MtpGenerator runs its own "
            "decoder") in capsys.readouterr().err


def test_bad_sweep_options_are_reported_together(tmp_path, capsys):
    args = ["sweep", "--preset", "smoke", "--workers", "0", "--timeout", "0", "--name", "../x"]
    assert main(args + ["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--workers 0: must be an integer >= 1" in err and "--timeout 0" in err and "--name '../x'" in err
    assert not any(tmp_path.iterdir())


def test_json_never_contains_nan(tiny, capsys):
    # --allow-suspect: a busy machine may hold a 1-token side beyond its timing floor's band (exit 3, more rounds)
    assert main(["run", "--preset", "tiny", "--k", "2", "--tokens", "2", "--rounds", "1", "--json", "--allow-suspect"]) == 0
    obj = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert obj["steps"] == 1
    if obj["extra"]["rounds"]["floor_rounds"] == 0:  # one round has no interval: NaN, written as null
        assert obj["speedup_ci"] == [None, None]


def test_the_unvalidated_batched_readvance_is_refused_with_the_reason(capsys):
    args = ["run", "--preset", "tiny", "--policy", "sibling", "--commit", "readvance-batched", "--no-validate"]
    assert main(args) == 2
    assert "GroupQueryAttention rejects" in capsys.readouterr().err


@pytest.mark.parametrize("commit", ["readvance-m1", "select"])
def test_the_unvalidated_negative_control_runs_to_a_result(tiny, commit, capsys):
    args = ["run", "--preset", "tiny", "--tokens", "48", "--policy", "sibling", "--commit", commit, "--no-validate"]
    assert main(args + ["--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert obj["lossless"] is False and obj["slots"]["verify"]["hazards"] > 0


def _options(parser):
    """(command, option help) for every option of every subcommand, nested ones too."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {c}", h) for c, h in _options(sub))
        elif action.option_strings and action.dest != "help":
            yield action.option_strings[-1], parser.formatter_class(parser.prog)._get_help_string(action)


def test_help_gives_every_options_default_and_the_choices():
    from mtplab.cli.main import parser

    helps = dict(_options(parser()))
    missing = [name for name, text in helps.items() if "(default" not in text]
    assert not missing, f"options without a default in --help: {missing}"
    assert "a preset name (tiny, small, base" in helps["run --model"] and "older name of --model" in helps["run --preset"]
    assert "choices: cpu, cuda" in helps["run --backend"]
    assert "cuda" in helps["sweep --preset"] and "smoke" in helps["sweep --preset"]
    assert parser().parse_args(["sweep", "--grid", "smoke"]).preset == "smoke"  # --grid: a spec's preset is the model
    for command in ("run", "calibrate", "sweep", "report", "compare", "doctor", "model"):  # every help prints
        with pytest.raises(SystemExit) as done:
            parser().parse_args([command, "--help"])
        assert done.value.code == 0
    assert "95% interval" in parser()._subparsers._group_actions[0].choices["run"].format_help()


def test_sweep_runs_one_point_at_a_time_by_default_and_says_why(capsys):
    from mtplab.cli.main import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "timings you can trust" in text and "(default: 1)" in text
    assert parser().parse_args(["sweep", "--preset", "smoke"]).workers == 1


def test_preset_and_model_together_are_refused_even_when_the_preset_is_the_default(capsys):
    assert main(["run", "--preset", "small", "--model", "tiny"]) == 2
    assert "--preset 'small' and --model 'tiny': name the model once" in capsys.readouterr().err
    assert main(["calibrate", "--preset", "small", "--model", "tiny"]) == 2


def test_an_onnxruntime_without_the_cpu_kernel_is_refused_in_one_line_before_any_build(monkeypatch, capsys):
    from mtplab.engine import models
    from mtplab.model import artifact

    monkeypatch.setattr(models, "cpu_kernel_present", lambda: False)  # test double: as on the 1.30/1.31 CPU wheels
    monkeypatch.setattr(artifact, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    monkeypatch.setattr(models, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    assert main(["run", "--preset", "tiny", "--k", "2", "--tokens", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no CPU GatedDeltaNet kernel" in err[0] and "onnxruntime>=1.32" in err[0]


def test_calibrate_refuses_what_a_run_would_refuse_in_the_runs_words(capsys):
    folder = str(Path(__file__).parent / "data" / "builder-tiny")
    assert main(["calibrate", "--model", "tiny", "--batch", "0"]) == 2
    assert "--batch 0: must be an integer >= 1" in capsys.readouterr().err
    assert main(["calibrate", "--model", folder, "--int4"]) == 2
    assert "--int4 True with a model folder: int4 builds a preset's weights as int4" in capsys.readouterr().err


def test_every_output_path_is_checked_before_any_work(tmp_path, capsys):
    afile, fifo, loop = tmp_path / "afile", tmp_path / "fifo", tmp_path / "loop"
    afile.write_text("")
    os.mkfifo(fifo)
    loop.symlink_to(tmp_path / "pool")
    (tmp_path / "pool").symlink_to(loop)
    cases = [
        (["calibrate", "--model", "tiny", "--out", str(tmp_path)], "--out " + str(tmp_path) + ": is a folder"),
        (["compare", str(tmp_path), str(tmp_path), "--out", str(tmp_path)], "is a folder; give a file path"),
        (["sweep", "--grid", "smoke", "--results", str(afile)], f"--results {afile}: is a file, not a folder"),
        (["sweep", "--grid", "smoke", "--results", str(tmp_path), "--name", "index.html"], "the results index's file"),
        (["model", "build", "--preset", "tiny", "--out", str(afile / "x")], f"{afile} is a file, not a folder"),
        (["model", "export-genai", "--preset", "tiny", "--out", str(afile)], f"--out {afile}: is a file, not a folder"),
        (["doctor", "--gpu-check", "--out", str(tmp_path)], "is a folder; give a file path"),
        # written by renaming a new file over the path: a device or a pipe would be replaced by a plain file
        (["run", "--preset", "tiny", "--out", "/dev/null"], "--out /dev/null: is a device, not a regular file"),
        (["calibrate", "--model", "tiny", "--out", str(fifo)], f"--out {fifo}: is a named pipe, not a regular file"),
        (["run", "--preset", "tiny", "--out", str(loop)], f"--out {loop}: cannot be followed ("),
        # root passes every permission check: the folder is asked to take a file (others are told it is not writable)
        (["run", "--preset", "tiny", "--out", "/proc/mtplab.json"], "--out /proc/mtplab.json: /proc "),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        assert message in capsys.readouterr().err, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fifo", "loop", "pool"]  # nothing written, no temp file left
    assert Path("/dev/null").is_char_device()


def test_a_result_written_through_a_symbolic_link_goes_to_its_target(tmp_path):
    from mtplab.base.files import output_file_problem, write_atomic

    target, link = tmp_path / "results.json", tmp_path / "latest.json"
    target.write_text("old")
    link.symlink_to(target)
    assert output_file_problem("--out", link) is None
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "latest.json", "results.json"]


def test_a_plugin_that_does_not_import_is_one_line_for_any_command(monkeypatch, capsys):
    import mtplab.engine.strategies as strategies

    monkeypatch.setenv("MTPLAB_PLUGINS", "no_such_plugin_module")
    monkeypatch.setattr(strategies, "_plugins_loaded", False)
    assert main(["run", "--preset", "tiny"]) == 2
    assert capsys.readouterr().err == ("mtplab: MTPLAB_PLUGINS / mtplab.plugins names 'no_such_plugin_module', which "
                                       "does not import: No module named 'no_such_plugin_module'\n")
    monkeypatch.delenv("MTPLAB_PLUGINS")
    monkeypatch.setattr(strategies, "_plugins_loaded", False)


def test_options_that_belong_to_another_mode_are_refused_not_ignored(capsys):
    assert main(["doctor", "--ks", "1", "2"]) == 2
    assert "--ks belong to --gpu-check" in capsys.readouterr().err
    assert main(["sweep", "--grid", "smoke", "--address", "10.0.0.1:6379"]) == 2
    assert "--address 10.0.0.1:6379: a Ray cluster's address, for --executor ray only" in capsys.readouterr().err
    assert main(["sweep", "spec.yaml", "--grid", "smoke"]) == 2
    assert "give a grid spec file or --grid (one of" in (err := capsys.readouterr().err) and "), not both" in err


@pytest.mark.parametrize("argv, said", [
    (["run", "--modle", "tiny"], "mtplab run: unrecognized arguments: --modle (did you mean --model?), tiny"),
    (["run", "--k"], "mtplab run: argument --k: expected one argument"),
    (["model", "build", "--presett", "tiny"], "mtplab model build: unrecognized arguments: --presett (did you mean "
                                              "--preset?), tiny"),
])
def test_an_option_argparse_refuses_is_one_line_from_its_own_command(capsys, argv, said):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(said) and err.count("\n") == 1 and "usage:" not in err, err


def test_an_out_path_in_a_folder_that_does_not_exist_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "r.json"
    for args in (["run", "--preset", "tiny", "--out", str(out)], ["calibrate", "--model", "tiny", "--out", str(out)],
                 ["compare", str(tmp_path), str(tmp_path), "--out", str(out)]):
        assert main(args) == 2, args
        assert f"--out {out}: its folder {out.parent} does not exist; make it first" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no folder made


def test_a_temperature_alone_samples_with_rejection_sampling_and_a_named_rule_is_kept(capsys):
    from mtplab.cli.main import parser
    from mtplab.cli.options import run_config

    run, problems = run_config(parser().parse_args(["run", "--preset", "tiny", "--temperature", "0.7"]))
    assert problems == [] and run.acceptance == "rejection-sampling"
    assert run_config(parser().parse_args(["run", "--preset", "tiny"]))[0].acceptance == "greedy-match"
    assert main(["run", "--preset", "tiny", "--temperature", "0.7", "--acceptance", "greedy-match"]) == 2
    assert "--temperature 0.7 samples, but --acceptance 'greedy-match' decodes greedily" in capsys.readouterr().err
