"""Builder output folders: described from genai_config.json and the graphs, run losslessly, refused when wrong.

All on tests/data/builder-tiny (onnxruntime-genai's model builder output for a tiny random-weight
Qwen3.5 hybrid: 3 LinearAttention layers, 1 attention layer, one MTP layer).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from mtplab.check import verdict as oracle
from mtplab.check.lossless import checked_pass
from mtplab.cli.inspect import inspect_text
from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.builder import open_builder
from mtplab.model.prompts import prompt_tokens
from mtplab.runtime.executor import Slot, Status

FIXTURE = Path(__file__).parent / "data" / "builder-tiny"


@pytest.fixture(scope="module")
def builder():
    return open_builder(FIXTURE)


def _run(**changes) -> RunConfig:
    values = {"model": "tiny", "drafter": "oracle", "alpha": 0.7, "tokens": 24} | changes
    if values["drafter"] != "oracle":  # alpha is the oracle's
        values.pop("alpha")
    return RunConfig(**values)


def _checked(model, run: RunConfig):
    engine = Engine(run, model)
    prompt = prompt_tokens(model.description.vocab_size, run.prompt_len, run.seed)
    checked = checked_pass(engine, prompt, run.tokens)
    greedy, spec, identity = checked.greedy, checked.spec, checked.identity
    ok, verdict = oracle.verdict(identity)
    return engine, greedy, spec, identity, ok, verdict


def test_inspect_lists_the_layers_the_head_and_the_state_layouts(builder):
    text = inspect_text(builder)
    assert "4 layers = 3 linear-attention (LinearAttention) + 1 attention" in text
    assert [line.split(": ")[1] for line in text.splitlines() if line.startswith("  layer ")][:4] == [
        "linear-attention", "linear-attention", "linear-attention", "attention"]
    assert "MTP head mtp.onnx: tokens input_ids, hidden hidden_states -> logits logits, hidden hidden_states_out" in text
    assert "past.0.conv -> present.0.conv [1, 192, 3] float32, [B, C, K-1] channels-first" in text
    assert ("past.0.recurrent -> present.0.recurrent [1, 4, 16, 32] float32, [B, Hv, Dk, Dv] K-major (from LinearAttention); "
            "in place on the CPU; on CUDA its own present buffer, copied after the forward") in text
    assert "(from CausalConvWithState); own present buffer, copied after the forward" in text  # on every provider
    assert "position_ids [3, 1, M] (MRoPE)" in text
    assert "select: runs" in text and "ops CPUExecutionProvider lacks in model.onnx: none" in text
    assert "Primary (greedy, the decode, prefills, re-advances) runs model.onnx given a session of its own" in text


def test_the_users_folder_is_left_as_the_builder_wrote_it(builder):
    assert builder.description.target.path.parent != FIXTURE  # select's copy lives in the cache
    assert builder.description.original_target == FIXTURE / "model.onnx"
    outputs = {o.name for o in onnx.load(str(FIXTURE / "model.onnx"), load_external_data=False).graph.output}
    assert not any(o.name in outputs for roles in builder.description.target.select_outputs.values()
                   for o in roles.values())


def test_greedy_equals_onnxruntime_genai_generator_on_the_same_folder(builder):
    pytest.importorskip("onnxruntime_genai")
    from mtplab.experiment.genai_builder import builder_peer_folder
    from mtplab.experiment.genai_runner import GenaiPeer

    prompt = prompt_tokens(builder.description.vocab_size, 8, 0)
    ours = Engine(_run(k=1), builder).greedy(prompt, 48).tokens
    theirs, _ = GenaiPeer(builder_peer_folder(builder, 1)).greedy(prompt, 48)
    assert ours == theirs and len(set(ours)) > 16


def test_the_peers_copy_of_a_builder_folder_runs_the_target_on_the_runs_threads_and_the_head_on_one(builder, tmp_path,
                                                                                                    monkeypatch):
    from mtplab.experiment.genai_builder import builder_peer_folder

    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))
    folder = builder_peer_folder(builder, 2)

    def threads(part):
        return json.loads((folder / part / "genai_config.json").read_text())["model"]["decoder"]["session_options"][
            "intra_op_num_threads"]

    assert (threads("target"), threads("mtp")) == (2, 1)


@pytest.mark.parametrize("schedule", ["decode-verify", "fused"])
@pytest.mark.parametrize("commit", ["readvance-m1", "readvance-batched", "select"])
def test_oracle_drafts_are_lossless_at_k_1_and_4_for_every_commit(builder, commit, schedule):
    for k in (1, 4):
        _, greedy, spec, identity, ok, verdict = _checked(builder, _run(k=k, commit=commit, schedule=schedule))
        assert ok, verdict
        assert spec.tokens[0][:24] == greedy.tokens[0][:24]
        assert identity["state_commits_checked"] == spec.steps + 1
        assert sum(spec.accepted[0]) > 0  # alpha 0.7: some drafts accepted, the commit path exercised


def test_select_keeps_the_state_readvance_m1_keeps(builder):
    states = {}
    for commit in ("readvance-m1", "select"):
        engine, *_, ok, verdict = _checked(builder, _run(k=3, commit=commit))
        assert ok, verdict
        states[commit] = {n: a.copy() for n, a in engine.state.recurrent().items()}
    for name, a in states["select"].items():
        assert np.max(np.abs(a - states["readvance-m1"][name])) <= 1e-5, name


def test_the_mtp_head_drafts_losslessly(builder):
    engine, greedy, spec, _, ok, verdict = _checked(builder, _run(k=2, drafter="mtp"))
    assert ok, verdict
    assert engine.forwards["mtp/M=1"] == 2 * spec.steps


@pytest.mark.parametrize("policy", ["sibling-pinned", "shared-max"])
def test_both_slots_replay_with_no_fallbacks_primary_on_the_users_graph_given_a_session_of_its_own(builder, policy):
    engine, *_, ok, verdict = _checked(builder, _run(k=3, policy=policy))
    assert ok, verdict
    counters = engine.target.counters()
    for slot in ("primary", "verify"):
        assert counters[slot]["replays"] > 0 and counters[slot]["fallbacks"] == 0, (slot, counters)
    sessions = engine.target.sessions
    select = {o.name for roles in builder.description.target.select_outputs.values() for o in roles.values()}
    assert select <= {o.name for o in sessions[Slot.VERIFY].get_outputs()}
    if policy == "sibling-pinned":  # greedy and the decode pay nothing for select's extra outputs
        assert not select & {o.name for o in sessions[Slot.PRIMARY].get_outputs()}
    else:  # one session holds both slots' plans: mtplab's copy
        assert sessions[Slot.PRIMARY] is sessions[Slot.VERIFY]


def test_shared_jit_declines_the_verify_capture(builder):
    engine, *_, ok, verdict = _checked(builder, _run(k=3, policy="shared-jit"))
    assert ok, verdict
    counters = engine.target.counters()
    assert counters["verify"]["replays"] == 0 and counters["verify"]["fallbacks"] > 0


# -- refused folders --------------------------------------------------------------------------------
@pytest.fixture
def copy(tmp_path):
    out = tmp_path / "model"
    shutil.copytree(FIXTURE, out)
    return out


def _rename_input(folder: Path, old: str, new: str) -> None:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for v in model.graph.input:
        if v.name == old:
            v.name = new
    for node in model.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
    onnx.save(model, str(folder / "model.onnx"))


def test_a_missing_weights_file_is_refused_naming_it(copy):
    (copy / "mtp.onnx.data").unlink()
    with pytest.raises(ValueError, match=r"missing file mtp\.onnx\.data \(external weights of mtp\.onnx\)"):
        open_builder(copy)


def test_a_weights_file_cut_short_is_refused_naming_it_and_its_size(copy):
    data = copy / "model.onnx.data"
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match=rf"model\.onnx\.data holds {size // 2:,} bytes, but model\.onnx's weights "
                                         rf"reach {size:,} into it: the file is cut short"):
        open_builder(copy)


def test_a_folder_without_genai_config_is_refused(copy):
    (copy / "genai_config.json").unlink()
    with pytest.raises(ValueError, match="missing file genai_config.json"):
        open_builder(copy)


def test_a_renamed_input_is_refused_naming_it(copy):
    _rename_input(copy, "attention_mask", "mask")
    with pytest.raises(ValueError, match=r"model\.onnx has no input named 'attention_mask'"):
        open_builder(copy)


def test_a_renamed_state_input_is_refused_naming_it(copy):
    _rename_input(copy, "past.1.recurrent", "past.1.state")
    with pytest.raises(ValueError, match=r"past\.1\.state"):
        open_builder(copy)


def test_an_unknown_state_layout_is_refused(copy):
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    for v in model.graph.input:
        if v.name == "past.0.recurrent":
            v.type.tensor_type.shape.dim[2].dim_param = "d_state"
    onnx.save(model, str(copy / "model.onnx"))
    with pytest.raises(ValueError, match=r"unknown state layout: past\.0\.recurrent is declared \['batch_size', 4, 'd_state', 32\]"):
        open_builder(copy)


def test_a_config_without_an_mtp_head_is_refused(copy):
    cfg = json.loads((copy / "genai_config.json").read_text())
    del cfg["model"]["mtp"]
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no enabled `mtp` section"):
        open_builder(copy)


def test_cli_inspect_prints_the_report_and_refuses_a_folder_that_is_no_model(tmp_path, capsys):
    from mtplab.cli.main import main

    assert main(["model", "inspect", str(FIXTURE)]) == 0
    assert "3 linear-attention (LinearAttention) + 1 attention" in capsys.readouterr().out
    assert main(["model", "inspect", str(tmp_path)]) == 2
    assert "neither genai_config.json" in capsys.readouterr().err
    cut = tmp_path / "weights-cut"  # weights cut short are said to be that, in one line, not a missing op
    shutil.copytree(FIXTURE, cut)
    with open(cut / "mtp.onnx.data", "r+b") as f:
        f.truncate(1000)
    assert main(["model", "inspect", str(cut)]) == 2
    err = capsys.readouterr().err
    assert "mtp.onnx.data holds 1,000 bytes, but mtp.onnx's weights reach" in err and "onnxruntime" not in err


def test_cli_run_on_the_folder_is_lossless_and_records_the_model(tmp_path, capsys):
    from mtplab.cli.main import main

    out = tmp_path / "r.json"
    code = main(["run", "--model", str(FIXTURE), "--drafter", "oracle", "--alpha", "0.7", "--k", "2", "--tokens", "24",
                 "--rounds", "1", "--commit", "select", "--out", str(out), "--allow-suspect"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["lossless"] and result["model"]["name"] == "builder-tiny" and result["model"]["kind"] == "builder"
    assert result["config"]["model"] == str(FIXTURE.resolve())


def test_cli_run_refuses_a_k_beyond_the_capacity_before_any_work(capsys):
    from mtplab.cli.main import main

    assert main(["run", "--model", str(FIXTURE), "--tokens", "250", "--k", "3"]) == 2
    assert "exceeds builder-tiny's KV capacity 256" in capsys.readouterr().err


def test_the_genai_peer_runs_on_the_same_folder(builder):
    pytest.importorskip("onnxruntime_genai")
    from mtplab.experiment.genai_point import run_genai_point

    r = run_genai_point(_run(engine="ort-genai", drafter="mtp", k=2, rounds=1, tokens=24), builder)
    assert r.lossless and r.model["name"] == "builder-tiny"


def test_ops_the_runtime_lacks_are_refused_naming_them(copy, monkeypatch):
    from mtplab.model import artifact

    monkeypatch.setattr(artifact, "available_ops", lambda: _without("LinearAttention"))  # an older onnxruntime
    with pytest.raises(ValueError, match=r"lacks ops its graphs use: \['LinearAttention'\] \(LinearAttention: onnxruntime 1\.30\.0"):
        open_builder(copy)


def _without(op: str) -> set[str]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return {s.name for s in C.get_all_operator_schema() if s.domain in ("", "com.microsoft")} - {op}


def test_crossed_key_and_value_names_are_refused(copy):
    cfg = json.loads((copy / "genai_config.json").read_text())
    names = cfg["model"]["decoder"]["inputs"]
    names["past_key_names"], names["past_value_names"] = names["past_value_names"], names["past_key_names"]
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"KV names do not match the attention node: past key is 'past_key_values\.3\.value'"):
        open_builder(copy)


def test_a_head_reading_another_hidden_output_is_refused(copy):
    cfg = json.loads((copy / "genai_config.json").read_text())
    cfg["model"]["mtp"]["main_hidden_states"] = "last_hidden"
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mtp\.main_hidden_states is 'last_hidden'"):
        open_builder(copy)


@pytest.mark.parametrize("edit, outcome", [
    ({"context_length": 1024}, 256),  # the graph's rotary tables hold 256 positions: past them nothing runs
    ({"context_length": "abc"}, r"model\.context_length is 'abc', not a whole number of tokens"),
    ({"context_length": 4096.7}, r"model\.context_length is 4096\.7, not a whole number of tokens above 0"),
    ({"context_length": 0}, r"model\.context_length is 0, not a whole number"),
    ({"decoder": {"num_hidden_layers": 2}}, "3 linear-attention (LinearAttention) + 1 attention"),  # the graph's layers
    ({"decoder": {"num_hidden_layers": 6}}, "3 linear-attention (LinearAttention) + 1 attention"),
    ({"vocab_size": 1024}, r"disagrees with the graphs: model\.onnx's logits is declared \[\.\.\., 512\], "
                           r"genai_config\.json's model\.vocab_size is 1024"),
    ({"decoder": {"hidden_size": 64}}, r"model\.onnx's hidden_states is declared \[\.\.\., 128\], genai_config\.json's "
                                       r"model\.decoder\.hidden_size is 64"),
    # the KV head dim is symbolic in these graphs: the attention node's annotated widths say what it computes
    ({"decoder": {"head_size": 16}}, r"model\.onnx: the head size disagrees: genai_config\.json's "
                                     r"model\.decoder\.head_size is 16; attention layer 3 computes heads of 32 "
                                     r"\(.*GroupQueryAttention's input .* is \[\.\.\., 128\] over 4 heads\)"),
    ({"mtp": {"head_size": 64}}, r"mtp\.onnx: the head size disagrees: genai_config\.json's model\.mtp\.head_size is 64"),
    ({"decoder": {"head_size": "32"}}, r"model\.decoder\.head_size is '32', not a whole number above 0"),
    ({"decoder": {"head_size": None}}, 256),  # not given: the attention node's own
    ({"decoder": {"head_size": 32.0}}, 256),  # a whole number, as some writers give it
    ({"context_length": 128.0}, 128),
])
def test_genai_config_values_are_held_to_the_graphs(copy, edit, outcome):
    cfg = json.loads((copy / "genai_config.json").read_text())
    for key, value in edit.items():
        if isinstance(value, dict):
            cfg["model"][key].update(value)
        else:
            cfg["model"][key] = value
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    if isinstance(outcome, int):
        desc = open_builder(copy).description
        assert desc.capacity == outcome
        assert {kv.head_dim for kv in (*desc.target.kv, *desc.mtp.kv)} == {32}  # the graph's own, whatever was given
    elif "layers" in str(edit):
        assert outcome in inspect_text(open_builder(copy))
    else:
        with pytest.raises(ValueError, match=outcome):
            open_builder(copy)


def _attention_graph(copy: Path):
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    return model, next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")


def test_a_stale_width_annotation_is_not_taken_for_the_head_size(copy):
    model, node = _attention_graph(copy)
    query = next(v for v in model.graph.value_info if v.name == node.input[0])
    query.type.tensor_type.shape.dim[2].dim_value = 64  # stale: onnxruntime runs by the real shapes, 128 wide
    onnx.save(model, str(copy / "model.onnx"))
    desc = open_builder(copy).description  # the key and value widths (64 over 2 heads) no longer agree with it
    assert {kv.head_dim for kv in desc.target.kv} == {32}


def test_a_head_size_the_graph_does_not_settle_must_be_given(copy):
    model, node = _attention_graph(copy)
    next(a for a in node.attribute if a.name == "num_heads").i = 2  # the query's 128 over 2 heads: 64, the key's 32
    onnx.save(model, str(copy / "model.onnx"))
    cfg = json.loads((copy / "genai_config.json").read_text())
    del cfg["model"]["decoder"]["head_size"]
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown KV layout: past_key_values\.3\.key .*head_size known"):
        open_builder(copy)


def test_a_graph_whose_attention_does_not_run_is_told_in_one_line_at_its_prefill(copy):
    model, node = _attention_graph(copy)
    next(a for a in node.attribute if a.name == "kv_num_heads").i = 1  # the annotations no longer agree: not read
    onnx.save(model, str(copy / "model.onnx"))
    engine = Engine(RunConfig(model=str(copy), commit="readvance-m1"), open_builder(copy))
    with pytest.raises(ValueError, match=r"does not run .*'s prefill: .*GroupQueryAttention.*kv_num_heads"):
        engine.greedy(prompt_tokens(engine.desc.vocab_size, 8, 0), 4)


def test_a_head_whose_attention_does_not_run_is_told_in_one_line_at_its_prefill(copy, capfd):
    model = onnx.load(str(copy / "mtp.onnx"), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    next(a for a in node.attribute if a.name == "kv_num_heads").i = 1
    onnx.save(model, str(copy / "mtp.onnx"))
    engine = Engine(RunConfig(model=str(copy), commit="readvance-m1"), open_builder(copy))
    assert "Non-zero status code" not in capfd.readouterr().err  # its warm-up failed quietly: nothing was wrong yet
    assert engine.mtp.state[Slot.PRIMARY].status is Status.NEEDS_WARMUP  # left to fail where it is used
    prompt = prompt_tokens(engine.desc.vocab_size, 8, 0)
    assert len(engine.greedy(prompt, 4).tokens) == 4  # the target runs
    with pytest.raises(ValueError, match=r"does not run .*'s MTP head \(its prefill\): .*kv_num_heads"):
        engine.speculative(prompt, 8)


def test_a_short_context_runs_and_calibrates_within_it(copy, capsys):
    from mtplab.cli.main import main

    cfg = json.loads((copy / "genai_config.json").read_text())
    cfg["model"]["context_length"] = 24  # the calibration's own sizes (k up to 7, 16 greedy decodes) do not fit
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    assert open_builder(copy).description.capacity == 24
    run = ["run", "--model", str(copy), "--drafter", "oracle", "--alpha", "0.7", "--k", "1", "--rounds", "1",
           "--allow-suspect"]
    assert main([*run, "--tokens", "8"]) == 0, capsys.readouterr().err
    from mtplab.base.threads import threads_used
    from mtplab.experiment.calibrate import cache_key, cache_path

    calibration = json.loads(cache_path(cache_key(str(copy), threads_used(0))).read_text())
    assert calibration["copy_target"]["1"] > 0  # Primary ran model.onnx: the copy's M=1 is measured apart
    assert sorted(calibration["target"], key=int) == [str(m) for m in range(1, 8)]  # 8 + 2 * 7 + 2 tokens fit 24
    assert main([*run, "--tokens", "14"]) == 2
    assert "exceeds model's KV capacity 24 (allowed: tokens <= 12)" in capsys.readouterr().err


def test_a_graph_reading_a_tensor_nothing_produces_is_refused_naming_it(copy):
    """What the builder writes for its MultiHeadAttention exports (fp16 -e cpu, fp32 -e cuda, ...)."""
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    model.graph.node.append(onnx.helper.make_node("Shape", ["past_key_values.0.key"], ["shape_out"], name="reads_layer_0"))
    onnx.save(model, str(copy / "model.onnx"))
    with pytest.raises(ValueError, match=r"model\.onnx is not a valid graph: node reads_layer_0 reads "
                                         r"'past_key_values\.0\.key'.*MultiHeadAttention exports"):
        open_builder(copy)


@pytest.fixture(scope="module")
def fp16_logits(tmp_path_factory):
    """The fixture with its logits cast to float16 (what onnxruntime-genai's MtpGenerator needs on the CPU)."""
    from mtplab.experiment.genai_builder import _cast_logits

    folder = tmp_path_factory.mktemp("fp16-logits") / "builder-fp16-logits"
    shutil.copytree(FIXTURE, folder)
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    onnx.save(_cast_logits(model, "logits"), str(folder / "model.onnx"))
    return open_builder(folder)


def test_float16_logits_beside_float32_states_are_read_and_run_losslessly(fp16_logits):
    t = fp16_logits.description.target
    assert (t.logits_type, t.hidden_type, {kv.dtype for kv in t.kv}) == (np.float16, np.float32, {"float32"})
    assert "logits: logits (float16); hidden state for the head: hidden_states (float32)" in inspect_text(fp16_logits)
    *_, ok, verdict = _checked(fp16_logits, _run(k=3, commit="select"))
    assert ok, verdict


def test_bfloat16_graphs_are_refused_before_any_session_with_the_reason(builder):
    import dataclasses

    from mtplab.experiment.build import check_run_on_model

    desc = builder.description
    bf16 = dataclasses.replace(desc, target=dataclasses.replace(desc.target, dtype="bfloat16"))
    with pytest.raises(ValueError, match=r"computes in bfloat16 \(activations, logits\).*build the model with -p fp16"):
        check_run_on_model(_run(model=str(FIXTURE)), bf16)
    check_run_on_model(_run(model=str(FIXTURE)), desc)


def test_int4_belongs_to_presets_not_folders():
    with pytest.raises(ValueError, match="int4=True with a model folder"):
        RunConfig(model=str(FIXTURE), int4=True)


def test_a_k_beyond_the_calibrated_verify_sizes_runs_without_a_prediction(capsys):
    from mtplab.cli.main import main

    code = main(["run", "--model", str(FIXTURE), "--k", "9", "--tokens", "24", "--rounds", "2", "--drafter", "oracle",
                 "--commit", "readvance-m1", "--json", "--allow-suspect"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["lossless"] and r["config"]["k"] == 9 and not r.get("predicted")


def test_an_older_config_naming_a_preset_and_a_folder_runs_the_folder():
    assert RunConfig.from_dict({"preset": "tiny", "model": str(FIXTURE)}).model == str(FIXTURE.resolve())
    assert RunConfig.from_dict({"preset": "tiny", "model": ""}).model == "tiny"


def test_a_spec_names_a_folder_beside_it_from_any_working_directory(copy, tmp_path, monkeypatch):
    from mtplab.sweep import grid

    spec = copy.parent / "spec.yaml"
    spec.write_text("name: rel\ndefaults: {tokens: 16, drafter: oracle}\nmodel: [model, tiny]\nk: [1]\n")
    monkeypatch.chdir(tmp_path)
    loaded = grid.load(spec)
    assert sorted(p.run.model for p in loaded.points) == sorted([str(copy.resolve()), "tiny"])
    assert loaded.source["model"][0] == str(copy.resolve())  # sweep.json keeps the absolute folder


def test_two_folders_of_one_name_whose_weights_differ_get_caches_of_their_own(tmp_path, monkeypatch):
    import mtplab.base.files as files

    a, b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    shutil.copytree(FIXTURE, a)
    shutil.copytree(FIXTURE, b)
    with open(b / "model.onnx.data", "r+b") as f:  # one weight changed: the graphs and config stay the same
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    first, second = open_builder(a), open_builder(b)
    assert first.content != second.content and first.description.target.path != second.description.target.path
    import hashlib
    import types

    hashed = []  # the digest module's own hashing, counted
    monkeypatch.setattr(files, "hashlib", types.SimpleNamespace(sha256=lambda: hashed.append(1) or hashlib.sha256()))
    assert open_builder(b).content == second.content and not hashed  # the weights' digests are remembered


def test_selects_bound_replay_keeps_the_state_its_fed_replay_keeps_for_every_prefix(builder):
    """On the host select's LinearAttention replay runs on a binding per n once the verify's outputs are the same
    arrays from one commit to the next; arrays new at a commit are fed as copies. Both give the same state, bitwise."""
    from mtplab.engine.commits import OpReplay, select_commit

    engine = Engine(_run(k=3, commit="select"), builder)
    prompt = prompt_tokens(builder.description.vocab_size, 8, 0)
    engine.start(prompt)
    replay = select_commit(builder.description, engine.device)  # an OpReplay: the builder's LinearAttention form
    assert isinstance(replay, OpReplay)
    ver = engine.forward(Slot.VERIFY, np.asarray([3, 1, 4, 1]), in_place=False)
    start = {name: a.copy() for name, a in engine.state.gdn.items()}

    def replayed(outputs, n, how):
        for name, a in start.items():
            engine.state.gdn[name][...] = a
        how(engine.state, outputs, n)
        return {name: a.copy() for name, a in engine.state.gdn.items()}

    plans = []
    for n in (1, 4, 2, 1):  # the first commit is fed (arrays not seen before); then a binding per n
        bound = replayed(ver, n, replay._replay_bound)
        assert all(np.array_equal(bound[name], a) for name, a in replayed(ver, n, replay._replay_fed).items()), n
        assert any(not np.array_equal(bound[name], start[name]) for name in start)  # the prefix moved the state
        plans.append(sorted(replay.plans))
    assert plans == [[], [4], [2, 4], [1, 2, 4]]
    moved = {name: a.copy() for name, a in ver.items()}  # the verify's outputs in other buffers
    for _ in range(2):  # fed once (new arrays), then bound anew
        bound = replayed(moved, 2, replay._replay_bound)
        assert all(np.array_equal(bound[name], a) for name, a in replayed(ver, 2, replay._replay_fed).items())
    assert replay.plans[2][1][-1] is moved[replay.role_names[-1]]
    engine.state.gdn.update({name: a.copy() for name, a in start.items()})
    with pytest.raises(ValueError, match="select's replay of 5 tokens: the verify's outputs hold 4"):
        replay(engine.state, ver, 5)
    with pytest.raises(TypeError):
        replay(engine.state, ver, 2.0)
    assert all(np.array_equal(engine.state.gdn[name], a) for name, a in start.items())  # refused before any change
